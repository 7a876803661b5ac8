"""The per-chain step size: stable along the stiffest preconditioned direction, and capped by the gradient noise.

Each time the metric changes (and at each slow-phase probe) the largest curvature :math:`\\lambda_{max}` of the
preconditioned Hessian :math:`L^\\top H L / N` is estimated at the chain's point by power iteration
(:class:`~pyro_sgmcmc.kernels.curvature_probes.CurvatureProbes`; in the slow phase the running maximum over the
points probed; at least 1 with an adapted metric, where :math:`P = |\\bar H|^{-1}` makes it so), and

.. math:: \\epsilon = c / \\sqrt{\\lambda_{max}} \\ \\text{(second order: SGHMC, SGNHT)}, \\qquad
          \\epsilon = c / \\lambda_{max} \\ \\text{(first order: SGLD)},

with the kernel family's rule (:class:`~pyro_sgmcmc.kernels.adapt.stability.StabilityRule`, its constant
:math:`c` and order). From
the slow phase on, with subsampled data, the step is capped so that the gradient noise inflates the stationary
variance by at most ``NOISE_INFLATION``: the inflation is :math:`\\epsilon N V / (2 \\alpha T)`, so

.. math:: \\epsilon \\le 2 \\alpha T\\, \\mathtt{NOISE\\_INFLATION} / (N V),

with :math:`\\alpha` the kernel's damping and :math:`V` the largest per-coordinate variance of the minibatch drift
in :math:`w` units, averaged over the points probed. A divergence in adaptation halves the chain's step
(:func:`step_size_shrink`) until the next slow-phase probe re-derives it. A chain without a usable curvature keeps
its step (the user's, at first).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from ..curvature_probes import CurvatureProbes
from . import Adaptation
from .stability import StabilityRule

__all__ = [
    "NOISE_INFLATION",
    "StepSizeSettings",
    "StepSizeState",
    "step_size_init",
    "step_size_update",
    "step_size_shrink",
    "step_size_rederive",
    "step_size_final",
    "step_size_adaptation",
]

#: Largest accepted relative inflation of the stationary variance by gradient noise.
NOISE_INFLATION = 0.1


class StepSizeSettings(NamedTuple):
    """What the step-size rule needs, fixed for a run.

    Attributes
    ----------
    adapt : bool
        ``adapt_step_size``: False leaves the state as it is.
    preconditioned : bool
        The metric is adapted (:math:`\\lambda_{max} \\ge 1`).
    full_mass : bool
        The factor :math:`L` is dense ``(C, D, D)``; else diagonal ``(C, D)``.
    rule : StabilityRule
        The kernel family's rule: :math:`\\epsilon` from :math:`\\lambda_{max}`, and the damping :math:`\\alpha` of
        the noise cap (0: no cap).
    temperature : float
        :math:`T`.
    num_data : int
        :math:`N`.
    initial_step_size : float
        The user's step size, kept by a chain without a usable curvature.
    """

    adapt: bool
    preconditioned: bool
    full_mass: bool
    rule: StabilityRule
    temperature: float
    num_data: int
    initial_step_size: float


class StepSizeState(NamedTuple):
    """The step sizes and what they are derived from (all ``None`` before the first derivation).

    Attributes
    ----------
    step_size : Tensor ``(C, 1)`` or None
        One step size per chain.
    halvings, total_halvings : Tensor ``(C,)`` long or None
        Halvings in force (reset at each slow-phase probe), and all the warmup's.
    largest_curvature : Tensor ``(C,)`` or None
        The running maximum of :math:`\\lambda_{max}` over the slow phase's probes.
    noise_sum : Tensor ``(C, D, D)`` or ``(C, D)`` or None
        The summed covariances of the minibatch drift (z units), over ``noise_count`` points.
    """

    step_size: Optional[torch.Tensor]
    halvings: Optional[torch.Tensor]
    total_halvings: Optional[torch.Tensor]
    largest_curvature: Optional[torch.Tensor]
    noise_sum: Optional[torch.Tensor]
    noise_count: int

    def replace(self, **changes) -> "StepSizeState":
        """A copy with the named fields replaced (the others shared, not copied)."""
        return self._replace(**changes)

    def as_dict(self) -> dict:
        """``{field: value}`` in field order."""
        return dict(zip(self._fields, self))


def step_size_init() -> StepSizeState:
    """Nothing derived yet."""
    return StepSizeState(None, None, None, None, None, 0)


def step_size_update(
    settings: StepSizeSettings,
    state: StepSizeState,
    position: torch.Tensor,
    factor: torch.Tensor,
    probes: CurvatureProbes,
    noise_cap: bool = True,
) -> Tuple[StepSizeState, int]:
    """Derive each chain's step size at ``position`` ``(C, D)`` under the metric's ``factor`` (module docstring);
    ``noise_cap``: in the slow phase (running maximum of the curvature, gradient-noise cap). Returns the new state
    and the gradient evaluations (per chain) spent on probes."""
    if not settings.adapt:
        return state, 0
    if state.halvings is None:
        halvings = torch.zeros(position.shape[0], dtype=torch.long, device=position.device)
        state = state.replace(halvings=halvings, total_halvings=halvings.clone())
    lam, evaluations = probes.largest_curvature(position, factor, settings.full_mass)
    usable = torch.isfinite(lam) & (lam > 0)
    if noise_cap:  # slow phase: the step must be stable at every point probed so far, not only this one
        lam = torch.where(usable, lam, torch.zeros_like(lam))
        largest = lam if state.largest_curvature is None else state.largest_curvature.maximum(lam)
        state = state.replace(largest_curvature=largest)
        lam = largest
        usable = lam > 0
    if settings.preconditioned:  # P = |H|^-1 makes the largest preconditioned curvature at least 1: a smaller
        lam = lam.clamp_min(1.0)  # estimate (a flat probe, noise) must not give a huge step
    step_size = settings.rule.stable_step_size(lam)
    damping = settings.rule.damping
    if noise_cap and damping > 0:  # not in the initial buffer: far from the typical set the noise says nothing
        state, largest, spent = _drift_noise(settings, state, position, factor, probes)
        evaluations += spent
        largest = largest.amax(-1)  # (C,): per-step drift variance, w units
        # gradient noise inflates the kinetic (SGLD: the position) temperature by eps N V / (2 alpha T)
        limit = 2.0 * damping * settings.temperature * NOISE_INFLATION / (settings.num_data * largest)
        capped = (largest > 0) & torch.isfinite(largest)
        step_size = torch.where(capped, step_size.minimum(limit), step_size)
    step_size = step_size * 0.5 ** state.halvings.to(step_size.dtype)
    if state.step_size is None:  # a chain without a usable curvature keeps the user's step size
        fallback = torch.full_like(step_size, min(settings.initial_step_size, torch.finfo(step_size.dtype).max))
    else:
        fallback = state.step_size.squeeze(-1)
    step_size = torch.where(usable, step_size, fallback).unsqueeze(-1).to(position.dtype)
    return state.replace(step_size=step_size), evaluations


def _drift_noise(
    settings: StepSizeSettings, state: StepSizeState, position: torch.Tensor, factor: torch.Tensor, probes
) -> Tuple[StepSizeState, torch.Tensor, int]:
    """Per-coordinate variance ``(C, D)`` of the minibatch drift in w units, averaged over every point of the chain
    measured so far (kept in z units, so that it survives changes of the metric): :math:`\\mathrm{diag}(L^\\top V
    L)`."""
    measured, evaluations = probes.drift_noise_covariance(position)
    noise_sum = measured if state.noise_sum is None else state.noise_sum + measured
    state = state.replace(noise_sum=noise_sum, noise_count=state.noise_count + 1)
    mean = noise_sum / state.noise_count
    if mean.dim() == 3:  # diag(L' V L)
        if settings.full_mass:
            return state, torch.einsum("cji,cjk,cki->ci", factor, mean, factor), evaluations
        return state, factor * factor * mean.diagonal(dim1=-2, dim2=-1), evaluations
    if settings.full_mass:
        return state, torch.einsum("cji,cj->ci", factor * factor, mean), evaluations
    return state, factor * factor * mean, evaluations


def step_size_shrink(state: StepSizeState, diverging: torch.Tensor) -> StepSizeState:
    """Halve the step size of the chains ``diverging`` ``(C,)`` (bool) until the next derivation."""
    step_size = state.step_size
    if step_size is not None:
        step_size = torch.where(diverging.unsqueeze(-1), 0.5 * step_size, step_size)
    return state.replace(
        step_size=step_size,
        halvings=state.halvings + diverging.long(),
        total_halvings=state.total_halvings + diverging.long(),
    )


def step_size_rederive(state: StepSizeState) -> StepSizeState:
    """Forget the halvings in force: the next derivation starts afresh (divergences halve it again)."""
    if state.halvings is None:
        return state
    return state.replace(halvings=torch.zeros_like(state.halvings))


def step_size_final(state: StepSizeState) -> Optional[torch.Tensor]:
    """The adapted step sizes, ``(C, 1)`` (``None`` if none was derived)."""
    return state.step_size


#: The step-size adaptation as ``(init, update, final)``.
step_size_adaptation = Adaptation(step_size_init, step_size_update, step_size_final)
