r"""The run loop of vectorised chains: set up, step, keep the draws, checkpoint, report progress.

One :class:`ChainRun` advances ``C`` chains of an SG-MCMC kernel together. At step ``t`` (0-based)
it calls ``kernel.step()``, stores the draw if :meth:`RunLength.keeps` ``(t)``, calls
``hook_fn(kernel, params, stage, i)`` as :class:`pyro.infer.MCMC` does (``stage`` is ``"Warmup"``
or ``"Sample"``, ``i`` the index of the step within its stage: ``t`` in warmup, ``t - W`` after),
writes a checkpoint every ``checkpoint_every`` steps and at the end, and updates the progress bar
about 200 times a run. Its :attr:`~ChainRun.result` holds the draws (constrained), their
statistics and the per-chain diagnostics, after a complete run or, with :class:`PartialRun`, after
an interrupted one.

Resuming. The run traces the model (:meth:`~SGMCMCKernel.prepare_chains`: the potential and the fingerprint need
it), then reads and checks the checkpoint, so that one of other settings is refused before the set-up; a matching
one restores the chains (:meth:`~SGMCMCKernel.restore_chains`) in place of the set-up's work
(:meth:`~SGMCMCKernel.start_chains`: drawing the starting points, a control variate's MAP search and full-data
pass, the first evaluation), whose results the checkpoint holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import torch

from ..checkpoint import CheckpointMismatch
from ..draws import DrawStore
from ..kernels.base import SGMCMCKernel
from .checkpoint import RunCheckpoint, open_checkpoint
from .checkpoint_settings import CheckpointSettings
from .fingerprint import fingerprint
from .length import RunLength
from .partial import PartialRun
from .restore_checks import RunLayout

__all__ = ["ChainRun", "Chains", "CheckpointSettings", "RunResult"]


@dataclass(frozen=True)
class Chains:
    """Which chains a run advances and from where: the keywords of :meth:`SGMCMCKernel.setup_chains`."""

    num_chains: int
    num_superchains: int
    seed: Optional[int] = None
    chain_ids: Optional[Sequence[int]] = None
    initial_params: Optional[Dict[str, torch.Tensor]] = None


class RunResult(NamedTuple):
    """What a run leaves: draws ``{site: (C, S, ...)}`` (``None`` if none), statistics, diagnostics, stop."""

    samples: Optional[Dict[str, torch.Tensor]]
    sample_stats: Dict[str, torch.Tensor]
    diagnostics: List[Optional[dict]]
    superchain_ids: Optional[torch.Tensor]
    partial: Optional[PartialRun]


class ChainRun:
    """One run of ``num_chains`` vectorised chains of ``kernel`` (see the module docstring).

    Parameters
    ----------
    kernel : SGMCMCKernel
        The kernel (set up by :meth:`run`).
    length : RunLength
        Warmup, draws, thinning, ``keep_last``.
    chains : Chains
        The chains, their seed, global ids and starting points.
    hook_fn : callable, optional
        ``hook_fn(kernel, params, stage, i)``, called after every step with the unconstrained params.
    checkpoint : CheckpointSettings, optional
        Write (and resume from) a checkpoint.
    save_params, transforms :
        The sites to keep (default all) and the transforms back to their support (default the kernel's).
    disable_progbar : bool
        No progress bar.
    """

    def __init__(
        self,
        kernel: SGMCMCKernel,
        length: RunLength,
        chains: Chains,
        *,
        hook_fn: Optional[Callable] = None,
        checkpoint: Optional[CheckpointSettings] = None,
        save_params: Optional[Sequence[str]] = None,
        transforms: Optional[dict] = None,
        disable_progbar: bool = False,
    ) -> None:
        self.kernel, self.length, self.chains = kernel, length, chains
        self.hook_fn, self.checkpoint, self.disable_progbar = hook_fn, checkpoint, disable_progbar
        self.save_params, self.transforms = save_params, transforms  # the sites kept, and back to their support
        self.steps_done, self.phase = 0, "set-up"  # where the run is: steps completed, and the stage of the next
        self.writer: Optional[RunCheckpoint] = None  # the run's checkpoint, once opened
        self.result = RunResult(None, {}, [None] * chains.num_chains, None, None)

    def run(self, args: tuple, kwargs: dict) -> RunResult:
        """Set up the chains on ``model(*args, **kwargs)`` and run them; the result also stays in :attr:`result`.

        An exception (``KeyboardInterrupt`` included) is re-raised after :attr:`result` has recorded
        the draws kept so far and where the run stopped.
        """
        kernel, store, checkpoint = self.kernel, None, None
        try:
            chains, length = self.chains, self.length
            layout = {k: v for k, v in vars(chains).items() if k != "initial_params"}
            kernel.prepare_chains(length.warmup_steps, args, kwargs, **layout)  # traces the model
            # locked for this run until its end, its directory probed; one to resume is read and checked now
            checkpoint = self.writer = self._open_checkpoint()
            if checkpoint is not None and checkpoint.resuming:  # restores all the set-up would do: skipped
                self.phase = "restore"
                potential = kernel.potential
                store = DrawStore(chains.num_chains, length.num_kept, potential.dim, potential.dtype, potential.device)
                checkpoint.restore(kernel, store, length, self._layout())
            else:
                kernel.start_chains(chains.initial_params)
                position = kernel.state.position
                store = DrawStore(
                    chains.num_chains, length.num_kept, position.shape[-1], position.dtype, position.device
                )
                if checkpoint is not None:
                    checkpoint.start(kernel)
            self._steps(store, checkpoint)
        except BaseException as error:
            self._stop(store, error)
            raise
        finally:
            if checkpoint is not None:
                checkpoint.close()  # the path's lock, released however the run ends
        self.result = self._keep(store, None)
        kernel.cleanup()
        return self.result

    def _steps(self, store: DrawStore, checkpoint: Optional[RunCheckpoint]) -> None:
        kernel, length = self.kernel, self.length
        total, warmup = length.total_steps, length.warmup_steps
        start = 0 if checkpoint is None else checkpoint.steps_done
        self.steps_done = start
        self.phase = "sampling" if start >= warmup else "warmup"  # the chains are set up: their draws can be read
        progress = _progress(total, self.disable_progbar)
        refresh = max(1, total // 200)  # cheap progress bar: about 200 updates per run
        for t in range(start, total):
            sampling = t >= warmup
            self.phase = "sampling" if sampling else "warmup"
            state = kernel.step()
            self.steps_done = t + 1
            if length.keeps(t):
                store.append(state.position, kernel.last_stats)
            if self.hook_fn is not None:
                params = kernel.potential.unpack(state.position)
                self.hook_fn(kernel, params, "Sample" if sampling else "Warmup", t - warmup if sampling else t)
            if checkpoint is not None and ((t + 1) % self.checkpoint.every == 0 or t == total - 1):
                checkpoint.write(t + 1, "sampling" if t + 1 > warmup else "warmup", kernel, store)
            if progress is not None and (t % refresh == 0 or t == total - 1):
                progress.set_description("Sample" if sampling else "Warmup", refresh=False)
                progress.set_postfix(kernel.logging(), refresh=False)
                progress.update(t + 1 - progress.n)
        if progress is not None:
            progress.close()

    def _open_checkpoint(self) -> Optional[RunCheckpoint]:
        """The run's checkpoint (``None`` without one); a matching one to resume is loaded (module docstring)."""
        if self.checkpoint is None:
            return None
        chains = self.chains
        settings = fingerprint(
            self.kernel,
            self.length,
            num_chains=chains.num_chains,
            num_superchains=chains.num_superchains,
            seed=chains.seed,
            chain_ids=chains.chain_ids,
            initial_params=chains.initial_params,
        )
        checkpoint = self.checkpoint
        return open_checkpoint(
            checkpoint.path, settings, self.length, resume=checkpoint.resume, sync=checkpoint.sync, key=checkpoint.key
        )

    def _layout(self) -> RunLayout:
        """What a restored state is checked against (:mod:`~pyro_sgmcmc.run.restore_checks`): this run's chains,
        model and length."""
        kernel, length = self.kernel, self.length
        potential = kernel.potential
        return RunLayout(
            num_chains=self.chains.num_chains,
            dim=potential.dim,
            dtype=potential.dtype,
            plates={plate.name: plate.size for plate in kernel.minibatches.plates},
            warmup_steps=length.warmup_steps,
            total_steps=length.total_steps,
            seed=self.chains.seed,
            chain_ids=list(kernel.generators.chain_ids),
        )

    def _resumable_checkpoint(self, error: BaseException) -> Optional[str]:
        """The path of a checkpoint of this run that ``run()`` can resume after ``error`` (``None``: none)."""
        writer = self.writer
        if writer is None or writer.on_disk is None or isinstance(error, CheckpointMismatch):
            return None
        return str(writer.path)

    def _keep(self, store: DrawStore, partial: Optional[PartialRun]) -> RunResult:
        """The stored draws (constrained), their statistics and the per-chain diagnostics."""
        kernel = self.kernel
        potential = kernel.potential
        draws, stats = store.filled()  # views: (chains, draws, dim) and (chains, draws)
        if "sampling_stage" in stats:  # a cyclical schedule: only the sampling stages' draws (a function of t)
            keep = stats["sampling_stage"][0]
            draws, stats = draws[:, keep], {key: value[:, keep] for key, value in stats.items()}
        transforms = kernel.transforms if self.transforms is None else self.transforms
        unconstrained = potential.unpack(draws)
        samples = {
            name: (transforms[name].inv(unconstrained[name]) if name in transforms else unconstrained[name])
            for name in (self.save_params or potential.site_names)
        }
        diagnostics = [kernel.chain_diagnostics(c) for c in range(self.chains.num_chains)]
        return RunResult(samples, dict(stats), diagnostics, kernel.superchain_ids.clone(), partial)

    def _stop(self, store: Optional[DrawStore], error: BaseException) -> None:
        """Record an interrupted run: the draws so far (if any) and where it stopped."""
        # before the chains were set up or restored (set-up, restore) no draw in memory is the run's
        stepping = self.phase in ("warmup", "sampling") and store is not None
        writer = self.writer
        restoring = self.phase == "restore" and writer is not None and writer.on_disk is not None
        partial = PartialRun(
            steps_done=writer.on_disk if restoring else self.steps_done,
            total_steps=self.length.total_steps,
            num_draws=store.count if stepping else 0,
            num_samples=self.length.num_kept,
            error=f"{type(error).__name__}: {error}".rstrip(": "),
            checkpoint_path=self._resumable_checkpoint(error),
            phase=self.phase,
        )
        # a refused checkpoint may have filled the store with draws it then rejected: they are not kept
        if stepping and store.count and not isinstance(error, CheckpointMismatch):
            self.result = self._keep(store, partial)
        else:
            self.result = RunResult(None, {}, [None] * self.chains.num_chains, None, partial)


def _progress(total: int, disable: bool):
    if disable:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Warmup", dynamic_ncols=True)
