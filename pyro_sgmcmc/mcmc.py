"""``pyro_sgmcmc.MCMC``: :class:`pyro.infer.MCMC` plus vectorised chains for the SG-MCMC kernels.

Pyro runs ``num_chains > 1`` as one process per chain (or one after the other when there are
fewer cores than chains). Stochastic-gradient methods want many short chains, so this subclass
adds ``chain_method="vectorized"``: all chains advance together in batched tensor operations
(the model runs once per step under :func:`torch.func.vmap`), each with its own noise and its
own minibatches. Everything else (``get_samples``, ``summary``, ``diagnostics``,
``arviz.from_pyro``) is Pyro's.
"""

from __future__ import annotations

import numbers
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Union

import pyro
import pyro.infer
import pyro.ops.stats
import pyro.poutine as poutine
import torch
from pyro.util import optional

from .checkpoint import (
    CheckpointMismatch,
    check_serialisable,
    chunk_directory,
    clear_chunks,
    commit_files,
    expected_draws,
    load_checkpoint,
    read_blob,
    read_chunks,
    save_checkpoint,
    write_blob,
    write_chunk,
)
from .draws import DrawStore
from .kernels.base import SGMCMCKernel

__all__ = ["MCMC", "PartialRun", "PartialRunWarning", "RunNotFinished"]

_CHAIN_METHODS = ("default", "vectorized")


class PartialRunWarning(UserWarning):
    """The draws read come from a run that stopped before its end (see :attr:`MCMC.partial`)."""


class RunNotFinished(RuntimeError):
    """There are no draws to read: the run was not started, or stopped before its first kept draw."""


class PartialRun(NamedTuple):
    """Where an interrupted run stopped (:attr:`MCMC.partial`).

    Attributes
    ----------
    steps_done, total_steps : int
        Steps completed (warmup included) and the steps of the complete run.
    num_draws, num_samples : int
        Draws kept per chain so far, and those a complete run keeps.
    error : str
        The exception that stopped the run (type and message).
    checkpoint_path : str or None
        The run's checkpoint, from which :meth:`MCMC.run` with the same settings resumes.
    """

    steps_done: int
    total_steps: int
    num_draws: int
    num_samples: int
    error: str
    checkpoint_path: Optional[str]

    def describe(self) -> str:
        """One sentence: where the run stopped, what is kept, how to continue."""
        if self.checkpoint_path is not None:
            resume = (
                f"call run() again with the same settings and checkpoint_path={self.checkpoint_path!r} "
                "to resume from its last checkpoint"
            )
        else:
            resume = "run it again (pass checkpoint_path to be able to resume an interrupted run)"
        return (
            f"the run stopped at step {self.steps_done} of {self.total_steps} ({self.error}) with "
            f"{self.num_draws} of {self.num_samples} draws per chain; {resume}"
        )


class MCMC(pyro.infer.MCMC):
    """Drop-in :class:`pyro.infer.MCMC` with vectorised chains, superchains, thinning and last-state runs.

    Parameters
    ----------
    kernel, num_samples, warmup_steps, initial_params, num_chains, hook_fn, mp_context, disable_progbar, \
disable_validation, transforms, save_params :
        As for :class:`pyro.infer.MCMC`. With ``chain_method="vectorized"``, ``initial_params``
        (unconstrained) has a leading axis of ``num_chains`` or ``num_superchains``, ``hook_fn`` is
        called once per step with the batched unconstrained params, and ``mp_context`` is unused.
    chain_method : {"default", "vectorized"}
        ``"default"`` is Pyro's behaviour (processes, or one chain after another).
        ``"vectorized"`` (SG-MCMC kernels only) runs all chains in one batched computation.
    num_superchains : int, optional
        ``K``: the chains are split into ``K`` groups of ``num_chains / K`` consecutive chains, each
        group starting from one point (drawn by the kernel's ``init_strategy``, or given). Chains in a
        group differ only by their noise and minibatches, as nested R-hat requires
        (:func:`pyro_sgmcmc.nested_rhat`). Default: every chain is its own superchain.
    thinning : int
        Keep every ``thinning``-th draw after warmup; ``num_samples`` counts *kept* draws.
    keep_last : int, optional
        Keep only the last ``keep_last`` kept draws of each chain (parallel SG-MCMC; at
        ``temperature=0`` a deep ensemble). Memory is then ``O(num_chains * keep_last)``.
    seed : int, optional
        Seed of the per-chain random streams (chain ``c`` uses a stream determined by ``(seed, c)``
        only). Default: drawn from torch's global generator, so ``pyro.set_rng_seed`` applies.
    checkpoint_path : str or path, optional
        Write the run's complete state (positions, momenta, thermostats, step counter, every
        chain's random-generator state and minibatch cursor, divergence records) to this file
        every ``checkpoint_every`` steps, atomically, and the draws kept since the previous write
        to a new chunk file in ``<checkpoint_path>.draws/`` (a write costs O(k), see
        :mod:`pyro_sgmcmc.checkpoint`). If the file exists when :meth:`run` starts (an interrupted
        run with the same settings) and ``resume`` is true, the run continues from it and its draws
        are bit-identical to those of an uninterrupted run; a file from a run with other settings,
        or one that is damaged or edited, raises :class:`~pyro_sgmcmc.checkpoint.CheckpointMismatch`
        naming what differs. Files are read with ``torch.load(weights_only=True)``. The final
        checkpoint is kept.
    checkpoint_every : int, optional
        Steps between checkpoints (a process killed at any moment loses at most this many steps).
        Default 1,000 when ``checkpoint_path`` is given.
    resume : bool
        Continue from an existing checkpoint (default) or start afresh and overwrite it.
    checkpoint_sync : bool
        ``fsync`` each checkpoint file before it replaces the previous one (default), so that it
        survives a power failure or an operating-system crash too. ``False`` skips it: a write then
        costs no disk latency (about 7 ms per file here) and is still atomic for a process that is
        killed, but not for a machine that stops.
    chain_ids : sequence of int, optional
        Global ids of these chains (chain ``c`` draws from the stream of ``(seed, chain_ids[c])``);
        default ``range(num_chains)``. A slice of a larger run gives exactly that run's draws for
        these chains (:class:`pyro_sgmcmc.distributed.DistributedMCMC` runs one slice per process).

    Attributes
    ----------
    sample_stats : dict
        Per kept draw, ``(num_chains, num_draws)`` tensors: ``lp``, ``step_size``, ``diverging``,
        ``temperature`` and the kernel's own (``kinetic_energy``, ``thermostat``).
    superchain_ids : Tensor ``(num_chains,)``
        The superchain of each chain.
    partial : PartialRun or None
        ``None`` after a complete run; after a run stopped by an exception (``KeyboardInterrupt``
        included), where it stopped. The draws kept until then are readable and every reader warns
        with :class:`PartialRunWarning`; with none kept, the readers raise :class:`RunNotFinished`.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import MCMC, SGHMC
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
    ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
    ...         pyro.sample("obs", dist.Normal(mu, 1.), obs=y[idx])
    >>> y = 3. + torch.randn(100, generator=torch.Generator().manual_seed(0))
    >>> mcmc = MCMC(SGHMC(model, step_size=0.05, friction=2.), num_samples=100, warmup_steps=200,
    ...             num_chains=32, num_superchains=4, chain_method="vectorized", seed=0, disable_progbar=True)
    >>> mcmc.run(y)
    >>> mcmc.get_samples(group_by_chain=True)["mu"].shape
    torch.Size([32, 100])
    >>> abs(float(mcmc.get_samples()["mu"].mean() - y.mean())) < 0.05
    True
    """

    def __init__(
        self,
        kernel,
        num_samples: int,
        warmup_steps: Optional[int] = None,
        initial_params: Optional[Dict[str, torch.Tensor]] = None,
        num_chains: int = 1,
        hook_fn: Optional[Callable] = None,
        mp_context=None,
        disable_progbar: bool = False,
        disable_validation: bool = True,
        transforms=None,
        save_params=None,
        *,
        chain_method: str = "default",
        num_superchains: Optional[int] = None,
        thinning: int = 1,
        keep_last: Optional[int] = None,
        seed: Optional[int] = None,
        checkpoint_path: Optional[Union[str, os.PathLike]] = None,
        checkpoint_every: Optional[int] = None,
        resume: bool = True,
        chain_ids: Optional[Sequence[int]] = None,
        checkpoint_sync: bool = True,
    ) -> None:
        if not isinstance(chain_method, str) or chain_method not in _CHAIN_METHODS:
            raise ValueError(f"chain_method must be one of {_CHAIN_METHODS}; got {chain_method!r}")
        if warmup_steps is not None:
            _check_non_negative_int(warmup_steps, "warmup_steps")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError(f"seed must be None or a non-negative integer; got {seed!r}")
        if checkpoint_path is not None:
            if not isinstance(checkpoint_path, (str, os.PathLike)) or not str(checkpoint_path):
                raise TypeError(f"checkpoint_path must be a file path (str or os.PathLike); got {checkpoint_path!r}")
            if Path(checkpoint_path).is_dir():
                raise ValueError(f"checkpoint_path {str(checkpoint_path)!r} is a directory; give a file path")
            if not Path(checkpoint_path).parent.is_dir():
                raise ValueError(f"checkpoint_path: the directory {str(Path(checkpoint_path).parent)!r} does not exist")
        _check_positive_int(num_samples, "num_samples")
        _check_positive_int(num_chains, "num_chains")
        _check_positive_int(thinning, "thinning")
        if keep_last is not None:
            _check_positive_int(keep_last, "keep_last")
        if num_superchains is not None:
            _check_positive_int(num_superchains, "num_superchains")
            if num_chains % num_superchains:
                raise ValueError(f"num_chains={num_chains} must be a multiple of num_superchains={num_superchains}")
        self.chain_method = chain_method
        self.num_superchains = num_chains if num_superchains is None else num_superchains
        self.thinning = thinning
        self.keep_last = keep_last
        self.seed = None if seed is None else int(seed)
        self.sample_stats: Dict[str, torch.Tensor] = {}
        self.partial: Optional[PartialRun] = None
        self.superchain_ids = torch.arange(num_chains) // (num_chains // self.num_superchains)
        if checkpoint_every is not None:
            _check_positive_int(checkpoint_every, "checkpoint_every")
            if checkpoint_path is None:
                raise ValueError("checkpoint_every needs checkpoint_path")
        self.checkpoint_path = None if checkpoint_path is None else Path(checkpoint_path)
        self.checkpoint_every = checkpoint_every or (1000 if checkpoint_path is not None else None)
        self.resume = bool(resume)
        if not isinstance(checkpoint_sync, bool):
            raise TypeError(f"checkpoint_sync must be True or False; got {checkpoint_sync!r}")
        self.checkpoint_sync = checkpoint_sync
        if chain_ids is not None:
            if not isinstance(chain_ids, Sequence) or not all(
                isinstance(c, numbers.Integral) and not isinstance(c, bool) and c >= 0 for c in list(chain_ids)
            ):
                raise ValueError(f"chain_ids must be a sequence of non-negative integers; got {chain_ids!r}")
            if len(chain_ids) != num_chains or len(set(chain_ids)) != num_chains:
                raise ValueError(f"chain_ids must hold num_chains={num_chains} distinct ids; got {list(chain_ids)}")
            chain_ids = [int(c) for c in chain_ids]
        self.chain_ids = chain_ids
        if chain_method == "default":
            if (
                num_superchains is not None
                or thinning != 1
                or keep_last is not None
                or seed is not None
                or checkpoint_path
                or chain_ids is not None
            ):
                raise ValueError(
                    "num_superchains, thinning, keep_last, seed, checkpoint_path and chain_ids need "
                    "chain_method='vectorized' "
                    "(Pyro's own chain methods do not support them)"
                )
            super().__init__(
                kernel, num_samples, warmup_steps, initial_params, num_chains, hook_fn, mp_context,
                disable_progbar, disable_validation, transforms, save_params,
            )  # fmt: skip
            return
        if not isinstance(kernel, SGMCMCKernel):
            raise ValueError(
                "chain_method='vectorized' needs a pyro_sgmcmc kernel (SGLD, SGHMC, SGNHT); "
                f"got {type(kernel).__name__}"
            )
        # The parts of pyro.infer.MCMC's state that its methods (get_samples, summary, diagnostics) read.
        self.kernel = kernel
        self.num_chains = num_chains
        self.transforms = transforms
        self.warmup_steps = num_samples if warmup_steps is None else warmup_steps
        _check_non_negative_int(self.warmup_steps, "warmup_steps")
        self.num_samples = num_samples if keep_last is None else min(num_samples, keep_last)
        self._num_kept_steps = num_samples
        self.disable_validation = disable_validation
        self.disable_progbar = disable_progbar
        self.hook_fn = hook_fn
        self.initial_params = initial_params
        self.save_params = save_params
        self._samples = None
        self._args = None
        self._kwargs = None
        self._diagnostics = [None] * num_chains

    @poutine.block
    def run(self, *args, **kwargs) -> None:
        """Run the chains on ``model(*args, **kwargs)`` and store the draws (see :class:`pyro.infer.MCMC`).

        If the run stops early (``KeyboardInterrupt`` or any exception, re-raised), the draws kept so
        far stay readable: :meth:`get_samples`, :meth:`summary`, :meth:`diagnostics` and
        :func:`~pyro_sgmcmc.to_inference_data` give them with a :class:`PartialRunWarning`, and
        :attr:`partial` says where the run stopped and how to resume it.
        """
        if self.chain_method == "default":
            return super().run(*args, **kwargs)
        self._args, self._kwargs = args, kwargs
        self._samples, self.sample_stats, self.partial = None, {}, None
        kernel: SGMCMCKernel = self.kernel
        self._progress_steps = 0
        store = None
        try:
            with optional(pyro.validation_enabled(not self.disable_validation), self.disable_validation is not None):
                args = tuple(arg.detach() if torch.is_tensor(arg) else arg for arg in args)
                kernel.setup_chains(
                    self.warmup_steps,
                    args,
                    kwargs,
                    num_chains=self.num_chains,
                    initial_params=self.initial_params,
                    num_superchains=self.num_superchains,
                    seed=self.seed,
                    chain_ids=self.chain_ids,
                )
                self.superchain_ids = kernel.superchain_ids.clone()
                position = kernel.state.position
                store = DrawStore(
                    self.num_chains, self.num_samples, position.shape[-1], position.dtype, position.device
                )
                self._run_steps(kernel, store)
        except BaseException as error:
            self._stop(kernel, store, error)
            raise
        self._keep(kernel, store)
        kernel.cleanup()

    def get_samples(self, num_samples: Optional[int] = None, group_by_chain: bool = False) -> Dict[str, torch.Tensor]:
        """Pyro's :meth:`~pyro.infer.MCMC.get_samples`; after an interrupted run, the draws so far (with a warning)."""
        self._check_draws("get_samples")
        return super().get_samples(num_samples, group_by_chain)

    def summary(self, prob: float = 0.9) -> None:
        """Pyro's summary table (mean, sd, median, interval, ``n_eff``, ``r_hat``), in linear memory."""
        self._check_draws("summary")
        if self.partial is not None:
            print(f"PARTIAL RUN: {self.partial.describe()}")
        with _linear_memory_cummin():
            return super().summary(prob)

    def diagnostics(self) -> dict:
        """Pyro's diagnostics (``n_eff``, ``r_hat``, divergences per chain), in linear memory."""
        self._check_draws("diagnostics")
        with _linear_memory_cummin():
            return super().diagnostics()

    def _check_draws(self, reader: str) -> None:
        """Raise :class:`RunNotFinished` when there are no draws; warn when they are a partial run's."""
        partial = getattr(self, "partial", None)
        if getattr(self, "_samples", None) is None:
            if partial is not None:
                raise RunNotFinished(f"{reader}(): no draws to read: {partial.describe()}")
            raise RunNotFinished(f"{reader}(): no draws to read: call run(...) first")
        if partial is not None:
            warnings.warn(f"{reader}() reads a partial run: {partial.describe()}", PartialRunWarning, stacklevel=3)

    @property
    def total_steps(self) -> int:
        """Steps of a complete run: warmup plus ``num_samples * thinning``."""
        return self.warmup_steps + self._num_kept_steps * self.thinning

    def _keep(self, kernel: SGMCMCKernel, store: DrawStore) -> None:
        """Expose the stored draws (constrained), their statistics and the per-chain diagnostics."""
        potential = kernel.potential
        draws, stats = store.filled()  # views: (chains, draws, dim) and (chains, draws)
        names = self.save_params or potential.site_names
        self.transforms = kernel.transforms if self.transforms is None else self.transforms
        unconstrained = potential.unpack(draws)
        self._samples = {
            name: (self.transforms[name].inv(unconstrained[name]) if name in self.transforms else unconstrained[name])
            for name in names
        }
        self.sample_stats = dict(stats)
        self._diagnostics = [kernel.chain_diagnostics(c) for c in range(self.num_chains)]

    def _stop(self, kernel: SGMCMCKernel, store: Optional[DrawStore], error: BaseException) -> None:
        """Record an interrupted run: the draws so far (if any) and where it stopped."""
        steps_done = self._progress_steps
        self.partial = PartialRun(
            steps_done=steps_done,
            total_steps=self.total_steps,
            num_draws=0 if store is None else store.count,
            num_samples=self.num_samples,
            error=f"{type(error).__name__}: {error}".rstrip(": "),
            checkpoint_path=None if self.checkpoint_path is None else str(self.checkpoint_path),
        )
        # a refused checkpoint may have filled the store with draws it then rejected: they are not kept
        if (
            store is not None
            and store.count
            and kernel.potential is not None
            and not isinstance(error, CheckpointMismatch)
        ):
            self._keep(kernel, store)
        else:
            self._diagnostics = [None] * self.num_chains

    def _run_steps(self, kernel: SGMCMCKernel, store: DrawStore) -> None:
        total = self.total_steps
        checkpoint = None if self.checkpoint_path is None else self._open_checkpoint(kernel, store)
        start = 0 if checkpoint is None else checkpoint.steps_done
        self._progress_steps = start
        progress = _progress(total, self.disable_progbar)
        refresh = max(1, total // 200)  # cheap progress bar: about 200 updates per run
        first_kept = self._num_kept_steps - self.num_samples  # keep_last drops the draws before this one
        for t in range(start, total):
            state = kernel.step()
            self._progress_steps = t + 1
            sampling = t >= self.warmup_steps
            if sampling and (t - self.warmup_steps + 1) % self.thinning == 0:
                if (t - self.warmup_steps + 1) // self.thinning > first_kept:
                    store.append(state.position, kernel.last_stats)
            if self.hook_fn is not None:
                self.hook_fn(kernel, kernel.potential.unpack(state.position), "Sample" if sampling else "Warmup", t)
            if checkpoint is not None and ((t + 1) % self.checkpoint_every == 0 or t == total - 1):
                checkpoint.write(t + 1, "sampling" if t + 1 > self.warmup_steps else "warmup", kernel, store)
            if progress is not None and (t % refresh == 0 or t == total - 1):
                progress.set_description("Sample" if sampling else "Warmup", refresh=False)
                progress.set_postfix(kernel.logging(), refresh=False)
                progress.update(t + 1 - progress.n)
        if progress is not None:
            progress.close()

    def _open_checkpoint(self, kernel: SGMCMCKernel, store: DrawStore) -> "_RunCheckpoint":
        """Resume from the checkpoint (validated) into ``kernel`` and ``store``, or start it afresh."""
        # before any step: a state that cannot be saved and read back safely is an error now, not at the first write
        check_serialisable(kernel.state_dict(), f"{type(kernel).__name__}'s state")
        checkpoint = _RunCheckpoint(self.checkpoint_path, self._fingerprint(kernel), self.checkpoint_sync)
        if self.resume and self.checkpoint_path.exists():
            checkpoint.resume(kernel, store, self)
        else:
            clear_chunks(self.checkpoint_path)
        return checkpoint

    def _fingerprint(self, kernel: SGMCMCKernel) -> dict:
        """The settings a checkpoint must share with the run that resumes it: all that changes the draws."""
        potential = kernel.potential
        return {
            "kernel": type(kernel).__name__,
            "hyperparameters": _hyperparameters(kernel),
            "sites": [(s.name, tuple(s.unconstrained_shape)) for s in potential.sites],
            "plates": [(p.name, p.size, p.subsample_size, p.user_indices) for p in potential.subsample_plates],
            "dtype": str(potential.dtype),
            "data": _data_fingerprint(potential.model_args, potential.model_kwargs),
            "num_data": potential.num_data,
            "num_chains": self.num_chains,
            "num_superchains": self.num_superchains,
            "warmup_steps": self.warmup_steps,
            "num_samples": self._num_kept_steps,
            "thinning": self.thinning,
            "keep_last": self.keep_last,
            "seed": self.seed,
            **({} if self.chain_ids is None else {"chain_ids": self.chain_ids}),
        }


class _RunCheckpoint:
    """A run's checkpoint: the draw chunks written so far and the index that lists them (see checkpoint.py)."""

    def __init__(self, path: Path, fingerprint: dict, sync: bool = True) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.sync = sync
        self.last_chunk: Optional[dict] = None  # the entry of the last chunk written (the hash chain's end)
        self.tables: Dict[str, dict] = {}  # per plate: the file of its permutation table and its epoch
        self.written = 0  # draws already in chunk files
        self.steps_done = 0

    def write(self, steps_done: int, phase: str, kernel: SGMCMCKernel, store: DrawStore) -> None:
        """One chunk with the draws since the last write (O(k)), a new permutation table if an epoch began,
        then the index: written together (their fsyncs concurrent), renamed in that order."""
        pending: list = []
        last_chunk = self.last_chunk
        if store.count > self.written:
            positions, stats = store.filled(self.written)
            last_chunk = write_chunk(self.path, self.written, positions, stats, last_chunk, pending=pending)
        state = self._externalise(kernel.state_dict(), pending)
        payload = {
            "fingerprint": self.fingerprint,
            "steps_done": steps_done,
            "phase": phase,
            "kernel": state,
            "last_chunk": last_chunk,
        }
        save_checkpoint(payload, self.path, pending=pending)
        commit_files(pending, self.sync)
        self.last_chunk, self.written, self.steps_done = last_chunk, store.count, steps_done
        self._forget_replaced_tables()

    def _externalise(self, state: dict, pending: list) -> dict:
        """Move the minibatch permutation tables out of the index: each in its own file, written only when
        its plate has begun a new epoch since the previous write (O(C N) once per epoch, not per write)."""
        minibatches = dict(state["minibatches"])
        epochs = minibatches.get("epochs", {})
        files = {}
        for name, table in minibatches.pop("permutations").items():
            entry = self.tables.get(name)
            if entry is None or entry["epoch"] != epochs.get(name):
                entry = {**write_blob(self.path, table, pending=pending), "epoch": epochs.get(name), "replaces": entry}
                self.tables[name] = entry
            files[name] = {"file": entry["file"], "sha256": entry["sha256"]}
        minibatches["permutation_files"] = files
        return {**state, "minibatches": minibatches}

    def _forget_replaced_tables(self) -> None:
        """Delete the table files the new index no longer names (after it replaced the previous index)."""
        for entry in self.tables.values():
            replaced = entry.pop("replaces", None)
            if replaced is not None and replaced["file"] != entry["file"]:
                (chunk_directory(self.path) / replaced["file"]).unlink(missing_ok=True)

    def _internalise(self, state: Any) -> dict:
        """The kernel's state with its permutation tables read back from their files (verified)."""
        if not isinstance(state, dict) or not isinstance(state.get("minibatches"), dict):
            raise CheckpointMismatch(f"checkpoint {self.path}: the record 'kernel' does not hold a kernel's state")
        minibatches = dict(state["minibatches"])
        files = minibatches.pop("permutation_files", {})
        if not isinstance(files, dict):
            raise CheckpointMismatch(f"checkpoint {self.path}: the record 'kernel/minibatches' is malformed")
        minibatches["permutations"] = {
            name: read_blob(self.path, entry, f"kernel/minibatches/permutation_files/{name}")
            for name, entry in files.items()
        }
        epochs = minibatches.get("epochs", {})
        self.tables = {name: {**entry, "epoch": epochs.get(name)} for name, entry in files.items()}
        return {**state, "minibatches": minibatches}

    def resume(self, kernel: SGMCMCKernel, store: DrawStore, run: "MCMC") -> None:
        """Load, verify and validate the checkpoint into ``kernel`` and ``store``."""
        saved = load_checkpoint(self.path, self.fingerprint)
        steps_done = saved.get("steps_done")
        if isinstance(steps_done, bool) or not isinstance(steps_done, int) or not 0 <= steps_done <= run.total_steps:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: steps_done={steps_done!r} is not a step of this run (0 to {run.total_steps})"
            )
        expected = expected_draws(steps_done, run.warmup_steps, run.thinning, run._num_kept_steps, run.num_samples)
        for entry, positions, stats in read_chunks(self.path, saved.get("last_chunk")):
            self._extend(store, entry, positions, stats)
        if store.count != expected:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: {store.count} draws saved, but a run stopped after {steps_done} steps keeps "
                f"{expected}"
            )
        state = self._internalise(saved.get("kernel"))
        try:
            kernel.load_state_dict(state)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as error:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: the kernel's state cannot be restored ({type(error).__name__}: {error})"
            ) from error
        _validate_state(self.path, kernel, steps_done)
        self.last_chunk, self.written, self.steps_done = saved.get("last_chunk"), store.count, steps_done

    def _extend(self, store: DrawStore, entry: dict, positions: torch.Tensor, stats: Dict[str, torch.Tensor]) -> None:
        """Check one chunk's draws against this run (shapes, dtype, finite) and append them to ``store``."""
        expected = (store.num_chains, entry["stop"] - entry["start"], store.positions.shape[-1])
        if tuple(positions.shape) != expected or positions.dtype != store.positions.dtype:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: draw chunk {entry['file']} holds positions of shape {tuple(positions.shape)} "
                f"({positions.dtype}); this run's are {expected} ({store.positions.dtype})"
            )
        if not bool(torch.isfinite(positions).all()):
            raise CheckpointMismatch(f"checkpoint {self.path}: draw chunk {entry['file']} holds non-finite positions")
        try:
            store.extend(
                positions.to(store.positions.device), {k: v.to(store.positions.device) for k, v in stats.items()}
            )
        except (ValueError, RuntimeError) as error:
            raise CheckpointMismatch(f"checkpoint {self.path}: draw chunk {entry['file']}: {error}") from error


def _validate_state(path: Path, kernel: SGMCMCKernel, steps_done: int) -> None:
    """The restored chains: at the saved step, finite, of the model's shapes."""
    state = kernel.state
    if state.step != steps_done:
        raise CheckpointMismatch(f"checkpoint {path}: the kernel's state is at step {state.step}, not {steps_done}")
    for name in ("position", "momentum", "potential", "grad", "thermostat"):
        value = getattr(state, name)
        if value is not None and not bool(torch.isfinite(value).all()):
            raise CheckpointMismatch(f"checkpoint {path}: the chains' saved {name} is not finite")


def _hyperparameters(kernel: SGMCMCKernel) -> Dict[str, str]:
    """The kernel's public settings that change the draws, as stable strings (no memory addresses)."""
    out = {}
    for key, value in vars(kernel).items():
        if key.startswith("_") or key in ("model", "init_strategy", "potential", "transforms", "state"):
            continue  # the model and its data are fingerprinted apart; the start point is overwritten on resume
        if value is None or isinstance(value, (bool, int, float, str)) or key == "step_size":
            out[key] = repr(value)
    return out


def _data_fingerprint(args: tuple, kwargs: dict) -> list:
    """Per model argument: a tensor's dtype, shape and SHA-256 (one pass, once per checkpointed run); else its type."""
    import hashlib

    out = []
    for key, value in [(str(i), v) for i, v in enumerate(args)] + sorted(kwargs.items()):
        if torch.is_tensor(value):
            tensor = value.detach().cpu().contiguous()
            digest = (
                hashlib.sha256(tensor.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                if tensor.numel()
                else ""
            )
            out.append((key, str(tensor.dtype), tuple(tensor.shape), digest))
        elif value is None or isinstance(value, (bool, int, float, str)):
            out.append((key, repr(value)))
        else:
            out.append((key, type(value).__name__))
    return out


@contextmanager
def _linear_memory_cummin():
    """Let Pyro's effective sample size take its running minimum with :func:`torch.cummin`.

    Pyro's ``effective_sample_size`` builds an ``(n, n)`` mask for the running minimum of the
    autocorrelation pairs (``pyro.ops.stats._cummin``): 32 GB at 90,000 draws, far beyond the
    length of an SG-MCMC run. ``torch.cummin`` gives the same values in ``O(n)`` memory.
    """
    original = pyro.ops.stats._cummin
    pyro.ops.stats._cummin = lambda values: torch.cummin(values, dim=0).values
    try:
        yield
    finally:
        pyro.ops.stats._cummin = original


def _progress(total: int, disable: bool):
    if disable:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Warmup", dynamic_ncols=True)


def _check_positive_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")


def _check_non_negative_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
