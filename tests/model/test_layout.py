"""The flat layout: unpack (views, one chain, rows of a batch, under vmap), pack, constrain round trips."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import ModelPotential


def model():
    pyro.sample("a", dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
    pyro.sample("b", dist.LogNormal(0.0, 1.0))
    pyro.sample("c", dist.Dirichlet(torch.ones(3)))


@pytest.fixture(scope="module")
def layout():
    return ModelPotential(model, jit_compile=False).layout


def test_unpack_one_chain_gives_views_with_the_unconstrained_shapes(layout):
    assert layout.dim == 6 + 1 + 2 and layout.site_names == ["a", "b", "c"]
    buffer = torch.arange(3 * layout.dim, dtype=torch.float32).reshape(3, layout.dim)
    row = buffer[1]  # a row view with a storage offset, as the kernels hand it over
    parts = layout.unpack(row)
    assert [tuple(v.shape) for v in parts.values()] == [(2, 3), (), (2,)]
    assert torch.equal(parts["a"].reshape(-1), row[:6]) and float(parts["b"]) == float(row[6])
    assert torch.equal(parts["c"], row[7:])
    buffer[1, 6] = -1.0  # views: they see a change of the position
    assert float(parts["b"]) == -1.0
    strided = torch.arange(2.0 * layout.dim)[::2]  # not contiguous: the general path
    assert torch.equal(layout.unpack(strided)["c"], strided[7:])


def test_unpack_batched_and_under_vmap_equal_one_by_one(layout):
    positions = torch.randn(4, layout.dim)
    batched = layout.unpack(positions)
    mapped = torch.func.vmap(lambda z: layout.unpack(z)["a"].sum() + layout.unpack(z)["c"][1])(positions)
    for c in range(4):
        one = layout.unpack(positions[c])
        for name in layout.site_names:
            assert torch.equal(batched[name][c], one[name])
        assert torch.allclose(mapped[c], one["a"].sum() + one["c"][1])


def test_pack_unpack_and_constrain_unconstrain_round_trip(layout):
    z = torch.randn(layout.dim)
    assert torch.equal(layout.pack(layout.unpack(z)), z)
    assert torch.allclose(layout.unconstrain(layout.constrain(z)), z, atol=1e-5)
    values = {}
    log_det = layout.constrain_into(z, values)
    constrained = layout.constrain(z)
    assert all(torch.allclose(values[k], constrained[k]) for k in layout.site_names)
    expected = sum(
        s.transform.log_abs_det_jacobian(u, constrained[s.name]).sum()
        for s, u in zip(layout.sites, layout.unpack(z).values())
        if s.has_jacobian
    )
    assert torch.allclose(log_det, expected)
    batch = torch.randn(5, 2, layout.dim)
    assert torch.equal(layout.pack(layout.unpack(batch), (5, 2)), batch)


def test_pack_names_what_is_wrong(layout):
    with pytest.raises(TypeError, match="must be a dict"):
        layout.pack([torch.zeros(6)])
    with pytest.raises(ValueError, match=r"missing \['c'\], unknown \['d'\]"):
        layout.pack({"a": torch.zeros(2, 3), "b": torch.zeros(()), "d": torch.zeros(2)})
    with pytest.raises(ValueError, match="unconstrained shape"):
        layout.pack({"a": torch.zeros(6), "b": torch.zeros(()), "c": torch.zeros(2)})
