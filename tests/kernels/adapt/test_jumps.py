"""The jump thresholds (``kernels/adapt/jumps.py``) against their formula computed directly."""

from __future__ import annotations

import math

import torch

from pyro_sgmcmc.kernels.adapt.jumps import (
    JUMP_Z,
    MAX_DELTA_ENERGY,
    MIN_JUMP_STEPS,
    jumps_final,
    jumps_init,
    jumps_update,
    running_threshold,
)


def test_thresholds_are_the_rms_of_the_changes_of_their_window():
    """Warmup of 60 steps: the running threshold uses every step so far, the sampling one steps 31-60 only; a
    non-finite change counts as zero. Exact: 1000 + 10 * sqrt(mean of squares)."""
    jumps = torch.arange(1, 61, dtype=torch.float64).reshape(-1, 1) * torch.tensor([1.0, -2.0], dtype=torch.float64)
    jumps[5, 0] = math.inf
    state = jumps_init(60, 2, "cpu")
    for step in range(1, 61):
        state = jumps_update(state, step, jumps[step - 1])
        if step == MIN_JUMP_STEPS - 1:
            assert running_threshold(state) is None and jumps_final(state) is None
    squares = torch.where(torch.isfinite(jumps), jumps**2, torch.zeros_like(jumps))
    expected_running = MAX_DELTA_ENERGY + JUMP_Z * squares.mean(0).sqrt()
    expected_final = MAX_DELTA_ENERGY + JUMP_Z * squares[30:].mean(0).sqrt()
    assert torch.allclose(running_threshold(state), expected_running, rtol=1e-14)
    assert torch.allclose(jumps_final(state), expected_final, rtol=1e-14)
    assert (state.count, state.running_count) == (30, 60)


def test_the_running_threshold_counts_only_the_steps_after_running_start():
    """``running_start=10``: the running sums hold steps 11-40 only (the approach's descent before it is not the
    minibatch noise); the sampling threshold's window (steps 21-40) is unchanged. Exact."""
    jumps = 1e4 * torch.ones(40, 1, dtype=torch.float64)
    jumps[10:] = 3.0
    state = jumps_init(40, 1, "cpu", running_start=10)
    for step in range(1, 41):
        state = jumps_update(state, step, jumps[step - 1])
    assert state.running_count == 30 and state.count == 20
    expected = torch.tensor([MAX_DELTA_ENERGY + JUMP_Z * 3.0], dtype=torch.float64)
    assert torch.allclose(running_threshold(state), expected, rtol=1e-14)
    assert torch.allclose(jumps_final(state), expected, rtol=1e-14)
