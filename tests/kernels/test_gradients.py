"""Gradient estimators as values with one signature (``kernels/gradients.py``).

Oracle: the full-data potential of a linear regression written directly with ``torch.distributions`` and
differentiated by autograd. Each estimator, called on ``M`` chains at the same point, each chain with its own
minibatch (the kernel's sampler: each chain's first minibatch is a uniform ``B``-subset), must average to the
oracle within ``Z`` Monte Carlo standard errors in each of the ``D + 1`` numbers (``U`` and its gradient):
with ``Z = 4.5`` a correct estimator fails with probability below ``(D + 1) * 7e-6`` per estimator.
"""

from __future__ import annotations

import socket

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.distributed as torch_dist

from pyro_sgmcmc import ModelPotential
from pyro_sgmcmc.chains.minibatch import MinibatchSampler
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.kernels.control_variates import ControlVariate
from pyro_sgmcmc.kernels.gradients import MinibatchGradient, all_reduced, as_estimator

N, B, D, M, Z = 200, 10, 3, 4000, 4.5


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=generator, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64) + torch.randn(
        N, generator=generator, dtype=torch.float64
    )
    return x, y


def _model(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(D, dtype=torch.float64), 1.0).to_event(1))
    with pyro.plate("data", N, subsample_size=B) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, 1.0), obs=y[i])


def _full_data(x, y, w):
    """The oracle: U(w) = -log N(w; 0, I) - sum_n log N(y_n; x_n w, 1), and its gradient by autograd."""
    w = w.detach().requires_grad_(True)
    u = -(
        torch.distributions.Normal(0.0, 1.0).log_prob(w).sum()
        + torch.distributions.Normal(x @ w, 1.0).log_prob(y).sum()
    )
    return u.detach(), torch.autograd.grad(u, w)[0]


def _check_unbiased(estimator, potential, point, x, y):
    indices = MinibatchSampler(potential.subsample_plates, ChainGenerators(1, range(M))).next()
    u, g = estimator(point.expand(M, D).clone(), indices)
    assert u.shape == (M,) and g.shape == (M, D)
    truth_u, truth_g = _full_data(x, y, point)
    values = torch.cat([u.unsqueeze(-1), g], -1)
    truth = torch.cat([truth_u.unsqueeze(-1), truth_g])
    error = values.mean(0) - truth
    standard_error = values.std(0) / M**0.5
    assert (error.abs() < Z * standard_error).all(), (error / standard_error).tolist()
    assert (standard_error > 0).all()  # the estimates do vary: the test can fail


def test_minibatch_and_control_variate_estimators_are_unbiased_for_the_full_data_potential():
    x, y = _data()
    potential = ModelPotential(_model, (x, y))
    point = torch.tensor([0.3, 0.1, 1.5], dtype=torch.float64)
    _check_unbiased(MinibatchGradient(potential), potential, point, x, y)
    centre = ControlVariate(potential, {"w": torch.tensor([0.9, -0.4, 1.8], dtype=torch.float64)}, point)
    _check_unbiased(centre, potential, point, x, y)
    # at its centre the control variate is exact: the full-data values, whatever the minibatch
    indices = MinibatchSampler(potential.subsample_plates, ChainGenerators(1, range(5))).next()
    u, g = centre(centre.centre.expand(5, D).clone(), indices)
    truth_u, truth_g = _full_data(x, y, centre.centre)
    torch.testing.assert_close(u, truth_u.expand(5), rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(g, truth_g.expand(5, D), rtol=1e-12, atol=1e-9)


def test_an_all_reduced_estimator_of_one_rank_is_the_estimator():
    x, y = _data()
    potential = ModelPotential(_model, (x, y))
    estimator = MinibatchGradient(potential)
    positions = torch.randn(4, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    indices = MinibatchSampler(potential.subsample_plates, ChainGenerators(2, range(4))).next()
    expected = estimator(positions, indices)
    wrapped = all_reduced(estimator)
    assert wrapped.potential is potential and wrapped.replayable
    for got, want in zip(wrapped(positions, indices), expected):  # no process group: the identity
        assert torch.equal(got, want)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:  # a group of one rank: the all-reduce path, the identity too
        for got, want in zip(all_reduced(estimator, group=torch_dist.group.WORLD)(positions, indices), expected):
            assert torch.equal(got, want)
    finally:
        torch_dist.destroy_process_group()


def test_a_function_is_an_estimator():
    def quadratic(z, indices):
        return 0.5 * (z * z).sum(-1), z.clone()

    estimator = as_estimator(quadratic)
    assert not estimator.replayable and as_estimator(estimator) is estimator
    u, g = all_reduced(quadratic)(torch.ones(2, 3), {})
    assert u.tolist() == [1.5, 1.5] and torch.equal(g, torch.ones(2, 3))
    with pytest.raises(TypeError, match="estimator"):
        as_estimator(3.0)


# ------------------------------------------------------------------ a kernel's gradient_estimator=


def _user_model(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(D), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=B) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, 0.5), obs=y[i])


def _user_run(**options):
    import pyro_sgmcmc
    from pyro_sgmcmc import SGHMC

    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(N, D, generator=generator), torch.randn(N, generator=generator)
    mcmc = pyro_sgmcmc.MCMC(SGHMC(_user_model, **options), num_samples=50, warmup_steps=50, num_chains=2,
                            chain_method="vectorized", seed=0, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    return mcmc


def test_a_kernel_uses_the_users_gradient_estimator():
    """``gradient_estimator=MinibatchGradient`` is the plain estimate: the draws of ``control_variate=None``, bit
    for bit; a user's estimator is called at every step (here one wrapping the plain one, counting its calls)."""
    plain = _user_run(control_variate=None).get_samples()["w"]
    assert torch.equal(_user_run(gradient_estimator=MinibatchGradient).get_samples()["w"], plain)
    calls = []

    def counting(potential):
        inner = MinibatchGradient(potential)

        def estimate(positions, indices):
            calls.append(positions.shape)
            return inner.potential_and_grad(positions, indices)

        return as_estimator(estimate, potential, replayable=True)

    assert torch.equal(_user_run(gradient_estimator=counting).get_samples()["w"], plain)
    # every step calls it (the warmup's probes too, with more positions); the 50 sampling steps with the 2 chains
    assert len(calls) >= 100 and all(shape == (2, D) for shape in calls[-50:])


def test_a_bad_gradient_estimator_is_named():
    from pyro_sgmcmc import SGHMC

    with pytest.raises(TypeError, match="gradient_estimator must be None or a callable"):
        SGHMC(_user_model, gradient_estimator=3)
    with pytest.raises(ValueError, match="gradient_estimator replaces the control variate"):
        SGHMC(_user_model, gradient_estimator=MinibatchGradient, control_variate="map")
    with pytest.raises(TypeError, match=r"gradient_estimator\(potential\) must return an estimator"):
        _user_run(gradient_estimator=lambda potential: 3)
