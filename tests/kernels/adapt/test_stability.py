"""A kernel family declares its own stability rule (``kernels/adapt/stability.py``); the warmup reads it.

The toy family below is defined here and nowhere in the package: a Langevin kernel whose declared rule is
``c = 0.05`` (half SGLD's). Nothing in the warmup knows it, yet its adapted step size follows its rule, and its
declared relaxation time decides the slow-mixing warning.
"""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import SGHMC, SGLD, SGNHT, SlowMixingWarning
from pyro_sgmcmc.kernels.adapt.stability import StabilityRule
from pyro_sgmcmc.kernels.base import SGMCMCKernel


class CautiousLangevin(SGMCMCKernel):
    """Langevin dynamics ``z' = z + eps a + sqrt(2 eps T / N) zeta``, declaring a first-order rule with c = 0.05."""

    rule = StabilityRule(0.05, second_order=False, damping=1.0)

    def transition(self, state, drift, step_size, noise, drift_scale=1.0, out=None):
        position = state.position + step_size * drift_scale * drift
        if noise is not None:
            position = position + (2 * step_size * self.noise_temperature) ** 0.5 * noise
        return position, None, None

    def warmup_stability_rule(self) -> StabilityRule:
        return self.rule


class ForgetfulRule(StabilityRule):
    """A rule whose chains need a billion steps per unit of step size to forget their state."""

    def relaxation_time(self, step_size: torch.Tensor) -> torch.Tensor:
        return 1e9 / step_size


def gaussian():
    """A Gaussian with curvatures 1 and 100 (full data): the adapted metric whitens it, lambda_max = 1."""
    pyro.sample("z", dist.Normal(torch.zeros(2), torch.tensor([1.0, 0.1])).to_event(1))


def _adapted_step(kernel) -> torch.Tensor:
    kernel.setup_chains(200, num_chains=2, seed=0)
    for _ in range(200):
        kernel.step()
    return kernel.warmup.chain_step_size


def test_the_warmup_follows_the_rule_a_new_family_declares(float64):
    """Whitened curvature 1 (probed by central differences on an exact quadratic: to rounding, and floored at 1):
    the step is the declared constant, 0.05, where SGLD's is 0.1 and SGHMC's 0.4 / sqrt(1)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowMixingWarning)  # a relaxation time of 20 steps: within 0.2 of the 150
        toy = _adapted_step(CautiousLangevin(gaussian, num_data=1))
    assert torch.allclose(toy, torch.full((2, 1), 0.05), rtol=1e-6), toy
    assert torch.allclose(_adapted_step(SGLD(gaussian, num_data=1)), torch.full((2, 1), 0.1), rtol=1e-6)
    assert torch.allclose(_adapted_step(SGHMC(gaussian, num_data=1)), torch.full((2, 1), 0.4), rtol=1e-6)


def test_the_declared_relaxation_time_decides_the_slow_mixing_warning(float64):
    kernel = CautiousLangevin(gaussian, num_data=1)
    kernel.rule = ForgetfulRule(*CautiousLangevin.rule)
    with pytest.warns(SlowMixingWarning, match="CautiousLangevin: the adapted step size of chain"):
        _adapted_step(kernel)


@pytest.mark.parametrize(
    "kernel, rule",
    [
        (SGLD(gaussian), StabilityRule(0.1, False, 1.0)),
        (SGHMC(gaussian, friction=2.0), StabilityRule(0.4, True, 2.0)),
        (SGNHT(gaussian, diffusion=3.0), StabilityRule(0.1, True, 3.0)),
    ],
)
def test_the_three_families_declare_their_rules(kernel, rule):
    """SGLD first order (c / lambda), SGHMC and SGNHT second order (c / sqrt(lambda)) damped by their friction
    and diffusion; the relaxation times are 1 / eps and 2 / (eps alpha)."""
    assert kernel.warmup_stability_rule() == rule
    step = torch.tensor([0.01], dtype=torch.float64)
    expected = 1 / step if not rule.second_order else 2 / (step * rule.damping)
    assert torch.equal(kernel.warmup_stability_rule().relaxation_time(step), expected)
