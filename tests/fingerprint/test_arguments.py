"""The model's entries of the fingerprint (fingerprint/arguments.py): named, opened level by level, readable."""

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule

from pyro_sgmcmc.fingerprint import model_fingerprint
from pyro_sgmcmc.fingerprint.arguments import MAX_LISTED


def model(x, y=None, *rest, scale=1.0, **extra):
    pyro.sample("mu", dist.Normal(0.0, scale))


def _arguments(fingerprint):
    return {k: v for k, v in fingerprint.items() if k.startswith("argument")}


def test_arguments_are_named_by_the_model_s_signature_however_they_are_passed():
    x = torch.arange(3.0)
    by_position = _arguments(model_fingerprint(model, (x, 2, "a"), {"scale": 0.5, "flag": True}))
    tensor = by_position.pop("argument 'x'")
    assert tensor.startswith("tensor torch.float32 (3,) sha256 ") and len(tensor.split()[-1]) == 64
    assert by_position == {
        "argument 'y'": "2",
        "argument 'rest[0]'": "'a'",
        "argument 'scale'": "0.5",
        "argument 'flag'": "True",
    }
    by_keyword = model_fingerprint(model, (), {"x": x, "y": 2})
    assert _arguments(by_keyword) == _arguments(model_fingerprint(model, (x, 2), {}))


def test_arguments_the_signature_does_not_take_are_named_by_position():
    entries = _arguments(model_fingerprint(lambda *a: None, (1, 2), {}))
    assert entries == {"argument 'a[0]'": "1", "argument 'a[1]'": "2"}
    entries = _arguments(model_fingerprint(len, (1,), {"k": 2}))  # a builtin: no signature to bind
    assert entries == {"argument 0": "1", "argument 'k'": "2"}


def test_containers_are_opened_level_by_level_within_the_listing_s_bound():
    data = {"small": {"a": np.zeros(2), "b": [1, 2]}, "big": list(range(2 * MAX_LISTED)), "empty": {}}
    entries = _arguments(model_fingerprint(model, (data,), {}))
    assert set(entries) == {
        'argument \'x["small"]["a"]\'',
        'argument \'x["small"]["b"][0]\'',
        'argument \'x["small"]["b"][1]\'',
        "argument 'x[\"big\"]'",
        "argument 'x[\"empty\"]'",
    }
    assert entries['argument \'x["small"]["a"]\''].startswith("ndarray float64 (2,) sha256 ")
    assert entries["argument 'x[\"big\"]'"].startswith("list sha256 ")
    assert len(_arguments(model_fingerprint(model, (list(range(10 * MAX_LISTED)),), {}))) == 1


def test_the_model_s_code_is_listed_per_function():
    def scale():
        return 2.0

    def local_model(x):
        pyro.sample("mu", dist.Normal(0.0, scale()))

    entries = model_fingerprint(local_model, (torch.zeros(2),), {})
    code = sorted(k for k in entries if k.startswith("the model's code"))
    assert code == [
        "the model's code: test_the_model_s_code_is_listed_per_function.<locals>.local_model",
        "the model's code: test_the_model_s_code_is_listed_per_function.<locals>.scale",
    ]


class Regression(PyroModule):
    def __init__(self, prior_scale):
        super().__init__()
        self.prior_scale = prior_scale

    def forward(self, features, target=None):
        pyro.sample("w", dist.Normal(0.0, self.prior_scale))


def test_a_module_model_is_named_by_forward_and_described_by_its_attributes():
    first = model_fingerprint(Regression(1.0), (torch.zeros(2),), {"target": None})
    assert {"argument 'features'", "argument 'target'", "the model's code: Regression.forward"} <= set(first)
    other = model_fingerprint(Regression(2.0), (torch.zeros(2),), {"target": None})
    assert [k for k in first if first[k] != other[k]] == ["the model"]
