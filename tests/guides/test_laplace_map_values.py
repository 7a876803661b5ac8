"""Laplace from a MAP the user already has: ``AutoLaplace(model, map_values=...)``, no refit.

Oracle: exactness. A guide given the MAP of another guide (fitted by ``fit_map``) as
``map_values`` builds, with no fit, the *same* approximation as the fitted guide, bit for bit for
real sites, for every subset (all sites, the last layer, named sites) and curvature; a trained plain
``torch.nn.Module`` of the same layout gives its parameters as the MAP. Bad values get errors that
name the sites.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc.guides import AutoLaplace
from tests.guides.test_evidence import Mlp, _classification


@pytest.fixture(autouse=True)
def clear_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _fitted(curvature, subset):
    x, y = _classification()
    pyro.set_rng_seed(0)
    guide = AutoLaplace(Mlp(), curvature=curvature, subset_of_weights=subset, disable_progbar=True)
    with pyro.validation_enabled(False):
        guide.fit_map(x, y, num_steps=200, lr=0.05)
    return guide, x, y


def _assert_same(a, b):
    assert torch.equal(a.loc, b.loc)
    assert list(a.site_slices) == list(b.site_slices)
    assert torch.equal(a.likelihood_curvature, b.likelihood_curvature)
    assert torch.equal(a.log_likelihood, b.log_likelihood)
    assert torch.equal(a.log_marginal_likelihood(), b.log_marginal_likelihood())
    assert sorted(a.fixed) == sorted(b.fixed) and all(torch.equal(a.fixed[k], b.fixed[k]) for k in a.fixed)


@pytest.mark.parametrize(
    "curvature, subset",
    [("kron", "all"), ("diag_ggn", "all"), ("full_ggn", "last_layer"), ("kron", ["hidden.weight", "out.bias"])],
)
def test_map_values_give_the_approximation_of_the_fitted_guide_exactly(float64, curvature, subset):
    fitted, x, y = _fitted(curvature, subset)
    expected = fitted.laplace_approximation(x, y)
    values = {name: value.detach().clone() for name, value in fitted.median().items()}
    pyro.clear_param_store()
    given = AutoLaplace(Mlp(), curvature=curvature, subset_of_weights=subset, map_values=values, disable_progbar=True)
    _assert_same(given.laplace_approximation(x, y), expected)  # no fit, no call of the guide first


def test_map_values_win_over_a_stale_parameter_store(float64):
    """A parameter store still holding another guide's ``loc`` under the same name must not replace the MAP."""
    fitted, x, y = _fitted("kron", "all")
    expected = fitted.laplace_approximation(x, y)
    values = {name: value.detach().clone() for name, value in fitted.median().items()}
    other = AutoLaplace(Mlp(), curvature="kron", disable_progbar=True)
    other(x, y)  # registers another loc under the guide's parameter name
    given = AutoLaplace(Mlp(), curvature="kron", map_values=values, disable_progbar=True)
    _assert_same(given.laplace_approximation(x, y), expected)


def test_a_trained_torch_module_gives_its_parameters(float64):
    """A plain ``nn.Module`` whose parameter names are the model's site names (``hidden.weight``, ...)."""

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden, self.out = torch.nn.Linear(4, 5), torch.nn.Linear(5, 3)

    x, y = _classification()
    torch.manual_seed(0)
    plain = Plain().double()
    guide = AutoLaplace(Mlp(), curvature="kron", map_values=plain, disable_progbar=True)
    laplace = guide.laplace_approximation(x, y)
    for name, parameter in plain.named_parameters():
        assert torch.equal(laplace.median()[name], parameter.detach())


def test_a_constrained_site_round_trips_through_its_transform(float64):
    """``map_values`` are constrained values; a positive site goes through log and back (1 ulp at most)."""

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("y", dist.Normal(x @ w, sigma), obs=y)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g)
    y = x @ torch.tensor([1.0, -1.0]) + 0.3 * torch.randn(30, generator=g)
    pyro.set_rng_seed(0)
    fitted = AutoLaplace(model, curvature="full", disable_progbar=True)
    fitted.fit_map(x, y, num_steps=300, lr=0.05)
    expected = fitted.laplace_approximation(x, y)
    values = {name: value.detach().clone() for name, value in fitted.median().items()}
    given = AutoLaplace(model, curvature="full", map_values=values, disable_progbar=True).laplace_approximation(x, y)
    assert torch.allclose(given.loc, expected.loc, rtol=1e-14, atol=0)  # exp then log: float64 rounding only
    assert torch.allclose(given.precision, expected.precision, rtol=1e-10, atol=0)


def test_bad_map_values_name_the_sites(float64):
    x, y = _classification()
    shapes = {"hidden.weight": (5, 4), "hidden.bias": (5,), "out.weight": (3, 5), "out.bias": (3,)}
    values = {name: torch.zeros(shape) for name, shape in shapes.items()}
    missing = {k: v for k, v in values.items() if k != "out.bias"}
    missing["out.bais"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"no value for the latent sites \['out.bias'\].*'out.bais'"):
        AutoLaplace(Mlp(), map_values=missing).laplace_approximation(x, y)
    wrong = dict(values, **{"out.bias": torch.zeros(4)})
    with pytest.raises(ValueError, match=r"map_values\['out.bias'\] has shape \(4,\)"):
        AutoLaplace(Mlp(), map_values=wrong).laplace_approximation(x, y)
    for bad in ({}, {"out.bias": 3.0}, [torch.zeros(3)], {"out.bias": torch.zeros(3, dtype=torch.long)}):
        with pytest.raises(TypeError, match="map_values"):
            AutoLaplace(Mlp(), map_values=bad)
    with pytest.raises(ValueError, match="map_values .* or init_loc_fn"):
        AutoLaplace(Mlp(), map_values=values, init_loc_fn=lambda site: None)
