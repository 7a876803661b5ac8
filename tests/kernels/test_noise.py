"""The injected noise has exactly the scale the update equations give (coupling with a shared generator).

Two exact checks, in float64 on a full-batch model (so the global generator feeds only the noise):

* one step: the chain draws ``zeta``, its keyed draw of the step (``kernel.generators.normal(..., step=t)``);
  the new state must equal the update equation evaluated by hand with that zeta, for several T.
* many steps on a Gaussian target: SGLD and SGHMC are then linear recursions, so with the same seed
  ``z_t(T) - z_t(0)`` is ``sqrt(T)`` times the same noise response; ``(z_t(T) - z_t(0)) / sqrt(T)``
  must agree across temperatures along the whole trajectory.

Tolerance 1e-12: both sides are the same float64 expressions up to operation order.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import SGHMC, SGLD, SGNHT

NUM_DATA = 50


def gaussian_model(y):
    mu = pyro.sample("mu", dist.Normal(torch.zeros(2), 3.0).to_event(1))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("y", dist.Normal(mu, 1.0).to_event(1), obs=y)


def _setup(kernel, seed=0):
    y = torch.randn(NUM_DATA, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 1.0
    kernel.initial_params = {"mu": torch.tensor([0.5, -0.5])}
    kernel.setup(0, y)
    return kernel


@pytest.mark.parametrize("temperature", [1.0, 0.25, 3.0])
def test_one_step_noise_scale(float64, temperature):
    eps, alpha, mass = 0.1, 2.0, 1.5
    for kernel in [
        SGLD(gaussian_model, step_size=eps, temperature=temperature),
        SGHMC(gaussian_model, step_size=eps, temperature=temperature, friction=alpha, mass=mass),
        SGNHT(gaussian_model, step_size=eps, temperature=temperature, diffusion=alpha, mass=mass),
    ]:
        _setup(kernel)
        state = kernel.state
        before = state.replace(
            position=state.position[0], momentum=None if state.momentum is None else state.momentum[0]
        )
        drift = -before.grad[0] / NUM_DATA
        zeta = kernel.generators.normal((2,), torch.float64, step=state.step)[0]  # the chain's draw of this step
        kernel.sample(kernel.initial_params)
        after = kernel.state.replace(position=kernel.state.position[0])
        if after.momentum is not None:
            after = after.replace(momentum=after.momentum[0])
        calT = temperature / NUM_DATA
        if isinstance(kernel, SGLD):
            expected = before.position + eps * drift + math.sqrt(2 * eps * calT) * zeta
        elif isinstance(kernel, SGHMC):
            m = (1 - eps * alpha / mass) * before.momentum + eps * drift + math.sqrt(2 * eps * calT * alpha) * zeta
            assert torch.allclose(after.momentum, m, rtol=0, atol=1e-12)
            expected = before.position + eps * m / mass
        else:
            xi = before.thermostat[0]
            m = before.momentum - eps * xi * before.momentum / mass + eps * drift
            m = m + math.sqrt(2 * eps * calT * alpha) * zeta
            assert torch.allclose(after.momentum, m, rtol=0, atol=1e-12)
            xi_new = xi + eps * ((m * m).sum() / (mass * 2) - calT)
            assert torch.allclose(after.thermostat[0], xi_new, rtol=0, atol=1e-12)
            expected = before.position + eps * m / mass
        assert torch.allclose(after.position, expected, rtol=0, atol=1e-12), type(kernel).__name__
        assert after.step == before.step + 1


def _trajectory(kernel_cls, temperature, num_steps=200, **kwargs):
    torch.manual_seed(7)  # seeds the chain's stream, drawn at set-up
    kernel = _setup(kernel_cls(gaussian_model, temperature=temperature, **kwargs))
    params, path = kernel.initial_params, []
    for _ in range(num_steps):
        params = kernel.sample(params)
        path.append(params["mu"].clone())
    return torch.stack(path)


@pytest.mark.parametrize(
    "kernel_cls,kwargs", [(SGLD, {"step_size": 0.2}), (SGHMC, {"step_size": 0.2, "friction": 1.0})]
)
def test_noise_scales_with_sqrt_temperature_along_a_trajectory(float64, kernel_cls, kwargs):
    deterministic = _trajectory(kernel_cls, 0.0, **kwargs)
    responses = [(_trajectory(kernel_cls, t, **kwargs) - deterministic) / math.sqrt(t) for t in (0.5, 1.0, 4.0)]
    assert responses[0].abs().max() > 1e-3  # the noise does move the chain
    for response in responses[1:]:
        assert torch.allclose(response, responses[0], rtol=0, atol=1e-12), (response - responses[0]).abs().max()
