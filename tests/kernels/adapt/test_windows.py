"""Stan's windows (``kernels/adapt/windows.py``) and the warmup driver, run on an exact Gaussian without a kernel."""

from __future__ import annotations

import torch

from pyro_sgmcmc.kernels.adapt.saved import adaptation_fields, restore_adaptation
from pyro_sgmcmc.kernels.adapt.stability import StabilityRule
from pyro_sgmcmc.kernels.adapt.step_size import StepSizeSettings
from pyro_sgmcmc.kernels.adapt.windows import WindowedSettings, windowed_final, windowed_init, windowed_update
from pyro_sgmcmc.kernels.adaptation import WarmupContext, WarmupDriver
from pyro_sgmcmc.kernels.curvature_probes import CurvatureProbes
from pyro_sgmcmc.kernels.state import SGMCMCState

NUM_DATA = 100
#: The potential's Hessian: U(z) = z' A z / 2, a Gaussian posterior of covariance A^-1 (normalised curvature A / N).
A = NUM_DATA * torch.tensor([[4.0, 1.0], [1.0, 2.0]], dtype=torch.float64)


def _exact(positions, indices):
    return 0.5 * torch.einsum("ci,ij,cj->c", positions, A, positions), positions @ A


def test_the_first_metric_whitens_the_curvature_and_the_step_follows_the_rule(float64):
    """Full data (no minibatch noise): the probed Hessian is A up to rounding, so L L' = (A / N)^-1, the
    preconditioned curvature L' (A / N) L is the identity, lambda_max = 1 and the second-order step is c."""
    probes = CurvatureProbes(_exact, lambda: {}, (), NUM_DATA)
    step = StepSizeSettings(True, True, True, StabilityRule(0.4, True, 1.0), 1.0, NUM_DATA, 1e-3)
    settings = WindowedSettings(100, 0, (1, 2, 4, 8, 15), (24, 34, 43, 53, 62, 71, 81, 90), True, True, 1.0, step)
    position = torch.tensor([[0.3, -0.2], [1.0, 2.0]])
    state = windowed_init(settings, position, probes)
    step_size, factor = windowed_final(state)
    whitened = factor.transpose(-1, -2) @ (A / NUM_DATA) @ factor
    assert torch.allclose(whitened, torch.eye(2).expand(2, 2, 2), atol=1e-8)
    assert torch.allclose(step_size, torch.full((2, 1), 0.4), rtol=1e-6)
    assert state.num_extra_evaluations == 2 * 2 + 2 * 12  # a probe per coordinate, 12 power iterations
    # a probe of the initial buffer replaces the metric (momentum reset); a step between probes does not
    state, replaced = windowed_update(settings, state, 2, position, position @ A, probes)
    assert replaced
    state, replaced = windowed_update(settings, state, 3, position, position @ A, probes)
    assert not replaced
    for step in range(16, 25):
        state, _ = windowed_update(settings, state, step, position, position @ A, probes)
    assert state.metric.count == 1 and state.metric.draw_count == 9  # one slow-phase probe, draws after step 15
    restored = restore_adaptation(state, adaptation_fields(state), "cpu")
    assert all(torch.equal(a, b) for a, b in zip(restored.metric[:1], state.metric[:1]))
    assert restored.step.noise_count == state.step.noise_count


def test_the_warmup_runs_without_a_kernel(float64):
    """The driver needs only the values of a WarmupContext: an SGLD on the exact Gaussian, warmed up by hand
    (approach, adaptation), reaches the mode from z = (30, -30), and the kernel-shaped calls return the state."""

    def transition(state, drift, step_size, noise, drift_scale=1.0):
        """SGLD at T = 1: z' = z + eps a + sqrt(2 eps T / N) zeta, a = drift_scale * drift."""
        moved = state.position + step_size * drift_scale * drift + (2 * step_size / NUM_DATA) ** 0.5 * noise
        return moved, None, None

    rule = StabilityRule(0.1, second_order=False, damping=1.0)
    flags = dict(adapt_step_size=True, adapt_mass_matrix=True, full_mass=None)
    control_variate = dict(automatic_control_variate=False, uses_control_variate=False)
    context = WarmupContext(
        _exact, lambda: {}, transition, None, (), NUM_DATA, 1.0, rule, **flags, **control_variate,
        initial_step_size=1e-3, kernel_name="SGLD",
    )  # fmt: skip
    warmup = WarmupDriver()
    position = torch.tensor([[30.0, -30.0]])
    state = SGMCMCState(position, None, None, *_exact(position, {}), 0)
    state = warmup.setup(200, state, context)
    generator = torch.Generator().manual_seed(0)
    while state.step < 200:
        if warmup.in_approach(state.step):
            state = warmup.approach_step(state)
            continue
        noise = torch.randn(state.position.shape, generator=generator)
        moved, _, _ = warmup.transition(state, state.grad, warmup.chain_step_size, noise, -1.0 / NUM_DATA)
        new = SGMCMCState(moved, None, None, *_exact(moved, {}), state.step + 1)
        state, chosen = warmup.after_step(state, new, torch.zeros(1, dtype=torch.bool))
        assert chosen is None
    # the posterior sd is at most 1 / sqrt(100 * 1.38) = 0.085 in every direction: within 6 sds of the mode
    assert float(state.position.norm()) < 0.5, state.position
    assert warmup.phase(state.step) == "sampling" and warmup.jump_threshold is not None
