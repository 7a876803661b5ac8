"""``chain_method="parallel"``: Pyro's own :class:`pyro.infer.MCMC` runs the chains; what an interrupted run keeps.

:class:`pyro.infer.MCMC` collects its draws in a local list inside ``run`` and loses them all when an
exception (``KeyboardInterrupt`` included) stops it. It runs its chains in one of two ways: in worker
processes, one per chain (when the machine has a core for each), which send every draw to this process
through a queue; or in this process, one chain after another. Either way every draw passes through this
process, as the values its *sampler* yields: per chain a structure ``{site: shape}`` (after the chain's
set-up), then one flat unconstrained vector per draw, then the kernel's diagnostics. A
:class:`SampleStream` wraps that sampler (:func:`pyro_sgmcmc._compat.observe_pyro_sampler`) and copies each
draw, as it passes, into a store preallocated for all chains (a second copy of the draws while the run
runs, freed when it ends). A :class:`SampleRecorder` wraps ``hook_fn``: in this process it counts the steps
and keeps the last draw of the chain running here, which Pyro computes before it calls the hook and yields
it (so a run stopped by the hook of draw ``k`` keeps ``k + 1`` draws, as the other chain methods do).

A stopped run keeps a ``(chains, draws)`` block (:func:`stopped_parallel_run`): the first ``n`` draws of
the first ``k`` chains, with ``k * n`` as large as the draws received allow (ties: more chains). Chains in
worker processes advance together, so that is every chain with the draws of the slowest; chains run one
after another keep the finished chains, or the first chain's draws so far, whichever holds more draws.
They are the first draws of an uninterrupted run with the same seed, constrained through the transforms
Pyro would apply (the given ``transforms``, else the kernel's).
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from ..schedules import Schedule
from .partial import PartialRun

__all__ = ["SampleRecorder", "SampleStream", "StoppedRun", "pyro_transforms", "sampling_stage", "stopped_parallel_run"]


class SampleRecorder:
    """``hook_fn(kernel, params, stage, i)`` of a Pyro run: count the steps run in this process and keep the last
    sampling draw of the chain running here, then call ``hook_fn`` (in a worker process, its own copy does so)."""

    def __init__(self, hook_fn: Optional[Callable]) -> None:
        self.hook_fn = hook_fn
        self.start()

    def start(self) -> None:
        """Forget a previous run."""
        self.steps: Dict[int, int] = {}  # chain -> steps run in this process
        self.last: Optional[Tuple[int, int, Dict[str, torch.Tensor]]] = None  # (chain, draw index, params)

    def __call__(self, kernel, params: Dict[str, torch.Tensor], stage: str, i: int) -> None:
        chain = chain_of(stage)
        self.steps[chain] = self.steps.get(chain, 0) + 1
        if stage.startswith("Sample"):  # the draw is kept before the user's hook runs, as a vectorised run does
            # by reference, not copied (a copy of every draw cost ~20 us a step): it is read only when the run stops
            # between this hook and Pyro's yield of the same draw, before any later step could write into it
            self.last = (chain, i, dict(params))
        if self.hook_fn is not None:
            self.hook_fn(kernel, params, stage, i)


@functools.lru_cache(maxsize=256)
def chain_of(stage: str) -> int:
    """The chain of Pyro's stage name: ``c`` in ``"Sample [c]"``, 0 in ``"Sample"`` (one chain, or a worker's)."""
    found = re.search(r"\[(\d+)\]", stage)
    return int(found.group(1)) if found else 0


class SampleStream:
    """Pyro's sampler, whose ``run`` yields ``(value, chain)``, with every draw copied as it passes (module docstring).

    Parameters
    ----------
    sampler :
        The sampler of a :class:`pyro.infer.MCMC` (its ``run`` and ``terminate`` are called through).
    num_chains, num_samples : int
        The run's chains and draws per chain.
    """

    def __init__(self, sampler, num_chains: int, num_samples: int) -> None:
        self.sampler = sampler
        self.num_chains, self.num_samples = num_chains, num_samples
        self.start()

    def start(self) -> None:
        """Forget a previous run's draws."""
        self.received = [0] * self.num_chains  # values received per chain: structure, draws, diagnostics
        self.structure: Optional[Dict[str, torch.Size]] = None
        self.store: Optional[torch.Tensor] = None  # (num_chains, num_samples, flat size), allocated at the first draw
        self.diagnostics: Dict[int, dict] = {}

    def run(self, *args, **kwargs):
        """Pyro's sampler's ``run``, each value recorded before it is passed on."""
        for value, chain in self.sampler.run(*args, **kwargs):
            self._record(value, chain)
            yield value, chain

    def terminate(self, *args, **kwargs):
        return self.sampler.terminate(*args, **kwargs)

    def _record(self, value, chain: int) -> None:
        count = self.received[chain]
        if count == 0:  # the chain is set up: the sites and their shapes
            self.structure = dict(value)
        elif count <= self.num_samples:
            if self.store is None:  # on the draws' device: no copy to the host per step
                shape = (self.num_chains, self.num_samples, value.numel())
                self.store = torch.empty(shape, dtype=value.dtype, device=value.device)
            self.store[chain, count - 1] = value  # a copy: a worker's value lives in shared memory
        else:
            self.diagnostics[chain] = value
        self.received[chain] = count + 1  # last: a draw interrupted while copied is not counted

    def draws(self, chain: int) -> int:
        """Draws of ``chain`` received so far."""
        return min(max(self.received[chain] - 1, 0), self.num_samples)


class StoppedRun(NamedTuple):
    """What a stopped ``"parallel"`` run keeps: where it stopped, and its draws (``None``: none) and diagnostics."""

    partial: PartialRun
    samples: Optional[Dict[str, torch.Tensor]]
    diagnostics: List[dict]


def stopped_parallel_run(
    stream: SampleStream,
    recorder: SampleRecorder,
    error: BaseException,
    warmup_steps: int,
    constrain: Callable[[], dict],
    running_diagnostics: Callable[[], dict],
    sampling_stage: Optional[Callable[[int], bool]] = None,
) -> StoppedRun:
    """The block of draws a ``"parallel"`` run stopped by ``error`` keeps (module docstring), and its partial record.

    ``constrain()`` gives the transforms to the sites' supports and ``running_diagnostics()`` the diagnostics of
    the kernel in this process (called only if there are draws); ``sampling_stage(j)`` says whether draw ``j`` is
    one of a staged schedule's sampling stages (default: all are). The diagnostics kept are, per kept chain, its
    kernel's (divergences among the kept draws) when they are known for every kept chain: a finished chain's
    from the stream, the chain running in this process from its kernel; else none (a worker's are lost).
    """
    num_chains, num_samples = stream.num_chains, stream.num_samples
    counts = [stream.draws(c) for c in range(num_chains)]
    last = recorder.last
    pending = last is not None and last[0] < num_chains and last[1] == counts[last[0]] < num_samples
    if pending:  # computed here and passed to the hook, not yet yielded: kept, as the other chain methods keep it
        counts[last[0]] += 1
    areas = [(k * min(counts[:k]), k) for k in range(1, num_chains + 1)]
    area, kept_chains = max(areas)
    num_draws = area // kept_chains if area else 0
    in_process = max(recorder.steps.values(), default=0)
    if num_draws:
        steps_done, phase = warmup_steps + num_draws, "sampling"
    elif in_process or stream.structure is not None:
        steps_done, phase = min(in_process, warmup_steps), "warmup"
    else:
        steps_done, phase = 0, "set-up"
    samples, diagnostics = None, [{} for _ in range(kept_chains if num_draws else num_chains)]
    if num_draws:
        flat = _block(stream, last if pending else None, kept_chains, num_draws)
        keep = [j for j in range(num_draws) if sampling_stage is None or sampling_stage(j)]
        flat = flat[:, keep]
        samples = _unpack(flat, _structure(stream, last), constrain())
        known = dict(stream.diagnostics)  # the finished chains'
        if recorder.steps and max(recorder.steps) not in known:
            known[max(recorder.steps)] = running_diagnostics()  # the chain that ran here last: its kernel is here
        if all(c in known for c in range(kept_chains)):
            diagnostics = [_among(known[c], num_draws) for c in range(kept_chains)]
        num_draws = len(keep)
    partial = PartialRun(
        steps_done=steps_done,
        total_steps=warmup_steps + num_samples,
        num_draws=num_draws,
        num_samples=num_samples,
        error=f"{type(error).__name__}: {error}".rstrip(": "),
        checkpoint_path=None,
        phase=phase,
        num_chains_kept=kept_chains if num_draws and kept_chains < num_chains else None,
    )
    return StoppedRun(partial, samples if num_draws else None, diagnostics)


def _block(stream: SampleStream, last, chains: int, draws: int) -> torch.Tensor:
    """The first ``draws`` flat draws of the first ``chains`` chains, with the hook's last draw in its place."""
    if stream.store is not None:
        block = stream.store[:chains, :draws].clone()
    else:
        block = None
    if last is not None and last[0] < chains and last[1] < draws:
        chain, index, params = last
        flat = torch.cat([params[name].reshape(-1) for name in _structure(stream, last)])
        if block is None:
            block = flat.new_empty((chains, draws, flat.numel()))
        block[chain, index] = flat
    return block


def _among(diagnostics: dict, num_draws: int) -> dict:
    """A chain's diagnostics with its divergences limited to the draws kept."""
    if isinstance(diagnostics.get("divergences"), list):
        return {**diagnostics, "divergences": [i for i in diagnostics["divergences"] if i < num_draws]}
    return diagnostics


def _structure(stream: SampleStream, last) -> Dict[str, torch.Size]:
    """The sites and shapes of the flat draws: Pyro's structure, or (no draw received yet) the hook's draw's."""
    if stream.structure is not None:
        return stream.structure
    return {name: value.shape for name, value in last[2].items()}


def _unpack(flat: torch.Tensor, structure: Dict[str, torch.Size], transforms: dict) -> Dict[str, torch.Tensor]:
    """``{site: (chains, draws, *shape)}`` from flat draws, constrained, as :meth:`pyro.infer.MCMC.run` unpacks them
    (the sites in sorted order, as it does)."""
    chains, draws = flat.shape[:2]
    samples, start = {}, 0
    for name in sorted(structure):
        shape = torch.Size(structure[name])
        value = flat[:, :, start : start + shape.numel()].reshape((chains, draws) + shape)
        start += shape.numel()
        samples[name] = transforms[name].inv(value) if name in transforms else value
    return samples


def sampling_stage(kernel, warmup_steps: int) -> Optional[Callable[[int], bool]]:
    """``j -> bool``: whether draw ``j`` of a Pyro run is in a staged schedule's sampling stage (``None``: all are)."""
    schedule = getattr(kernel, "step_size", None)
    if not (isinstance(schedule, Schedule) and schedule.staged):
        return None
    schedule = schedule.starting_at(warmup_steps)
    return lambda j: schedule.sampling_stage(warmup_steps + j)


def pyro_transforms(kernel, transforms: Optional[dict], args: tuple, kwargs: dict) -> dict:
    """The transforms Pyro's run applies to its draws: ``transforms`` if given, else the kernel's, set up here first
    (with no warmup) when its chains ran in worker processes, as :meth:`pyro.infer.MCMC.run` does."""
    if transforms is not None:
        return transforms
    if getattr(kernel, "transforms", None) is None:
        kernel.setup(0, *args, **kwargs)
    return kernel.transforms or {}
