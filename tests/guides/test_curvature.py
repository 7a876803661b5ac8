"""Curvature of the log-likelihood and the prior, against brute-force references.

Every test runs in float64 with fixed data. The references are computed with plain autograd on
plain torch functions (no Pyro), one example at a time, so they share no code with the sweep.
Tolerances: the quantities are equal in exact arithmetic, so the comparisons allow only float64
rounding accumulated over a few hundred terms (relative 1e-9), except the Monte Carlo test.
"""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc import ModelPotential
from pyro_sgmcmc.guides.curvature import Curvature, likelihood_curvature, prior_terms

RTOL = 1e-9  # float64 rounding over sums of ~100 products; the quantities agree exactly otherwise
PATHS = ["per-example", "jacobian"]


def _data(n=53, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, g


def _close(a, b, rtol=RTOL):
    scale = b.abs().max().clamp(min=1e-300)
    assert ((a - b).abs().max() / scale).item() < rtol, (a, b)


# ------------------------------------------------------------------ Gaussian linear regression
def test_diag_ggn_equals_exact_hessian_diagonal_for_gaussian_regression(float64):
    """Normal likelihood, linear mean: GGN = Hessian = X^T X / sigma^2 (N = 53, B = 10: the last
    chunk of the Jacobian path overlaps the one before it, and the mask must drop the repeats)."""
    x, g = _data()
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(53, generator=g)
    sigma = 0.7

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=10) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])

    potential = ModelPotential(model, (x, y))
    position = torch.tensor([0.3, -0.1, 0.8])
    exact = x.T @ x / sigma**2
    for path in PATHS:
        diag = likelihood_curvature(potential, position, "diag_ggn", disable_progbar=True, path=path)
        _close(diag.curvature, exact.diagonal())
        full = likelihood_curvature(potential, position, "full_ggn", disable_progbar=True, path=path)
        _close(full.curvature, exact)
        assert diag.num_terms == 53
        loglik = dist.Normal(x @ position, sigma).log_prob(y).sum()
        _close(diag.log_likelihood, loglik)
    hessian = likelihood_curvature(potential, position, "full", disable_progbar=True)
    _close(hessian.curvature, exact)


# ------------------------------------------------------------------ a small nonlinear network
def _mlp(theta, x, hidden=4, d_in=3, out=3):
    """theta = (W1 (hidden x d_in), b1, W2 (out x hidden), b2) flattened, in the order of site names."""
    sizes = [("b1", hidden), ("b2", out), ("w1", hidden * d_in), ("w2", out * hidden)]
    parts, offset = {}, 0
    for name, size in sizes:
        parts[name] = theta[offset : offset + size]
        offset += size
    h = torch.tanh(x @ parts["w1"].reshape(hidden, d_in).T + parts["b1"])
    return h @ parts["w2"].reshape(out, hidden).T + parts["b2"]


def _mlp_model(likelihood, out, n, batch):
    def model(x, y):
        b1 = pyro.sample("b1", dist.Normal(0.0, 1.0).expand([4]).to_event(1))
        b2 = pyro.sample("b2", dist.Normal(0.0, 1.0).expand([out]).to_event(1))
        w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([4 * 3]).to_event(1))
        w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([out * 4]).to_event(1))
        theta = torch.cat([b1, b2, w1, w2])
        plate = pyro.plate("data", n, subsample_size=batch)
        f = _mlp(theta, x[plate.indices], out=out)
        with plate:
            pyro.sample("y", likelihood(f), obs=y[plate.indices])

    return model


def _per_example_rows(theta, x, fn):
    """Rows g_{n,k} = d fn(theta, x_n)_k / d theta by one backward pass each (plain autograd)."""
    rows = []
    for n in range(x.shape[0]):
        z = theta.clone().requires_grad_(True)
        values = fn(z, x[n : n + 1]).reshape(-1)
        for value in values:
            (grad,) = torch.autograd.grad(value, z, retain_graph=True)
            rows.append(grad)
    return torch.stack(rows)


CASES = {
    # name: (likelihood, number of outputs, labels, reference Fisher factor A^T f per example)
    "categorical": (
        lambda f: dist.Categorical(logits=f),
        3,
        lambda g, n: torch.randint(0, 3, (n,), generator=g),
        lambda f, p: p.sqrt() * (f.log_softmax(-1) - (p * f.log_softmax(-1)).sum(-1, keepdim=True)),
    ),
    "bernoulli": (
        lambda f: dist.Bernoulli(logits=f.squeeze(-1)),
        1,
        lambda g, n: torch.randint(0, 2, (n,), generator=g).double(),
        lambda f, p: (p * (1 - p)).sqrt() * f,
    ),
    "normal": (
        lambda f: dist.Normal(f.squeeze(-1), 0.4),
        1,
        lambda g, n: torch.randn(n, generator=g, dtype=torch.float64),
        lambda f, p: f / 0.4,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ggn_is_exact_for_categorical_bernoulli_normal(case, float64):
    """diag_ggn and full_ggn equal sum_n J_n^T F_n J_n with F the closed-form Fisher of the output
    distribution: diag(p) - p p^T (Categorical logits), p(1-p) (Bernoulli logit), 1/sigma^2 (Normal loc).
    The reference factors F = A A^T and differentiates A^T f with A held fixed, example by example."""
    likelihood, out, labels, factor = CASES[case]
    n = 23
    x, g = _data(n)
    y = labels(g, n)
    model = _mlp_model(likelihood, out, n, batch=5)
    potential = ModelPotential(model, (x, y))
    d = potential.dim
    theta = 0.7 * torch.randn(d, generator=g, dtype=torch.float64)

    def whitened(z, xn):
        f = _mlp(z, xn, out=out)
        if case == "categorical":
            p = f.detach().softmax(-1)
        elif case == "bernoulli":
            p = torch.sigmoid(f.detach())
        else:
            p = None
        return factor(f, p)

    rows = _per_example_rows(theta, x, whitened)
    for path in PATHS:
        diag = likelihood_curvature(potential, theta, "diag_ggn", disable_progbar=True, path=path)
        _close(diag.curvature, (rows**2).sum(0))
        full = likelihood_curvature(potential, theta, "full_ggn", disable_progbar=True, path=path)
        _close(full.curvature, rows.T @ rows)


def test_empirical_fisher_equals_loop_over_single_examples(float64):
    """diag_ef = sum_n (grad log p(y_n | theta))^2 with per-example gradients from a Python loop over
    the examples; it is not the square of the minibatch gradient (checked too)."""
    n = 23
    x, g = _data(n)
    y = torch.randint(0, 3, (n,), generator=g)
    model = _mlp_model(lambda f: dist.Categorical(logits=f), 3, n, batch=5)
    potential = ModelPotential(model, (x, y))
    theta = 0.7 * torch.randn(potential.dim, generator=g, dtype=torch.float64)
    reference = torch.zeros(potential.dim)
    for i in range(n):
        z = theta.clone().requires_grad_(True)
        log_p = dist.Categorical(logits=_mlp(z, x[i : i + 1])).log_prob(y[i : i + 1]).sum()
        (grad,) = torch.autograd.grad(log_p, z)
        reference += grad**2
    for path in PATHS:
        ef = likelihood_curvature(potential, theta, "diag_ef", disable_progbar=True, path=path)
        _close(ef.curvature, reference)
    z = theta.clone().requires_grad_(True)
    (batch_grad,) = torch.autograd.grad(dist.Categorical(logits=_mlp(z, x)).log_prob(y).sum(), z)
    assert not torch.allclose(batch_grad**2, reference)


def test_full_is_the_exact_hessian_with_a_learned_noise_scale(float64):
    """curvature='full' is the Hessian of -sum_n log p(y_n | theta), here with a LogNormal-free
    positive scale (unconstrained log sigma), where the Hessian differs from the GGN."""
    n = 17
    x, g = _data(n, d=2)
    y = x @ torch.tensor([1.0, -1.0]) + 0.5 * torch.randn(n, generator=g)

    def model(x, y):
        sigma = pyro.sample("sigma", dist.HalfNormal(2.0))
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=4) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])

    potential = ModelPotential(model, (x, y))
    position = torch.tensor([math.log(0.6), 0.9, -1.1])  # (log sigma, w): sorted names

    def negative_loglik(z):
        return -dist.Normal(x @ z[1:], z[0].exp()).log_prob(y).sum()

    reference = torch.autograd.functional.hessian(negative_loglik, position)
    result = likelihood_curvature(potential, position, "full", disable_progbar=True)
    _close(result.curvature, reference)
    ggn = likelihood_curvature(potential, position, "full_ggn", disable_progbar=True)
    assert not torch.allclose(ggn.curvature, reference)  # the Hessian is not the Fisher off the MAP
    # The scale's Fisher block is 2 / sigma^2 per example on d sigma: 2 n in log-sigma coordinates.
    assert abs(ggn.curvature[0, 0].item() - 2 * n) < 1e-9 * n


def test_monte_carlo_fisher_for_a_poisson_likelihood(float64):
    """A Poisson likelihood has no closed form here: diag_ggn draws labels. Its Fisher on the log
    rate is the rate, so the exact diagonal is sum_n rate_n x_n^2. With S = 400 labels per example
    the estimate's relative standard error is below 1.5% (Var[(k - r)^2] = r + 2 r^2 for Poisson),
    so the tolerance is 6%, four standard errors."""
    n = 40
    x, g = _data(n, d=2)
    y = torch.poisson(torch.exp(x @ torch.tensor([0.5, -0.3])), generator=g)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=10) as idx:
            pyro.sample("y", dist.Poisson((x[idx] @ w).exp()), obs=y[idx])

    potential = ModelPotential(model, (x, y))
    position = torch.tensor([0.5, -0.3])
    rate = torch.exp(x @ position)
    exact = (rate[:, None] * x**2).sum(0)
    variance = ((rate + 2 * rate**2)[:, None] * x**4).sum(0) / 400
    pyro.set_rng_seed(0)
    estimate = likelihood_curvature(potential, position, "diag_ggn", num_mc_samples=400, disable_progbar=True)
    assert ((estimate.curvature - exact).abs() < 4 * variance.sqrt()).all(), (estimate.curvature, exact)
    assert ((estimate.curvature - exact).abs() / exact < 0.06).all()


def test_a_model_that_hard_codes_the_minibatch_size_takes_the_per_example_route(float64):
    """A model with a shape hard-coded to the minibatch size: the per-example route runs the model on
    chunks of the plate's own ``subsample_size`` (never on one index), so it needs no fallback and
    gives the exact result, without a warning."""
    x, g = _data(20)
    y = torch.randn(20, generator=g)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=5) as idx:
            offset = torch.zeros(5)  # hard-coded batch size
            pyro.sample("y", dist.Normal(x[idx] @ w + offset, 1.0), obs=y[idx])

    potential = ModelPotential(model, (x, y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = likelihood_curvature(potential, torch.zeros(3), "diag_ggn", disable_progbar=True)
    assert result.method == "per-example"
    _close(result.curvature, (x**2).sum(0))


def test_an_observed_site_outside_the_plate_counts_once(float64):
    """A global observation (outside the data plate) is one likelihood term, not one per example."""
    x, g = _data(20)
    y = torch.randn(20, generator=g)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        pyro.sample("anchor", dist.Normal(w.sum(), 0.5), obs=torch.tensor(1.0))
        with pyro.plate("data", len(y), subsample_size=5) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])

    potential = ModelPotential(model, (x, y))
    exact = (x**2).sum(0) + 1 / 0.25
    for path in PATHS:
        result = likelihood_curvature(potential, torch.zeros(3), "diag_ggn", disable_progbar=True, path=path)
        _close(result.curvature, exact)


# ------------------------------------------------------------------ prior
def test_prior_curvature_is_the_exact_hessian_of_the_unconstrained_log_prior(float64):
    """Normal(0, 2) prior: precision 1/4. Gamma prior on a positive site (unconstrained u = log s):
    -d^2/du^2 [log Gamma(e^u; a, b) + u] = b e^u. Dirichlet site (stick-breaking, not elementwise):
    the diagonal of the autograd Hessian of the log density with its log-det-Jacobian."""

    def model():
        pyro.sample("w", dist.Normal(0.0, 2.0).expand([3]).to_event(1))
        pyro.sample("s", dist.Gamma(3.0, 2.0))
        pyro.sample("p", dist.Dirichlet(torch.tensor([1.5, 2.0, 3.0])))

    potential = ModelPotential(model)
    assert potential.site_names == ["p", "s", "w"]
    position = torch.tensor([0.2, -0.4, math.log(1.3), 0.1, -0.2, 0.3])
    result = prior_terms(potential, position)
    full = prior_terms(potential, position, full=True)

    def log_density(z):
        transform = torch.distributions.biject_to(dist.Dirichlet(torch.ones(3)).support)
        p = transform(z[:2])
        total = dist.Dirichlet(torch.tensor([1.5, 2.0, 3.0])).log_prob(p) + transform.log_abs_det_jacobian(z[:2], p)
        total = total + dist.Gamma(3.0, 2.0).log_prob(z[2].exp()) + z[2]
        return total + dist.Normal(0.0, 2.0).log_prob(z[3:]).sum()

    hessian = torch.autograd.functional.hessian(log_density, position)
    _close(full.curvature, -hessian)
    _close(result.curvature, -hessian.diagonal())
    _close(result.curvature[3:], torch.full((3,), 0.25))
    _close(result.curvature[2], torch.tensor(2.0 * 1.3))
    _close(result.log_density, log_density(position))
    _close(result.mean[3:], torch.zeros(3), rtol=1.0)  # the Normal prior's mean; 0 for constrained sites


def test_unknown_curvature_lists_the_accepted_names():
    with pytest.raises(ValueError, match="accepted: 'diag_ef', 'diag_ggn', 'full', 'full_ggn'"):
        Curvature.parse("kfac")
    assert Curvature.parse("diag_ef") is Curvature.DIAG_EF


def test_a_likelihood_that_cannot_be_sampled_asks_for_the_empirical_fisher(float64):
    """``pyro.factor`` terms have no distribution to draw labels from: diag_ggn says to use diag_ef,
    which works on them (its terms are log-densities only)."""

    def model(y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y), subsample_size=2) as idx:
            pyro.factor("f", -((w - y[idx]) ** 2))

    potential = ModelPotential(model, (torch.arange(6.0),))
    with pytest.raises(ValueError, match="use curvature='diag_ef'"):
        likelihood_curvature(potential, torch.zeros(1), "diag_ggn", disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = likelihood_curvature(potential, torch.zeros(1), "diag_ef", disable_progbar=True)
    # d/dw of -(w - y)^2 at w = 0 is 2 y: the sum of squares is 4 * sum(y^2) = 4 * 55
    assert abs(result.curvature.item() - 220.0) < 1e-9


# ------------------------------------------------------------------ networks of nn.Linear layers
class _Net(PyroModule):
    def __init__(self, out: int, center: bool = False):
        super().__init__()
        self.center = center
        self.hidden = PyroModule[torch.nn.Linear](3, 5)
        self.hidden.weight = PyroSample(dist.Normal(0.0, 1.0).expand([5, 3]).to_event(2))
        self.hidden.bias = PyroSample(dist.Normal(0.0, 1.0).expand([5]).to_event(1))
        self.out = PyroModule[torch.nn.Linear](5, out)
        self.out.weight = PyroSample(dist.Normal(0.0, 1.0).expand([out, 5]).to_event(2))
        self.out.bias = PyroSample(dist.Normal(0.0, 1.0).expand([out]).to_event(1))

    def forward(self, x):
        h = torch.tanh(self.hidden(x))
        if self.center:  # mixes the examples of a minibatch, as batch norm does
            h = h - h.mean(0)
        return self.out(h)


@pytest.mark.parametrize("likelihood", ["categorical", "normal"])
@pytest.mark.parametrize("curvature", ["diag_ef", "diag_ggn"])
def test_linear_layer_path_equals_per_example_gradients(likelihood, curvature, float64):
    """For a PyroModule of nn.Linear layers the sweep uses sum_n (delta_n a_n^T)^2 = (delta^2)^T (a^2)
    from layer inputs and output gradients; it must equal the vmap per-example gradients."""
    n = 37
    x, g = _data(n)
    out = 3 if likelihood == "categorical" else 1
    y = torch.randint(0, 3, (n,), generator=g) if likelihood == "categorical" else torch.randn(n, generator=g)
    pyro.set_rng_seed(0)
    net = _Net(out).double()

    def model(x, y):
        plate = pyro.plate("data", n, subsample_size=8)
        f = net(x[plate.indices])
        with plate:
            fn = dist.Categorical(logits=f) if likelihood == "categorical" else dist.Normal(f.squeeze(-1), 0.3)
            pyro.sample("y", fn, obs=y[plate.indices])

    potential = ModelPotential(model, (x, y))
    theta = torch.randn(potential.dim, generator=g, dtype=torch.float64)
    fast = likelihood_curvature(potential, theta, curvature, disable_progbar=True)
    assert fast.method == "linear-layers"
    reference = likelihood_curvature(potential, theta, curvature, disable_progbar=True, path="per-example")
    assert reference.method == "per-example"
    _close(fast.curvature, reference.curvature)
    _close(fast.log_likelihood, reference.log_likelihood)


def test_examples_that_interact_fall_back_to_per_example_gradients(float64):
    """A network that centres its hidden layer over the minibatch: the layer trick would be wrong,
    the check on the first examples sees it and the sweep uses per-example gradients instead."""
    n = 12
    x, g = _data(n)
    y = torch.randint(0, 3, (n,), generator=g)
    pyro.set_rng_seed(0)
    net = _Net(3, center=True).double()

    def model(x, y):
        plate = pyro.plate("data", n, subsample_size=4)
        f = net(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=f), obs=y[plate.indices])

    potential = ModelPotential(model, (x, y))
    theta = torch.randn(potential.dim, generator=g, dtype=torch.float64)
    result = likelihood_curvature(potential, theta, "diag_ggn", disable_progbar=True)
    assert result.method == "per-example"


def test_monte_carlo_labels_for_a_categorical_network_match_the_exact_fisher(float64):
    """monte_carlo_fisher=True draws labels even where the Fisher is known: the trace of the estimate is
    within 5% of the exact diagonal GGN's. With 37 examples x 1000 labels its relative standard
    error is about 1% (each label's squared gradient has a relative sd of order 2), so 5% is about
    five standard errors. The linear-layer route handles the sampled rows too."""
    n = 37
    x, g = _data(n)
    y = torch.randint(0, 3, (n,), generator=g)
    pyro.set_rng_seed(0)
    net = _Net(3).double()

    def model(x, y):
        plate = pyro.plate("data", n, subsample_size=8)
        f = net(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=f), obs=y[plate.indices])

    potential = ModelPotential(model, (x, y))
    theta = torch.randn(potential.dim, generator=g, dtype=torch.float64)
    exact = likelihood_curvature(potential, theta, "diag_ggn", disable_progbar=True)
    estimate = likelihood_curvature(potential, theta, "diag_ggn", monte_carlo_fisher=True, num_mc_samples=1000,
                                    disable_progbar=True)  # fmt: skip
    assert estimate.method == "linear-layers"
    assert abs(estimate.curvature.sum() / exact.curvature.sum() - 1) < 0.05
