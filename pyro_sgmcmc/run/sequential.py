"""``chain_method="sequential"``: the chains of a run one after another, each a one-chain vectorised run.

Chain ``c`` (global id ``chain_ids[c]``) runs alone with the stream of ``(seed, chain_ids[c])`` from
row ``c`` of the starting points a vectorised run of all the chains draws
(:mod:`pyro_sgmcmc.run.starts`), so its noise, minibatches and start are those it has in the
vectorised run, at the memory of one chain. Its hook sees Pyro's stage names with the chain,
``"Warmup [c]"`` and ``"Sample [c]"``. A run stopped in chain ``c`` keeps a ``(chains, draws)``
block: its ``c`` finished chains, complete, if ``c > 0``; else the first chain's draws so far (the
first draws of an uninterrupted run, bit for bit). Its :class:`PartialRun` counts the steps of all
chains and says how many chains it keeps (``num_chains_kept``, ``None`` when all).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from .loop import ChainRun, Chains, RunResult
from .partial import PartialRun
from .starts import model_potential, starting_points

__all__ = ["SequentialRun"]


class SequentialRun:
    """Run the ``chains`` of ``kernel`` one by one; ``make_run(one_chain, hook_fn)`` builds the one-chain
    :class:`~pyro_sgmcmc.run.ChainRun` of each."""

    def __init__(
        self,
        kernel,
        make_run: Callable[[Chains, Optional[Callable]], ChainRun],
        chains: Chains,
        hook_fn: Optional[Callable],
    ) -> None:
        self.kernel = kernel
        self.make_run = make_run
        self.chains = chains
        self.seed = chains.seed
        self.hook_fn = hook_fn
        self.result: Optional[RunResult] = None

    def run(self, args: tuple, kwargs: dict) -> RunResult:
        """Run every chain; :attr:`result` holds their draws (or, if one raised, where the run stopped)."""
        chains = self.chains
        try:
            potential = model_potential(self.kernel, args, kwargs)
            if self.seed is None:  # drawn where a vectorised run draws it: after the trace, before the starting points
                self.seed = int(torch.randint(0, 2**62, ()))
            starts = starting_points(
                self.kernel, chains.initial_params, chains.num_chains, chains.num_superchains, chains.seed
            )
        except BaseException as error:  # stopped in set-up: no draws, and where it stopped
            self.result = RunResult(None, {}, [None] * chains.num_chains, None, self._in_set_up(error))
            raise
        ids = range(chains.num_chains) if chains.chain_ids is None else chains.chain_ids
        results: List[RunResult] = []
        for chain, chain_id in enumerate(ids):
            start = potential.unpack(starts[chain : chain + 1])
            run = self.make_run(Chains(1, 1, self.seed, [chain_id], start), self._hook(chain_id))
            try:
                results.append(run.run(args, kwargs))
            except BaseException:
                self.result = self._stopped(results, run, chain)
                raise
        self.result = _concatenate(results)
        return self.result

    def _stopped(self, finished: List[RunResult], run: ChainRun, chain: int) -> RunResult:
        """What is kept of a run stopped in its chain ``chain``: see the module docstring."""
        chains, total, stopped = self.chains, run.length.total_steps, run.result
        kept = _concatenate(finished) if finished else stopped
        num_kept = len(finished) if finished else 1
        partial = PartialRun(
            steps_done=chain * total + run.steps_done,
            total_steps=chains.num_chains * total,
            num_draws=stopped.partial.num_draws if not finished else stopped.partial.num_samples,
            num_samples=stopped.partial.num_samples,
            error=stopped.partial.error,
            checkpoint_path=None,
            phase=stopped.partial.phase,
            num_chains_kept=None if num_kept == chains.num_chains else num_kept,
        )
        if kept.samples is None:  # stopped before the first chain's first kept draw
            return RunResult(None, {}, [None] * chains.num_chains, None, partial)
        superchains = torch.arange(chains.num_chains) // (chains.num_chains // chains.num_superchains)
        return RunResult(kept.samples, kept.sample_stats, kept.diagnostics, superchains[:num_kept], partial)

    def _in_set_up(self, error: BaseException) -> PartialRun:
        length = self.make_run(self.chains, None).length
        return PartialRun(
            steps_done=0,
            total_steps=self.chains.num_chains * length.total_steps,
            num_draws=0,
            num_samples=length.num_kept,
            error=f"{type(error).__name__}: {error}".rstrip(": "),
            checkpoint_path=None,
            phase="set-up",
        )

    def _hook(self, chain_id: int) -> Optional[Callable]:
        hook_fn = self.hook_fn
        if hook_fn is None or self.chains.num_chains == 1:
            return hook_fn

        def hook(kernel, params, stage, i):
            return hook_fn(kernel, params, f"{stage} [{chain_id}]", i)

        return hook


def _concatenate(results: Sequence[RunResult]) -> RunResult:
    """One result of the chains of several one-chain runs, in their order."""
    if len(results) == 1:
        return results[0]
    samples = {name: torch.cat([r.samples[name] for r in results]) for name in results[0].samples}
    stats = {name: torch.cat([r.sample_stats[name] for r in results]) for name in results[0].sample_stats}
    diagnostics = [d for r in results for d in r.diagnostics]
    return RunResult(samples, stats, diagnostics, None, None)
