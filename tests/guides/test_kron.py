"""Kronecker-factored (K-FAC) Laplace: ``AutoLaplace(curvature="kron")``.

Oracles:

* a single ``nn.Linear`` layer with a Gaussian likelihood of fixed scale, where every example has
  the same output curvature :math:`G_n = I/\\sigma^2`, so K-FAC is exact: without a bias the whole
  precision equals the dense GGN (``full_ggn``), and for a linear-Gaussian model that is also the
  exact posterior precision, so the evidence is the exact evidence;
* for a two-layer tanh network (where K-FAC is an approximation), the two facts that still hold
  exactly: a bias block is :math:`\\sum_n G_n`, equal to the dense GGN's bias block, and a weight
  block is that same :math:`G` times :math:`A = \\frac1N\\sum_n a_n a_n^\\top`, computed here from
  the layer inputs directly;
* the Gaussian's operations (draws, log-density, marginal variances, GLM predictive) against the
  dense matrix of the same precision.

Float64 throughout; the K-FAC arithmetic differs from the dense one only by rounding, so the
tolerance is relative 1e-8 (eigendecompositions of small, well-conditioned factors).
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc.guides import AutoLaplace
from pyro_sgmcmc.guides.kron import KroneckerNormal

RTOL = 1e-8
N, B, D_IN, D_OUT, SIGMA = 30, 10, 3, 2, 0.4


@pytest.fixture(autouse=True)
def clear_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _close(a, b, rtol=RTOL):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item() < rtol, (a, b)


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D_IN, generator=g, dtype=torch.float64)
    y = x @ torch.randn(D_IN, D_OUT, generator=g, dtype=torch.float64) + SIGMA * torch.randn(
        N, D_OUT, generator=g, dtype=torch.float64
    )
    return x, y


class _Linear(PyroModule):
    """One nn.Linear layer with Normal(0, 1) weights (and bias), a Gaussian likelihood of fixed scale."""

    def __init__(self, bias: bool):
        super().__init__()
        self.layer = PyroModule[torch.nn.Linear](D_IN, D_OUT, bias=bias).double()
        self.layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([D_OUT, D_IN]).to_event(2))
        if bias:
            self.layer.bias = PyroSample(dist.Normal(0.0, 2.0).expand([D_OUT]).to_event(1))

    def forward(self, x, y):
        plate = pyro.plate("data", len(x), subsample_size=B)  # the layer runs outside it: global weights
        mean = self.layer(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Normal(mean, SIGMA).to_event(1), obs=y[plate.indices])


class _Mlp(PyroModule):
    def __init__(self):
        super().__init__()
        self.hidden = PyroModule[torch.nn.Linear](D_IN, 4).double()
        self.hidden.weight = PyroSample(dist.Normal(0.0, 1.0).expand([4, D_IN]).to_event(2))
        self.hidden.bias = PyroSample(dist.Normal(0.0, 1.0).expand([4]).to_event(1))
        self.out = PyroModule[torch.nn.Linear](4, 3).double()
        self.out.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 4]).to_event(2))
        self.out.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    def logits(self, x):
        return self.out(torch.tanh(self.hidden(x)))

    def forward(self, x, y):
        plate = pyro.plate("data", len(x), subsample_size=B)
        logits = self.logits(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[plate.indices])


def _approximations(model, args, loc, *curvatures, **kwargs):
    """Laplace approximations of ``model`` at the same point ``loc`` (guide order), one per curvature."""
    out = []
    for curvature in curvatures:
        pyro.clear_param_store()
        guide = AutoLaplace(model, curvature=curvature, disable_progbar=True, **kwargs)
        guide(*args)
        guide.loc.data = loc.clone()
        out.append(guide.laplace_approximation(*args))
    return out


def test_kron_is_exact_for_one_linear_layer_with_a_gaussian_likelihood(float64):
    """No bias: precision, covariance, evidence and the evidence-optimal prior precision equal those
    of the dense GGN, which for this linear-Gaussian model is the exact posterior."""
    x, y = _data()
    model = _Linear(bias=False)
    loc = torch.randn(D_IN * D_OUT, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    kron, full = _approximations(model, (x, y), loc, "kron", "full_ggn")
    assert kron.is_kron and not kron.is_diagonal
    dense = kron.posterior_precision.dense()
    _close(dense, full.precision)
    _close(kron.covariance, full.covariance)
    _close(kron.scale, full.scale)  # marginal sds
    _close(kron.log_marginal_likelihood(), full.log_marginal_likelihood())
    _close(kron.log_marginal_likelihood(0.3), full.log_marginal_likelihood(0.3))
    _close(kron.optimize_prior_precision(), full.optimize_prior_precision(), rtol=1e-6)  # L-BFGS stopping


def test_kron_bias_and_weight_blocks(float64):
    """With a bias, K-FAC drops the weight-bias cross terms only: both diagonal blocks are exact."""
    x, y = _data()
    model = _Linear(bias=True)
    d = D_IN * D_OUT + D_OUT
    loc = torch.randn(d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    kron, full = _approximations(model, (x, y), loc, "kron", "full_ggn")
    dense = kron.posterior_precision.dense()
    for name in ("layer.weight", "layer.bias"):
        where = kron.site_slices[name]
        _close(dense[where, where], full.precision[where, where])
    weight, bias = kron.site_slices["layer.weight"], kron.site_slices["layer.bias"]
    assert dense[weight, bias].abs().max() == 0  # independent sites
    assert full.precision[weight, bias].abs().max() > 1.0  # which the exact precision is not


def test_kron_factors_of_a_two_layer_network(float64):
    """K-FAC is approximate here; its bias blocks are exactly the dense GGN's, and each weight block
    is exactly (bias block of the same layer) (x) A with A = sum_n a_n a_n^T / N from the layer inputs."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, D_IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (N,), generator=g)
    pyro.set_rng_seed(0)
    model = _Mlp()
    d = 4 * D_IN + 4 + 3 * 4 + 3
    loc = 0.7 * torch.randn(d, generator=g, dtype=torch.float64)
    kron, full = _approximations(model, (x, y), loc, "kron", "full_ggn")
    dense = kron.posterior_precision.dense()
    params = kron.params()
    inputs = {"hidden": x, "out": torch.tanh(x @ params["hidden.weight"].T + params["hidden.bias"])}
    for layer in ("hidden", "out"):
        bias = kron.site_slices[f"{layer}.bias"]
        weight = kron.site_slices[f"{layer}.weight"]
        _close(dense[bias, bias], full.precision[bias, bias])
        a = inputs[layer].T @ inputs[layer] / N
        _close(
            dense[weight, weight],
            torch.kron(full.precision[bias, bias] - torch.eye(bias.stop - bias.start), a)
            + torch.eye(weight.stop - weight.start),
        )  # the model's N(0, 1) prior adds I to both blocks
    # the approximation is not the exact GGN: the weight blocks differ
    weight = kron.site_slices["out.weight"]
    assert (dense[weight, weight] - full.precision[weight, weight]).abs().max() > 1e-3


def test_kron_gaussian_operations_match_the_dense_precision(float64):
    """Draws, log-density, marginals, quantiles, GLM predictive, Predictive and as_prior."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N, D_IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (N,), generator=g)
    pyro.set_rng_seed(0)
    model = _Mlp()
    d = 4 * D_IN + 4 + 3 * 4 + 3
    loc = 0.7 * torch.randn(d, generator=g, dtype=torch.float64)
    (kron,) = _approximations(model, (x, y), loc, "kron")
    precision = kron.posterior_precision.dense()
    covariance = torch.linalg.inv(precision)
    posterior = kron.get_posterior()
    assert isinstance(posterior, KroneckerNormal)
    reference = dist.MultivariateNormal(loc, precision_matrix=precision)
    points = reference.sample((5,))
    _close(posterior.log_prob(points), reference.log_prob(points))
    _close(kron.scale**2, covariance.diagonal())
    _close(kron.covariance, covariance)
    # draws: Lambda^-1/2 applied twice is Lambda^-1 (exact), and the sample covariance agrees to
    # Monte Carlo error: 4000 draws give a relative standard error of about sqrt(2/4000) = 0.022 on a
    # variance, so 0.1 is over 4 standard errors on every coordinate
    v = torch.randn(d, generator=g, dtype=torch.float64)
    _close(kron.posterior_precision.apply_power(kron.posterior_precision.apply_power(v, -0.5), -0.5), covariance @ v)
    pyro.set_rng_seed(1)
    draws = posterior.sample((4000,))
    assert ((draws.var(0) / covariance.diagonal() - 1).abs() < 0.1).all()
    quantiles = kron.quantiles([0.5, 0.8413447460685429])  # +1 sd
    _close(quantiles["out.bias"][1] - quantiles["out.bias"][0], kron.scale[kron.site_slices["out.bias"]])
    # the GLM predictive: J Sigma J^T with the dense covariance
    prediction = kron.predict(lambda params, inputs: pyro.poutine.condition(model.logits, data=params)(inputs), x[:4])

    def logits(theta, inputs):
        return pyro.poutine.condition(model.logits, data=kron.params(theta))(inputs)

    jacobian = torch.autograd.functional.jacobian(lambda t: logits(t, x[:4]), loc)  # (4, 3, d)
    _close(prediction.covariance, jacobian @ covariance @ jacobian.transpose(-1, -2))
    # Predictive and as_prior
    samples = Predictive(model, guide=kron, num_samples=7)(x, y)
    assert samples["out.weight"].shape[-2:] == (3, 4) and samples["y"].shape[-1] == B
    priors = kron.as_prior()
    assert priors["out.weight"].event_shape == (3, 4) and priors["out.bias"].event_shape == (3,)
    where = kron.site_slices["out.weight"]
    value = loc[where] + 0.1
    block = dist.MultivariateNormal(loc[where], precision_matrix=precision[where, where])
    _close(priors["out.weight"].log_prob(value.reshape(3, 4)), block.log_prob(value))


def test_kron_refuses_models_that_are_not_linear_layers(float64):
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D_IN]).to_event(1))
        with pyro.plate("data", len(x), subsample_size=B) as idx:
            pyro.sample("y", dist.Normal(torch.sin(x[idx] @ w), SIGMA), obs=y[idx, 0])

    x, y = _data()
    guide = AutoLaplace(model, curvature="kron", disable_progbar=True)
    guide(x, y)
    with pytest.raises(ValueError, match="curvature='kron' needs a network of F.linear layers"):
        guide.laplace_approximation(x, y)


def test_kron_needs_one_prior_precision_per_site(float64):
    """A weight prior with different scales per entry has no isotropic precision: a named error
    that asks for prior_precision, which then works."""

    class Anisotropic(_Linear):
        def __init__(self):
            super().__init__(bias=False)
            scales = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
            self.layer.weight = PyroSample(dist.Normal(0.0, scales).to_event(2))

    x, y = _data()
    model = Anisotropic()
    guide = AutoLaplace(model, curvature="kron", disable_progbar=True)
    guide(x, y)
    with pytest.raises(ValueError, match="site 'layer.weight' has several"):
        guide.laplace_approximation(x, y)
    pyro.clear_param_store()
    guide = AutoLaplace(model, curvature="kron", prior_precision=2.0, disable_progbar=True)
    guide(x, y)
    laplace = guide.laplace_approximation(x, y)
    assert math.isfinite(laplace.log_marginal_likelihood().item())


def test_kron_posterior_as_the_next_tasks_prior_is_exact_for_one_linear_layer(float64):
    """Continual learning: K-FAC is exact for one bias-free linear layer with a Gaussian likelihood,
    so task 1's ``as_prior()`` (a KroneckerNormal per site) carries its posterior exactly, and task
    2's ``"full"`` Laplace (exact for a linear-Gaussian model with a Gaussian prior) must give the
    exact posterior precision given both tasks' data, ``I (x) X^T X / sigma^2 + I`` in the row-major
    layout of ``W`` (out, in), ``X`` the inputs of both tasks and ``I`` the N(0, 1) prior."""

    class WithPrior(_Linear):
        def __init__(self, prior=None):
            super().__init__(bias=False)
            if prior is not None:
                self.layer.weight = PyroSample(prior)

    x, y = _data(5)
    x1, y1, x2, y2 = x[:20], y[:20], x[20:], y[20:]  # task 1: 20 examples, task 2: the other 10
    loc = torch.zeros(D_IN * D_OUT, dtype=torch.float64)
    (first,) = _approximations(WithPrior(), (x1, y1), loc, "kron")
    priors = first.as_prior()
    assert priors["layer.weight"].event_shape == (D_OUT, D_IN)
    (second,) = _approximations(WithPrior(priors["layer.weight"]), (x2, y2), loc, "full")
    design = torch.cat([x1, x2])
    exact = torch.kron(torch.eye(D_OUT, dtype=torch.float64), design.T @ design / SIGMA**2) + torch.eye(D_IN * D_OUT)
    _close(second.precision, exact)


def test_kron_on_a_model_without_subsampling(float64):
    """``pyro.plate("data", N)`` without ``subsample_size``: the sweep is one chunk of all the data,
    and the factors equal those of the minibatched model. A model that does not index its data by
    the plate's indices works too: the sweep runs it on the whole plate (one chunk), never on a few rows."""

    class FullBatch(_Linear):
        def forward(self, x, y):
            plate = pyro.plate("data", len(x))
            mean = self.layer(x[plate.indices])
            with plate:
                pyro.sample("y", dist.Normal(mean, SIGMA).to_event(1), obs=y[plate.indices])

    class Unindexed(_Linear):
        def forward(self, x, y):
            mean = self.layer(x)
            with pyro.plate("data", len(x)):
                pyro.sample("y", dist.Normal(mean, SIGMA).to_event(1), obs=y)

    x, y = _data()
    loc = torch.randn(D_IN * D_OUT + D_OUT, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    (whole,) = _approximations(FullBatch(bias=True), (x, y), loc, "kron")
    (batched,) = _approximations(_Linear(bias=True), (x, y), loc, "kron")
    _close(whole.posterior_precision.dense(), batched.posterior_precision.dense())
    _close(whole.log_marginal_likelihood(), batched.log_marginal_likelihood())
    pyro.clear_param_store()
    guide = AutoLaplace(Unindexed(bias=True), curvature="kron", disable_progbar=True)
    guide(x, y)
    guide.loc.data = loc.clone()
    unindexed = guide.laplace_approximation(x, y)
    _close(unindexed.posterior_precision.dense(), batched.posterior_precision.dense())


def test_kron_posterior_repr_shows_the_shapes(float64):
    """``print(laplace.get_posterior())`` says what the Gaussian is over, as torch's distributions do
    (``Normal(loc: torch.Size([3]), ...)``): the flat mean's size and each site's factor shapes,
    ``G (out, out) x A (in, in)`` for a weight, ``G`` for a bias; a site's block (``as_prior``) its own."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, D_IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (N,), generator=g)
    pyro.set_rng_seed(0)
    d = 4 * D_IN + 4 + 3 * 4 + 3
    (kron,) = _approximations(_Mlp(), (x, y), 0.1 * torch.randn(d, generator=g, dtype=torch.float64), "kron")
    factors = "hidden.weight: (4, 4) x (3, 3), hidden.bias: (4, 4), out.weight: (3, 3) x (4, 4), out.bias: (3, 3)"
    assert repr(kron.get_posterior()) == f"KroneckerNormal(loc: torch.Size([{d}]), factors: {{{factors}}})"
    assert repr(kron.posterior_precision) == f"KronPrecision(factors: {{{factors}}})"
    assert repr(kron.as_prior()["out.bias"]) == "KroneckerNormal(loc: torch.Size([3]), factors: {out.bias: (3, 3)})"
