"""``pyro_sgmcmc.MCMC``: :class:`pyro.infer.MCMC`'s interface plus vectorised and sequential chains for SG-MCMC.

Pyro runs ``num_chains > 1`` as one process per chain (or one after the other when there are
fewer cores than chains). Stochastic-gradient methods want many short chains, so this class
adds NumPyro's ``chain_method="vectorized"``: all chains advance together in batched tensor
operations (the model runs once per step under :func:`torch.func.vmap`), each with its own noise
and its own minibatches; and ``"sequential"``: the same chains one after another. With
``chain_method="parallel"`` it runs a :class:`pyro.infer.MCMC` it holds (:attr:`MCMC.pyro_mcmc`).

Whatever the chain method, the run's draws end in one :class:`~pyro_sgmcmc.run.readers.Draws` value
(:attr:`MCMC.draws`), which answers ``get_samples``, ``summary`` and ``diagnostics`` as Pyro does,
with ``n_eff`` in memory linear in the draws (:mod:`pyro_sgmcmc.diagnostics.summary`);
``arviz.from_pyro`` reads it as it reads a :class:`pyro.infer.MCMC`. The class writes no member of
Pyro's: it is not a subclass, and it reads the :class:`pyro.infer.MCMC` it holds through that
class's public methods (and one documented read in :mod:`pyro_sgmcmc._compat`).

The run itself lives in :mod:`pyro_sgmcmc.run` (the loop, its checkpoint, partial runs); this
module checks the settings and keeps the result.
"""

from __future__ import annotations

import numbers
import os
import warnings
from typing import Callable, Dict, Optional, Sequence, Union

import pyro
import pyro.infer
import pyro.poutine as poutine
import torch
from pyro.util import optional

from ._compat import observe_pyro_sampler, pyro_chain_diagnostics
from .kernels.base import SGMCMCKernel
from .run import ChainRun, Chains, RunLength, RunResult
from .run.checkpoint_settings import (
    CheckpointSettings,
    accepts_deprecated_checkpoint_keywords,
    as_checkpoint_settings,
    deprecated_checkpoint_attribute,
)
from .run.checks import (
    check_chain_ids,
    check_chains,
    check_non_negative_int,
    check_positive_int,
)
from .run.partial import PartialRun, PartialRunWarning, RunNotFinished
from .run.pyro_chains import SampleRecorder, SampleStream, pyro_transforms, sampling_stage, stopped_parallel_run
from .run.readers import Draws
from .run.sequential import SequentialRun

__all__ = ["MCMC", "CheckpointSettings", "PartialRun", "PartialRunWarning", "RunNotFinished"]

CHAIN_METHODS = ("parallel", "sequential", "vectorized")
_OWN_OPTIONS = "num_superchains, thinning, keep_last, seed, checkpoint and chain_ids"


class MCMC:
    """Drop-in :class:`pyro.infer.MCMC` with vectorised chains, superchains, thinning and last-state runs.

    The same constructor, ``run``, ``get_samples``, ``summary`` and ``diagnostics`` as
    :class:`pyro.infer.MCMC`, and the same attributes (``kernel``, ``num_samples``, ``warmup_steps``,
    ``num_chains``, ``transforms``, ...); it holds a :class:`pyro.infer.MCMC` rather than being one.

    Parameters
    ----------
    kernel, num_samples, warmup_steps, initial_params, num_chains, hook_fn, mp_context, disable_progbar, \
disable_validation, transforms, save_params :
        As for :class:`pyro.infer.MCMC`. With ``chain_method="vectorized"`` or ``"sequential"``,
        ``initial_params`` (unconstrained) has a leading axis of ``num_chains`` or
        ``num_superchains``, and ``mp_context`` is unused. ``hook_fn(kernel, params, stage, i)`` is
        called after every step as Pyro calls it: ``stage`` is ``"Warmup"`` or ``"Sample"``
        (``"Warmup [c]"``, ``"Sample [c]"`` for chain ``c`` of a sequential run) and ``i`` the index
        of the step *within its stage* (``0 .. warmup_steps - 1``, then ``0 .. num_samples *
        thinning - 1``); with ``"vectorized"`` the params are batched, one row per chain
        (``kernel.state.step`` is the step's index in the whole run, plus one).
    chain_method : {"parallel", "sequential", "vectorized"}
        NumPyro's names. ``"parallel"`` (the default) is :class:`pyro.infer.MCMC`'s own behaviour,
        for every kernel: one process per chain when the machine has a core for each, else one
        chain after another. ``"vectorized"`` (SG-MCMC kernels only) runs all chains in one process
        as one batched computation. ``"sequential"`` (SG-MCMC kernels only) runs the chains one
        after another in this process, each as a one-chain vectorised run: chain ``c`` has the
        starting point, noise and minibatches it has in a ``"vectorized"`` run with the same
        ``seed`` (so the same draws, up to the rounding of batched arithmetic), at the memory of
        one chain; it takes every option of ``"vectorized"`` but ``checkpoint``.
        ``"default"`` is the deprecated spelling of ``"parallel"`` (a :class:`FutureWarning`; it
        goes in the next release).
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
    checkpoint : str, os.PathLike or CheckpointSettings, optional
        Make the run resumable (``chain_method="vectorized"`` only): write its complete state to a
        file, atomically, every ``every`` steps and at the end, and resume from that file when
        :meth:`run` starts and finds it (an interrupted run with the same settings), bit-identically.
        A path ``p`` is short for ``CheckpointSettings(p)``: every 1,000 steps, resume, ``fsync`` each
        write; :class:`CheckpointSettings` explains each field and its other values. The previous release's keywords
        ``checkpoint_path``, ``checkpoint_every``, ``resume`` and ``checkpoint_sync`` still work in this
        release, with a :class:`FutureWarning` (and so do the attributes of those names).
    chain_ids : sequence of int, optional
        Global ids of these chains (chain ``c`` draws from the stream of ``(seed, chain_ids[c])``);
        default ``range(num_chains)``. A slice of a larger run gives exactly that run's draws for
        these chains (:class:`pyro_sgmcmc.distributed.DistributedMCMC` runs one slice per process).

    Attributes
    ----------
    draws : Draws or None
        The last run's draws ``{site: (num_chains, num_draws, ...)}``, the per-chain diagnostics of
        its kernel and the model arguments it ran on (:class:`~pyro_sgmcmc.run.readers.Draws`);
        ``None`` before a run, or after one stopped before its first kept draw.
    pyro_mcmc : pyro.infer.MCMC or None
        With ``chain_method="parallel"``, the :class:`pyro.infer.MCMC` that runs the chains.
    recorder, stream : SampleRecorder, SampleStream or None
        With ``chain_method="parallel"``, the hook and the view of Pyro's sampler that keep the draws of an
        interrupted run (:mod:`pyro_sgmcmc.run.pyro_chains`).
    sample_stats : dict
        Per kept draw, ``(num_chains, num_draws)`` tensors: ``lp``, ``step_size``, ``diverging``,
        ``temperature`` and the kernel's own (``kinetic_energy``, ``thermostat``).
    superchain_ids : Tensor ``(num_chains,)``
        The superchain of each chain (of each kept chain, after a partial run that keeps fewer).
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

    @accepts_deprecated_checkpoint_keywords
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
        chain_method: str = "parallel",
        num_superchains: Optional[int] = None,
        thinning: int = 1,
        keep_last: Optional[int] = None,
        seed: Optional[int] = None,
        checkpoint: Union[str, os.PathLike, CheckpointSettings, None] = None,
        chain_ids: Optional[Sequence[int]] = None,
    ) -> None:
        chain_method = _chain_method(chain_method)
        if warmup_steps is not None:
            check_non_negative_int(warmup_steps, "warmup_steps")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError(f"seed must be None or a non-negative integer; got {seed!r}")
        checkpoint = as_checkpoint_settings(checkpoint)
        check_positive_int(num_samples, "num_samples")
        check_chains(num_chains, num_superchains)
        check_positive_int(thinning, "thinning")
        if keep_last is not None:
            check_positive_int(keep_last, "keep_last")
        self.chain_method = chain_method
        self.num_superchains = num_chains if num_superchains is None else num_superchains
        self.thinning = thinning
        self.keep_last = keep_last
        self.seed = None if seed is None else int(seed)
        self.sample_stats: Dict[str, torch.Tensor] = {}
        self.partial: Optional[PartialRun] = None
        self.draws: Optional[Draws] = None
        self.pyro_mcmc: Optional[pyro.infer.MCMC] = None
        self.recorder: Optional[SampleRecorder] = None
        self.stream: Optional[SampleStream] = None
        self.superchain_ids = torch.arange(num_chains) // (num_chains // self.num_superchains)
        self.checkpoint: Optional[CheckpointSettings] = checkpoint
        self.chain_ids = check_chain_ids(chain_ids, num_chains)
        self.kernel = kernel
        self.num_chains = num_chains
        self.transforms = transforms
        self.warmup_steps = num_samples if warmup_steps is None else warmup_steps
        self.run_length = RunLength(self.warmup_steps, num_samples, thinning, keep_last)
        self.num_samples = self.run_length.num_kept
        self.disable_validation = disable_validation
        self.disable_progbar = disable_progbar
        self.hook_fn = hook_fn
        self.initial_params = initial_params
        self.save_params = save_params
        if chain_method == "parallel":
            own = (num_superchains, keep_last, seed, checkpoint, chain_ids)
            if thinning != 1 or any(value is not None for value in own):
                raise ValueError(
                    f"{_OWN_OPTIONS} need chain_method='vectorized' or 'sequential' "
                    "(Pyro's parallel chains do not support them)"
                )
            self.recorder = SampleRecorder(hook_fn)  # see run.pyro_chains
            self.pyro_mcmc = pyro.infer.MCMC(
                kernel, num_samples, warmup_steps, initial_params, num_chains, self.recorder, mp_context,
                disable_progbar, disable_validation, transforms, save_params,
            )  # fmt: skip
            self.stream = observe_pyro_sampler(
                self.pyro_mcmc, lambda pyros: SampleStream(pyros, num_chains, num_samples)
            )
            return
        if not isinstance(kernel, SGMCMCKernel):
            raise ValueError(
                f"chain_method={chain_method!r} needs a pyro_sgmcmc kernel (SGLD, SGHMC, SGNHT); "
                f"got {type(kernel).__name__}"
            )
        if chain_method == "sequential" and checkpoint is not None:
            raise ValueError("checkpoint needs chain_method='vectorized' (a sequential run is not checkpointed)")

    @poutine.block
    def run(self, *args, **kwargs) -> None:
        """Run the chains on ``model(*args, **kwargs)``; keep the draws in :attr:`draws` (as :class:`pyro.infer.MCMC`).

        If a run stops early (``KeyboardInterrupt`` or any exception, re-raised), the draws kept so
        far stay readable (``"sequential"``: see :mod:`pyro_sgmcmc.run.sequential`; ``"parallel"``:
        :mod:`pyro_sgmcmc.run.pyro_chains`): :meth:`get_samples`,
        :meth:`summary`, :meth:`diagnostics` and :func:`~pyro_sgmcmc.to_inference_data` give them
        with a :class:`PartialRunWarning`, and :attr:`partial` says where the run stopped and how to
        resume it.
        """
        self.draws, self.sample_stats, self.partial = None, {}, None
        self.superchain_ids = torch.arange(self.num_chains) // (self.num_chains // self.num_superchains)
        if self.chain_method == "parallel":
            self._run_pyro(args, kwargs)
            return
        detached = tuple(arg.detach() if torch.is_tensor(arg) else arg for arg in args)
        with optional(pyro.validation_enabled(not self.disable_validation), self.disable_validation is not None):
            if self.chain_method == "vectorized":
                self._run_vectorized(detached, args, kwargs)
            else:
                self._run_sequential(detached, args, kwargs)

    def _run_pyro(self, args: tuple, kwargs: dict) -> None:
        """``chain_method="parallel"``: Pyro's run, read back through its public ``get_samples``."""
        sampler, recorder, stream = self.pyro_mcmc, self.recorder, self.stream
        recorder.start()
        stream.start()
        try:
            sampler.run(*args, **kwargs)
        except BaseException as error:
            stopped = stopped_parallel_run(
                stream,
                recorder,
                error,
                self.warmup_steps,
                lambda: pyro_transforms(self.kernel, self.transforms, args, kwargs),
                self.kernel.diagnostics,
                sampling_stage(self.kernel, self.warmup_steps),
            )
            self.partial = stopped.partial
            if stopped.samples is not None:
                self.draws = Draws(stopped.samples, stopped.diagnostics, args, kwargs)
                self.superchain_ids = self.superchain_ids[: len(stopped.diagnostics)]
            raise
        finally:
            recorder.start()  # the copies are no longer needed
            stream.start()
        samples = sampler.get_samples(group_by_chain=True)
        stage = sampling_stage(self.kernel, self.warmup_steps)
        if stage is not None:  # the sampling stages' draws only, as elsewhere
            samples = {name: value[:, [stage(j) for j in range(self.num_samples)]] for name, value in samples.items()}
        self.draws = Draws(samples, pyro_chain_diagnostics(sampler), args, kwargs)
        self.transforms = sampler.transforms

    def _chain_run(self, chains: Chains, hook_fn: Optional[Callable], checkpoint=None) -> ChainRun:
        return ChainRun(
            self.kernel,
            self.run_length,
            chains,
            hook_fn=hook_fn,
            checkpoint=checkpoint,
            save_params=self.save_params,
            transforms=self.transforms,
            disable_progbar=self.disable_progbar,
        )

    def _chains(self) -> Chains:
        return Chains(self.num_chains, self.num_superchains, self.seed, self.chain_ids, self.initial_params)

    def _run_vectorized(self, args: tuple, given_args: tuple, kwargs: dict) -> None:
        run = self._chain_run(self._chains(), self.hook_fn, self.checkpoint)
        try:
            run.run(args, kwargs)
        finally:
            self._take(run.result, given_args, kwargs)

    def _run_sequential(self, args: tuple, given_args: tuple, kwargs: dict) -> None:
        run = SequentialRun(self.kernel, self._chain_run, self._chains(), self.hook_fn)
        try:
            run.run(args, kwargs)
        finally:
            self._take(run.result, given_args, kwargs)
            self.seed = run.seed

    def _take(self, result: Optional[RunResult], args: tuple, kwargs: dict) -> None:
        """Keep a run's draws, statistics, diagnostics and stop."""
        if result is None:
            return
        self.sample_stats, self.partial = result.sample_stats, result.partial
        if result.samples is not None:
            self.draws = Draws(result.samples, list(result.diagnostics), args, kwargs)
        if result.superchain_ids is not None:
            self.superchain_ids = result.superchain_ids
        if self.transforms is None:
            self.transforms = self.kernel.transforms

    def get_samples(self, num_samples: Optional[int] = None, group_by_chain: bool = False) -> Dict[str, torch.Tensor]:
        """Pyro's :meth:`~pyro.infer.MCMC.get_samples`; after an interrupted run, the draws so far (with a warning).

        ``{site: (num_chains * num_samples, ...)}``, chain after chain, or ``{site: (num_chains,
        num_samples, ...)}`` with ``group_by_chain``; with ``num_samples``, that many draws picked
        uniformly with replacement.
        """
        return self._read("get_samples").get_samples(num_samples, group_by_chain)

    def summary(self, prob: float = 0.9) -> None:
        """Pyro's summary table (mean, sd, median, interval, ``n_eff``, ``r_hat``), in linear memory."""
        draws = self._read("summary")
        if self.partial is not None:
            print(f"PARTIAL RUN: {self.partial.describe()}")
        draws.summary(prob)

    def diagnostics(self) -> dict:
        """Pyro's diagnostics (``n_eff``, ``r_hat``, divergences per chain), in linear memory."""
        return self._read("diagnostics").diagnostics()

    def _read(self, reader: str) -> Draws:
        """The draws; :class:`RunNotFinished` when there are none, a warning when they are a partial run's."""
        partial = self.partial
        if self.draws is None:
            if partial is not None:
                raise RunNotFinished(f"{reader}(): no draws to read: {partial.describe()}")
            raise RunNotFinished(f"{reader}(): no draws to read: call run(...) first")
        if partial is not None:
            warnings.warn(f"{reader}() reads a partial run: {partial.describe()}", PartialRunWarning, stacklevel=3)
        return self.draws

    # arviz.from_pyro reads the model arguments of a pyro.infer.MCMC run under these private names of
    # Pyro's; they are this class's own (read-only) copies, for that reader.
    @property
    def _args(self) -> Optional[tuple]:
        return None if self.draws is None else self.draws.args

    @property
    def _kwargs(self) -> Optional[dict]:
        return None if self.draws is None else self.draws.kwargs

    checkpoint_path = deprecated_checkpoint_attribute("checkpoint_path")
    checkpoint_every = deprecated_checkpoint_attribute("checkpoint_every")
    resume = deprecated_checkpoint_attribute("resume")
    checkpoint_sync = deprecated_checkpoint_attribute("checkpoint_sync")

    @property
    def total_steps(self) -> int:
        """Steps of a complete run: warmup plus ``num_samples * thinning``."""
        return self.run_length.total_steps


def _chain_method(value) -> str:
    if isinstance(value, str) and value == "default":
        warnings.warn(
            "chain_method='default' is deprecated; it is now called chain_method='parallel' (Pyro's own chains)",
            FutureWarning,
            stacklevel=3,
        )
        return "parallel"
    if not isinstance(value, str) or value not in CHAIN_METHODS:
        raise ValueError(f"chain_method must be one of {CHAIN_METHODS}; got {value!r}")
    return value
