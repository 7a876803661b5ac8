"""Large chains write a step's position and momentum into the memory of the state of two steps back,
only when nothing outside the kernel refers to it.

``RECYCLE_MIN_BYTES = 0`` on an instance turns the reuse on for these small models, so that every test
here runs the reuse path; each test also checks that memory was in fact reused in its run (otherwise it
would pass without testing anything). Values kept by the caller are compared bit for bit with clones
taken when they were kept: any overwrite changes them, since every step moves every coordinate.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT

NEVER = 2**62  # RECYCLE_MIN_BYTES that turns the reuse off


def _model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y), subsample_size=8) as i:
        pyro.sample("y", dist.Normal(x[i] @ w + b, 1.0), obs=y[i])


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=generator)
    return x, x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(40, generator=generator)


def _kernel(kernel_class, min_bytes: int, num_chains: int = 3):
    kernel = kernel_class(_model, step_size=0.01)
    kernel.RECYCLE_MIN_BYTES = min_bytes
    pyro.set_rng_seed(0)  # the starting points (init_to_uniform) come from the global generator
    kernel.setup_chains(0, _data(), {}, num_chains=num_chains, seed=1)
    return kernel


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC, SGNHT])
def test_reuse_leaves_the_trajectory_bit_identical(kernel_class):
    reused, fresh = _kernel(kernel_class, 0), _kernel(kernel_class, NEVER)
    assert reused._recycle and not fresh._recycle
    pointers = set()
    for _ in range(12):
        a, b = reused.step(), fresh.step()
        assert torch.equal(a.position, b.position)
        assert (a.momentum is None and b.momentum is None) or torch.equal(a.momentum, b.momentum)
        pointers.add(a.position.data_ptr())
    assert len(pointers) == 2  # nothing kept: two buffers take turns


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC, SGNHT])
def test_kept_states_tensors_and_views_are_never_overwritten(kernel_class):
    kernel = _kernel(kernel_class, 0)
    kept = []  # (what the caller keeps, a clone of its value at that time)
    pointers = []
    for t in range(16):
        state = kernel.step()
        pointers.append(state.position.data_ptr())
        if t == 2:
            kept.append((state, [v.clone() if isinstance(v, torch.Tensor) else v for v in state]))
        if t == 5:
            kept.append((state.position, state.position.clone()))
        if t == 8:
            kept.append((state.position[1], state.position[1].clone()))  # a view only
        if t == 11:
            values = kernel.potential.unpack(state.position)  # site views, as a hook receives them
            kept.append((values, {k: v.clone() for k, v in values.items()}))
        if t == 13:  # shares the memory without referring to the tensor (not a view: no _base)
            detached = state.momentum.detach() if state.momentum is not None else state.position.detach()
            assert detached._base is None
            kept.append((detached, detached.clone()))
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
    # the run did reuse memory (the steps in between kept nothing): some buffer came back
    assert len(set(pointers)) < len(pointers)


def test_a_pyro_mcmc_run_with_reuse_gives_the_same_draws():
    """pyro.infer.MCMC holds the previous step's site values while the kernel steps."""
    draws = []
    for min_bytes in (0, NEVER):
        kernel = SGHMC(_model, step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False)
        kernel.RECYCLE_MIN_BYTES = min_bytes
        pyro.set_rng_seed(3)
        mcmc = pyro.infer.MCMC(kernel, num_samples=15, warmup_steps=5, disable_progbar=True)
        mcmc.run(*_data())
        assert kernel._recycle == (min_bytes == 0)
        draws.append(mcmc.get_samples())
    for name in draws[0]:
        assert torch.equal(draws[0][name], draws[1][name]), name


def test_vectorised_mcmc_with_a_hook_that_keeps_values_gives_the_same_draws():
    results = []
    for min_bytes in (0, NEVER):
        kept = []
        kernel = SGHMC(_model, step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False)
        kernel.RECYCLE_MIN_BYTES = min_bytes
        mcmc = MCMC(
            kernel, num_samples=10, warmup_steps=3, num_chains=4, chain_method="vectorized", seed=2,
            disable_progbar=True, hook_fn=lambda k, values, stage, i: kept.append(values),
        )  # fmt: skip
        pyro.set_rng_seed(0)
        mcmc.run(*_data())
        results.append((mcmc.get_samples(group_by_chain=True), [{k: v.clone() for k, v in d.items()} for d in kept]))
        for values, clone in zip(kept, results[-1][1]):
            for name in values:  # what the hook kept is still what it was given
                assert torch.equal(values[name], clone[name])
    (samples_a, hooks_a), (samples_b, hooks_b) = results
    for name in samples_a:
        assert torch.equal(samples_a[name], samples_b[name]), name
    for a, b in zip(hooks_a, hooks_b):
        for name in a:
            assert torch.equal(a[name], b[name])
