"""``init_to_fan_in``: the default start of ``AutoLaplace``, torch's ``nn.Linear`` scale for weight matrices.

Oracles: exact coupling with ``torch.nn.Linear``'s own initialisation (the same generator state gives
the same weight, bit for bit), the fallback for the other sites, and a regression MLP whose MAP fit
from this start reaches a test RMSE several times better than the same fit from a draw of the prior
(the issue's observation: 0.60 against 0.25 on the reviewer's network).
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.nn import PyroModule, PyroSample

from pyro_sgmcmc.guides import AutoLaplace, init_to_fan_in


def _site(fn):
    return {"name": "w", "fn": fn, "type": "sample", "is_observed": False}


@pytest.mark.parametrize("shape", [(3, 100), (50, 30), (1, 1)])
def test_a_weight_matrix_starts_as_torch_nn_linear_starts_its_weight(shape):
    """Same generator state, same weight: kaiming_uniform_(a=sqrt(5)), bound 1 / sqrt(fan_in)."""
    out_features, in_features = shape
    torch.manual_seed(7)
    value = init_to_fan_in(_site(dist.Normal(0.0, 1.0).expand(list(shape)).to_event(2)))
    torch.manual_seed(7)
    reference = torch.nn.Linear(in_features, out_features).weight.detach()
    assert torch.equal(value, reference)


def test_the_draw_is_around_the_prior_mean_and_scaled():
    """``mean + scale * u`` with ``u`` the draw of scale 1 from the same generator state."""
    mean = torch.arange(12.0).reshape(3, 4)
    torch.manual_seed(3)
    unit = init_to_fan_in(_site(dist.Normal(0.0, 1.0).expand([3, 4]).to_event(2)))
    torch.manual_seed(3)
    value = init_to_fan_in(scale=0.5)(_site(dist.Normal(mean, 2.0).to_event(2)))
    assert torch.allclose(value, mean + 0.5 * unit, rtol=0, atol=1e-6)
    assert unit.abs().max() <= 0.5  # bound 1 / sqrt(4)


def test_other_sites_take_the_fallback():
    """A bias (1-d), a scalar and a positive matrix are not weight matrices: ``fallback`` decides."""
    marker = torch.tensor(123.0)
    fallback = lambda site: marker  # noqa: E731
    strategy = init_to_fan_in(fallback=fallback)
    for fn in (
        dist.Normal(0.0, 1.0).expand([5]).to_event(1),
        dist.Normal(0.0, 1.0),
        dist.LogNormal(0.0, 1.0).expand([2, 3]).to_event(2),
    ):
        assert strategy(_site(fn)) is marker


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="scale"):
        init_to_fan_in(scale=0.0)
    with pytest.raises(TypeError, match="fallback"):
        init_to_fan_in(fallback=3)


class _Regression(PyroModule):
    """8 -> 50 -> 50 -> 1 tanh, N(0, 1) on every weight, Gaussian noise 0.1, minibatches of 64."""

    def __init__(self):
        super().__init__()
        sizes = [8, 50, 50, 1]
        self.layers = PyroModule[torch.nn.ModuleList](
            [PyroModule[torch.nn.Linear](a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        )
        for layer, (a, b) in zip(self.layers, zip(sizes[:-1], sizes[1:])):
            layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([b, a]).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([b]).to_event(1))

    def mean(self, x):
        for number, layer in enumerate(self.layers):
            x = layer(x)
            x = torch.tanh(x) if number < len(self.layers) - 1 else x
        return x.squeeze(-1)

    def forward(self, x, y):
        plate = pyro.plate("data", len(x), subsample_size=64)
        mean = self.mean(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Normal(mean, 0.1), obs=y[plate.indices])


def _test_rmse(init, seed: int) -> float:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, generator=g)
    x, x_test = torch.randn(512, 8, generator=g), torch.randn(512, 8, generator=g)
    y, y_test = (torch.sin(v @ w / 2) + 0.1 * torch.randn(512, generator=g) for v in (x, x_test))
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = _Regression()
    guide = AutoLaplace(net, init_loc_fn=init)
    with pyro.validation_enabled(False):
        guide.fit_map(x, y, num_steps=600, lr=1e-2, seed=seed)
    with torch.no_grad():
        prediction = pyro.poutine.condition(net.mean, data=guide.median())(x_test)
    pyro.clear_param_store()
    return float(((prediction - y_test) ** 2).mean().sqrt())


@pytest.mark.parametrize("seed", [0, 1])
def test_fit_map_trains_from_the_default_start_and_not_from_a_prior_draw(seed):
    """The same 600 Adam steps of ``fit_map``: from ``init_to_fan_in`` (the default) the test RMSE is
    below 0.3 (the targets' standard deviation is about 0.7, the noise 0.1); from ``init_to_sample``
    (N(0, 1) weights: pre-activations of sd ~7, saturated tanh units) it is over 3 times larger.
    Measured: 0.174 / 0.168 against 2.16 / 2.36 for seeds 0 / 1 (Pyro's ``init_to_median``, the former
    default: 0.33 / 0.27; these weights with the biases drawn by ``init_to_median``: 0.133 / 0.136), so
    both margins are wide."""
    default = _test_rmse(init_to_fan_in, seed)
    prior_draw = _test_rmse(init_to_sample, seed)
    assert default < 0.3, default
    assert prior_draw > 3 * default, (prior_draw, default)
