"""trace_model: the latent sites, plates, N, dtype and device read from one trace; the import paths."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from torch.distributions import biject_to, constraints

from pyro_sgmcmc.model.trace import ModelError, is_identity, trace_model


def model(x, y):
    scale = pyro.sample("scale", dist.HalfNormal(1.0))
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", len(y), subsample_size=5) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, scale), obs=y[idx])


def test_trace_model_reads_sites_plates_and_num_data(float64):
    x, y = torch.randn(20, 2), torch.randn(20)
    traced = trace_model(model, (x, y), {}, init_to_uniform)
    assert [s.name for s in traced.sites] == ["scale", "w"]  # sorted by name
    assert [(s.offset, s.numel, s.has_jacobian) for s in traced.sites] == [(0, 1, True), (1, 2, False)]
    assert [(p.name, p.size, p.subsample_size, p.scale) for p in traced.subsample_plates] == [("data", 20, 5, 4.0)]
    assert traced.num_data == 20 and traced.dtype == torch.float64 and traced.device == x.device
    assert set(traced.values) == {"scale", "w"} and float(traced.values["scale"]) > 0
    assert trace_model(model, (x, y), {}, init_to_uniform, num_data=7).num_data == 7


def test_is_identity_only_for_real_support():
    assert is_identity(biject_to(constraints.real))
    assert is_identity(biject_to(constraints.independent(constraints.real, 2)))
    assert not is_identity(biject_to(constraints.positive))
    assert not is_identity(biject_to(constraints.simplex))


def test_names_other_rooms_import_keep_their_paths():
    import pyro_sgmcmc
    import pyro_sgmcmc.model as room
    import pyro_sgmcmc.model.potential as old

    for name in ["JitMode", "LatentSite", "ModelError", "ModelPotential", "SubsamplePlate", "check_jit_compile"]:
        assert getattr(old, name) is getattr(room, name)
    assert pyro_sgmcmc.ModelPotential is room.ModelPotential and pyro_sgmcmc.ModelError is room.ModelError


SHAPE_PAIRS = [  # (observed value, distribution's batch + event shape)
    ((), ()), ((5,), ()), ((), (5,)), ((5,), (5,)), ((5,), (1,)), ((1,), (5,)), ((3, 1), (5,)), ((2, 3), (3,)),
    ((4, 1, 3), (2, 1)), ((1, 1, 1), (7, 8)),  # broadcast
    ((5,), (3,)), ((2, 3), (2,)), ((4, 3), (3, 3)), ((2, 1, 3), (2, 2)), ((6,), (2, 3)),  # do not
]  # fmt: skip


@pytest.mark.parametrize("value_shape, expected_shape", SHAPE_PAIRS, ids=str)
def test_observed_shapes_are_refused_exactly_when_torch_does_not_broadcast_them(value_shape, expected_shape):
    def shaped(value):
        pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("y", dist.Normal(torch.zeros(expected_shape), 1.0), obs=value)

    value = torch.zeros(value_shape)
    try:  # the oracle: torch's own rule (NumPy's)
        torch.broadcast_shapes(value_shape, expected_shape)
    except RuntimeError:
        with pytest.raises(ModelError, match=r"observed site 'y' has a value of shape .* that does not broadcast"):
            trace_model(shaped, (value,), {}, init_to_uniform)
    else:
        assert trace_model(shaped, (value,), {}, init_to_uniform).sites[0].name == "w"


def test_an_observation_not_indexed_by_its_plate_is_refused_naming_the_site_and_plate():
    x, y = torch.randn(20, 2), torch.randn(20)

    def unindexed(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=5) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y)  # y, not y[idx]

    expected = r"observed site 'y' has a value of shape \(20,\) .* shape \(5,\) \(plates \['data'\]\).*obs=y\[idx\]"
    with pytest.raises(ModelError, match=expected):
        trace_model(unindexed, (x, y), {}, init_to_uniform)
