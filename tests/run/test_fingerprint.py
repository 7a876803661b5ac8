"""A checkpoint resumes only the run that wrote it: data, code and schedule (run/fingerprint.py, issue 26.1).

Each test runs a tiny model to the end with a checkpoint, changes one input, and runs again: a run whose inputs
differ is refused with the component named; one whose inputs are equal resumes the finished checkpoint (it takes
no step, and its draws are the first run's).
"""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGLD, CheckpointSettings, Schedule
from pyro_sgmcmc.checkpoint import CheckpointMismatch

from . import fingerprint_script as script

SETTINGS = dict(num_samples=6, warmup_steps=4, num_chains=2, chain_method="vectorized", seed=1, disable_progbar=True)
PRIOR_SCALE = 10.0  # read by model_reading_a_global


def _rows(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g), 1.5 + torch.randn(n, generator=g)


def dict_model(data):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("rows", len(data["y"]), subsample_size=10) as idx:
        pyro.sample("obs", dist.Normal(mu + 0.1 * data["x"][idx], 1.0), obs=data["y"][idx])


def list_model(data):
    x, y = data
    dict_model({"x": x, "y": y})


def numpy_model(x, y):
    dict_model({"x": torch.as_tensor(x), "y": torch.as_tensor(y)})


def model_reading_a_global(data):
    mu = pyro.sample("mu", dist.Normal(0.0, PRIOR_SCALE))
    with pyro.plate("rows", len(data["y"]), subsample_size=10) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=data["y"][idx])


def _run(path, model, *args, step_size=1e-3, **kwargs):
    """Run to the end with a checkpoint every 5 steps; the steps it took are in ``mcmc.steps``."""
    steps = []
    kernel = SGLD(model, step_size=step_size, adapt_step_size=False, adapt_mass_matrix=False)
    mcmc = MCMC(kernel, checkpoint=CheckpointSettings(path, every=5), hook_fn=lambda *a: steps.append(a), **SETTINGS)
    mcmc.run(*args, **kwargs)
    mcmc.steps = steps
    return mcmc


def _resumes_unchanged(first, again):
    assert again.steps == [] and len(first.steps) == 10  # the finished checkpoint was resumed, not run again
    assert torch.equal(again.get_samples()["mu"], first.get_samples()["mu"])


def _dict_data(change=False):
    x, y = _rows()
    return {"x": x, "y": y.clone().index_fill_(0, torch.tensor([7]), 9.0) if change else y}


def _list_data(change=False):
    x, y = _rows()
    return [x.clone().index_fill_(0, torch.tensor([3]), -4.0) if change else x, y]


def _numpy_data(change=False):
    x, y = (t.numpy().astype(np.float64) for t in _rows())
    if change:
        x[11] += 1e-9  # one value, by less than float32 could hold
    return (x, y)


@pytest.mark.parametrize(
    "model, data, component",
    [
        (dict_model, lambda change: ((_dict_data(change),), {}), "argument 'data[\"y\"]'"),
        (list_model, lambda change: ((_list_data(change),), {}), "argument 'data[0]'"),
        (numpy_model, lambda change: (_numpy_data(change), {}), "argument 'x'"),
        (numpy_model, lambda change: ((), dict(zip("xy", _numpy_data(change)))), "argument 'x'"),
    ],
    ids=["dict-of-tensors", "list-of-tensors", "numpy-positional", "numpy-keywords"],
)
def test_changed_data_is_refused_naming_the_argument_and_equal_data_resumes(tmp_path, model, data, component):
    path = tmp_path / "run.ckpt"
    args, kwargs = data(False)
    first = _run(path, model, *args, **kwargs)
    args, kwargs = data(True)
    with pytest.raises(CheckpointMismatch, match=f"different settings:(.|\n)*\n  {re.escape(component)}: theirs"):
        _run(path, model, *args, **kwargs)
    args, kwargs = data(False)  # rebuilt: equal values in new objects
    _resumes_unchanged(first, _run(path, model, *args, **kwargs))


def _compiled_model(scale: str):
    """``model(data)`` compiled from source with the prior scale written as the constant ``scale``."""
    source = f"""
def model(data):
    mu = pyro.sample("mu", dist.Normal(0.0, {scale}))
    with pyro.plate("rows", len(data["y"]), subsample_size=10) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=data["y"][idx])
"""
    namespace = {"pyro": pyro, "dist": dist}
    exec(compile(source, "user_model.py", "exec"), namespace)
    return namespace["model"]


def test_a_changed_constant_in_the_models_code_is_refused_naming_the_models_code(tmp_path):
    path = tmp_path / "run.ckpt"
    data = {"y": _rows()[1]}
    first = _run(path, _compiled_model("10.0"), data)
    with pytest.raises(CheckpointMismatch, match="different settings:(.|\n)*\n  the model's code: model: theirs"):
        _run(path, _compiled_model("1.0"), data)
    _resumes_unchanged(first, _run(path, _compiled_model("10.0"), data))  # the same code, compiled again


def test_a_changed_global_that_the_model_reads_is_refused_naming_the_models_code(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    data = {"y": _rows()[1]}
    first = _run(path, model_reading_a_global, data)
    monkeypatch.setattr(sys.modules[__name__], "PRIOR_SCALE", 1.0)
    with pytest.raises(CheckpointMismatch, match="\n  the model's code: model_reading_a_global: theirs"):
        _run(path, model_reading_a_global, data)
    monkeypatch.setattr(sys.modules[__name__], "PRIOR_SCALE", 10.0)
    _resumes_unchanged(first, _run(path, model_reading_a_global, data))


def _script(tmp_path, out, *extra):
    command = [sys.executable, str(Path(script.__file__)), str(tmp_path / out), str(tmp_path / "run.ckpt"), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])


def test_a_schedule_without_repr_resumes_in_a_new_process(tmp_path):
    """Its fingerprint is its class and values, not a repr holding its address; the NumPy, list and set data
    are fingerprinted the same by each process (each has its own hash seed, so its own set order)."""
    stopped = _script(tmp_path, "a.pt", "--stop", "13")
    assert stopped.returncode == 3, stopped.stderr
    resumed = _script(tmp_path, "b.pt")
    assert resumed.returncode == 0, resumed.stderr
    reference = script.run().get_samples(group_by_chain=True)
    draws = torch.load(tmp_path / "b.pt", weights_only=True)
    assert torch.equal(draws["mu"], reference["mu"])


class CountingSchedule(Schedule):
    """A step size that shrinks with the number of calls: state that changes as the run goes."""

    def __init__(self):
        self.calls = 0

    def __call__(self, t):
        self.calls += 1
        return 1e-3 / (1.0 + self.calls / 10.0)


class SavedCountingSchedule(CountingSchedule):
    """The same, with its state saved and restored by the checkpoint."""

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def test_a_schedule_that_keeps_state_it_does_not_save_is_refused_before_the_first_step(tmp_path):
    data = {"x": _rows()[0], "y": _rows()[1]}
    with pytest.raises(TypeError, match=r"CountingSchedule changes its attributes \['calls'\](.|\n)*state_dict"):
        _run(tmp_path / "run.ckpt", dict_model, data, step_size=CountingSchedule())
    assert not (tmp_path / "run.ckpt").exists()
    assert len(_run(tmp_path / "other.ckpt", dict_model, data, step_size=SavedCountingSchedule()).steps) == 10


def test_a_schedule_that_saves_its_state_resumes_bit_identically(tmp_path):
    """Interrupted after step 8 (checkpoint at 5), run again with the same, advanced, schedule object: its state is
    restored to the checkpoint's, so the draws equal an uninterrupted run's."""
    data = {"x": _rows()[0], "y": _rows()[1]}
    reference = _run(tmp_path / "reference.ckpt", dict_model, data, step_size=SavedCountingSchedule())
    schedule = SavedCountingSchedule()

    def stop(kernel, *_):
        if kernel.state.step == 8:
            raise KeyboardInterrupt

    kernel = SGLD(dict_model, step_size=schedule, adapt_step_size=False, adapt_mass_matrix=False)
    mcmc = MCMC(kernel, checkpoint=CheckpointSettings(tmp_path / "run.ckpt", every=5), hook_fn=stop, **SETTINGS)
    with pytest.raises(KeyboardInterrupt):
        mcmc.run(data)
    resumed = _run(tmp_path / "run.ckpt", dict_model, data, step_size=schedule)
    assert len(resumed.steps) == 5
    assert torch.equal(resumed.get_samples()["mu"], reference.get_samples()["mu"])


def test_an_argument_whose_content_cannot_be_read_is_refused_before_the_first_step_naming_it(tmp_path):
    """A generator has no attributes and a repr holding its address: nothing would tell two runs' apart."""
    x, y = _rows()
    data = {"x": x, "y": y, "rng": torch.Generator()}
    with pytest.raises(TypeError, match=r"argument 'data\[\"rng\"\]' is a torch._C.Generator whose content"):
        _run(tmp_path / "run.ckpt", dict_model, data)
    assert not (tmp_path / "run.ckpt").exists()
