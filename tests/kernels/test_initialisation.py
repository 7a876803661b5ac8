"""The chains' starting points (kernels/initialisation.py): drawn and given starts are checked for a finite
potential and gradient in one vectorised evaluation, with exactly the starts of the one-by-one check."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import ModelPotential
from pyro_sgmcmc.kernels.initialisation import initial_positions, seeded_global_rng


def walled(x, y):
    """A model whose potential is infinite where ``w[0] < 0``: about half of ``init_to_uniform``'s draws fail."""
    w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    pyro.factor("wall", torch.where(w[0] < 0, torch.tensor(-float("inf")), torch.tensor(0.0)))
    with pyro.plate("data", x.shape[0], subsample_size=10) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, 1.0), obs=y[i])


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(100, 2, generator=generator)
    return x, x @ torch.tensor([1.0, 0.5])


def potential():
    with pyro.validation_enabled(False):
        return ModelPotential(walled, model_args=data(), init_strategy=pyro.infer.autoguide.init_to_uniform)


def one_by_one(potential, seed, superchains):
    """The starts as the one-by-one check draws them: each superchain's stream, draw after draw until finite."""
    starts = []
    for superchain in superchains:
        with seeded_global_rng(seed, superchain, potential.device):
            starts.append(potential.initial_position(fresh=True))
    return torch.stack(starts)


def test_drawn_starts_equal_the_one_by_one_draws_also_where_a_first_draw_fails():
    model_potential = potential()
    first_draw_fails = []
    for superchain in range(8):
        with seeded_global_rng(7, superchain, model_potential.device):
            position, _ = model_potential.draw_start(fresh=True)
        first_draw_fails.append(bool(position[0] < 0))
    assert any(first_draw_fails) and not all(first_draw_fails)  # both paths are exercised
    vectorised = initial_positions(model_potential, None, num_chains=16, num_superchains=8, seed=7)
    expected = one_by_one(potential(), 7, range(8)).repeat_interleave(2, 0)
    assert torch.equal(vectorised, expected)
    assert bool((vectorised[:, 0] >= 0).all())


def test_given_starts_with_an_infinite_potential_are_refused_with_their_count():
    model_potential = potential()
    starts = {"w": torch.tensor([[1.0, 0.0], [-1.0, 0.0], [-2.0, 0.0]])}
    with pytest.raises(ValueError, match="non-finite potential energy or gradient at 2 of the 3 distinct"):
        initial_positions(model_potential, starts, num_chains=3, num_superchains=3, seed=0)
    fine = {"w": torch.tensor([[1.0, 0.0], [2.0, 0.0], [2.0, 0.0]])}
    assert torch.equal(initial_positions(model_potential, fine, 3, 3, seed=0), fine["w"])
