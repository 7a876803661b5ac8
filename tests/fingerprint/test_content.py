"""Content digests (fingerprint/content.py): equal content, equal digest, in any process; any change, another."""

import copy
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_sgmcmc.fingerprint import ContentHasher, Unfingerprintable, content_digest


class Point:
    """An object with no ``__repr__``: its default repr holds its memory address."""

    def __init__(self, x, y):
        self.x, self.y = x, y


class Slotted:
    __slots__ = ("a", "__b")

    def __init__(self, a, b):
        self.a, self.__b = a, b


def _digest(value):
    return ContentHasher().digest(value, "value")


PAIRS = {  # a value, and one that differs from it in one respect
    "tensor-element": (torch.arange(6.0), torch.arange(6.0).index_fill(0, torch.tensor([4]), 4.5)),
    "tensor-dtype": (torch.arange(6.0), torch.arange(6.0, dtype=torch.float64)),
    "tensor-shape": (torch.arange(6.0), torch.arange(6.0).reshape(2, 3)),
    "tensor-expanded": (torch.zeros(1).expand(3), torch.zeros(4).expand(2, 4)),
    "numpy-element": (np.linspace(0, 1, 5), np.linspace(0, 1, 5) + np.eye(1, 5, 3).ravel() * 1e-12),
    "numpy-dtype": (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int64)),
    "numpy-scalar": (np.float32(1.0), np.float64(1.0)),
    "numpy-objects": (np.array([1, "a"], dtype=object), np.array([1, "b"], dtype=object)),
    "nested-dict": ({"a": {"b": [1, 2.0, "c"]}}, {"a": {"b": [1, 2.5, "c"]}}),
    "int-or-float": ([1, 2], [1.0, 2]),
    "list-or-tuple": ([1, 2], (1, 2)),
    "set": ({"a", "b", "c"}, {"a", "b", "d"}),
    "mixed-keys": ({1: "x", "1": "y"}, {1: "y", "1": "x"}),
    "object-attribute": (Point(1.0, torch.ones(2)), Point(1.0, torch.zeros(2))),
    "slots": (Slotted(1, 2), Slotted(1, 3)),
    "object-class": (Point(1, 2), Slotted(1, 2)),
}


@pytest.mark.parametrize("value, changed", list(PAIRS.values()), ids=list(PAIRS))
def test_equal_content_gives_an_equal_digest_and_one_change_another(value, changed):
    assert _digest(value) == _digest(copy.deepcopy(value))  # new objects, same content
    assert _digest(value) != _digest(changed)


def test_dict_and_set_order_does_not_count():
    assert _digest({"a": 1, "b": [2]}) == _digest({"b": [2], "a": 1})
    assert _digest({1: "x", "k": 2, (0, 1): 3}) == _digest({(0, 1): 3, "k": 2, 1: "x"})
    assert _digest({3, 1, 2}) == _digest({2, 3, 1})


def test_cycles_and_shared_references_are_walked_once():
    loop = [1]
    loop.append(loop)
    other = [1]
    other.append(other)
    assert _digest(loop) == _digest(other) != _digest([1, [1]])
    point = Point(1, None)
    point.y = point
    assert len(_digest(point)) == 64


def test_an_object_without_a_stable_repr_is_refused_naming_where_it_is():
    data = {"config": {"rng": torch.Generator()}}
    with pytest.raises(Unfingerprintable, match=r"argument 'data'\[\"config\"\]\[\"rng\"\] is a torch._C.Generator"):
        ContentHasher().digest(data, "argument 'data'")
    assert issubclass(Unfingerprintable, TypeError)


class Locked:
    """Attributes that cannot be read (a lock), and a repr without an address that says what matters."""

    def __init__(self, n):
        self.n, self.lock = n, threading.Lock()

    def __repr__(self):
        return f"Locked({self.n})"


def test_an_object_whose_attributes_cannot_be_read_is_its_repr_when_that_holds_no_address():
    assert _digest(Locked(1)) == _digest(Locked(1)) != _digest(Locked(2))
    assert _digest([Locked(1), Point(1, 2)]) == _digest([Locked(1), Point(1, 2)])


def test_a_logger_is_its_name_not_the_process_s_loggers():
    assert _digest(logging.getLogger("a.b")) != _digest(logging.getLogger("a.c"))
    logging.getLogger("another.logger.made.later")
    assert _digest(logging.getLogger("a.b")) == _digest(logging.getLogger("a.b"))


# ---------------------------------------------------------------------- code
def _functions(source: str, filename: str = "user_code.py") -> dict:
    namespace = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


SOURCE = """
SCALE = {global_scale}

def helper(x):
    return x * {helper_constant}

def model(x, offset={default}):
    return helper(x) + SCALE + offset + torch.tensor({constant})
"""
BASE = dict(global_scale=1.0, helper_constant=2.0, default=0.5, constant=3.0)


def _units(**changes) -> dict:
    hasher = ContentHasher()
    hasher.digest(_functions(SOURCE.format(**{**BASE, **changes}))["model"], "the model")
    return hasher.units


@pytest.mark.parametrize(
    "change, unit",
    [({"constant": 3.5}, "model"), ({"default": 0.0}, "model"), ({"global_scale": 2.0}, "model"),
     ({"helper_constant": 2.5}, "helper")],
    ids=["constant", "default", "global", "callee-constant"],
)  # fmt: skip
def test_a_change_in_the_code_changes_the_unit_of_the_function_that_holds_it(change, unit):
    before, after = _units(), _units(**change)
    assert set(before) == {"model", "helper"}
    assert [name for name in before if before[name] != after[name]] == [unit]


def test_the_code_s_file_and_lines_do_not_count():
    hasher = ContentHasher()
    model = _functions("\n\n\n# moved down\n" + SOURCE.format(**BASE), "elsewhere.py")["model"]
    hasher.digest(model, "the model")
    assert hasher.units == _units()


def test_closure_values_count():
    def make(scale):
        def model(x):
            return x * scale

        return model

    assert content_digest(make(1.0), "f") == content_digest(make(1.0), "f") != content_digest(make(2.0), "f")


def test_library_code_is_its_name():
    hasher = ContentHasher()
    hasher.digest([torch.nn.functional.relu, torch.randn, torch.Tensor.sum, len, np.mean, torch.nn.Linear], "x")
    assert hasher.units == {}


def test_digests_are_the_same_in_another_process_with_another_hash_seed():
    """Sets of strings iterate in an order that changes with the hash seed; no digest may."""
    code = (
        "import json; from tests.fingerprint import test_content as t; "
        "print(json.dumps([t.content_digest(v, 'v') for v in t.cross_process_values()]))"
    )
    digests = [content_digest(v, "v") for v in cross_process_values()]  # the functions' code included
    root = Path(__file__).parents[2]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        command = [sys.executable, "-c", code]
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == digests


def cross_process_values():
    return [
        {"alpha", "beta", "gamma", "delta"},
        {"b": 1, 2: "x", ("t", 1): frozenset({"u", "v"})},
        Point(np.arange(3.0), {"k": torch.ones(2)}),
        _functions(SOURCE.format(**BASE))["model"],
        _scaled(2.0),
        Point,
    ]


def _scaled(scale):
    return lambda x: helper_of_the_lambda(x) * scale


def helper_of_the_lambda(x):
    return {"a", "b"} if x else frozenset()


def test_a_global_named_like_an_attribute_the_code_reads_does_not_count():
    source = "shape = {}\n\ndef model(x):\n    return x.shape\n"
    one, other = (_functions(source.format(v))["model"] for v in (1, 2))
    assert content_digest(one, "m") == content_digest(other, "m")
