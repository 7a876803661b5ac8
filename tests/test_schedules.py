"""Step-size schedules: values, validation, and the named constructor."""

import math
import pickle

import pytest

from pyro_sgmcmc import Constant, RobbinsMonro, make_schedule
from pyro_sgmcmc.schedules import as_schedule


def test_constant_and_robbins_monro_values():
    assert Constant(0.1)(0) == Constant(0.1)(10**6) == 0.1
    schedule = RobbinsMonro(a=0.5, b=10.0, gamma=0.55)
    for t in (0, 1, 100, 10**6):
        assert schedule(t) == pytest.approx(0.5 * (10.0 + t) ** -0.55, rel=1e-15)
    # decreasing, with sum eps = inf and sum eps^2 < inf for gamma in (0.5, 1]
    assert schedule(10) < schedule(0)


def test_make_schedule_and_as_schedule():
    assert make_schedule("constant", value=0.2)(5) == 0.2
    assert make_schedule("robbins_monro", a=1.0, b=1.0, gamma=1.0)(3) == pytest.approx(0.25)
    assert as_schedule(0.3)(7) == 0.3
    assert as_schedule(lambda t: 1.0 / (1 + t))(3) == 0.25


def test_schedules_pickle():
    schedule = RobbinsMonro(a=0.5, b=2.0, gamma=0.75)
    assert pickle.loads(pickle.dumps(schedule))(4) == schedule(4)


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf])
def test_constant_rejects_non_positive(value):
    with pytest.raises(ValueError, match="step_size must be a positive, finite float"):
        Constant(value)


def test_robbins_monro_rejects_bad_arguments():
    with pytest.raises(ValueError, match="a must be positive"):
        RobbinsMonro(a=0.0)
    with pytest.raises(ValueError, match="b must be positive"):
        RobbinsMonro(a=1.0, b=0.0)
    with pytest.raises(ValueError, match=r"gamma must be in \(0.5, 1\]"):
        RobbinsMonro(a=1.0, gamma=1.5)
