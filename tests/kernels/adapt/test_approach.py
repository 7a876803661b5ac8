"""The approach's iRprop- (``kernels/adapt/approach.py``): exact steps against the rule written out by hand."""

from __future__ import annotations

import torch

from pyro_sgmcmc.kernels.adapt.approach import (
    GROWTH,
    SHRINK,
    approach_final,
    approach_init,
    approach_reject,
    approach_update,
)


def test_steps_grow_while_the_sign_persists_and_stop_after_a_change(float64):
    """From z = 100 (delta_0 = 0.01 * 100 = 1): the first move is 1, the next 1.2 (same sign: times GROWTH), then
    a sign change moves nothing, halves the step and forgets the sign; the next move is the halved step."""
    state = approach_init(torch.tensor([[100.0]]))
    z, state = approach_update(state, torch.tensor([[100.0]]), torch.tensor([[3.0]]))
    assert z.item() == 99.0
    z, state = approach_update(state, z, torch.tensor([[5.0]]))
    assert z.item() == 99.0 - GROWTH
    z, state = approach_update(state, z, torch.tensor([[-2.0]]))
    assert z.item() == 99.0 - GROWTH and state.previous_sign.item() == 0.0  # no move after a sign change
    assert approach_final(state).item() == GROWTH * SHRINK
    z, state = approach_update(state, z, torch.tensor([[-2.0]]))
    assert z.item() == 99.0 - GROWTH + GROWTH * SHRINK


def test_a_step_never_more_than_doubles_a_coordinate(float64):
    """The step is capped at ``max(|z|, 1)``: from z = 0.5 with a huge step, the move is 1."""
    state = approach_init(torch.tensor([[0.5]])).replace(steps=torch.tensor([[1e6]]))
    z, _ = approach_update(state, torch.tensor([[0.5]]), torch.tensor([[1.0]]))
    assert z.item() == -0.5


def test_a_refused_chain_halves_its_steps_and_the_state_given_is_left_as_it_was(float64):
    state = approach_init(torch.tensor([[10.0, 1.0], [20.0, 2.0]]))
    before = [t.clone() for t in state]
    _, moved = approach_update(state, torch.tensor([[10.0, 1.0], [20.0, 2.0]]), torch.ones(2, 2))
    refused = approach_reject(moved, torch.tensor([True, False]))
    assert torch.equal(refused.steps[0], SHRINK * moved.steps[0]) and torch.equal(refused.steps[1], moved.steps[1])
    assert refused.previous_sign[0].abs().sum() == 0 and refused.rejections.tolist() == [1, 0]
    assert all(torch.equal(a, b) for a, b in zip(before, state))  # pure: nothing written in place
