"""A fast MAP fit for :class:`~pyro_sgmcmc.guides.AutoLaplace` on the package's compiled potential.

``SVI(model, AutoLaplace(model), optim, Trace_ELBO())`` runs Pyro's tracing and handlers at every
step. :func:`fit_map` instead minimises the same objective, the unconstrained negative log joint
:math:`U(\\theta) = -\\log p(\\theta) - \\log|\\det J| - \\frac{N}{B}\\sum_{n\\in\\mathcal B}\\log
p(y_n\\mid\\theta)`, with :meth:`~pyro_sgmcmc.ModelPotential.potential_and_grad`, the route the
SG-MCMC kernels take: with ``jit_compile`` the model's Python and Pyro's machinery run once and
later steps replay the recorded tensor operations (the ``jit_compile`` rules of
:class:`~pyro_sgmcmc.ModelPotential` apply). Each step draws a fresh minibatch (without
replacement within the step) for every subsampled plate from its own ``torch.Generator``; the
optimiser is ``torch.optim.Adam``.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..model.potential import ModelPotential
from ._checks import check_positive_int
from .sites import potential_permutation, unconstrained_shapes

__all__ = ["EpochMinibatches", "fit_map", "minibatch_indices"]


def fit_map(guide, *args, num_steps: int, lr: float = 1e-2, seed: int = 0, jit_compile="auto", **kwargs) -> List[float]:
    """Fit the MAP point of ``guide`` (an AutoLaplace) with Adam on the compiled potential.

    See :meth:`pyro_sgmcmc.guides.AutoLaplace.fit_map`. Returns the potential energy at each step
    (minibatch estimates).
    """
    num_steps = check_positive_int(num_steps, "num_steps")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be a positive number; got {lr!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int; got {seed!r}")
    if guide.prototype_trace is None:
        guide(*args, **kwargs)
    potential = ModelPotential(guide.raw_model, args, kwargs, jit_compile=jit_compile)
    names = [name for name, _ in guide.prototype_trace.iter_stochastic_nodes()]
    perm = potential_permutation(names, unconstrained_shapes(guide.prototype_trace), potential)
    start = torch.empty_like(guide.loc.detach())
    start[perm] = guide.loc.detach()
    position = torch.nn.Parameter(start)
    optimizer = torch.optim.Adam([position], lr=lr)
    generator = torch.Generator(device=start.device).manual_seed(seed)
    losses = []
    for _ in range(num_steps):
        indices = minibatch_indices(potential, generator, start.device)
        value, grad = potential.potential_and_grad(position.detach(), indices)
        position.grad = grad
        optimizer.step()
        losses.append(float(value))
    guide.loc.data.copy_(position.detach()[perm])
    return losses


def minibatch_indices(potential, generator: torch.Generator, device) -> Optional[dict]:
    """``{plate: indices}``: a fresh minibatch of each subsampled plate of ``potential`` (without replacement
    within it) from ``generator``; ``None`` when the model picks its own minibatch (user indices)."""
    indices = {}
    for plate in potential.subsample_plates:
        if plate.user_indices:
            return None  # the model picks its own minibatch
        indices[plate.name] = torch.randperm(plate.size, generator=generator, device=device)[: plate.subsample_size]
    return indices


class EpochMinibatches:
    """Minibatches in epochs, as a shuffled ``DataLoader(drop_last=True)`` gives them.

    Each call returns ``{plate: indices}``, the next ``subsample_size`` indices of one random
    permutation of each subsampled plate, so that every example is seen once per epoch; a new
    permutation is drawn when fewer than ``subsample_size`` indices are left (the remainder of an
    epoch is dropped: a plate's minibatch has a fixed size). ``None`` when the model picks its own
    minibatch.
    """

    def __init__(self, potential, generator: torch.Generator, device) -> None:
        self.plates = potential.subsample_plates
        self.generator = generator
        self.device = device
        self.orders = {plate.name: torch.empty(0, dtype=torch.long) for plate in self.plates}

    def __call__(self) -> Optional[dict]:
        indices = {}
        for plate in self.plates:
            if plate.user_indices:
                return None
            order = self.orders[plate.name]
            if len(order) < plate.subsample_size:
                order = torch.randperm(plate.size, generator=self.generator, device=self.device)
            indices[plate.name], self.orders[plate.name] = order[: plate.subsample_size], order[plate.subsample_size :]
        return indices
