"""At T = 0 the kernels are optimisers: exact, step-for-step comparisons with torch.optim.SGD.

Oracle (see ``diffusions.underdamped_step``): SGHMC at T = 0 with step size eps, friction alpha and
mass sigma^2 is ``torch.optim.SGD(lr=eps/sigma^2, momentum=1 - eps*alpha/sigma^2, dampening=1 - eps)``
on the normalised potential U/N, with PyTorch's momentum buffer equal to -m. Both update the momentum
first and then the position with the new momentum, so no half-step alignment is needed; the only
difference is PyTorch's first step, which copies the gradient into an empty buffer undamped. We
pre-seed PyTorch's buffer with -m_0 = 0 so that its first step uses the damped rule like ours.
SGLD at T = 0 is ``SGD(lr=eps)``. Tolerance 1e-10 in float64: the two sides compute the same
floating-point expressions in a different order, so differences are rounding (~1e-15 per step).
"""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import SGHMC, SGLD


def _data(n=200, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    logits = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(logits), generator=g)
    return x, y


def logistic_model(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 2.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)


def normalised_potential(w, x, y):
    """U(w) / N by hand, independent of Pyro."""
    prior = torch.distributions.Normal(0.0, 2.0).log_prob(w).sum()
    lik = torch.distributions.Bernoulli(logits=x @ w).log_prob(y).sum()
    return -(prior + lik) / x.shape[0]


def _run_kernel(kernel, x, y, w0, num_steps):
    kernel.initial_params = {"w": w0.clone()}
    kernel.setup(0, x, y)
    params = kernel.initial_params
    path = []
    for _ in range(num_steps):
        params = kernel.sample(params)
        path.append(params["w"].clone())
    return torch.stack(path)


@pytest.mark.parametrize("step_size,friction,mass", [(0.1, 1.0, 1.0), (0.05, 3.0, 2.0), (0.3, 0.5, 0.5)])
def test_sghmc_at_zero_temperature_is_sgd_with_momentum(float64, step_size, friction, mass):
    x, y = _data()
    w0 = torch.tensor([0.3, -0.2, 0.1])
    num_steps = 300
    kernel = SGHMC(logistic_model, step_size=step_size, temperature=0.0, friction=friction, mass=mass)
    ours = _run_kernel(kernel, x, y, w0, num_steps)
    assert kernel.potential.num_data == x.shape[0]

    w = w0.clone().requires_grad_(True)
    optimizer = torch.optim.SGD(
        [w], lr=step_size / mass, momentum=1 - step_size * friction / mass, dampening=1 - step_size
    )
    optimizer.state[w]["momentum_buffer"] = torch.zeros_like(w)  # -m_0, see module docstring
    theirs = []
    for _ in range(num_steps):
        optimizer.zero_grad()
        normalised_potential(w, x, y).backward()
        optimizer.step()
        theirs.append(w.detach().clone())
    theirs = torch.stack(theirs)
    # The trajectory moves: the comparison is not between two constant sequences.
    assert (theirs[-1] - w0).abs().max() > 0.1
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-10), (ours - theirs).abs().max()
    # and the momentum is minus PyTorch's buffer
    assert torch.allclose(kernel.state.momentum[0], -optimizer.state[w]["momentum_buffer"], rtol=0, atol=1e-10)


def test_sgld_at_zero_temperature_is_plain_sgd(float64):
    x, y = _data()
    w0 = torch.tensor([0.3, -0.2, 0.1])
    step_size, num_steps = 0.5, 300
    ours = _run_kernel(SGLD(logistic_model, step_size=step_size, temperature=0.0), x, y, w0, num_steps)

    w = w0.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([w], lr=step_size)
    theirs = []
    for _ in range(num_steps):
        optimizer.zero_grad()
        normalised_potential(w, x, y).backward()
        optimizer.step()
        theirs.append(w.detach().clone())
    theirs = torch.stack(theirs)
    assert (theirs[-1] - w0).abs().max() > 0.1
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-10), (ours - theirs).abs().max()


def test_zero_temperature_draws_no_noise(float64, monkeypatch):
    """At T = 0 no noise is drawn: a full-batch step never calls the chains' streams."""
    x, y = _data()
    kernel = SGHMC(logistic_model, step_size=0.1, temperature=0.0)
    kernel.initial_params = {"w": torch.zeros(3)}
    kernel.setup(0, x, y)
    draws = []
    monkeypatch.setattr(type(kernel.generators), "fill_normal", lambda self, out, **kw: draws.append(kw) or out)
    kernel.sample(kernel.initial_params)
    assert draws == []
