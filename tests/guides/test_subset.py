"""Subset-of-weights Laplace: ``AutoLaplace(..., subset_of_weights="last_layer" | [sites])``.

Oracle: the last-layer approximation of a network is, by definition, the all-weights
approximation of the network whose hidden layer is a constant at the MAP. That second network is
written out here by hand (its hidden weights are buffers, not sites) and fitted with
``subset_of_weights="all"``: every number (precision or Kronecker factors, evidence at several
precisions, GLM predictive mean and covariance) must agree, for every curvature. Both sides run
the same arithmetic on the same numbers in float64, so the tolerance is relative 1e-10 (rounding
of the reordered sums). The last-layer GGN is also checked against torch.func.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc.guides import AutoLaplace
from tests.guides.test_evidence import HIDDEN, K, Mlp, _classification, _closed_form, _exact_ggn

RTOL = 1e-10


@pytest.fixture(autouse=True)
def clear_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _close(a, b, rtol=RTOL):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item() < rtol, (a, b)


class LastLayerOnly(PyroModule):
    """The Mlp with its hidden layer frozen at given values: only ``out.weight`` / ``out.bias`` are sites."""

    def __init__(self, hidden_weight, hidden_bias):
        super().__init__()
        self.hidden = torch.nn.Linear(hidden_weight.shape[1], HIDDEN).double()
        with torch.no_grad():
            self.hidden.weight.copy_(hidden_weight)
            self.hidden.bias.copy_(hidden_bias)
        self.out = PyroModule[torch.nn.Linear](HIDDEN, K).double()
        self.out.weight = PyroSample(dist.Normal(0.0, 1.0).expand([K, HIDDEN]).to_event(2))
        self.out.bias = PyroSample(dist.Normal(0.0, 1.0).expand([K]).to_event(1))

    def logits(self, x):
        return self.out(torch.tanh(self.hidden(x)))

    def forward(self, x, y):
        plate = pyro.plate("data", len(x))
        logits = self.logits(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[plate.indices])


def _at_random_point(net, x, y, curvature, subset, seed=1):
    guide = AutoLaplace(net, curvature=curvature, disable_progbar=True, subset_of_weights=subset)
    guide(x, y)
    g = torch.Generator().manual_seed(seed)
    guide.loc.data = torch.randn(guide.loc.shape, generator=g, dtype=torch.float64)
    return guide


def _logits_fn(module):
    return lambda params, x: pyro.poutine.condition(module.logits, data=params)(x)


@pytest.mark.parametrize("curvature", ["diag_ggn", "diag_ef", "full_ggn", "full", "kron"])
@pytest.mark.parametrize("subset", ["last_layer", ["out.weight", "out.bias"]])
def test_last_layer_is_the_full_laplace_of_the_frozen_network(float64, curvature, subset):
    net = Mlp()
    x, y = _classification()
    guide = _at_random_point(net, x, y, curvature, subset)
    laplace = guide.laplace_approximation(x, y)
    assert list(laplace.site_slices) == ["out.weight", "out.bias"]
    assert sorted(laplace.fixed) == ["hidden.bias", "hidden.weight"]
    map_values = guide.median()
    for name in ("hidden.weight", "hidden.bias"):
        _close(laplace.fixed[name], map_values[name])
    pyro.clear_param_store()
    frozen = LastLayerOnly(map_values["hidden.weight"], map_values["hidden.bias"])
    reference_guide = AutoLaplace(frozen, curvature=curvature, disable_progbar=True)
    reference_guide(x, y)
    reference_guide.loc.data = torch.cat([map_values["out.weight"].reshape(-1), map_values["out.bias"]])
    reference = reference_guide.laplace_approximation(x, y)
    _close(laplace.loc, reference.loc)
    _close(laplace.log_likelihood, reference.log_likelihood)
    if curvature == "kron":
        for name in ("out.weight", "out.bias"):
            for ours, theirs in zip(laplace.kron_factors[name], reference.kron_factors[name]):
                _close(ours, theirs)
    _close(laplace.precision, reference.precision)
    if curvature != "full":  # the exact Hessian need not be positive definite at a random point
        for lam in [0.1, 1.0, 10.0]:
            _close(laplace.log_marginal_likelihood(lam), reference.log_marginal_likelihood(lam))
        _close(laplace.log_marginal_likelihood(), reference.log_marginal_likelihood())
        ours = laplace.predict(_logits_fn(net), x[:7])
        theirs = reference.predict(_logits_fn(frozen), x[:7])
        _close(ours.mean, theirs.mean)
        _close(ours.covariance, theirs.covariance)


def test_last_layer_ggn_against_torch_func(float64):
    """The last layer's full GGN is the (out.weight, out.bias) block of the whole network's exact GGN."""
    net = Mlp()
    x, y = _classification()
    pyro.clear_param_store()
    whole = _at_random_point(net, x, y, "full_ggn", "all").laplace_approximation(x, y)
    log_lik, ggn = _exact_ggn(net, whole, x, y)
    pyro.clear_param_store()
    last = _at_random_point(net, x, y, "full_ggn", "last_layer").laplace_approximation(x, y)
    block = slice(whole.site_slices["out.weight"].start, whole.site_slices["out.bias"].stop)
    _close(last.likelihood_curvature, ggn[block, block])
    theta = last.loc
    for lam in [0.3, 3.0]:
        _close(last.log_marginal_likelihood(lam), _closed_form(log_lik, ggn[block, block], theta, lam))


def test_fixed_sites_are_point_masses_in_draws_median_and_quantiles(float64):
    """Predictive through the original model: hidden weights are the MAP in every draw, last-layer
    weights vary; median/quantiles list every site."""
    net = Mlp()
    x, y = _classification()
    guide = _at_random_point(net, x, y, "diag_ggn", "last_layer")
    laplace = guide.laplace_approximation(x, y)
    laplace.set_prior_precision(1.0)
    draws = Predictive(net, guide=laplace, num_samples=5, return_sites=["hidden.weight", "out.weight"])(x, y)
    assert (draws["hidden.weight"] == laplace.fixed["hidden.weight"]).all()
    assert draws["out.weight"].std(0).min() > 0
    median, quantiles = laplace.median(), laplace.quantiles([0.1, 0.9])
    assert sorted(median) == sorted(quantiles) == ["hidden.bias", "hidden.weight", "out.bias", "out.weight"]
    assert (quantiles["hidden.bias"][0] == quantiles["hidden.bias"][1]).all()
    assert (quantiles["out.bias"][0] < quantiles["out.bias"][1]).all()


def test_bad_subsets_are_named():
    with pytest.raises(ValueError, match="subset_of_weights"):
        AutoLaplace(Mlp(torch.float32), subset_of_weights="first_layer")
    with pytest.raises(ValueError, match="subset_of_weights"):
        AutoLaplace(Mlp(torch.float32), subset_of_weights=[])
    net = Mlp(torch.float32)
    x, y = _classification(torch.float32)
    guide = AutoLaplace(net, subset_of_weights=["out.weight", "nope"], disable_progbar=True)
    guide(x, y)
    with pytest.raises(ValueError, match="unknown sites \\['nope'\\]"):
        guide.laplace_approximation(x, y)

    def no_network(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(x)):
            pyro.sample("y", dist.Normal(w, 1.0), obs=x[:, 0])

    pyro.clear_param_store()
    guide = AutoLaplace(no_network, subset_of_weights="last_layer", disable_progbar=True)
    guide(x, y)
    with pytest.raises(ValueError, match="last_layer"):
        guide.laplace_approximation(x, y)


# ------------------------------------------------------------------ the GLM predictive's linear-layer path
@pytest.mark.parametrize("curvature", ["diag_ggn", "kron"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_linear_layer_predictive_equals_the_jacobian_path(float64, curvature, subset):
    """J Sigma J^T from layer inputs and output gradients (no Jacobian formed) against the per-input
    vmap(jacrev) Jacobian path on the same approximation: the same sums reordered, float64
    rounding: relative 1e-10. The fast path must have been taken (it returns a result)."""
    from pyro_sgmcmc.guides.predictive import _jacobian_path, _LinearLayerPath

    net = Mlp()
    x, y = _classification()
    laplace = _at_random_point(net, x, y, curvature, subset).laplace_approximation(x, y)
    laplace.set_prior_precision({"hidden.weight": 0.5, "hidden.bias": 2.0, "out.weight": 3.0, "out.bias": 0.7}
                                if subset == "all" else 0.9)  # fmt: skip
    fn = _logits_fn(net)
    fast = _LinearLayerPath(laplace, fn)(laplace.loc, x[:9])
    assert fast is not None
    reference = _jacobian_path(laplace, fn)(laplace.loc, x[:9])
    _close(fast[0], reference[0])
    _close(fast[1], reference[1])
    prediction = laplace.predict(fn, x[:9], batch_size=4)  # the public call agrees too
    _close(prediction.covariance, reference[1])


def test_linear_layer_path_declines_what_it_cannot_do(float64):
    """A site used outside F.linear (here as a matrix product) leaves the fast path (None) and
    predict falls back to the Jacobian path."""
    from pyro_sgmcmc.guides.predictive import _jacobian_path, _LinearLayerPath

    net = Mlp()
    x, y = _classification()
    laplace = _at_random_point(net, x, y, "diag_ggn", "all").laplace_approximation(x, y)

    def matmul(params, inputs):
        hidden = torch.tanh(inputs @ params["hidden.weight"].T + params["hidden.bias"])
        return hidden @ params["out.weight"].T + params["out.bias"]

    assert _LinearLayerPath(laplace, matmul)(laplace.loc, x[:5]) is None
    _close(laplace.predict(matmul, x[:5]).covariance, _jacobian_path(laplace, matmul)(laplace.loc, x[:5])[1])
