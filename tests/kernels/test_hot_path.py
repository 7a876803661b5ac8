"""The per-step shortcuts of the kernels' hot path give what the plain computation gives."""

import pyro
import pyro.distributions as dist
import torch

from pyro_sgmcmc import MCMC, SGHMC, SGLD
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.kernels.base import LOGGING_EVERY


def _model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with pyro.plate("data", len(y), subsample_size=4) as i:
        pyro.sample("y", dist.Normal(mu.sum(), 1.0), obs=y[i])


def test_one_chain_noise_equals_its_row_among_others():
    """One chain's draw (its whole tensor) is the same numbers as its row in a draw of several chains."""
    for shape in [(7,), (3151,), (4, 5)]:
        fast = ChainGenerators(3, [5]).normal(shape, torch.float32, step=9)
        among = ChainGenerators(3, [2, 5, 8]).normal(shape, torch.float32, step=9)
        assert torch.equal(fast[0], among[1]), shape


class _Fixed:
    """A gradient estimator that always gives the same values."""

    def __init__(self, energy, grad):
        self.energy, self.grad = energy, grad

    def potential_and_grad(self, positions, indices):
        return self.energy, self.grad.clone()


def test_a_finite_gradient_whose_sum_overflows_is_not_a_divergence():
    """Finiteness is checked by one sum; a sum that overflows takes the exact check and is no divergence,
    a non-finite entry is one."""
    kernel = SGLD(_model, step_size=1e-3)
    y = torch.randn(20)
    kernel.setup_chains(0, (y,), {}, num_chains=2, seed=0)
    huge = torch.full((2, 3), torch.finfo(torch.float32).max)
    energy = torch.zeros(2)
    kernel.gradient_estimator = _Fixed(energy, huge)
    kernel.step()
    assert not kernel.last_stats["diverging"].any() and kernel.num_divergences == 0
    bad = huge.clone()
    bad[1, 2] = float("nan")
    kernel.gradient_estimator = _Fixed(energy, bad)
    kernel.step()
    assert kernel.last_stats["diverging"].tolist() == [False, True]
    kernel.step()
    assert kernel.num_divergences == 2 == int(kernel.last_stats["num_divergences"].sum())
    assert kernel.logging()["div"] == "2"


def test_divergence_count_survives_a_checkpoint():
    kernel = SGLD(_model, step_size=1e-3)
    y = torch.randn(20)
    kernel.setup_chains(0, (y,), {}, num_chains=2, seed=0)
    energy = kernel.state.potential.clone()
    energy[1] = float("nan")  # chain 1's new point has a non-finite potential: a divergence
    proposed = kernel.state.replace(potential=energy)
    kernel.divergence_record.reject(kernel.state, proposed, torch.tensor([True, False]), None, kernel.potential)
    saved = kernel.state_dict()
    other = SGLD(_model, step_size=1e-3)
    other.setup_chains(0, (y,), {}, num_chains=2, seed=0)
    other.load_state_dict(saved)
    assert other.num_divergences == kernel.num_divergences == 1


def test_pyro_mcmc_draws_are_the_kernel_trajectory():
    """pyro.infer.MCMC's draws (through sample()'s one-chain unpack) are the kernel's own positions, and
    logging() reports the state's log density as of its last refresh: pyro.infer.MCMC asks for it after every
    step, and it formats its figures afresh every LOGGING_EVERY steps (here at steps 1, 26, 51), not at each."""
    y = torch.randn(20)
    pyro.set_rng_seed(0)
    kernel = SGHMC(_model, step_size=1e-2)
    positions, shown, actual = [], {}, {}

    def hook(k, *_):
        positions.append(k.state.position[0].clone())
        shown[k.state.step] = k.logging()["lp"]
        actual[k.state.step] = f"{-float(k.state.potential):.4g}"

    mcmc = pyro.infer.MCMC(kernel, num_samples=60, warmup_steps=0, disable_progbar=True, hook_fn=hook)
    mcmc.run(y)
    assert torch.equal(mcmc.get_samples()["mu"], torch.stack(positions))
    assert LOGGING_EVERY == 25 and sorted(shown) == list(range(1, 61))
    for step, lp in shown.items():
        assert lp == actual[1 + LOGGING_EVERY * ((step - 1) // LOGGING_EVERY)], step
    assert len(set(shown.values())) == 3  # refreshed at steps 1, 26 and 51, each time to the state's value
    run = dict(num_samples=30, warmup_steps=0, num_chains=2, chain_method="vectorized", seed=0)
    batched = MCMC(SGHMC(_model, step_size=1e-2), disable_progbar=False, **run)
    batched.run(y)  # its progress bar asks for logging() at every step of so short a run
    means = {}

    def mean_hook(k, *_):
        means[k.state.step] = f"{-float(k.state.potential.mean()):.4g}"

    again = MCMC(SGHMC(_model, step_size=1e-2), disable_progbar=True, hook_fn=mean_hook, **run)
    again.run(y)  # the same run (same seed): its states' mean log densities
    assert batched.kernel.logging()["lp"] == means[26]  # the last refresh of a 30-step run


def test_diffusions_scale_the_drift_in_their_pass_and_fill_given_buffers():
    """``drift_scale * drift`` is the normalised drift (to round-off: one rounding instead of two), and
    ``out`` buffers receive exactly the values new tensors would hold."""
    from pyro_sgmcmc.kernels.diffusions import langevin_step, nose_hoover_step, underdamped_step

    g = torch.Generator().manual_seed(0)
    z, m, grad, noise = (torch.randn(3, 50, generator=g, dtype=torch.float64) for _ in range(4))
    xi = torch.rand(3, generator=g, dtype=torch.float64)
    scale = -1.0 / 977
    fused = underdamped_step(z, m, grad, 0.1, 0.01, 0.5, 2.0, noise, scale)
    plain = underdamped_step(z, m, grad * scale, 0.1, 0.01, 0.5, 2.0, noise)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=0.0)
    torch.testing.assert_close(
        langevin_step(z, grad, 0.1, 0.01, noise, scale),
        langevin_step(z, grad * scale, 0.1, 0.01, noise),
        rtol=1e-14,
        atol=0,
    )
    for a, b in zip(
        nose_hoover_step(z, m, xi, grad, 0.1, 0.01, 0.5, 2.0, noise, scale),
        nose_hoover_step(z, m, xi, grad * scale, 0.1, 0.01, 0.5, 2.0, noise),
    ):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-17)
    buffers = (torch.full_like(z, float("nan")), torch.full_like(m, float("nan")))
    into = underdamped_step(z, m, grad, 0.1, 0.01, 0.5, 2.0, noise, scale, out=buffers)
    assert into[0] is buffers[0] and into[1] is buffers[1]
    assert torch.equal(into[0], fused[0]) and torch.equal(into[1], fused[1])
    buffers = (torch.full_like(z, float("nan")), torch.full_like(m, float("nan")))
    into = nose_hoover_step(z, m, xi, grad, 0.1, 0.01, 0.5, 2.0, noise, scale, out=buffers)
    fresh = nose_hoover_step(z, m, xi, grad, 0.1, 0.01, 0.5, 2.0, noise, scale)
    assert into[0] is buffers[0] and into[1] is buffers[1]
    assert all(torch.equal(a, b) for a, b in zip(into, fresh))
    position_buffer = torch.full_like(z, float("nan"))
    assert torch.equal(
        langevin_step(z, grad, 0.1, 0.01, noise, scale, out=position_buffer),
        langevin_step(z, grad, 0.1, 0.01, noise, scale),
    )


def test_diffusion_out_buffers_of_the_wrong_form_are_refused_by_name():
    import pytest

    from pyro_sgmcmc.kernels.diffusions import langevin_step, nose_hoover_step, underdamped_step

    z = m = grad = noise = torch.zeros(2, 5)
    xi = torch.zeros(2)
    for bad in (torch.empty(2, 4), torch.empty(2, 5, dtype=torch.float64)):
        with pytest.raises(ValueError, match="out: the new position's buffer"):
            langevin_step(z, grad, 0.1, 0.01, noise, out=bad)
        with pytest.raises(ValueError, match="out: the new momentum's buffer"):
            underdamped_step(z, m, grad, 0.1, 0.01, 0.5, 1.0, noise, out=(None, bad))
        with pytest.raises(ValueError, match="out: the new position's buffer"):
            nose_hoover_step(z, m, xi, grad, 0.1, 0.01, 0.5, 1.0, noise, out=(bad, None))
