"""export/replay.py: a recorded call replays the same operators, so it gives the model's values bit for bit on new
inputs; a recording that a replay could betray (random numbers, a value read to Python, a shape that depends on
values, a write into the data) is refused; a replay is trusted only after agreeing with a second call.

The oracle is the function itself, called on the same new inputs: a replay runs the same ATen kernels on the same
values, so equality is exact (``torch.equal``), no tolerance.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyro_sgmcmc.export.replay import Program, ReplayedCalls, record

ROOT = Path(__file__).resolve().parents[2]
G = torch.Generator().manual_seed(0)
X = torch.randn(40, 3, generator=G)  # the "data": read by the function, never an input
Y = torch.randn(40, generator=G)


def normal_log_likelihood(positions, rows):
    """``(D, 4)`` positions (3 weights and a log scale) and ``(K, B)`` rows -> ``(D, K, B)``, under two vmaps as
    the export runs a model."""

    def one(position, index):
        loc = X[index] @ position[:3]
        return torch.distributions.Normal(loc, position[3].exp(), validate_args=False).log_prob(Y[index])

    return torch.func.vmap(torch.func.vmap(one, in_dims=(None, 0)), in_dims=(0, None))(positions, rows)


def _inputs(seed, draws=5, combinations=2, batch=10):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(draws, 4, generator=g), torch.randint(0, 40, (combinations, batch), generator=g)


def test_a_replay_runs_the_recorded_operators_on_new_inputs_bit_for_bit():
    result, program, why = record(normal_log_likelihood, *_inputs(1))
    assert why is None and isinstance(program, Program)
    assert torch.equal(result, normal_log_likelihood(*_inputs(1)))
    new = _inputs(2)
    expected = normal_log_likelihood(*new)
    assert torch.equal(program(*new), expected)
    compiled = program.compiled(*new)
    assert compiled is not None and torch.equal(compiled(*_inputs(3)), normal_log_likelihood(*_inputs(3)))
    # the data are read where they are, not copied into the recording
    assert any(c is X for c in program.constants) and any(c is Y for c in program.constants)


def test_a_value_read_from_the_data_and_integer_indices_are_replayed():
    def scaled(positions, index):  # float(X.sum()) reads the data, not the inputs: the same at every call
        return positions * float(X.sum()) + X[index].sum(-1)

    inputs = (torch.randn(3, 10, generator=G), torch.arange(10))
    _, program, why = record(scaled, *inputs)
    assert why is None
    new = (torch.randn(3, 10, generator=G), torch.randint(0, 40, (10,), generator=G))
    assert torch.equal(program(*new), scaled(*new))


def _read_through_an_alias(p):
    buffer = torch.zeros(3)
    buffer[:2].copy_(p[0])  # written through a view: the buffer now depends on the input
    return p * float(buffer.sum())


@pytest.mark.parametrize(
    "fn, reason",
    [
        (lambda p: p + torch.randn_like(p), "draws random numbers"),
        (lambda p: p * float(p.sum()), "reads a value to Python"),
        (_read_through_an_alias, "reads a value to Python"),
        (lambda p: p[p > 0], "output shape that depends on the values"),
        (lambda p: p + X[:2, :2].add_(0.0).sum(), "writes into a tensor that existed before the call"),
        (lambda p: p + Y.mul_(1.0).sum(), "writes into a tensor that existed before the call"),
    ],
    ids=["random", "item", "item-through-an-alias", "mask", "write-into-a-view-of-the-data", "write-into-the-data"],
)
def test_a_recording_that_a_replay_could_betray_is_refused(fn, reason):
    result, program, why = record(fn, torch.randn(2, 2, generator=G))
    assert program is None and reason in why
    assert isinstance(result, torch.Tensor)  # the call itself ran and its result is returned


class _Counted:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, positions, rows):
        self.calls += 1
        return self.fn(positions, rows)


def _dict_call(positions, rows):
    return {"y": normal_log_likelihood(positions, rows["data"])}


def test_replayed_calls_record_then_check_then_replay():
    evaluate = _Counted(_dict_call)
    replayed = ReplayedCalls(evaluate)
    for seed in range(5):
        positions, rows = _inputs(seed)
        got = replayed(positions[1:], {"data": rows})  # a view with an offset: copied before a replay
        assert torch.equal(got["y"], _dict_call(positions[1:], {"data": rows})["y"])
    assert evaluate.calls == 2  # recorded at the first block, checked at the second, replayed after
    assert not replayed.why_not
    replayed(*_inputs(9, draws=3)[:1], {"data": _inputs(9)[1]})  # a new shape: recorded anew
    assert evaluate.calls == 3 and len(replayed.replays) == 2


def test_a_replay_that_disagrees_with_the_second_call_is_not_used():
    scale = {"now": 2.0}

    def drifting(positions, rows):  # a Python number the recording sees as a constant, changing between calls
        return {"y": normal_log_likelihood(positions, rows["data"]) * scale["now"]}

    evaluate = _Counted(drifting)
    replayed = ReplayedCalls(evaluate)
    for seed in range(4):
        positions, rows = _inputs(seed)
        scale["now"] = 2.0 + seed
        assert torch.equal(replayed(positions, {"data": rows})["y"], drifting(positions, {"data": rows})["y"])
    assert evaluate.calls == 4  # every call evaluated by the function itself
    assert list(replayed.why_not.values()) == ["its replay disagreed with the model"]


def test_a_refused_recording_leaves_every_call_to_the_function():
    evaluate = _Counted(lambda positions, rows: {"y": positions + torch.randn_like(positions)})
    replayed = ReplayedCalls(evaluate)
    for seed in range(3):
        replayed(_inputs(seed)[0], {"data": _inputs(seed)[1]})
    assert evaluate.calls == 3 and "draws random numbers" in next(iter(replayed.why_not.values()))


def test_recording_imports_no_dynamo():
    # TorchDispatchMode subclasses are wrapped for Dynamo, whose first call imported torch._dynamo (1.1 s of CPU)
    code = (
        "import sys, torch\n"
        "from pyro_sgmcmc.export.replay import record\n"
        "record(lambda p: torch.func.vmap(torch.exp)(p), torch.ones(2, 2))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
