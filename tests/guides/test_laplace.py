"""AutoLaplace and LaplaceApproximation: closed forms, Pyro's own Laplace guide, and bad input.

The oracle of most tests is Bayesian linear regression with a Gaussian prior and a known noise
scale, where the posterior, the evidence and the predictive are Gaussian in closed form and the
Laplace approximation with a dense curvature is exact. The MAP is set to its closed form (the
guide is called once to set it up), so these comparisons need no optimisation and hold to float64
rounding; the tolerances are relative 1e-9 unless a comment says otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.optimize
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoLaplaceApproximation
from pyro.infer.autoguide.initialization import init_to_value

from pyro_sgmcmc.guides import AutoLaplace, LaplaceApproximation
from pyro_sgmcmc.guides.curvature import MAX_FULL_DIM

SIGMA = 0.5  # known noise scale
N, D, B = 40, 3, 10


@pytest.fixture(autouse=True)
def clear_param_store():
    """Guides keep their parameters in Pyro's global param store: start every test afresh."""
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _close(a, b, rtol=1e-9):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item() < rtol, (a, b)


@pytest.fixture
def regression(float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.7 + SIGMA * torch.randn(N, generator=g)
    return x, y


def linear_model(x, y, w_scale=1.0, b_scale=2.0):
    """Sites b (scalar) and w (D): sampled in that order, so the guide's vector is (b, w)."""
    b = pyro.sample("b", dist.Normal(0.0, b_scale))
    w = pyro.sample("w", dist.Normal(0.0, w_scale).expand([D]).to_event(1))
    with pyro.plate("data", len(y), subsample_size=B) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w + b, SIGMA), obs=y[idx])


def _design(x):
    return torch.cat([torch.ones(len(x), 1), x], dim=1)  # columns (b, w): the guide's order


def _exact_posterior(x, y, prior_precision):
    """Posterior precision and mean of (b, w) for prior N(0, diag(prior_precision)^-1)."""
    design = _design(x)
    precision = design.T @ design / SIGMA**2 + torch.diag(prior_precision)
    mean = torch.linalg.solve(precision, design.T @ y / SIGMA**2)
    return precision, mean


def _exact_log_evidence(x, y, prior_precision):
    design = _design(x)
    covariance = SIGMA**2 * torch.eye(len(y)) + design @ torch.diag(1 / prior_precision) @ design.T
    return dist.MultivariateNormal(torch.zeros(len(y)), covariance).log_prob(y)


def _laplace(model, x, y, curvature, loc, **kwargs):
    guide = AutoLaplace(model, curvature=curvature, disable_progbar=True, **kwargs)
    guide(x, y)  # set up the prototype, then put the MAP in place
    guide.loc.data = loc.clone()
    return guide.laplace_approximation(x, y)


MODEL_PRECISION = torch.tensor([0.25, 1.0, 1.0, 1.0], dtype=torch.float64)  # b ~ N(0, 2), w ~ N(0, 1)


# ------------------------------------------------------------------ the Gaussian and the guide API
def test_full_laplace_is_the_exact_posterior_of_bayesian_linear_regression(regression):
    x, y = regression
    precision, mean = _exact_posterior(x, y, MODEL_PRECISION)
    laplace = _laplace(linear_model, x, y, "full", mean)
    assert isinstance(laplace, LaplaceApproximation)
    _close(laplace.precision, precision)
    _close(laplace.covariance, torch.linalg.inv(precision))
    posterior = laplace.get_posterior()
    assert isinstance(posterior, dist.MultivariateNormal)
    _close(posterior.covariance_matrix, torch.linalg.inv(precision))
    # the diagonal GGN is the diagonal of the same precision (Gaussian likelihood, linear mean)
    diagonal = _laplace(linear_model, x, y, "diag_ggn", mean)
    _close(diagonal.precision, precision.diagonal())
    assert isinstance(diagonal.get_posterior().base_dist, dist.Normal)


def test_median_quantiles_sampling_and_predictive(regression):
    x, y = regression
    _, mean = _exact_posterior(x, y, MODEL_PRECISION)
    laplace = _laplace(linear_model, x, y, "diag_ggn", mean)
    _close(laplace.median()["w"], mean[1:])
    _close(laplace.median()["b"], mean[0])
    quantiles = laplace.quantiles([0.1, 0.5, 0.9])
    z = dist.Normal(0.0, 1.0).icdf(torch.tensor(0.9))
    _close(quantiles["w"][2] - quantiles["w"][1], z * laplace.scale[1:])
    assert quantiles["w"].shape == (3, D)
    draw = laplace(x, y)
    assert set(draw) == {"b", "w"} and draw["w"].shape == (D,)
    pyro.set_rng_seed(1)
    num_samples = 300
    samples = Predictive(linear_model, guide=laplace, num_samples=num_samples)(x, y)
    assert samples["w"].shape == (num_samples, 1, D) and samples["y"].shape == (num_samples, B)
    # Monte Carlo check of the draws: |mean - loc| < 4 standard errors in every coordinate
    error = (samples["w"].squeeze(1).mean(0) - mean[1:]).abs()
    assert (error < 4 * laplace.scale[1:] / math.sqrt(num_samples)).all()


def test_full_curvature_equals_pyro_autolaplaceapproximation(float64):
    """A full-batch model with a learned (positive) noise scale: the Hessian is not a GGN, and
    'full' must equal the covariance of Pyro's own AutoLaplaceApproximation at the same point."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 2, generator=g)
    y = x @ torch.tensor([1.0, -1.0]) + 0.4 * torch.randn(30, generator=g)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(x @ w, sigma), obs=y)

    pyro.clear_param_store()
    guide = AutoLaplace(model, curvature="full", disable_progbar=True)
    optimizer = pyro.optim.Adam({"lr": 0.05})
    svi = SVI(model, guide, optimizer, Trace_ELBO())
    for _ in range(300):
        svi.step(x, y)
    ours = guide.laplace_approximation(x, y)
    theirs_guide = AutoLaplaceApproximation(model)
    theirs_guide(x, y)
    theirs_guide.loc.data = guide.loc.detach().clone()
    theirs = theirs_guide.laplace_approximation(x, y)
    scale_tril = theirs.scale[:, None] * theirs.scale_tril
    _close(ours.covariance, scale_tril @ scale_tril.T, rtol=1e-8)  # two Cholesky inversions: 1e-8


def test_svi_fits_the_map_minibatch_by_minibatch(float64):
    """SVI with Trace_ELBO on a subsampled plate reaches the full-data MAP of a logistic regression
    (computed by L-BFGS on the full data). The learning rate decays to 1e-3, where the minibatch
    noise of the iterate is below 0.02; the tolerance is 0.05."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(200, 2, generator=g)
    y = torch.bernoulli(torch.sigmoid(x @ torch.tensor([1.5, -1.0])), generator=g)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=20) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    w = torch.zeros(2, requires_grad=True)
    lbfgs = torch.optim.LBFGS([w], line_search_fn="strong_wolfe", max_iter=100)

    def closure():
        lbfgs.zero_grad()
        loss = -dist.Bernoulli(logits=x @ w).log_prob(y).sum() - dist.Normal(0.0, 1.0).log_prob(w).sum()
        loss.backward()
        return loss

    lbfgs.step(closure)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoLaplace(model, disable_progbar=True)
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.05, "lrd": 0.99}), Trace_ELBO())
    for _ in range(500):
        svi.step(x, y)
    assert (guide.loc.detach() - w.detach()).abs().max() < 0.05
    laplace = guide.laplace_approximation(x, y)
    assert laplace.scale.shape == (2,) and (laplace.scale > 0).all()


# ------------------------------------------------------------------ marginal likelihood
def test_refit_log_marginal_likelihood_is_the_exact_evidence(regression):
    """At the model's own prior (textbook formula) and, with evidence="refit", at other prior
    precisions (second-order expansion at the MAP), against log N(y; 0, sigma^2 I + X Sigma_0 X^T)."""
    x, y = regression
    _, mean = _exact_posterior(x, y, MODEL_PRECISION)
    laplace = _laplace(linear_model, x, y, "full", mean)
    _close(laplace.log_marginal_likelihood(), _exact_log_evidence(x, y, MODEL_PRECISION))
    for value in [0.1, 1.0, 30.0]:
        _close(
            laplace.log_marginal_likelihood(value, evidence="refit"), _exact_log_evidence(x, y, torch.full((4,), value))
        )
    per_site = {"b": 0.05, "w": 3.0}
    exact = _exact_log_evidence(x, y, torch.tensor([0.05, 3.0, 3.0, 3.0]))
    _close(laplace.log_marginal_likelihood(per_site, evidence="refit"), exact)
    # the same numbers with a diagonal curvature when the design is orthogonal (X^T X diagonal)
    q, _ = torch.linalg.qr(torch.randn(N, D + 1, generator=torch.Generator().manual_seed(3)))
    x_orth = q[:, 1:] - q[:, 1:].mean(0)  # centred columns: orthogonal to the intercept column
    x_orth, _ = torch.linalg.qr(x_orth)
    precision, mean = _exact_posterior(x_orth, y, MODEL_PRECISION)
    assert (precision - torch.diag(precision.diagonal())).abs().max() < 1e-12
    diagonal = _laplace(linear_model, x_orth, y, "diag_ggn", mean)
    _close(diagonal.log_marginal_likelihood(), _exact_log_evidence(x_orth, y, MODEL_PRECISION))
    _close(
        diagonal.log_marginal_likelihood(7.0, evidence="refit"), _exact_log_evidence(x_orth, y, torch.full((4,), 7.0))
    )


def test_standard_evidence_is_exact_at_the_map_of_each_prior_precision(regression):
    """The standard evidence keeps theta_* fixed; for Bayesian linear regression it is the exact
    evidence when theta_* is the MAP *of that prior* (the log-likelihood is quadratic, so the Laplace
    integral at the right MAP is exact), and below it at another prior's MAP (the exact evidence
    is the refit one, which adds 1/2 b^T Lambda^-1 b >= 0). Float64 rounding: relative 1e-9."""
    x, y = regression
    for value in [0.1, 1.0, 30.0]:
        lam = torch.full((4,), value)
        _, mean = _exact_posterior(x, y, lam)
        laplace = _laplace(linear_model, x, y, "full", mean)
        _close(laplace.log_marginal_likelihood(value), _exact_log_evidence(x, y, lam))
    _, mean = _exact_posterior(x, y, MODEL_PRECISION)
    laplace = _laplace(linear_model, x, y, "full", mean)
    for value in [0.1, 30.0]:  # theta_* is not the MAP of these priors: strictly below the exact evidence
        gap = _exact_log_evidence(x, y, torch.full((4,), value)) - laplace.log_marginal_likelihood(value)
        assert gap > 1e-6, gap


def test_refit_optimize_prior_precision_finds_the_exact_evidence_maximiser(regression):
    """With evidence="refit": scalar and per-site optima against scipy's maximiser of the closed-form evidence. Both
    optimisers stop at gradient tolerances near 1e-7 on a smooth 1-2 parameter problem, so the
    optima agree to relative 1e-4."""
    x, y = regression
    _, mean = _exact_posterior(x, y, MODEL_PRECISION)
    laplace = _laplace(linear_model, x, y, "full", mean)

    def negative_exact(log_lam, groups):
        lam = torch.tensor(np.exp(log_lam))[groups]
        return -_exact_log_evidence(x, y, lam).item()

    scalar = scipy.optimize.minimize(negative_exact, [0.0], args=([0, 0, 0, 0],), method="BFGS", tol=1e-10)
    optimum = laplace.optimize_prior_precision("scalar", evidence="refit")
    assert abs(optimum.item() / math.exp(scalar.x[0]) - 1) < 1e-4
    _close(laplace.prior_precision["w"], optimum)
    # the approximation now uses the optimised Gaussian prior: precision = X^T X / sigma^2 + lambda I
    _close(laplace.precision, _design(x).T @ _design(x) / SIGMA**2 + optimum * torch.eye(4))
    site = scipy.optimize.minimize(negative_exact, [0.0, 0.0], args=([0, 1, 1, 1],), method="BFGS", tol=1e-10)
    optima = laplace.optimize_prior_precision("site", evidence="refit")
    assert abs(optima["b"].item() / math.exp(site.x[0]) - 1) < 1e-4
    assert abs(optima["w"].item() / math.exp(site.x[1]) - 1) < 1e-4
    laplace.set_prior_precision(None)  # back to the model's prior
    _close(laplace.log_marginal_likelihood(), _exact_log_evidence(x, y, MODEL_PRECISION))


# ------------------------------------------------------------------ as_prior (continual learning)
def test_as_prior_propagates_the_posterior_exactly_for_linear_regression(regression):
    """Task 1's posterior as task 2's prior gives the posterior of both tasks' data (one site, full
    curvature, Gaussian likelihood: no approximation anywhere)."""
    x, y = regression
    g = torch.Generator().manual_seed(4)
    x2 = torch.randn(N, D, generator=g)
    y2 = x2 @ torch.tensor([1.0, -2.0, 0.5]) + SIGMA * torch.randn(N, generator=g)
    prior = dist.Normal(0.0, 1.0).expand([D]).to_event(1)

    def make_model(prior):
        def model(x, y):
            w = pyro.sample("w", prior)
            with pyro.plate("data", len(y), subsample_size=B) as idx:
                pyro.sample("y", dist.Normal(x[idx] @ w, SIGMA), obs=y[idx])

        return model

    def exact(xs, ys):
        precision = xs.T @ xs / SIGMA**2 + torch.eye(D)
        return precision, torch.linalg.solve(precision, xs.T @ ys / SIGMA**2)

    _, mean1 = exact(x, y)
    first = _laplace(make_model(prior), x, y, "full", mean1)
    priors = first.as_prior()
    assert set(priors) == {"w"} and priors["w"].event_shape == (D,)
    precision12, mean12 = exact(torch.cat([x, x2]), torch.cat([y, y2]))
    second = _laplace(make_model(priors["w"]), x2, y2, "full", mean12)
    _close(second.precision, precision12)


def test_as_prior_of_a_diagonal_approximation_with_a_constrained_site(float64):
    """A positive site: a LogNormal-like TransformedDistribution whose median is exp(loc)."""

    def model(y):
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(w.sum(), sigma), obs=y)

    y = torch.randn(20, generator=torch.Generator().manual_seed(5))
    guide = AutoLaplace(model, disable_progbar=True, init_loc_fn=init_to_value(values={"sigma": torch.tensor(1.0)}))
    guide(y)
    laplace = guide.laplace_approximation(y)
    priors = laplace.as_prior()
    assert isinstance(priors["sigma"], dist.TransformedDistribution)
    assert isinstance(priors["w"], dist.Independent) and priors["w"].event_shape == (2, 2)
    draws = priors["sigma"].sample((1000,))
    assert (draws > 0).all()
    _close(priors["w"].base_dist.scale.reshape(-1), laplace.scale[laplace.site_slices["w"]])
    log_median = priors["sigma"].base_dist.mean  # the median of exp(N(m, s)) is exp(m)
    _close(log_median, laplace.loc[laplace.site_slices["sigma"]].reshape(()))


# ------------------------------------------------------------------ linearised predictive
def test_glm_predictive_matches_a_brute_force_jacobian(float64):
    """J(x) Sigma J(x)^T with J from autograd, example by example, for a small tanh network."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(25, 2, generator=g)
    y = torch.randint(0, 3, (25,), generator=g)

    def net(params, x):
        return torch.tanh(x @ params["w1"]) @ params["w2"]

    def model(x, y):
        w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, 4]).to_event(2))
        w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
        with pyro.plate("data", len(y), subsample_size=5) as idx:
            pyro.sample("y", dist.Categorical(logits=net({"w1": w1, "w2": w2}, x[idx])), obs=y[idx])

    for curvature in ["diag_ggn", "full_ggn"]:
        loc = torch.randn(20, generator=g)
        laplace = _laplace(model, x, y, curvature, loc)
        prediction = laplace.predict(net, x[:7], batch_size=3)
        covariance = laplace.covariance if curvature == "full_ggn" else torch.diag(laplace.covariance)
        for i in range(7):
            jacobian = torch.autograd.functional.jacobian(lambda z: net(laplace.params(z), x[i : i + 1])[0], loc)
            _close(prediction.covariance[i], jacobian @ covariance @ jacobian.T)
            _close(prediction.mean[i], net(laplace.params(), x[i : i + 1])[0])
        probit = laplace.predict(net, x[:7], link="probit")
        variance = prediction.covariance.diagonal(dim1=-2, dim2=-1)
        _close(probit, torch.softmax(prediction.mean / torch.sqrt(1 + math.pi / 8 * variance), dim=-1))
        mc = laplace.predict(net, x[:7], link="mc", num_samples=20000, generator=torch.Generator().manual_seed(0))
        # an independent Monte Carlo of E[softmax(f)], f ~ N(mean, covariance): each average of
        # 20000 numbers in [0, 1] has a standard error below 0.0035, so 0.02 is over 4 SE for the difference
        normal = dist.MultivariateNormal(prediction.mean, prediction.covariance + 1e-12 * torch.eye(3))
        reference = torch.softmax(normal.sample((20000,)), dim=-1).mean(0)
        assert (mc - reference).abs().max() < 0.02
        _close(mc.sum(-1), torch.ones(7))


def test_glm_predictive_binary_probit_and_regression_variance(regression):
    """One output: sigmoid(mu / sqrt(1 + pi/8 s^2)); regression: the exact predictive variance."""
    x, y = regression
    precision, mean = _exact_posterior(x, y, MODEL_PRECISION)
    laplace = _laplace(linear_model, x, y, "full", mean)

    def linear(params, x):
        return (x @ params["w"] + params["b"]).unsqueeze(-1)

    prediction = laplace.predict(linear, x)
    design = _design(x)
    _close(prediction.covariance[:, 0, 0], torch.einsum("ni,ij,nj->n", design, torch.linalg.inv(precision), design))
    probs = laplace.predict(linear, x, link="probit")
    expected = torch.sigmoid(prediction.mean / torch.sqrt(1 + math.pi / 8 * prediction.covariance[:, :, 0]))
    _close(probs, expected)
    with pytest.raises(ValueError, match="unknown link 'softmax'"):
        laplace.predict(linear, x, link="softmax")


# ------------------------------------------------------------------ bad input
def test_unknown_curvature_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown curvature 'kfac'; accepted: 'diag_ef', 'diag_ggn', 'full'"):
        AutoLaplace(linear_model, curvature="kfac")


def test_laplace_approximation_before_any_fit(regression):
    x, y = regression
    with pytest.raises(ValueError, match="needs a fitted MAP"):
        AutoLaplace(linear_model).laplace_approximation(x, y)


def test_non_positive_prior_precision(regression):
    x, y = regression
    for bad in [0.0, -1.0, float("nan"), {"w": -2.0}]:
        with pytest.raises(ValueError, match=r"prior_precision\S* must be positive"):
            AutoLaplace(linear_model, prior_precision=bad)
    _, mean = _exact_posterior(x, y, MODEL_PRECISION)
    laplace = _laplace(linear_model, x, y, "diag_ggn", mean)
    with pytest.raises(ValueError, match=r"prior_precision\S* must be positive"):
        laplace.set_prior_precision(0.0)
    with pytest.raises(ValueError, match=r"prior_precision\S* must be positive"):
        laplace.log_marginal_likelihood({"b": 1.0, "w": 0.0})
    with pytest.raises(ValueError, match="unknown sites"):
        laplace.set_prior_precision({"v": 1.0})
    with pytest.raises(ValueError, match="mode must be"):
        laplace.optimize_prior_precision("layer")


def test_full_curvature_on_a_model_too_big(float64):
    big = MAX_FULL_DIM + 1

    def model(y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([big]).to_event(1))
        pyro.sample("y", dist.Normal(w.sum(), 1.0), obs=y)

    guide = AutoLaplace(model, curvature="full")
    guide(torch.tensor(0.0))
    with pytest.raises(ValueError, match=f"latent dimension <= {MAX_FULL_DIM}"):
        guide.laplace_approximation(torch.tensor(0.0))


def test_discrete_latent_sites_are_refused():
    def model(y):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z, 1.0), obs=y)

    with pytest.raises(ValueError, match=r"continuous latent sites; \['z'\] are discrete"):
        AutoLaplace(model)(torch.tensor(0.0))


def test_a_non_positive_precision_is_reported_with_its_sites(float64):
    """An improper flat prior and a site the likelihood does not see: the precision is 0 there."""

    def model(y):
        pyro.sample("free", dist.ImproperUniform(dist.constraints.real, (), ()))
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(w, 1.0), obs=y)

    guide = AutoLaplace(model, init_loc_fn=init_to_value(values={"free": torch.tensor(0.0)}))
    guide(torch.tensor(0.0))
    with pytest.raises(ValueError, match=r"not positive for sites \['free'\]"):
        guide.laplace_approximation(torch.tensor(0.0))
    assert guide.laplace_approximation.__doc__


def test_diagonal_as_prior_keeps_each_sites_own_event_dims(float64):
    """The diagonal ``as_prior`` matches ``AutoDiagVI.as_prior``: a site's plate dims stay batch dims.

    ``b`` is sampled inside a (non-subsampled) plate of 4, so its prior must have batch shape (4,)
    and event shape (): a prior with event shape (4,) would not fit ``pyro.plate("units", 4)`` in the
    next task's model (its draws would get shape (4, 4)). ``w`` has one event dim of its own, ``s``
    is a positive scalar and ``p`` lives on the simplex (3 constrained, 2 unconstrained numbers).
    The shapes are exact and the same as AutoDiagVI's on the same model; then the priors are
    plugged back into the model, which must run with every site keeping its shape.
    """
    from pyro_sgmcmc.guides import AutoDiagVI

    def model(y, priors=None):
        priors = priors or {}
        w = pyro.sample("w", priors.get("w", dist.Normal(torch.zeros(3), 1.0).to_event(1)))
        s = pyro.sample("s", priors.get("s", dist.HalfNormal(1.0)))
        with pyro.plate("units", 4):
            b = pyro.sample("b", priors.get("b", dist.Normal(0.0, 1.0)))
        p = pyro.sample("p", priors.get("p", dist.Dirichlet(torch.ones(3))))
        mean = w.sum() + b.sum() + (p * torch.arange(3.0)).sum()
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(mean, s), obs=y)

    y = torch.randn(30, generator=torch.Generator().manual_seed(3))
    guide = AutoLaplace(model, disable_progbar=True, init_loc_fn=init_to_value(values={"s": torch.tensor(1.0)}))
    guide(y)
    priors = guide.laplace_approximation(y).as_prior()
    shapes = {name: (tuple(d.batch_shape), tuple(d.event_shape)) for name, d in priors.items()}
    assert shapes == {"w": ((), (3,)), "s": ((), ()), "b": ((4,), ()), "p": ((), (3,))}
    vi = AutoDiagVI(model)
    vi(y)
    vi_shapes = {name: (tuple(d.batch_shape), tuple(d.event_shape)) for name, d in vi.as_prior().items()}
    assert shapes == vi_shapes
    trace = pyro.poutine.trace(model).get_trace(y, priors)
    assert {name: tuple(trace.nodes[name]["value"].shape) for name in priors} == {
        "w": (3,), "s": (), "b": (4,), "p": (3,)
    }  # fmt: skip
    assert torch.isfinite(trace.log_prob_sum())


# ------------------------------------------------------------------ Gaussian noise scale
def _ridge(x, y, lam, sigma):
    design = _design(x)
    precision = design.T @ design / sigma**2 + lam * torch.eye(D + 1)
    return torch.linalg.solve(precision, design.T @ y / sigma**2)


def _exact_evidence_at(x, y, lam, sigma):
    design = _design(x)
    covariance = sigma**2 * torch.eye(len(y)) + design @ design.T / lam
    return dist.MultivariateNormal(torch.zeros(len(y)), covariance).log_prob(y)


def test_evidence_at_another_noise_scale_is_exact_at_its_map(regression):
    """The model's noise is SIGMA = 0.5; at (lambda, sigma) with theta_* the MAP of that prior and
    noise, the standard evidence with sigma_noise=sigma is the exact evidence
    log N(y; 0, sigma^2 I + X X^T / lambda) (the log-likelihood is quadratic). Float64: 1e-9."""
    x, y = regression
    for lam, sigma in [(0.5, 0.3), (4.0, 1.2)]:
        laplace = _laplace(linear_model, x, y, "full", _ridge(x, y, lam, sigma))
        assert laplace.has_gaussian_noise
        _close(laplace.log_marginal_likelihood(lam, sigma_noise=sigma), _exact_evidence_at(x, y, lam, sigma))
        laplace.set_prior_precision(lam)
        laplace.set_sigma_noise(sigma)  # the precision follows: X^T X / sigma^2 + lambda I
        _close(laplace.precision, _design(x).T @ _design(x) / sigma**2 + lam * torch.eye(D + 1))
        _close(laplace.log_marginal_likelihood(), _exact_evidence_at(x, y, lam, sigma))


def test_tune_sigma_noise_finds_the_joint_maximiser(regression):
    """At a fixed theta_*, (lambda, sigma) against scipy's maximiser of the evidence written from
    the data directly: sum log N(y | X theta_*, sigma) + log N(theta_* | 0, 1/lambda) + d/2 log 2 pi
    - 1/2 log det(X^T X / sigma^2 + lambda I). A smooth 2-d problem, both optimisers at gradient
    tolerances ~1e-8: relative 1e-5."""
    x, y = regression
    theta = _ridge(x, y, 1.0, SIGMA)
    laplace = _laplace(linear_model, x, y, "full", theta)
    design = _design(x)

    def negative(params):
        lam, sigma = math.exp(params[0]), math.exp(params[1])
        log_lik = dist.Normal(design @ theta, sigma).log_prob(y).sum()
        log_prior = dist.Normal(0.0, lam**-0.5).log_prob(theta).sum()
        logdet = torch.logdet(design.T @ design / sigma**2 + lam * torch.eye(D + 1))
        return -(log_lik + log_prior + 0.5 * (D + 1) * math.log(2 * math.pi) - 0.5 * logdet).item()

    reference = np.exp(scipy.optimize.minimize(negative, [0.0, 0.0], method="BFGS", tol=1e-12).x)
    optimum = laplace.optimize_prior_precision("scalar", tune_sigma_noise=True)
    assert abs(optimum.item() / reference[0] - 1) < 1e-5, (optimum, reference)
    assert abs(laplace.sigma_noise.item() / reference[1] - 1) < 1e-5, (laplace.sigma_noise, reference)
    assert abs(laplace.sigma_noise.item() / SIGMA - 1) > 1e-2  # the data's own noise differs from the model's


def test_sigma_noise_needs_a_fixed_gaussian_likelihood(float64):
    def logistic(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)

    x = torch.randn(20, 2, generator=torch.Generator().manual_seed(0))
    laplace = _laplace(logistic, x, (x[:, 0] > 0).double(), "full", torch.zeros(2))
    assert not laplace.has_gaussian_noise
    with pytest.raises(ValueError, match="tune_sigma_noise=True needs a Gaussian likelihood"):
        laplace.optimize_prior_precision(tune_sigma_noise=True)
    with pytest.raises(ValueError, match="sigma_noise needs a Gaussian likelihood"):
        laplace.log_marginal_likelihood(1.0, sigma_noise=0.5)


def test_mc_fisher_is_the_deprecated_spelling_of_monte_carlo_fisher():
    """``mc_fisher=`` still works for one release, with a FutureWarning naming the new spelling, in
    the guide and in the curvature function."""
    import pyro.distributions as dist

    from pyro_sgmcmc import ModelPotential
    from pyro_sgmcmc.guides import AutoLaplace
    from pyro_sgmcmc.guides.curvature import likelihood_curvature

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=4) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    with pytest.warns(FutureWarning, match="monte_carlo_fisher"):
        guide = AutoLaplace(model, mc_fisher=True)
    assert guide.monte_carlo_fisher is True
    with pytest.warns(FutureWarning, match="monte_carlo_fisher"):
        assert guide.mc_fisher is True
    x = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).float()
    potential = ModelPotential(model, (x, y))
    with pytest.warns(FutureWarning, match="monte_carlo_fisher"):
        result = likelihood_curvature(potential, torch.zeros(2), "diag_ggn", mc_fisher=False, disable_progbar=True)
    expected = likelihood_curvature(potential, torch.zeros(2), "diag_ggn", disable_progbar=True)
    assert torch.equal(result.curvature, expected.curvature)
