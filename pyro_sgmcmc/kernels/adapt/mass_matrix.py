"""The metric (inverse mass matrix) of each chain: the regularised inverse of the curvature averaged over its draws.

The metric is :math:`P = L L^\\top = |\\bar H|^{-1}`, :math:`\\bar H` the normalised Hessian :math:`\\nabla^2 U / N`
probed at the chain's points (:func:`~pyro_sgmcmc.kernels.metric.regularised_factor` makes the factor :math:`L`):
in the initial buffer each probe *replaces* it (:func:`metric_update`), in the slow phase the probes are
*averaged* (:func:`metric_accumulate`) and two more curvature statistics from the chain's own slow-phase draws
(:func:`metric_record`) regularise it: the covariance of the draws (``spread``, :func:`draw_covariance`) and the
curvature the gradients see (``fisher``, :func:`gradient_curvature`),

.. math:: \\bar H_{\\nabla} = \\frac{\\mathrm{Cov}_t[\\hat g] - \\Sigma_{noise}}{N T},

since under the (tempered) posterior :math:`E_\\pi[\\nabla U \\nabla U^\\top] = T\\, E_\\pi[\\nabla^2 U]` (integration
by parts), less the minibatch noise covariance :math:`\\Sigma_{noise}` measured by the step-size adaptation.

Examples
--------
>>> import torch
>>> state = metric_init(torch.zeros(1, 2), preconditioned=True)
>>> state = metric_update(state, torch.tensor([[4.0, 1.0]]) * 10, full_mass=False, num_data=10)
>>> metric_final(state)
tensor([[0.5000, 1.0000]])
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from ..curvature_probes import EXACT_DIAGONAL_MAX_DIM
from ..metric import regularised_factor
from . import Adaptation

__all__ = [
    "MetricState",
    "metric_init",
    "metric_record",
    "metric_accumulate",
    "metric_update",
    "metric_final",
    "draw_covariance",
    "gradient_curvature",
    "mass_matrix_adaptation",
]


class MetricState(NamedTuple):
    """The metric and the slow phase's running sums.

    Attributes
    ----------
    factor : Tensor ``(C, D)`` or ``(C, D, D)`` or None
        :math:`L` (diagonal, or dense with ``full_mass``); the identity without an adapted metric.
    hessian_sum : Tensor or None
        The slow phase's probed Hessians summed, ``count`` of them.
    draw_count : int
        Slow-phase draws summed: ``draw_sum`` ``(C, D)``, ``draw_outer`` (``(C, D, D)``, or the squares ``(C, D)``
        above ``EXACT_DIAGONAL_MAX_DIM``), and the same of the minibatch gradients, ``grad_sum``, ``grad_outer``.
    """

    factor: Optional[torch.Tensor]
    hessian_sum: Optional[torch.Tensor]
    count: int
    draw_count: int
    draw_sum: Optional[torch.Tensor]
    draw_outer: Optional[torch.Tensor]
    grad_sum: Optional[torch.Tensor]
    grad_outer: Optional[torch.Tensor]

    def replace(self, **changes) -> "MetricState":
        """A copy with the named fields replaced (the others shared, not copied)."""
        return self._replace(**changes)

    def as_dict(self) -> dict:
        """``{field: value}`` in field order."""
        return dict(zip(self._fields, self))


def metric_init(position: torch.Tensor, preconditioned: bool) -> MetricState:
    """No metric yet (``preconditioned``), or the identity for good (the step size alone adapts)."""
    return MetricState(None if preconditioned else torch.ones_like(position), None, 0, 0, None, None, None, None)


def metric_record(state: MetricState, position: torch.Tensor, grad: torch.Tensor) -> MetricState:
    """Add a slow-phase draw ``position`` ``(C, D)`` and its minibatch gradient to the running sums."""
    dense = position.shape[-1] <= EXACT_DIAGONAL_MAX_DIM
    outer = torch.einsum("ci,cj->cij", position, position) if dense else position * position
    grad_outer = torch.einsum("ci,cj->cij", grad, grad) if dense else grad * grad
    count = state.draw_count + 1
    if state.draw_sum is None:
        return state.replace(
            draw_count=count, draw_sum=position.clone(), draw_outer=outer, grad_sum=grad.clone(), grad_outer=grad_outer
        )
    return state.replace(
        draw_count=count,
        draw_sum=state.draw_sum + position,
        draw_outer=state.draw_outer + outer,
        grad_sum=state.grad_sum + grad,
        grad_outer=state.grad_outer + grad_outer,
    )


def metric_accumulate(state: MetricState, hessian: torch.Tensor) -> Tuple[MetricState, torch.Tensor]:
    """Add a slow-phase probe's ``hessian``; returns the new state and the mean probed curvature."""
    hessian_sum = hessian if state.hessian_sum is None else state.hessian_sum + hessian
    state = state.replace(hessian_sum=hessian_sum, count=state.count + 1)
    return state, hessian_sum / state.count


def metric_update(
    state: MetricState,
    hessian: torch.Tensor,
    full_mass: bool,
    num_data: int,
    transient: bool = False,
    spread: Optional[torch.Tensor] = None,
    fisher: Optional[torch.Tensor] = None,
) -> MetricState:
    """The regularised factor of :math:`|H / N|^{-1}` (:func:`~pyro_sgmcmc.kernels.metric.regularised_factor`;
    ``transient``: the initial buffer's floor; ``spread``, ``fisher``: the slow phase's caps)."""
    factor = regularised_factor(hessian / num_data, state.factor, full_mass, transient, spread, fisher)
    return state.replace(factor=factor)


def metric_final(state: MetricState) -> Optional[torch.Tensor]:
    """The factor :math:`L` of the adapted metric :math:`P = L L^\\top`."""
    return state.factor


def draw_covariance(state: MetricState, num_data: int, temperature: float) -> Optional[torch.Tensor]:
    """Covariance of the slow-phase draws in normalised units (``N / T`` times), ``(C, D, D)`` or ``(C, D)``."""
    if state.draw_count < 2:
        return None
    mean = state.draw_sum / state.draw_count
    if state.draw_outer.dim() == 3:
        covariance = state.draw_outer / state.draw_count - torch.einsum("ci,cj->cij", mean, mean)
    else:
        covariance = state.draw_outer / state.draw_count - mean * mean
    return covariance * (num_data / temperature)


def gradient_curvature(
    state: MetricState, noise_sum: Optional[torch.Tensor], noise_count: int, num_data: int, temperature: float
) -> Optional[torch.Tensor]:
    """The curvature seen by the gradients (module docstring) over the slow-phase draws, given the summed drift-noise
    covariances ``noise_sum`` of ``noise_count`` points; ``None`` without enough of either. Unlike the Hessian it is
    not zero in a linear tail (``-log tau`` as ``tau -> 0``: gradient 1, curvature 0)."""
    if state.draw_count < 2 or noise_sum is None:
        return None
    noise = noise_sum / noise_count * num_data**2  # Cov of grad U from Cov of grad U / N
    if noise.dim() != state.grad_outer.dim():
        noise = noise.diagonal(dim1=-2, dim2=-1) if noise.dim() == 3 else torch.diag_embed(noise)
    mean = state.grad_sum / state.draw_count
    mean_outer = torch.einsum("ci,cj->cij", mean, mean) if state.grad_outer.dim() == 3 else mean * mean
    return (state.grad_outer / state.draw_count - mean_outer - noise) / (num_data * temperature)


#: The metric adaptation as ``(init, update, final)`` (:func:`metric_record` and :func:`metric_accumulate` feed it).
mass_matrix_adaptation = Adaptation(metric_init, metric_update, metric_final)
