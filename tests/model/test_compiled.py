"""One chain compiled by torch.jit.trace, many chains (and minibatches) vectorised by torch.func.vmap."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import ModelPotential


def test_jit_compile_matches_the_plain_potential():
    """The traced potential replays the same operations: same value and gradient (float32 round-off)
    at points and minibatches other than the one it was traced with."""
    torch.manual_seed(1)
    x = torch.randn(100, 2)
    y = x @ torch.tensor([0.5, -1.0]) + 0.3 * torch.randn(100)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        with pyro.plate("data", 100, subsample_size=10) as i:
            pyro.sample("y", dist.Normal(x[i] @ w, sigma), obs=y[i])

    plain = ModelPotential(model, (x, y), jit_compile=False)
    compiled = ModelPotential(model, (x, y), jit_compile=True)
    for trial in range(4):
        z = torch.randn(plain.dim)
        indices = {"data": torch.randperm(100)[:10]}
        expected, got = plain.potential_and_grad(z, indices), compiled.potential_and_grad(z, indices)
        assert compiled._jitted is not None  # really compiled
        assert torch.allclose(got[0], expected[0], rtol=1e-5)
        assert torch.allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)


def test_jit_compile_falls_back_with_a_warning_on_value_dependent_control_flow():
    """A model that branches on a latent value cannot be traced faithfully: the check at a second
    point (which crosses the branch here) catches it, warns, and the plain potential is used."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        shift = 1.0 if float(mu) > 0 else -1.0  # Python branch on a latent value
        with pyro.plate("data", len(y), subsample_size=2) as i:
            pyro.sample("y", dist.Normal(mu + shift, 1.0), obs=y[i])

    y = torch.tensor([0.0, 1.0, 2.0, 3.0])
    compiled = ModelPotential(model, (y,), jit_compile=True)
    plain = ModelPotential(model, (y,), jit_compile=False)
    indices = {"data": torch.tensor([0, 1])}
    with pytest.warns(RuntimeWarning, match="jit_compile"):
        got = compiled.potential_and_grad(torch.tensor([0.004]), indices)
    assert compiled._jitted is None
    assert torch.allclose(got[0], plain.potential_and_grad(torch.tensor([0.004]), indices)[0])
    below = torch.tensor([-0.5])  # the other branch: must use the plain potential
    assert torch.allclose(compiled.potential_and_grad(below, indices)[0], plain.potential_and_grad(below, indices)[0])


def test_jit_compile_must_be_a_bool_or_auto():
    with pytest.raises(TypeError, match='jit_compile must be True, False or "auto"'):
        ModelPotential(lambda: None, jit_compile="yes")


def _linear(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=10) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, 0.5), obs=y[i])


def _linear_data():
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(100, 2, generator=generator)
    return x, x @ torch.tensor([0.5, -1.0]) + 0.5 * torch.randn(100, generator=generator)


def test_auto_compiles_only_while_validation_is_off():
    """The default ``"auto"``: with Pyro's validation on (Pyro's default; a compiled function would
    check only the traced minibatch) the model runs every time; switched off (as ``MCMC`` does) the
    next evaluation compiles, and the compiled potential gives the plain one's values (float32
    round-off of the same operations: relative 1e-5)."""
    x, y = _linear_data()
    auto, plain = ModelPotential(_linear, (x, y)), ModelPotential(_linear, (x, y), jit_compile=False)
    assert auto.jit_compile == "auto"
    indices = {"data": torch.arange(10)}
    z = torch.tensor([0.3, -0.2])
    with pyro.validation_enabled(True):
        auto.potential_and_grad(z, indices)
    assert not auto.compiled and auto.jit_failure is None  # not given up: decided again next time
    with pyro.validation_enabled(False):
        for trial in range(3):
            z = torch.randn(2, generator=torch.Generator().manual_seed(trial))
            indices = {"data": torch.randperm(100, generator=torch.Generator().manual_seed(trial))[:10]}
            got, expected = auto.potential_and_grad(z, indices), plain.potential_and_grad(z, indices)
            assert auto.compiled
            assert torch.allclose(got[0], expected[0], rtol=1e-5)
            assert torch.allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)
    assert not plain.compiled


@pytest.mark.parametrize("source", ["python", "torch"])
def test_auto_leaves_a_model_with_random_numbers_uncompiled_without_a_warning(source):
    """A model that draws random numbers of its own gives different results on the same point and
    minibatch. Tracing would freeze Python's random numbers, so ``"auto"`` does not compile it (nor
    one with torch's, which it cannot tell apart), silently: the model then runs at every evaluation,
    which the changing values show."""
    import random

    def noisy(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        jitter = random.gauss(0.0, 1.0) if source == "python" else torch.randn(())
        with pyro.plate("data", x.shape[0], subsample_size=10) as i:
            pyro.sample("y", dist.Normal(x[i] @ w + jitter, 0.5), obs=y[i])

    x, y = _linear_data()
    potential = ModelPotential(noisy, (x, y))
    indices, z = {"data": torch.arange(10)}, torch.zeros(2)
    with pyro.validation_enabled(False), warnings.catch_warnings():
        warnings.simplefilter("error")
        values = [float(potential.potential_and_grad(z, indices)[0]) for _ in range(3)]
    assert not potential.compiled
    assert "different results on the same point" in potential.jit_failure
    assert len(set(values)) == 3


def test_auto_leaves_value_dependent_control_flow_uncompiled_without_a_warning():
    """The two-point check catches a branch on a latent value (as with ``jit_compile=True``, which
    warns); ``"auto"`` falls back silently and gives the plain potential on both branches."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        shift = 1.0 if float(mu) > 0 else -1.0
        with pyro.plate("data", len(y), subsample_size=2) as i:
            pyro.sample("y", dist.Normal(mu + shift, 1.0), obs=y[i])

    y = torch.tensor([0.0, 1.0, 2.0, 3.0])
    auto, plain = ModelPotential(model, (y,)), ModelPotential(model, (y,), jit_compile=False)
    indices = {"data": torch.tensor([0, 1])}
    with pyro.validation_enabled(False), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the model's own float(mu) warns (UserWarning)
        for z in (torch.tensor([0.004]), torch.tensor([-0.5])):
            assert torch.equal(auto.potential_and_grad(z, indices)[0], plain.potential_and_grad(z, indices)[0])
    assert not auto.compiled and "disagrees" in auto.jit_failure


# ---------------------------------------------------------------------- standard Normal priors in one product
def test_auto_waits_for_a_finite_point_before_compiling():
    """A starting point being tried may give a non-finite potential (NaN is not equal to itself, so the
    repeat check would fail on it): ``"auto"`` then decides at the next, finite evaluation."""
    x, y = _linear_data()
    potential = ModelPotential(_linear, (x, y))
    indices = {"data": torch.arange(10)}
    with pyro.validation_enabled(False):
        energy, _ = potential.potential_and_grad(torch.tensor([math.inf, 0.0]), indices)
        assert not torch.isfinite(energy) and not potential.compiled and potential.jit_failure is None
        potential.potential_and_grad(torch.zeros(2), indices)
    assert potential.compiled


@pytest.mark.parametrize(
    "error", [torch.OutOfMemoryError("CUDA out of memory"), RuntimeError("DefaultCPUAllocator: can't allocate memory")]
)
def test_out_of_memory_reaches_the_user_and_keeps_vmap(error, monkeypatch):
    """Running out of memory says nothing about whether the model can run under vmap: it is raised, and
    the vectorised path stays on (a model that cannot run under vmap still falls back, with a warning)."""

    def model():
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 10, subsample_size=5):
            pyro.sample("y", dist.Normal(w, 1.0), obs=torch.zeros(5))

    potential = ModelPotential(model)
    positions = torch.zeros(3, 1)
    indices = {"data": torch.arange(5).expand(3, 5)}
    potential.batched_potential_and_grad(positions, indices)  # builds the vectorised function

    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(potential.vectorized, "_over_chains", out_of_memory)
    with pytest.raises(type(error)):
        potential.batched_potential_and_grad(positions, indices)
    with pytest.raises(type(error)):  # still tried vectorised (no silent switch to one chain at a time)
        potential.batched_potential_and_grad(positions, indices)
    monkeypatch.setattr(potential.vectorized, "_over_minibatches", out_of_memory)
    monkeypatch.setattr(potential.vectorized, "summable", True)
    with pytest.raises(type(error)):
        potential.summed_potential_and_grad(positions[0], indices)
