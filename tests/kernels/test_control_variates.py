"""Control variates (``control_variate=``): exact full-data centre, lower gradient variance, exact posterior.

Model: conjugate Bayesian linear regression ``y ~ Normal(X w, 1)``, ``w ~ Normal(0, I)``, with the
observations in a subsampled plate; the posterior is Gaussian with precision ``I + X^T X`` and
mean ``Sigma X^T y``, the oracle of every test here.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.linalg
import torch
from pyro.infer.autoguide.initialization import init_to_value
from pyro.ops.stats import effective_sample_size

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT
from pyro_sgmcmc.kernels.control_variates import full_data_potential_and_grad
from pyro_sgmcmc.model.potential import ModelPotential

D = 3


def make_problem(n: int, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, D, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64) + torch.randn(n, generator=g, dtype=torch.float64)

    def model():
        w = pyro.sample("w", dist.Normal(torch.zeros(D, dtype=torch.float64), 1.0).to_event(1))
        with pyro.plate("data", n, subsample_size=batch) as idx:
            pyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])

    precision = torch.eye(D, dtype=torch.float64) + X.T @ X
    cov = torch.linalg.inv(precision)
    return model, X, y, cov @ (X.T @ y), cov


def test_full_data_potential_and_grad_is_exact():
    """N = 63 with B = 20 (coprime): the cyclic chunks still give the exact full-data U and gradient."""
    model, X, y, _, _ = make_problem(63, 20)
    potential = ModelPotential(model)
    z = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64, requires_grad=True)
    exact = -(dist.Normal(0.0, 1.0).log_prob(z).sum() + dist.Normal(X @ z, 1.0).log_prob(y).sum())
    (exact_grad,) = torch.autograd.grad(exact, z)
    u, g = full_data_potential_and_grad(potential, z.detach())
    assert torch.allclose(u, exact.detach(), rtol=1e-12, atol=1e-9)
    assert torch.allclose(g, exact_grad, rtol=1e-12, atol=1e-9)


def _gradients(kernel_cls, model, point, num_minibatches, **options):
    """Gradient estimates at one point from ``num_minibatches`` independent minibatches (one per chain)."""
    kernel = kernel_cls(model, step_size=1e-3, **options)
    kernel.setup_chains(0, num_chains=num_minibatches, initial_params={"w": point.expand(num_minibatches, D)}, seed=1)
    return kernel.state.grad


def test_control_variate_lowers_gradient_variance_as_predicted():
    """At a point one posterior sd from the mode, the CV estimate's variance matches the exact
    finite-population formula and is far below plain subsampling's.

    Oracle: for B of N without replacement, the covariance of the (N / B)-scaled minibatch sum of
    per-datum terms ``t_n`` is ``N^2 (N - B) / (B (N - 1)) Cov_n(t_n)``; ``t_n`` is the per-datum
    gradient ``-x_n (y_n - x_n^T w)`` (plain) or its difference from the centre (CV). The sample
    variance over M = 400 independent minibatches has relative sd sqrt(2 / M) = 7 % per coordinate;
    the summed variance is compared within 30 % (over 4 sds).
    """
    n, batch, m = 2000, 20, 400
    model, X, y, mean, cov = make_problem(n, batch)
    point = mean + cov.diagonal().sqrt()
    centre = {"w": mean}  # the exact posterior mode (Gaussian posterior): a valid dict centre
    plain = _gradients(SGLD, model, point, m)
    cv = _gradients(SGLD, model, point, m, control_variate=centre)
    factor = n**2 * (n - batch) / (batch * (n - 1))
    residual = y - X @ point
    terms_plain = -X * residual.unsqueeze(-1)
    terms_cv = terms_plain - (-X * (y - X @ mean).unsqueeze(-1))
    predicted_plain = factor * terms_plain.var(0, unbiased=False).sum()
    predicted_cv = factor * terms_cv.var(0, unbiased=False).sum()
    observed_plain = plain.var(0).sum()
    observed_cv = cv.var(0).sum()
    assert abs(float(observed_plain / predicted_plain) - 1) < 0.3
    assert abs(float(observed_cv / predicted_cv) - 1) < 0.3
    assert float(predicted_plain / predicted_cv) > 100  # the point of control variates
    # and unbiased: the mean of the CV estimates is the full-data gradient (within 4 standard errors)
    exact = -(X.T @ residual) + point
    error = (cv.mean(0) - exact).abs()
    assert bool((error < 4 * (cv.var(0) / m).sqrt() + 1e-9).all())


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, SGNHT])
def test_control_variate_map_centre_is_the_mode(kernel_cls):
    """``control_variate="map"`` finds the exact posterior mode (L-BFGS on the full data), every kernel.

    The gradient there is zero up to float64 round-off of the line search: it must have fallen by 8
    orders of magnitude from its value at ``w = 0`` (``|X^T y|``, about 480), i.e. to below 5e-6 (over
    8 start points the L-BFGS result ranged from 8e-12 to 2e-6; a fixed absolute 1e-6 was flaky)."""
    pyro.set_rng_seed(0)  # init_to_uniform draws the search's start from the global generator
    model, X, y, mean, cov = make_problem(500, 25)
    kernel = kernel_cls(model, step_size=1e-3, control_variate="map")
    kernel.setup_chains(0, num_chains=2, seed=0)
    centre = kernel.gradient_estimator.centre
    assert torch.allclose(centre, mean, atol=1e-6 * float(cov.diagonal().sqrt().min()) + 1e-8)
    assert float(kernel.gradient_estimator.centre_grad.abs().max()) < 1e-8 * float((X.T @ y).abs().max())


def test_control_variate_map_centre_with_a_float32_model():
    """A float32 model (torch's default dtype) gets its MAP centre too: L-BFGS keeps float64 state but
    evaluates the model in float32 (it used to feed float64 values to float32 data and crash). The
    centre is the mode to float32 precision. The line search compares potentials U ~ 700 whose float32
    resolution is ~700 * 6e-8 = 4e-5; near the mode U - U* = H d^2 / 2 with H ~ 500, so steps below
    d ~ sqrt(2 * 4e-5 / 500) ~ 4e-4 (0.01 posterior sd) cannot be told apart: the bound is 0.05 sd (a
    centre left at the start, 0, is ~20 sd off). Any centre keeps the CV gradient unbiased; its
    accuracy only sets how much variance is removed."""
    _, X, y, mean, cov = make_problem(500, 25)
    X32, y32 = X.float(), y.float()

    def model():
        w = pyro.sample("w", dist.Normal(torch.zeros(D), 1.0).to_event(1))
        with pyro.plate("data", 500, subsample_size=25) as idx:
            pyro.sample("y", dist.Normal(X32[idx] @ w, 1.0), obs=y32[idx])

    kernel = SGHMC(model, step_size=1e-3, control_variate="map")
    kernel.setup_chains(0, num_chains=2, seed=0)
    centre = kernel.gradient_estimator.centre
    assert centre.dtype == torch.float32
    sd = cov.diagonal().sqrt()
    assert torch.all((centre.double() - mean).abs() < 0.05 * sd), (centre, mean)


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, SGNHT])
def test_init_to_centre_starts_every_chain_at_the_map(kernel_cls):
    """``init_to_centre=True``: all chains start at the MAP centre, whatever the init strategy gave
    (init_to_uniform puts them up to 2 away, ~45 posterior sd); the MAP search still starts from the
    first chain's initial point. Without the flag the chains start where the init strategy put them."""
    pyro.set_rng_seed(0)
    model, X, y, mean, cov = make_problem(500, 25)
    kernel = kernel_cls(model, step_size=1e-3, control_variate="map", init_to_centre=True)
    kernel.setup_chains(0, num_chains=3, seed=0)
    centre = kernel.gradient_estimator.centre
    assert torch.equal(kernel.state.position, centre.expand(3, -1))
    assert torch.allclose(centre, mean, atol=1e-6 * float(cov.diagonal().sqrt().min()) + 1e-8)
    plain = kernel_cls(model, step_size=1e-3, control_variate="map")
    plain.setup_chains(0, num_chains=3, seed=0)
    assert float((plain.state.position - mean).abs().min()) > 1e-3  # init_to_uniform, not the centre


def test_init_to_centre_bad_input():
    model, *_ = make_problem(100, 10)
    with pytest.raises(ValueError, match="init_to_centre=True needs control_variate='map' or a dict"):
        SGHMC(model, init_to_centre=True)
    with pytest.raises(TypeError, match="init_to_centre must be True or False"):
        SGLD(model, control_variate="map", init_to_centre=1)


def _sgld_stationary_cov(X: torch.Tensor, step: float) -> np.ndarray:
    """Stationary covariance of full-gradient SGLD on this Gaussian posterior (discrete Lyapunov)."""
    n = X.shape[0]
    hessian = (np.eye(D) + (X.T @ X).numpy()) / n  # normalised
    a = np.eye(D) - step * hessian
    return scipy.linalg.solve_discrete_lyapunov(a, 2 * step / n * np.eye(D))


def test_sgld_with_control_variate_targets_the_exact_posterior():
    """SGLD-CV on N = 2000, B = 20: mean and sd agree with the closed form.

    Tolerances: |mean - exact| <= 4 sd / sqrt(ESS); the sd is compared with the stationary sd of
    full-gradient SGLD at this step (discrete Lyapunov, the known O(eps) bias: 2.5 %), within
    4 / sqrt(2 ESS) plus the gradient-noise inflation that remains with the CV,
    ``eps N V / 4`` in relative sd, V the CV drift variance at one posterior sd from the centre
    (computed exactly; about 0.3 %).
    """
    n, batch, step = 2000, 20, 0.05
    model, X, y, mean, cov = make_problem(n, batch)
    kernel = SGLD(model, step_size=step, control_variate="map", init_strategy=init_to_value(values={"w": mean}))
    mcmc = MCMC(kernel, num_samples=400, warmup_steps=100, num_chains=64, chain_method="vectorized", seed=3,
                disable_progbar=True)  # fmt: skip
    mcmc.run()
    w = mcmc.get_samples(group_by_chain=True)["w"]  # (64, 400, D)
    ess = effective_sample_size(w, chain_dim=0, sample_dim=1)
    assert float(ess.min()) > 300  # the tolerances below assume at least this many effective draws
    sd = cov.diagonal().sqrt()
    flat = w.reshape(-1, D)
    assert bool(((flat.mean(0) - mean).abs() <= 4 * sd / ess.sqrt()).all())
    expected_sd = torch.from_numpy(np.sqrt(np.diag(_sgld_stationary_cov(X, step))))
    factor = n**2 * (n - batch) / (batch * (n - 1))
    point = mean + sd
    terms_cv = -X * (X @ (mean - point)).unsqueeze(-1)
    noise = factor * terms_cv.var(0, unbiased=False).max() / n**2  # normalised drift variance
    inflation = step * n * float(noise) / 4
    tolerance = 4 / (2 * ess).sqrt() + inflation
    assert bool(((flat.std(0) / expected_sd - 1).abs() <= tolerance).all()), (flat.std(0) / expected_sd, tolerance)
    assert math.isfinite(float(kernel.last_stats["lp"].sum()))


def test_control_variate_bad_input():
    model, *_ = make_problem(100, 10)
    with pytest.raises(ValueError, match="control_variate"):
        SGLD(model, control_variate="mode")
    with pytest.raises(TypeError, match="control_variate"):
        SGLD(model, control_variate=3.0)
    kernel = SGLD(model, control_variate={"v": torch.zeros(D)})
    with pytest.raises(ValueError, match="missing \\['w'\\]"):
        kernel.setup_chains(0, num_chains=1, seed=0)

    def full_batch():
        pyro.sample("w", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match="exactly one subsampled"):
        SGLD(full_batch, control_variate="map").setup_chains(0, num_chains=1, seed=0)


# ---------------------------------------------------------------------- control_variate="auto"
def _first_sampling_step_uses_control_variate(record, calls=()):
    """A ``hook_fn`` recording, at each chain's first draw, whether it runs with a control variate (and
    how many full-data passes have been made so far)."""

    def hook(kernel, params, stage, i):
        if stage.startswith("Sample") and i == 0:
            record.append((kernel.diagnostics()["control variate"], len(calls)))

    return hook


def test_auto_control_variate_is_centred_at_the_map_and_kept_by_every_sequential_chain(full_data_passes):
    """A concentrated posterior (N = 2,000, B = 20): the preliminary centre already helps, the search goes on
    to the mode, and every chain of a sequential ``pyro.infer.MCMC`` run keeps the control variate (the later
    chains reuse the MAP found by the first instead of searching again)."""
    from pyro.infer import MCMC as PyroMCMC

    calls = full_data_passes
    model, _, _, mean, cov = make_problem(2_000, 20)
    pyro.set_rng_seed(0)
    kernel = SGHMC(model)
    record = []
    mcmc = PyroMCMC(kernel, num_samples=20, warmup_steps=200, num_chains=2, mp_context=None,
                    hook_fn=_first_sampling_step_uses_control_variate(record, calls), disable_progbar=True)  # fmt: skip
    mcmc.run()
    (first_kept, first_calls), (second_kept, second_calls) = record
    assert first_kept and second_kept
    assert first_calls > 0 and second_calls == first_calls  # the second chain searched nothing
    # Its centre is the mode up to a small fraction of a posterior sd: the preliminary 5 L-BFGS iterations
    # and the stages after it end within 0.05 T d / 2 = 0.075 nats of the minimum for this quadratic
    # potential, i.e. a squared offset |c - mode|^2 in the precision's metric of about 0.15.
    centre = kernel.warmup.auto.refined.centre
    offset = (centre - mean) @ torch.linalg.solve(cov, centre - mean)
    assert float(offset) < 0.5, float(offset)


def test_auto_control_variate_skips_the_full_search_where_it_cannot_help(full_data_passes):
    """A posterior that is not concentrated (a tanh network on N = 1,000 points, B = 100): the preliminary
    centre does not lower the gradient variance, so neither the full MAP search (hundreds of full-data passes
    for a network) nor the control variate is run."""
    calls = full_data_passes
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1_000, 2, generator=g)
    y = torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1]) + 0.3 * torch.randn(1_000, generator=g)

    def model():
        w1 = pyro.sample("w1", dist.Normal(torch.zeros(2, 16), 1.0).to_event(2))
        w2 = pyro.sample("w2", dist.Normal(torch.zeros(16), 1.0).to_event(1))
        with pyro.plate("data", 1_000, subsample_size=100) as idx:
            pyro.sample("y", dist.Normal(torch.tanh(x[idx] @ w1) @ w2, 0.3), obs=y[idx])

    pyro.set_rng_seed(0)
    record = []
    kernel = SGHMC(model)
    from pyro.infer import MCMC as PyroMCMC

    PyroMCMC(kernel, num_samples=5, warmup_steps=400, hook_fn=_first_sampling_step_uses_control_variate(record),
             disable_progbar=True).run()  # fmt: skip
    assert [kept for kept, _ in record] == [False]
    # Measured (paired minibatches, with the ratio's jackknife error): the preliminary centre lowers the variance
    # (ratio 0.70, error 12 % on 32 minibatches), the first stage of 10 iterations towards the network's MAP does
    # not lower it further (1.007 of it, error 3.5 %), and the search stops: 20 full-data passes. The bound is
    # the preliminary (start + at most 7 evaluations + centre) and one stage (at most 14): it fails if the
    # search ran on to the MAP (119 passes before the stages existed).
    assert len(calls) <= 24, len(calls)
