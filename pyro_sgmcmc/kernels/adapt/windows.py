"""Stan's windows: the metric and the step size adapted together, per chain, over the adaptation phase.

The schedule (:func:`~pyro_sgmcmc.kernels.preconditioning.adaptation_schedule`) probes the curvature after steps
``1, 2, 4, ...`` of an initial buffer (15 %), each probe *replacing* the metric (the momentum, in the old metric's
units, is then reset), then ``8`` times over a slow phase (75 %) whose probes are *averaged* and regularised by the
chain's own draws, and not in a terminal buffer (10 %). After each probe the step size is derived afresh under the
new metric (:mod:`.step_size`); a divergence halves it until the next slow-phase probe. With
``adapt_mass_matrix=False`` the metric stays the identity and only the step size adapts. See
:mod:`~pyro_sgmcmc.kernels.preconditioning` for the maths.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from ..curvature_probes import CurvatureProbes
from . import Adaptation
from .mass_matrix import (
    MetricState,
    draw_covariance,
    gradient_curvature,
    metric_accumulate,
    metric_init,
    metric_record,
    metric_update,
)
from .step_size import (
    StepSizeSettings,
    StepSizeState,
    step_size_init,
    step_size_rederive,
    step_size_shrink,
    step_size_update,
)

__all__ = [
    "WindowedSettings",
    "WindowedState",
    "windowed_init",
    "windowed_update",
    "windowed_shrink",
    "windowed_final",
    "windowed_adaptation",
]


class WindowedSettings(NamedTuple):
    """The adaptation phase's schedule and rules, fixed for a run.

    Attributes
    ----------
    warmup_steps : int
        Steps of the adaptation phase.
    offset : int
        Warmup steps before it (the approach).
    initial_probes, slow_probes : tuple of int
        Steps (counted from the adaptation's start) after which the curvature is probed.
    full_mass : bool
        Dense factor ``(C, D, D)`` instead of a diagonal ``(C, D)``.
    preconditioned : bool
        ``adapt_mass_matrix``: False keeps the identity.
    temperature : float
        :math:`T`.
    step_size : StepSizeSettings
        The step-size rule.
    """

    warmup_steps: int
    offset: int
    initial_probes: Tuple[int, ...]
    slow_probes: Tuple[int, ...]
    full_mass: bool
    preconditioned: bool
    temperature: float
    step_size: StepSizeSettings

    @property
    def slow_start(self) -> int:
        """First step (counted from the adaptation's start) after the initial buffer."""
        return self.initial_probes[-1] if self.initial_probes else 0


class WindowedState(NamedTuple):
    """The metric's and the step size's states, and the gradient evaluations (per chain) spent on probes."""

    metric: MetricState
    step: StepSizeState
    num_extra_evaluations: int

    @property
    def step_size(self) -> Optional[torch.Tensor]:
        """The per-chain step sizes, ``(C, 1)`` (``None`` before the first derivation)."""
        return self.step.step_size

    @property
    def factor(self) -> Optional[torch.Tensor]:
        """The metric's factor :math:`L`, ``(C, D)`` or ``(C, D, D)``."""
        return self.metric.factor

    @property
    def full_mass(self) -> bool:
        """Whether the factor is dense."""
        return self.metric.factor is not None and self.metric.factor.dim() == 3

    def replace(self, **changes) -> "WindowedState":
        """A copy with the named fields replaced (the others shared, not copied)."""
        return self._replace(**changes)

    def as_dict(self) -> dict:
        """``{field: value}`` in field order."""
        return dict(zip(self._fields, self))


def _derive_step_size(
    settings: WindowedSettings, state: WindowedState, position, probes: CurvatureProbes, noise_cap: bool
) -> WindowedState:
    step, evaluations = step_size_update(
        settings.step_size, state.step, position, state.metric.factor, probes, noise_cap
    )
    return state.replace(step=step, num_extra_evaluations=state.num_extra_evaluations + evaluations)


def _set_metric(
    settings: WindowedSettings,
    state: WindowedState,
    metric: MetricState,
    position,
    hessian,
    probes,
    noise_cap: bool = True,
    transient: bool = False,
    spread=None,
    fisher=None,
) -> WindowedState:
    """The regularised metric from ``hessian``, then the step size under it."""
    num_data = settings.step_size.num_data
    metric = metric_update(metric, hessian, settings.full_mass, num_data, transient, spread, fisher)
    return _derive_step_size(settings, state.replace(metric=metric), position, probes, noise_cap)


def _probe_hessian(state: WindowedState, position, probes: CurvatureProbes) -> Tuple[WindowedState, torch.Tensor]:
    hessian, evaluations = probes.hessian(position)
    return state.replace(num_extra_evaluations=state.num_extra_evaluations + evaluations), hessian


def windowed_init(settings: WindowedSettings, position: torch.Tensor, probes: CurvatureProbes) -> WindowedState:
    """The first metric (the local Gaussian at the chains' points ``(C, D)``) and the step size under it."""
    state = WindowedState(metric_init(position, settings.preconditioned), step_size_init(), 0)
    noise_cap = not settings.slow_probes
    if not settings.preconditioned:
        return _derive_step_size(settings, state, position, probes, noise_cap)
    state, hessian = _probe_hessian(state, position, probes)
    return _set_metric(settings, state, state.metric, position, hessian, probes, noise_cap, transient=True)


def windowed_update(
    settings: WindowedSettings,
    state: WindowedState,
    step: int,
    position: torch.Tensor,
    grad: torch.Tensor,
    probes: CurvatureProbes,
) -> Tuple[WindowedState, bool]:
    """After warmup step ``step`` (1-based count of steps taken, approach included) at ``position`` with minibatch
    gradient ``grad``. Returns the new state and whether the metric was replaced, so that the momentum, in units of
    the old metric, must be reset to zero (it would overshoot in the new one)."""
    step -= settings.offset
    if settings.preconditioned and settings.initial_probes and step > settings.initial_probes[-1]:
        state = state.replace(metric=metric_record(state.metric, position, grad))
    if step in settings.initial_probes:
        if not settings.preconditioned:
            return _derive_step_size(settings, state, position, probes, noise_cap=False), True
        state, hessian = _probe_hessian(state, position, probes)
        return _set_metric(settings, state, state.metric, position, hessian, probes, False, transient=True), True
    if step in settings.slow_probes:
        state = state.replace(step=step_size_rederive(state.step))
        if not settings.preconditioned:
            return _derive_step_size(settings, state, position, probes, noise_cap=True), False
        state, hessian = _probe_hessian(state, position, probes)
        metric, curvature = metric_accumulate(state.metric, hessian)
        num_data, temperature = settings.step_size.num_data, settings.temperature
        spread = draw_covariance(metric, num_data, temperature)
        noise = state.step
        fisher = gradient_curvature(metric, noise.noise_sum, noise.noise_count, num_data, temperature)
        return _set_metric(settings, state, metric, position, curvature, probes, spread=spread, fisher=fisher), False
    return state, False


def windowed_shrink(state: WindowedState, diverging: torch.Tensor) -> WindowedState:
    """Halve the step size of the chains ``diverging`` ``(C,)`` until the next derivation."""
    return state.replace(step=step_size_shrink(state.step, diverging))


def windowed_final(state: WindowedState) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(step_size, factor)``: the per-chain step sizes ``(C, 1)`` and the metric's factor :math:`L`."""
    return state.step.step_size, state.metric.factor


#: The windowed adaptation as ``(init, update, final)``.
windowed_adaptation = Adaptation(windowed_init, windowed_update, windowed_final)
