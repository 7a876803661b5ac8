"""``AutoLaplace.fit_map``: the MAP by Adam on the package's (compiled) potential.

Oracles: the closed-form MAP of Bayesian linear regression (full-batch, so the iteration is
deterministic; Adam's steps shrink as its second-moment estimate remembers the early gradients,
and 1,500 steps reach the optimum to ~1e-9, checked at 1e-6), and exact coupling: with the same
minibatch seed the compiled and the plain potential give the same path up to float64 rounding.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc.guides import AutoLaplace

N, D, SIGMA = 40, 3, 0.5


@pytest.fixture(autouse=True)
def clear_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5]) + 0.7 + SIGMA * torch.randn(N, generator=g)


def make_model(subsample_size=None):
    def model(x, y):
        b = pyro.sample("b", dist.Normal(0.0, 2.0))
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=subsample_size) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w + b, SIGMA), obs=y[idx])

    return model


def test_fit_map_reaches_the_closed_form_map(float64):
    x, y = _data()
    design = torch.cat([torch.ones(N, 1), x], dim=1)
    precision = design.T @ design / SIGMA**2 + torch.diag(torch.tensor([0.25, 1.0, 1.0, 1.0]))
    exact = torch.linalg.solve(precision, design.T @ y / SIGMA**2)  # the guide's order: (b, w)
    guide = AutoLaplace(make_model(), disable_progbar=True)
    losses = guide.fit_map(x, y, num_steps=1500, lr=0.05)
    assert len(losses) == 1500 and losses[-1] < losses[0]
    assert (guide.loc - exact).abs().max() / exact.abs().max() < 1e-6, (guide.loc, exact)


def test_compiled_and_plain_potentials_take_the_same_path(float64, monkeypatch):
    """Minibatches of 10 of 40, seed 3: the compiled run equals the plain one step for step."""
    import pyro_sgmcmc.guides.fit as fit

    made = []

    class Recording(fit.ModelPotential):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(fit, "ModelPotential", Recording)
    x, y = _data()
    points = []
    for jit_compile in (False, True):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        guide = AutoLaplace(make_model(10), disable_progbar=True)
        with pyro.validation_enabled(False):
            losses = guide.fit_map(x, y, num_steps=50, lr=0.05, seed=3, jit_compile=jit_compile)
        points.append((guide.loc.detach().clone(), torch.tensor(losses)))
    assert [potential.compiled for potential in made] == [False, True]  # the second run replayed a trace
    assert (points[0][0] - points[1][0]).abs().max() < 1e-10
    assert (points[0][1] - points[1][1]).abs().max() / points[0][1].abs().max() < 1e-10


def test_fit_map_bad_arguments():
    x, y = _data()
    guide = AutoLaplace(make_model(10), disable_progbar=True)
    with pytest.raises(TypeError, match="num_steps"):
        guide.fit_map(x, y, num_steps=1.0)
    with pytest.raises(ValueError, match="lr"):
        guide.fit_map(x, y, num_steps=2, lr=-1.0)
    with pytest.raises(TypeError, match="seed"):
        guide.fit_map(x, y, num_steps=2, seed="0")
