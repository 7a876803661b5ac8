"""The starting points of a run's chains, drawn as one vectorised run of all of them draws them.

A sequential run and a run spread over processes (:class:`pyro_sgmcmc.distributed.DistributedMCMC`)
draw every chain's starting point here, once, in the order a one-process vectorised run draws them
(the model's trace, then the run's seed, then the ``num_superchains`` points from the kernel's
``init_strategy``), and give chain ``c`` its row: so chain ``c`` starts where it starts in the
vectorised run, whatever runs beside it.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

__all__ = ["model_potential", "starting_points"]


def model_potential(kernel, args: tuple, kwargs: dict):
    """The kernel's potential of ``model(*args, **kwargs)`` (traced once per data set)."""
    detached = tuple(arg.detach() if torch.is_tensor(arg) else arg for arg in args)
    return kernel.ensure_potential(detached, kwargs)


def starting_points(
    kernel,
    initial_params: Optional[Dict[str, torch.Tensor]],
    num_chains: int,
    num_superchains: int,
    seed: Optional[int],
) -> torch.Tensor:
    """``(num_chains, dim)`` unconstrained starting points: given ones, or drawn by the init strategy, superchain
    ``s`` from a generator seeded by ``(seed, s)`` when ``seed`` is given (as the vectorised run draws them)."""
    return kernel.initial_positions(initial_params, num_chains, num_superchains, seed=seed)
