"""Gradient estimators: the potential and its gradient at the chains' positions for one step.

A kernel never evaluates the model itself: it asks its estimator for

.. math:: \\big(\\hat U(z_c),\\ \\nabla \\hat U(z_c)\\big)_{c = 1..C}

at the ``(C, D)`` positions, given the step's minibatch ``indices`` (``{plate name: (C, B) indices}``, each
chain its own rows, drawn by :class:`~pyro_sgmcmc.chains.minibatch.MinibatchSampler` from the chain's stream).
Every estimator is unbiased for the full-data :math:`U = -\\log \\pi`; they differ in their variance and cost:

* :class:`MinibatchGradient`: the plain minibatch estimate (each subsampled plate scales its log-likelihood by
  :math:`N / B`), one model evaluation per chain and step;
* :class:`~pyro_sgmcmc.kernels.control_variates.ControlVariate`: centred at a fixed point
  :math:`\\hat z` with known full-data values, :math:`\\nabla U(\\hat z) + \\nabla \\hat U_S(z) - \\nabla \\hat
  U_S(\\hat z)`, two evaluations per chain and step;
* a data-parallel estimate (each rank its shard's minibatch, averaged by an all-reduce) fits the same protocol:
  ``pyro_sgmcmc.distributed``'s potential already has ``batched_potential_and_grad(positions, indices)``, so
  wrapping it in :class:`MinibatchGradient` (or giving it a ``potential_and_grad`` method) makes it one.

To add an estimator, write a class with ``potential_and_grad(positions, indices)`` and the attribute
``potential`` (the :class:`~pyro_sgmcmc.ModelPotential` whose layout the positions follow).
"""

from __future__ import annotations

from typing import Mapping, Protocol, Tuple, runtime_checkable

import torch

__all__ = ["GradientEstimator", "MinibatchGradient"]


@runtime_checkable
class GradientEstimator(Protocol):
    """What a kernel needs from a gradient estimator (see the module docstring)."""

    def potential_and_grad(
        self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Estimates ``(U, dU/dz)`` of shapes ``(C,)`` and ``(C, D)`` at the ``(C, D)`` positions."""
        ...  # pragma: no cover - protocol


class MinibatchGradient:
    """The plain minibatch estimate of :math:`(U, \\nabla U)`: the model on each chain's own minibatch.

    Parameters
    ----------
    potential : ModelPotential
        Anything with ``batched_potential_and_grad(positions, indices)`` (a data-parallel potential too).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import ModelPotential
    >>> from pyro_sgmcmc.kernels.gradients import MinibatchGradient
    >>> def model():
    ...     pyro.sample("z", dist.Normal(0., 1.))
    >>> estimator = MinibatchGradient(ModelPotential(model))
    >>> u, g = estimator.potential_and_grad(torch.tensor([[1.0], [2.0]]), {})
    >>> g.squeeze(-1)
    tensor([1., 2.])
    """

    def __init__(self, potential) -> None:
        self.potential = potential
        self.potential_and_grad = potential.batched_potential_and_grad
