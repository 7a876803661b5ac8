"""Vectorised chains (kernels/batched.py, kernels/initialisation.py): what a caller keeps is never
overwritten, and ``seed=`` fixes the starting points without touching torch's global generator."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT
from pyro_sgmcmc.kernels.initialisation import global_superchain_ids


def _model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y), subsample_size=8) as i:
        pyro.sample("y", dist.Normal(x[i] @ w + b, 1.0), obs=y[i])


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=generator)
    return x, x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(40, generator=generator)


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC, SGNHT])
def test_kept_states_tensors_and_views_are_never_overwritten(kernel_class):
    """Values kept by the caller are compared bit for bit with clones taken when they were kept: any overwrite
    changes them, since every step moves every coordinate."""
    kernel = kernel_class(_model, step_size=0.01)
    kernel.setup_chains(0, _data(), {}, num_chains=3, seed=1)
    kept = []  # (what the caller keeps, a clone of its value at that time)
    for t in range(16):
        state = kernel.step()
        if t == 2:
            kept.append((state, [v.clone() if isinstance(v, torch.Tensor) else v for v in state]))
        if t == 5:
            kept.append((state.position, state.position.clone()))
        if t == 8:
            kept.append((state.position[1], state.position[1].clone()))  # a view only
        if t == 11:
            values = kernel.potential.unpack(state.position)  # site views, as a hook receives them
            kept.append((values, {k: v.clone() for k, v in values.items()}))
        del state
    for value, clone in kept:
        if isinstance(value, tuple):  # the state
            for field, saved in zip(value, clone):
                assert field is saved or torch.equal(field, saved)
        elif isinstance(value, dict):
            for name in value:
                assert torch.equal(value[name], clone[name]), name
        else:
            assert torch.equal(value, clone)


def _run(seed, global_seed, num_chains=4, num_superchains=2, **kwargs):
    pyro.set_rng_seed(global_seed)
    mcmc = MCMC(
        SGHMC(_model, step_size=0.01), num_samples=5, warmup_steps=25, num_chains=num_chains,
        num_superchains=num_superchains, chain_method="vectorized", seed=seed, disable_progbar=True, **kwargs,
    )  # fmt: skip
    before = torch.get_rng_state()
    mcmc.run(*_data())
    return mcmc, before


@pytest.mark.filterwarnings("ignore::pyro_sgmcmc.SlowMixingWarning")
def test_seed_fixes_the_starting_points_and_leaves_the_global_generator_alone():
    """Same ``seed=7`` under two different global states: bit-identical draws (the starting points included,
    drawn by init_to_uniform), and the global generator's state is what it was before the run."""
    first, before = _run(7, global_seed=0)
    assert torch.equal(torch.get_rng_state(), before)
    second, before = _run(7, global_seed=123)
    assert torch.equal(torch.get_rng_state(), before)
    a, b = first.get_samples(group_by_chain=True), second.get_samples(group_by_chain=True)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    other, _ = _run(8, global_seed=0)  # and the seed matters
    assert not torch.equal(other.get_samples()["w"], first.get_samples()["w"])


@pytest.mark.filterwarnings("ignore::pyro_sgmcmc.SlowMixingWarning")
def test_without_a_seed_the_starts_follow_the_global_generator():
    first, _ = _run(None, global_seed=0)
    second, _ = _run(None, global_seed=0)
    third, _ = _run(None, global_seed=1)
    assert torch.equal(first.get_samples()["w"], second.get_samples()["w"])
    assert not torch.equal(first.get_samples()["w"], third.get_samples()["w"])


def test_superchain_starts_depend_on_the_global_superchain_id_only():
    """A process holding chains 4-7 of 8 (superchains of 2) starts them where the whole run starts them."""
    x, y = _data()
    whole = SGLD(_model, step_size=0.01)
    whole.setup_chains(0, (x, y), {}, num_chains=8, num_superchains=4, seed=3)
    part = SGLD(_model, step_size=0.01)
    part.setup_chains(0, (x, y), {}, num_chains=4, num_superchains=2, seed=3, chain_ids=[4, 5, 6, 7])
    assert torch.equal(part.state.position, whole.state.position[4:])
    assert global_superchain_ids(4, 2, [4, 5, 6, 7]) == [2, 3] and global_superchain_ids(8, 4) == [0, 1, 2, 3]
    # the public method a data-parallel or distributed driver calls gives the same points
    starts = whole.initial_positions(None, 8, 4, seed=3)
    assert torch.equal(starts, whole.state.position)
