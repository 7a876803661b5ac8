"""The step-size rule (``kernels/adapt/step_size.py``) with probes that return known curvatures and noise."""

from __future__ import annotations

from typing import NamedTuple

import torch

from pyro_sgmcmc.kernels.adapt.stability import StabilityRule
from pyro_sgmcmc.kernels.adapt.step_size import (
    NOISE_INFLATION,
    StepSizeSettings,
    step_size_init,
    step_size_rederive,
    step_size_shrink,
    step_size_update,
)


class KnownProbes(NamedTuple):
    """Probes whose largest curvature and drift-noise covariance are given (and cost 3 and 5 evaluations)."""

    curvature: torch.Tensor
    noise: torch.Tensor

    def largest_curvature(self, position, factor, full):
        return self.curvature, 3

    def drift_noise_covariance(self, position):
        return self.noise, 5


def _settings(second_order: bool, **changes) -> StepSizeSettings:
    fields = dict(
        adapt=True, preconditioned=True, full_mass=False, rule=StabilityRule(0.4, second_order, damping=2.0),
        temperature=1.0, num_data=100, initial_step_size=1e-3,
    )  # fmt: skip
    fields.update(changes)
    return StepSizeSettings(**fields)


def test_the_rule_the_floor_and_the_fallback(float64):
    """Chain 0: lambda = 16, eps = c / sqrt(16) (second order) or c / 16 (first order); chain 1: lambda = 0.25 is
    floored at 1 under an adapted metric; chain 2: no usable curvature (NaN) keeps the user's step."""
    position, factor = torch.zeros(3, 2), torch.ones(3, 2)
    probes = KnownProbes(torch.tensor([16.0, 0.25, float("nan")]), torch.zeros(3, 2, 2))
    state, spent = step_size_update(_settings(True), step_size_init(), position, factor, probes, noise_cap=False)
    assert state.step_size.squeeze(-1).tolist() == [0.1, 0.4, 1e-3] and spent == 3
    state, _ = step_size_update(_settings(False), step_size_init(), position, factor, probes, noise_cap=False)
    assert state.step_size.squeeze(-1).tolist() == [0.025, 0.4, 1e-3]


def test_the_noise_cap_and_the_halvings(float64):
    """With V = 0.04 the cap is 2 alpha T NOISE_INFLATION / (N V) = 0.01 (below c / sqrt(1) = 0.4); with a
    diagonal factor of 2 the drift variance in w units is 4 V, the cap a quarter. A divergence halves only its
    chain's step, and stays in force until the step is re-derived (:func:`step_size_rederive`)."""
    position = torch.zeros(2, 1)
    probes = KnownProbes(torch.tensor([1.0, 1.0]), torch.full((2, 1, 1), 0.04))
    cap = 2 * 2.0 * 1.0 * NOISE_INFLATION / (100 * 0.04)
    state, spent = step_size_update(_settings(True), step_size_init(), position, torch.ones(2, 1), probes)
    assert torch.allclose(state.step_size, torch.full((2, 1), cap), rtol=1e-14) and spent == 8
    state = step_size_shrink(state, torch.tensor([True, False]))
    assert torch.allclose(state.step_size.squeeze(-1), torch.tensor([cap / 2, cap]), rtol=1e-14)
    state, _ = step_size_update(_settings(True), state, position, torch.full((2, 1), 2.0), probes)
    assert torch.allclose(state.step_size.squeeze(-1), torch.tensor([cap / 8, cap / 4]), rtol=1e-14)
    state, _ = step_size_update(_settings(True), step_size_rederive(state), position, torch.full((2, 1), 2.0), probes)
    assert torch.allclose(state.step_size.squeeze(-1), torch.tensor([cap / 4, cap / 4]), rtol=1e-14)
    assert state.total_halvings.tolist() == [1, 0] and state.noise_count == 3
