"""Chains across ranks: :class:`DistributedMCMC` runs each rank's block of chains and gathers them on rank 0."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from ..mcmc import MCMC
from ..run.checkpoint_settings import accepts_deprecated_checkpoint_keywords, as_checkpoint_settings
from ..run.checks import check_chains
from ..run.starts import model_potential, starting_points
from .process import rank_and_size, rank_chain_ids

__all__ = ["DistributedMCMC"]

#: The keyword arguments of :class:`pyro_sgmcmc.MCMC` that a distributed run takes as they are.
_OPTIONS = {
    "hook_fn", "disable_progbar", "disable_validation", "transforms", "save_params", "thinning", "keep_last", "seed",
    "checkpoint",
}  # fmt: skip


class DistributedMCMC(MCMC):
    """:class:`pyro_sgmcmc.MCMC` (vectorised chains) with the chains spread over the ranks.

    Rank ``r`` runs the global chains :func:`rank_chain_ids` ``(num_chains, P, r)`` vectorised; chain
    ``c`` uses the stream of ``(seed, c)`` whichever rank runs it. The ``num_superchains`` starting
    points (or the given ``initial_params``) are drawn on rank 0 exactly as a one-process run draws
    them and broadcast, so a superchain may straddle two ranks. After :meth:`run`:

    * on rank 0, ``get_samples``, ``sample_stats``, ``diagnostics``, ``superchain_ids`` and
      :func:`~pyro_sgmcmc.to_inference_data` cover all ``num_chains`` chains in global order;
    * on the other ranks they cover the rank's own chains (``chain_ids`` says which).

    Parameters
    ----------
    kernel, num_samples, warmup_steps, initial_params, num_chains, hook_fn, disable_progbar, \
disable_validation, transforms, save_params, num_superchains, thinning, keep_last, seed, checkpoint :
        As for :class:`pyro_sgmcmc.MCMC` (``chain_method`` is always ``"vectorized"``; the
        arguments after ``num_chains`` are keyword-only), with
        ``num_chains`` and ``num_superchains`` counting the chains of *all* ranks.
        ``seed`` defaults to one drawn on rank 0 and broadcast. ``hook_fn`` sees the rank's own
        chains. The checkpoint's path gets a ``.rank<r>`` suffix per rank. The previous
        release's ``checkpoint_path``, ``checkpoint_every``, ``resume`` and ``checkpoint_sync`` still
        work in this release, with a :class:`FutureWarning`.
    group : ProcessGroup, optional
        The process group (default: the default group).
    """

    @accepts_deprecated_checkpoint_keywords
    def __init__(self, kernel, num_samples: int, warmup_steps: Optional[int] = None,
                 initial_params: Optional[Dict[str, torch.Tensor]] = None, num_chains: int = 1, *,
                 num_superchains: Optional[int] = None, group=None, **options: Any) -> None:  # fmt: skip
        refused = sorted(set(options) & {"chain_method", "chain_ids", "mp_context"})
        if refused or not set(options) <= _OPTIONS:
            unknown = sorted(set(options) - _OPTIONS - set(refused))
            raise TypeError(
                f"DistributedMCMC() got unexpected keyword argument(s) {refused + unknown}: the chains are vectorised "
                "and split over the ranks by DistributedMCMC itself"
            )
        rank, world_size = rank_and_size(group)
        check_chains(num_chains, num_superchains)
        ids = rank_chain_ids(num_chains, world_size, rank)
        checkpoint = as_checkpoint_settings(options.get("checkpoint"))
        if checkpoint is not None:
            ranked = Path(f"{os.fspath(checkpoint.path)}.rank{rank}")
            options["checkpoint"] = dataclasses.replace(checkpoint, path=ranked)
        options["disable_progbar"] = options.get("disable_progbar", False) or rank != 0
        super().__init__(
            kernel, num_samples, warmup_steps, None, len(ids), chain_method="vectorized", chain_ids=list(ids), **options
        )
        self.group = group
        self.rank, self.world_size = rank, world_size
        self.global_num_chains = num_chains
        self.global_num_superchains = num_chains if num_superchains is None else num_superchains
        self.global_initial_params = initial_params
        self._local_chain_ids = list(ids)

    def run(self, *args, **kwargs) -> None:
        """Run this rank's chains; rank 0 gathers every rank's draws (a collective: call it on every rank)."""
        kernel = self.kernel
        ids = self._local_chain_ids
        self.num_chains, self.chain_ids = len(ids), list(ids)
        if self.seed is None:  # one seed for all ranks, drawn where a one-process run would draw it
            seed = torch.tensor([int(torch.randint(0, 2**62, ())) if self.rank == 0 else 0])
            dist.broadcast(seed, src=0, group=self.group)
            self.seed = int(seed)
        # Global starting points, drawn on rank 0 exactly as MCMC.run draws them (same model trace,
        # same calls to the init strategy), then broadcast.
        potential = model_potential(kernel, args, kwargs)
        positions = torch.zeros(self.global_num_chains, potential.dim, dtype=potential.dtype, device=potential.device)
        if self.rank == 0:
            positions = starting_points(
                kernel, self.global_initial_params, self.global_num_chains, self.global_num_superchains, self.seed
            )
        dist.broadcast(positions, src=0, group=self.group)
        self.initial_params = potential.unpack(positions[ids[0] : ids[-1] + 1])
        super().run(*args, **kwargs)
        global_superchains = torch.arange(self.global_num_chains) // (
            self.global_num_chains // self.global_num_superchains
        )
        self.superchain_ids = global_superchains[ids[0] : ids[-1] + 1]
        self._gather()
        if self.rank == 0:
            self.superchain_ids = global_superchains

    def _gather(self) -> None:
        """Rank 0 receives every rank's draws, statistics and diagnostics and concatenates them by chain."""
        draws = self.draws
        payload = {
            "chain_ids": self.chain_ids,
            "samples": {k: v.detach().cpu() for k, v in draws.samples.items()},
            "stats": {k: v.detach().cpu() for k, v in self.sample_stats.items()},
            "diagnostics": draws.chain_diagnostics,
        }
        received: Optional[List[Any]] = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(payload, received, dst=0, group=self.group)
        if self.rank != 0:
            return
        received.sort(key=lambda part: part["chain_ids"][0])
        device = self.kernel.state.position.device
        samples = {k: torch.cat([p["samples"][k] for p in received]).to(device) for k in draws.samples}
        diagnostics = [d for p in received for d in p["diagnostics"]]
        self.draws = dataclasses.replace(draws, samples=samples, chain_diagnostics=diagnostics)
        self.sample_stats = {k: torch.cat([p["stats"][k] for p in received]).to(device) for k in self.sample_stats}
        self.chain_ids = [c for p in received for c in p["chain_ids"]]
        self.num_chains = len(self.chain_ids)
