"""Schedules in the fingerprint (fingerprint/schedules.py): class and values, never an address; state saved or
refused."""

import json

import pytest

from pyro_sgmcmc import Constant, RobbinsMonro, Schedule
from pyro_sgmcmc.fingerprint import check_schedule_state, describe_schedule
from pyro_sgmcmc.kernels.configuration import describe


class Halving(Schedule):
    """No ``__repr__``: the default one holds the object's address."""

    def __init__(self, a):
        self.a = a

    def __call__(self, t):
        return self.a / 2 ** (t // 100)


class Counting(Schedule):
    def __init__(self):
        self.calls = 0

    def __call__(self, t):
        self.calls += 1
        return 0.01


class SavedCounting(Counting):
    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def test_a_schedule_is_its_class_code_and_values_without_an_address():
    one, same, other = (describe(Halving(a)) for a in (0.1, 0.1, 0.2))
    assert one == same != other
    assert one["schedule"] == "Halving" and len(one["code"]) == 64 and one["attributes"] == {"a": 0.1}
    assert "0x" not in json.dumps(one)
    assert describe(Constant(0.1)) == {"schedule": "pyro_sgmcmc.schedules.Constant", "attributes": {"value": 0.1}}
    assert describe(RobbinsMonro(0.1))["attributes"] == {"a": 0.1, "b": 1.0, "gamma": 0.55}


def test_a_callable_step_size_is_its_code():
    def step(t):
        return 0.1

    def other(t):
        return 0.2

    from pyro_sgmcmc.schedules import as_schedule

    described = describe(as_schedule(step))["attributes"]["fn"]
    assert described["function"].endswith("<locals>.step") and len(described["sha256"]) == 64
    assert describe(as_schedule(other))["attributes"]["fn"]["sha256"] != described["sha256"]


def test_a_schedule_that_saves_its_state_is_its_class_and_code_only():
    assert describe_schedule(SavedCounting(), describe)["state"] == "saved with the chains"
    assert "attributes" not in describe_schedule(SavedCounting(), describe)


def test_a_schedule_that_keeps_state_without_saving_it_is_refused_and_left_as_it_was():
    schedule = Counting()
    with pytest.raises(TypeError, match=r"step_size: the schedule .*Counting changes its attributes \['calls'\]"):
        check_schedule_state(schedule)
    assert schedule.calls == 0  # a copy was probed
    check_schedule_state(SavedCounting())
    check_schedule_state(Halving(0.1))
    check_schedule_state(Constant(0.1))


CALLS = []


def counting_step(t):
    CALLS.append(t)
    return 0.1


def test_a_step_size_function_that_keeps_state_in_a_global_is_refused():
    from pyro_sgmcmc.schedules import as_schedule

    with pytest.raises(TypeError, match=r"changes its attributes \['fn'\]"):
        check_schedule_state(as_schedule(counting_step))
