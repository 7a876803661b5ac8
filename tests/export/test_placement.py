"""Where a block goes in its target (``pyro_sgmcmc/export/placement.py``): targets laid out in memory as the
blocks come, so that writing a block streams, with the values of a row-major target."""

import torch

from pyro_sgmcmc.export.placement import Placement, target_like
from pyro_sgmcmc.export.pointwise import SiteLayout

LAYOUT = SiteLayout("y", (40,), ("data",), torch.float32, ("data",), 10)


def _rows(first, combinations, batch=10):
    return {"data": torch.arange(first, first + combinations * batch).view(combinations, batch)}


def test_a_target_follows_a_block_whose_draw_axis_is_fastest():
    # what vmap's matrix product gives a regression: (K B, D) made, seen as (D, K, B)
    place = Placement.of(LAYOUT, _rows(0, 2))
    block = torch.randn(2 * 10, 6).t().view(6, 2, 10)
    target = target_like(place, block, (12, 40), torch.float32, "cpu")
    assert target.shape == (12, 40) and target.stride() == (1, 12)
    place.write(target[:6], block)
    assert torch.equal(target[:6, :20], block.reshape(6, 20))


def test_a_row_major_block_or_an_indexed_write_gets_a_row_major_target():
    place = Placement.of(LAYOUT, _rows(0, 2))
    assert target_like(place, torch.randn(6, 2, 10), (12, 40), torch.float32, "cpu").stride() == (40, 1)
    overlapping = Placement.of(LAYOUT, {"data": torch.tensor([[20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
                                                               [25, 26, 27, 28, 29, 30, 31, 32, 33, 34]])})
    assert overlapping.axis is None  # the overlapping chunks are written by index
    block = torch.randn(20, 6).t().view(6, 2, 10)
    assert target_like(overlapping, block, (12, 40), torch.float32, "cpu").stride() == (40, 1)
    assert target_like(None, None, (12, 40), torch.float64, "cpu").stride() == (40, 1)


def test_one_draw_a_call_puts_the_draw_axis_outermost():
    place = Placement.of(LAYOUT, _rows(0, 2))
    block = torch.randn(20, 1).t().view(1, 2, 10)  # the draw axis has size one: its stride says nothing
    assert target_like(place, block, (12, 40), torch.float32, "cpu").stride() == (40, 1)
