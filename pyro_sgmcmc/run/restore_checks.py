"""A checkpoint's kernel state checked against the run that resumes it, before anything is made from it.

The checksums of :mod:`pyro_sgmcmc.checkpoint` detect damage, not a deliberate edit: whoever knows the
format can change a field and sign the file again. So every field of the saved state is checked here
against the resuming run's own settings (:class:`RunLayout`: chains, dimension, dtype, plates, length)
*before* :meth:`~pyro_sgmcmc.kernels.batched.BatchedChains.restore_chains` reads it, so that no tensor is
allocated, no loop run and no index drawn from a forged value. With ``C`` chains of dimension ``D``:

* ``state``: ``position``, ``grad`` (and ``momentum`` unless ``None``) of shape ``(C, D)``, ``potential``
  (and ``thermostat``) of shape ``(C,)``, all of the run's dtype and finite; ``frozen`` a ``(C,)`` bool;
  ``step`` equal to the checkpoint's ``steps_done``;
* ``seed`` and ``chain_ids``: the run's;
* ``minibatches``: exactly the run's subsampled plates, each with a ``cursor`` in ``[0, size]``, an
  ``epoch`` in ``[0, 2^62)``, positions ``(C,)`` of ``int64`` in ``[0, span]`` (the keyed permutation's
  domain) and keys ``(C, 6)`` of ``int64``;
* the divergence record: ``divergences`` a list of ``C`` increasing lists of draw indices in
  ``[0, steps_done - warmup_steps)``, per-chain counts ``(C,)`` of ``int64`` with
  ``0 <= warmup <= total <= steps_done`` and as many sampling divergences as listed, a log of
  ``(chain, step, phase, what)`` records, one per divergence;
* a control variate's ``centre`` and ``grad`` of shape ``(D,)`` and ``potential`` a scalar, of the run's dtype;
* every other tensor (the warmup's adapted metric and step sizes, its statistics): a leading axis of
  ``C``, at most three axes, each other axis ``1`` or ``D`` (so it holds at most ``C D^2`` numbers),
  of the run's dtype, ``float64``, ``int64`` or ``bool`` (NaN allowed: a diverged chain's warmup statistics hold
  some); every other integer non-negative.
  A user's step-size schedule's own state (``step_size_schedule``) is its ``load_state_dict``'s to check.

A field that fails is a :class:`~pyro_sgmcmc.checkpoint.CheckpointMismatch` naming it, e.g.
``minibatches['data'].cursor: 1000000000 is outside [0, 300]``. Tensors are on the CPU: the checkpoint
is read with ``map_location="cpu"`` and moved to the run's device only once restored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

import torch

from ..chains.permutation import NUM_ROUNDS, KeyedPermutation
from ..checkpoint_errors import CheckpointMismatch

__all__ = ["RunLayout", "check_kernel_state", "check_last_chunk"]

#: The largest epoch counter accepted (the keys are derived from it in 64-bit integers).
MAX_EPOCH = 2**62
#: The fields of the divergence record, checked together by :func:`_check_divergences`.
_DIVERGENCE_FIELDS = ("divergences", "num_warmup_divergences", "num_divergences", "frozen", "divergence_log")
#: Records of user code, which checks them itself: a step-size schedule's own state (its ``load_state_dict``).
USER_RECORDS = ("step_size_schedule",)
#: Fields checked by their own rule (not the generic one for the warmup's tensors), or by their owner.
_OWN_RULES = ("state", "seed", "chain_ids", "minibatches", "control_variate", "control_variate_candidate",
              "last_diverging", *_DIVERGENCE_FIELDS, *USER_RECORDS)  # fmt: skip


@dataclass(frozen=True)
class RunLayout:
    """What the resuming run is: the facts a saved field is checked against.

    Attributes
    ----------
    num_chains, dim : int
        Chains ``C`` and length ``D`` of the flat unconstrained position.
    dtype : torch.dtype
        The positions' dtype.
    plates : dict
        ``{name: size}`` of the plates the kernel draws minibatches of.
    warmup_steps, total_steps : int
        The run's warmup and all its steps.
    seed : int or None
        The run's seed (``None``: drawn, then any saved seed is the run's).
    chain_ids : sequence of int
        The chains' global ids.
    """

    num_chains: int
    dim: int
    dtype: torch.dtype
    plates: Dict[str, int]
    warmup_steps: int
    total_steps: int
    seed: Optional[int]
    chain_ids: Sequence[int]


def check_last_chunk(path, last_chunk: Any, expected_draws: int, steps_done: int) -> None:
    """The index's record of the last draw chunk: ``None`` when no draw is expected, else a dict whose draw range
    ``[start, stop)`` ends at ``expected_draws`` (checked before any chunk is read)."""
    if expected_draws == 0 and last_chunk is None:
        return
    if not isinstance(last_chunk, dict) or not all(k in last_chunk for k in ("file", "start", "stop", "sha256")):
        raise CheckpointMismatch(
            f"checkpoint {path}: last_chunk: {_short(last_chunk)} does not record the last of the {expected_draws} "
            f"draws a run keeps after steps_done={steps_done}"
        )
    start, stop = last_chunk["start"], last_chunk["stop"]
    if not (_is_int(start) and _is_int(stop) and 0 <= start < stop == expected_draws):
        raise CheckpointMismatch(
            f"checkpoint {path}: last_chunk: draws {start!r} to {stop!r}, but a run keeps {expected_draws} draws "
            f"after steps_done={steps_done}"
        )


def check_kernel_state(path, saved: dict, steps_done: int, run: RunLayout) -> None:
    """Every field of the kernel state ``saved`` (the checkpoint's ``kernel`` record) against ``run``.

    Raises :class:`~pyro_sgmcmc.checkpoint.CheckpointMismatch` naming the first field that is missing, of
    another type, dtype or shape, or out of its range (see the module docstring for the rules).
    """
    checker = _Checker(path, run)
    checker.state(_mapping(checker, saved.get("state"), "state"), steps_done)
    if run.seed is not None and saved.get("seed") != run.seed:
        checker.fail("seed", f"{saved.get('seed')!r} is not this run's seed {run.seed}")
    if not _is_int(saved.get("seed")):
        checker.fail("seed", f"{saved.get('seed')!r} is not an integer")
    if list(saved.get("chain_ids") or ()) != list(run.chain_ids):
        checker.fail("chain_ids", f"{saved.get('chain_ids')!r} are not this run's chain ids {list(run.chain_ids)}")
    checker.minibatches(_mapping(checker, saved.get("minibatches"), "minibatches"))
    checker.divergences(saved, steps_done)
    checker.tensor(saved.get("last_diverging"), "last_diverging", (run.num_chains,), torch.bool)
    for name in ("control_variate", "control_variate_candidate"):
        if name in saved:
            checker.control_variate(_mapping(checker, saved[name], name), name)
    for name, value in saved.items():
        if name not in _OWN_RULES:
            checker.generic(value, name)


class _Checker:
    """The rules of the module docstring, each raising a :class:`CheckpointMismatch` that names the field."""

    def __init__(self, path, run: RunLayout) -> None:
        self.path, self.run = path, run

    def fail(self, field: str, problem: str) -> None:
        raise CheckpointMismatch(f"checkpoint {self.path}: {field}: {problem}")

    def tensor(self, value: Any, field: str, shape: tuple, dtype: torch.dtype, finite: bool = False) -> None:
        """A tensor of exactly ``shape`` and ``dtype`` (and finite values with ``finite``)."""
        if not isinstance(value, torch.Tensor):
            self.fail(field, f"a {type(value).__name__} where a tensor of shape {shape} ({dtype}) is expected")
        if value.dtype != dtype:
            self.fail(field, f"dtype {value.dtype}, this run's is {dtype}")
        if tuple(value.shape) != shape:
            self.fail(field, f"shape {tuple(value.shape)}, this run's is {shape}")
        if finite and not bool(torch.isfinite(value).all()):
            self.fail(field, "not finite")

    def integer(self, value: Any, field: str, low: int, high: int) -> int:
        """A Python integer in ``[low, high]``."""
        if not _is_int(value):
            self.fail(field, f"{value!r} is not an integer")
        if not low <= value <= high:
            self.fail(field, f"{value} is outside [{low}, {high}]")
        return value

    def state(self, state: dict, steps_done: int) -> None:
        C, D, dtype = self.run.num_chains, self.run.dim, self.run.dtype
        for name in ("position", "grad", "momentum"):
            if name != "momentum" or state.get(name) is not None:
                self.tensor(state.get(name), f"state.{name}", (C, D), dtype, finite=True)
        for name in ("potential", "thermostat"):
            if name != "thermostat" or state.get(name) is not None:
                self.tensor(state.get(name), f"state.{name}", (C,), dtype, finite=True)
        if state.get("frozen") is not None:
            self.tensor(state["frozen"], "state.frozen", (C,), torch.bool)
        if state.get("step") != steps_done or not _is_int(state.get("step")):
            self.fail("state.step", f"{state.get('step')!r} is not the checkpoint's steps_done, {steps_done}")
        unknown = set(state) - {"position", "grad", "momentum", "potential", "thermostat", "frozen", "step"}
        if unknown:
            self.fail("state", f"unknown fields {sorted(unknown)}")

    def minibatches(self, saved: dict) -> None:
        C, plates = self.run.num_chains, self.run.plates
        if saved.get("permutations") not in ({}, None):
            self.fail("minibatches.permutations", "permutation tables (an earlier format) are not continued")
        for part in ("keys", "positions", "cursors", "epochs"):
            records = _mapping(self, saved.get(part), f"minibatches.{part}")
            if set(records) != set(plates):
                self.fail(f"minibatches.{part}", f"plates {sorted(records)}, this run's are {sorted(plates)}")
        for name, size in plates.items():
            field = f"minibatches[{name!r}]"
            self.integer(saved["cursors"][name], f"{field}.cursor", 0, size)
            self.integer(saved["epochs"][name], f"{field}.epoch", 0, MAX_EPOCH - 1)
            self.tensor(saved["keys"][name], f"{field}.keys", (C, NUM_ROUNDS), torch.long)
            positions = saved["positions"][name]
            self.tensor(positions, f"{field}.positions", (C,), torch.long)
            span = KeyedPermutation.span_of(size)
            if C and not (0 <= int(positions.min()) and int(positions.max()) <= span):
                self.fail(f"{field}.positions", f"{positions.tolist()} are outside [0, {span}]")

    def divergences(self, saved: dict, steps_done: int) -> None:
        C = self.run.num_chains
        sampling_steps = max(0, steps_done - self.run.warmup_steps)
        lists = saved.get("divergences")
        if not isinstance(lists, list) or len(lists) != C:
            self.fail("divergences", f"{_short(lists)} is not a list of {C} lists (one per chain)")
        for name in ("num_warmup_divergences", "num_divergences"):
            self.tensor(saved.get(name), name, (C,), torch.long)
        warmup, total = saved["num_warmup_divergences"], saved["num_divergences"]
        if C and not (0 <= int(warmup.min()) and bool((warmup <= total).all()) and int(total.max()) <= steps_done):
            self.fail("num_divergences", f"counts {total.tolist()} (warmup {warmup.tolist()}) are not within "
                      f"0 <= warmup <= total <= {steps_done}")  # fmt: skip
        for chain, draws in enumerate(lists):
            field = f"divergences[{chain}]"
            if not isinstance(draws, list) or len(draws) != int(total[chain] - warmup[chain]):
                self.fail(field, f"{_short(draws)} is not a list of the chain's "
                          f"{int(total[chain] - warmup[chain])} sampling divergences")  # fmt: skip
            for i, draw in enumerate(draws):
                self.integer(draw, f"{field}[{i}]", draws[i - 1] + 1 if i else 0, sampling_steps - 1)
        if saved.get("frozen") is not None:
            self.tensor(saved["frozen"], "frozen", (C,), torch.bool)
        log = saved.get("divergence_log")
        if not isinstance(log, list) or len(log) != int(total.sum()):
            self.fail("divergence_log", f"{_short(log)} is not a list of {int(total.sum())} records")
        for i, record in enumerate(log):
            field = f"divergence_log[{i}]"
            if not isinstance(record, (tuple, list)) or len(record) != 4:
                self.fail(field, f"{_short(record)} is not a record (chain, step, phase, what)")
            self.integer(record[0], f"{field}.chain", 0, C - 1)
            self.integer(record[1], f"{field}.step", 0, max(0, steps_done - 1))
            if record[2] not in ("warmup", "sampling") or not isinstance(record[3], str):
                self.fail(field, f"{_short(record)} is not a record (chain, step, 'warmup' or 'sampling', what)")

    def control_variate(self, saved: dict, field: str) -> None:
        D, dtype = self.run.dim, self.run.dtype
        self.tensor(saved.get("centre"), f"{field}.centre", (D,), dtype, finite=True)
        self.tensor(saved.get("grad"), f"{field}.grad", (D,), dtype, finite=True)
        self.tensor(saved.get("potential"), f"{field}.potential", (), dtype, finite=True)

    def generic(self, value: Any, field: str) -> None:
        """The warmup's fields and any other: nested dicts, lists and tuples of the tensors and numbers below."""
        if isinstance(value, dict):
            for key, item in value.items():
                self.generic(item, f"{field}.{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self.generic(item, f"{field}[{i}]")
        elif isinstance(value, torch.Tensor):
            self.bounded_tensor(value, field)
        elif _is_int(value) and value < 0:
            self.fail(field, f"{value} is negative")
        elif not isinstance(value, (bool, int, float, str, type(None))):
            self.fail(field, f"a {type(value).__name__} is not part of a kernel's state")

    def bounded_tensor(self, value: torch.Tensor, field: str) -> None:
        """A per-chain tensor: ``(C, ...)`` with at most two more axes of size 1 or ``D``, of a known dtype (its values
        may be NaN: a diverged chain's warmup statistics are, and the run goes on)."""
        C, D, dtype = self.run.num_chains, self.run.dim, self.run.dtype
        shape = tuple(value.shape)
        if not 1 <= len(shape) <= 3 or shape[0] != C or any(n not in (1, D) for n in shape[1:]):
            self.fail(field, f"shape {shape} is not a per-chain tensor of this run ({C}, and up to two axes of 1 "
                      f"or {D})")  # fmt: skip
        if value.dtype not in (dtype, torch.float64, torch.int64, torch.bool):
            self.fail(field, f"dtype {value.dtype}, this run's are {dtype}, torch.float64, torch.int64 or torch.bool")


def _mapping(checker: _Checker, value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        checker.fail(field, f"a {type(value).__name__} where a record of named fields is expected")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
