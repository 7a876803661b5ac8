"""The kernel's public read-outs (kernels/base.py): ``configuration()`` and the methods other rooms call."""

import json

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_value

from pyro_sgmcmc import SGHMC, SGLD, RobbinsMonro


def _model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", len(y), subsample_size=10) as i:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[i])


def test_configuration_is_json_and_holds_what_changes_the_draws():
    kernel = SGHMC(_model, step_size=0.05, friction=2.0, temperature=0.5, init_momentum="stationary")
    config = kernel.configuration()
    assert json.loads(json.dumps(config)) == config
    assert config["kernel"] == "pyro_sgmcmc.kernels.sghmc.SGHMC"
    assert (config["step_size"], config["friction"], config["temperature"]) == (0.05, 2.0, 0.5)
    assert config["init_momentum"] == "stationary" and config["adapt_step_size"] is True
    assert config["init_strategy"] == "pyro.infer.autoguide.initialization.init_to_uniform"
    assert SGLD(_model, step_size=RobbinsMonro(0.1), adapt_step_size=False).configuration()["step_size"] == {
        "schedule": "pyro_sgmcmc.schedules.RobbinsMonro",
        "attributes": {"a": 0.1, "b": 1.0, "gamma": 0.55},
    }


@pytest.mark.filterwarnings("ignore::pyro_sgmcmc.SlowMixingWarning")
def test_configuration_leaves_out_the_adapted_step_size():
    """The adapted step sizes are state, not configuration: a run does not change the fingerprint."""
    y = 3.0 + torch.randn(200, generator=torch.Generator().manual_seed(0))
    kernel = SGLD(_model)
    before = kernel.configuration()
    kernel.setup_chains(30, (y,), {}, num_chains=2, seed=0)
    for _ in range(30):
        kernel.step()
    assert kernel.warmup.chain_step_size is not None  # adapted
    assert kernel.configuration() == before and before["step_size"] is None


def test_configuration_digests_a_dict_control_variate_and_init_values():
    one = SGLD(_model, control_variate={"mu": torch.tensor(1.0)}).configuration()
    same = SGLD(_model, control_variate={"mu": torch.tensor(1.0)}).configuration()
    other = SGLD(_model, control_variate={"mu": torch.tensor(1.5)}).configuration()
    assert one == same and one["control_variate"] != other["control_variate"]
    assert len(one["control_variate"]["sha256"]) == 64
    start = SGLD(_model, init_strategy=init_to_value(values={"mu": torch.tensor(2.0)})).configuration()
    moved = SGLD(_model, init_strategy=init_to_value(values={"mu": torch.tensor(3.0)})).configuration()
    assert start["init_strategy"] != moved["init_strategy"]
    json.dumps(start)


def test_public_set_up_methods():
    """ensure_potential traces once per data set; initial_positions gives each superchain its own start,
    shared by its chains, the same for the same global state."""
    y = torch.randn(30)
    starts = []
    for _ in range(2):
        kernel = SGLD(_model)
        pyro.set_rng_seed(0)
        potential = kernel.ensure_potential((y,), {})
        assert kernel.ensure_potential((y,), {}) is potential
        starts.append(kernel.initial_positions(None, 4, 2))
    assert torch.equal(starts[0], starts[1]) and starts[0].shape == (4, 1) and torch.equal(*starts[0][:2])
    assert torch.equal(kernel.initial_positions(None, 4, 2, seed=5), kernel.initial_positions(None, 4, 2, seed=5))


def test_gradient_estimators_follow_one_protocol():
    from pyro_sgmcmc.kernels import ControlVariate, GradientEstimator, MinibatchGradient

    y = torch.randn(50, generator=torch.Generator().manual_seed(1))
    kernel = SGLD(_model, control_variate="map")
    kernel.setup_chains(0, (y,), {}, num_chains=2, seed=0)
    assert isinstance(kernel.gradient_estimator, ControlVariate)
    assert isinstance(kernel.gradient_estimator, GradientEstimator)
    plain = MinibatchGradient(kernel.potential)
    assert isinstance(plain, GradientEstimator)
    indices = kernel.minibatches.next()
    u, g = kernel.gradient_estimator.potential_and_grad(kernel.state.position, indices)
    u0, g0 = plain.potential_and_grad(kernel.state.position, indices)
    assert u.shape == u0.shape == (2,) and g.shape == g0.shape == (2, 1)
