"""The cyclical schedule (Zhang et al., 2020): its values against the closed form, its stages, its checks.

Oracle: with :math:`L = \\lceil K / M \\rceil` and :math:`k = t - t_0`,
:math:`\\epsilon_k = \\epsilon_0 / 2 \\, (\\cos(\\pi \\, \\mathrm{mod}(k, L) / L) + 1)`, written here with NumPy
independently of the class; step ``k`` explores when :math:`\\mathrm{mod}(k, L) / L < \\beta`.
"""

import math
import pickle

import numpy as np
import pytest
import torch

from pyro_sgmcmc import Cyclical, make_schedule
from pyro_sgmcmc.schedules import as_schedule


def closed_form(k, num_cycles, num_steps, peak, peak_factor=1.0):
    length = math.ceil(num_steps / num_cycles)
    return peak_factor * peak / 2 * (np.cos(np.pi * np.mod(k, length) / length) + 1)


@pytest.mark.parametrize("num_cycles,num_steps", [(4, 1000), (3, 10), (1, 7), (5, 5)])
def test_values_are_the_closed_form(num_cycles, num_steps):
    schedule = Cyclical(num_cycles, num_steps, exploration=0.3, peak=0.25)
    k = np.arange(2 * num_steps)  # beyond K the cycles go on
    ours = np.array([schedule(int(t)) for t in k])
    # the same expression in another order: rounding only (a few ulps of 0.25)
    np.testing.assert_allclose(ours, closed_form(k, num_cycles, num_steps, 0.25), rtol=0, atol=1e-15)
    length = math.ceil(num_steps / num_cycles)
    assert schedule(0) == 0.25 and schedule(length) == 0.25  # the peak at every cycle's start
    assert ours.min() > 0


@pytest.mark.parametrize("peak_factor", [0.5, 3.0, 20.0])
def test_peak_factor_scales_the_cycle_and_not_the_warmup(peak_factor):
    """Closed form with the peak epsilon_0 = F epsilon_b; the warmup (t < t_0) runs at the base step epsilon_b."""
    schedule = Cyclical(3, 30, exploration=0.3, peak=0.25, peak_factor=peak_factor).starting_at(4)
    k = np.arange(60)
    ours = np.array([schedule(4 + int(i)) for i in k])
    # the same expression in another order: rounding only (a few ulps of 0.25 F)
    np.testing.assert_allclose(ours, closed_form(k, 3, 30, 0.25, peak_factor), rtol=1e-15, atol=0)
    assert ours.max() == pytest.approx(0.25 * peak_factor, rel=1e-15)  # the peak, at every cycle's start
    assert [schedule(t) for t in range(4)] == [0.25] * 4
    # the stages do not depend on the peak
    plain = Cyclical(3, 30, exploration=0.3, peak=0.25).starting_at(4)
    assert [schedule.explores(t) for t in range(70)] == [plain.explores(t) for t in range(70)]


def test_peak_factor_one_is_the_plain_schedule_bit_for_bit():
    plain, one = Cyclical(4, 100, 0.5, peak=0.3), Cyclical(4, 100, 0.5, peak=0.3, peak_factor=1.0)
    assert [one(t) for t in range(200)] == [plain(t) for t in range(200)]


def test_a_cycle_decreases_from_the_peak_to_pi_squared_over_four_l_squared():
    schedule = Cyclical(2, 200, peak=1.0)
    cycle = np.array([schedule(t) for t in range(100)])
    assert np.all(np.diff(cycle) < 0)
    assert cycle[-1] == pytest.approx(math.pi**2 / (4 * 100**2), rel=1e-3)  # 1 - cos(x) ~ x^2 / 2, x = pi / L


def test_the_warmup_runs_at_the_peak_and_the_cycles_count_from_start():
    schedule = Cyclical(2, 8, exploration=0.5, peak=2.0).starting_at(5)
    assert [schedule(t) for t in range(5)] == [2.0] * 5
    assert [schedule(5 + k) for k in range(8)] == [Cyclical(2, 8, 0.5, 2.0)(k) for k in range(8)]
    assert schedule.start == 5 and not any(schedule.explores(t) for t in range(5))
    assert [schedule.cycle(t) for t in (0, 4, 5, 8, 9, 12, 13)] == [-1, -1, 0, 0, 1, 1, 2]


def test_the_stages():
    # L = 4, beta = 0.5: two exploration steps (r = 0, 1/4), then two sampling steps (r = 1/2, 3/4), per cycle
    schedule = Cyclical(2, 8, exploration=0.5, peak=1.0)
    assert [schedule.explores(t) for t in range(8)] == [True, True, False, False] * 2
    assert [schedule.sampling_stage(t) for t in range(8)] == [False, False, True, True] * 2
    # L = 10, beta = 0.25: r < 0.25 for mod(k, 10) in {0, 1, 2}, i.e. ceil(beta L) = 3 steps
    schedule = Cyclical(3, 30, exploration=0.25)
    assert [t for t in range(30) if schedule.explores(t)] == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    # beta = 0: noise throughout, a cosine schedule only
    assert not any(Cyclical(2, 10, exploration=0.0).explores(t) for t in range(30))
    # warmup is neither
    warm = Cyclical(2, 8, 0.5).starting_at(3)
    assert not warm.sampling_stage(2) and not warm.explores(2) and warm.explores(3)


def test_stage_stats_are_per_chain_tensors():
    schedule = Cyclical(2, 8, exploration=0.5).starting_at(1)
    stats = schedule.stage_stats(4, num_chains=3)
    assert stats["sampling_stage"].dtype == torch.bool and stats["sampling_stage"].tolist() == [True] * 3
    assert stats["cycle"].dtype == torch.int64 and stats["cycle"].tolist() == [0] * 3
    assert schedule.stage_stats(1, 2)["sampling_stage"].tolist() == [False, False]


def test_with_peak_takes_per_chain_step_sizes():
    peaks = torch.tensor([[0.1], [0.4]])
    schedule = Cyclical(2, 8, peak=1.0).with_peak(peaks)
    assert torch.equal(schedule(0), peaks)
    assert torch.allclose(schedule(2), peaks * 0.5, rtol=0, atol=1e-7)  # cos(pi / 2) = 0: half the peak
    assert Cyclical(2, 8, peak=1.0)(2) == pytest.approx(0.5, abs=1e-15)  # the original is unchanged
    # with a factor, the adapted step sizes are the base: the peak is F times each chain's
    scaled = Cyclical(2, 8, peak=1.0, peak_factor=4.0).with_peak(peaks)
    assert torch.allclose(scaled(0), 4.0 * peaks, rtol=1e-7, atol=0) and scaled.peak_factor == 4.0
    assert torch.allclose(scaled(2), 2.0 * peaks, rtol=1e-6, atol=0)  # half the peak (float32 cosine factor)


def test_it_is_a_schedule_that_pickles_and_has_a_faithful_repr():
    schedule = make_schedule("cyclical", num_cycles=3, num_steps=90, exploration=0.8, peak=0.01, peak_factor=2.0)
    assert as_schedule(schedule) is schedule and schedule.staged
    copy = pickle.loads(pickle.dumps(schedule))
    assert [copy(t) for t in range(90)] == [schedule(t) for t in range(90)]
    expected = "Cyclical(num_cycles=3, num_steps=90, exploration=0.8, peak=0.01, start=0, peak_factor=2.0)"
    assert repr(schedule) == expected
    assert eval(repr(schedule)).__dict__ == schedule.__dict__  # the repr (the checkpoint's fingerprint) says all


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(num_cycles=0), "num_cycles"),
        (dict(num_cycles=2.0), "num_cycles"),
        (dict(num_cycles=True), "num_cycles"),
        (dict(num_steps=3), "num_steps"),
        (dict(num_steps=10.5), "num_steps"),
        (dict(exploration=1.0), "exploration"),
        (dict(exploration=-0.1), "exploration"),
        (dict(exploration=math.nan), "exploration"),
        (dict(exploration=True), "exploration"),
        (dict(peak=0.0), "peak"),
        (dict(peak=math.inf), "peak"),
        (dict(peak="0.1"), "peak"),
        (dict(start=-1), "start"),
        (dict(peak_factor=0.0), "peak_factor"),
        (dict(peak_factor=-2.0), "peak_factor"),
        (dict(peak_factor=math.nan), "peak_factor"),
        (dict(peak_factor=True), "peak_factor"),
    ],
)
def test_bad_arguments_are_named(kwargs, name):
    arguments = dict(num_cycles=4, num_steps=100)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=f"Cyclical: {name}"):
        Cyclical(**arguments)


def test_other_schedules_have_no_stages():
    schedule = as_schedule(0.1)
    assert not schedule.staged and not schedule.explores(0) and schedule.stage_stats(0, 2) == {}
    assert schedule.starting_at(100) is schedule
