"""The kernels inside pyro.infer.MCMC: chains, initial params, summaries, ArviZ, divergences, counters."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sgmcmc import SGHMC, SGLD, SGNHT, DivergenceError, RobbinsMonro

KERNELS = [SGLD, SGHMC, SGNHT]


def regression_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfCauchy(2.5))
    with pyro.plate("data", x.shape[0], subsample_size=32) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=None if y is None else y[idx])


def _data(n=400):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    return x, x @ torch.tensor([1.0, -1.0]) + 0.5 * torch.randn(n, generator=g)


@pytest.mark.parametrize("kernel_cls", KERNELS)
def test_two_chains_with_distinct_initial_params(kernel_cls, capsys):
    x, y = _data()
    pyro.set_rng_seed(0)
    starts = {"w": torch.tensor([[3.0, 3.0], [-3.0, -3.0]]), "sigma": torch.tensor([0.0, 0.5])}
    kernel = kernel_cls(regression_model, step_size=1e-3, temperature=1e-6)  # tiny moves: draws stay by their start
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=0, num_chains=2, initial_params=starts, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["w"].shape == (2, 5, 2) and samples["sigma"].shape == (2, 5)
    assert torch.allclose(samples["w"][:, 0], starts["w"], atol=0.05)
    # sigma comes back constrained: exp of the unconstrained start
    assert torch.allclose(samples["sigma"][:, 0], starts["sigma"].exp(), atol=0.05)
    diagnostics = mcmc.diagnostics()
    assert set(diagnostics["divergences"]) == {"chain 0", "chain 1"}
    mcmc.summary()
    assert "sigma" in capsys.readouterr().out


def test_chains_without_initial_params_start_afresh_and_run_to_posterior():
    x, y = _data()
    pyro.set_rng_seed(1)
    mcmc = MCMC(
        SGHMC(regression_model, step_size=0.02), num_samples=400, warmup_steps=400, num_chains=2, disable_progbar=True
    )
    mcmc.run(x, y)
    w = mcmc.get_samples(group_by_chain=True)["w"]
    assert not torch.equal(w[0, 0], w[1, 0])
    # least squares is within a few posterior sd (~0.025) of the posterior mean
    ls = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1)
    assert torch.allclose(w.mean((0, 1)), ls, atol=0.1)


def test_arviz_from_pyro_reads_divergences_and_posterior():
    az = pytest.importorskip("arviz")
    x, y = _data()
    pyro.set_rng_seed(2)
    mcmc = MCMC(
        SGLD(regression_model, step_size=0.01), num_samples=50, warmup_steps=10, num_chains=2, disable_progbar=True
    )
    mcmc.run(x, y)
    idata = az.from_pyro(mcmc, log_likelihood=False)
    assert idata.posterior["w"].shape == (2, 50, 2)
    assert idata.sample_stats["diverging"].shape == (2, 50)
    assert "observed_data" in idata.groups()


def diverging_model():
    # The prior pulls x to 5, but the density is zero for x > 1: a step across x = 1 gives U = inf.
    x = pyro.sample("x", dist.Normal(5.0, 1.0))
    pyro.factor("wall", torch.where(x > 1.0, torch.tensor(-math.inf), torch.tensor(0.0)))


def test_divergences_are_counted_and_the_chain_stays_finite():
    pyro.set_rng_seed(0)
    kernel = SGLD(diverging_model, step_size=0.5, temperature=0.0)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=5, initial_params={"x": torch.tensor(0.0)}, disable_progbar=True)
    mcmc.run()
    draws = mcmc.get_samples()["x"]
    assert torch.isfinite(draws).all() and (draws <= 1).all()
    # From 0 the drift of 5 * 0.5 takes every step across the wall: each sampling step diverges.
    assert mcmc.diagnostics()["divergences"]["chain 0"] == list(range(20))
    assert kernel.diagnostics()["warmup divergences"] == 5
    assert kernel.last_stats["diverging"].tolist() == [True]


def test_divergence_can_raise_naming_the_step():
    kernel = SGLD(diverging_model, step_size=0.5, temperature=0.0, on_divergence="raise")
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=2, initial_params={"x": torch.tensor(0.0)}, disable_progbar=True)
    with pytest.raises(
        DivergenceError,
        match=r"non-finite potential energy \(observed site .wall.: log-density 1 -inf.*\) "
        r"at step 0 \(warmup\) in chain\(s\) \[0\]",
    ):
        mcmc.run()


def test_schedule_counter_belongs_to_each_chain():
    x, y = _data()
    schedule = RobbinsMonro(a=0.01, b=10.0, gamma=0.6)
    kernel = SGHMC(regression_model, step_size=schedule, adapt_step_size=False, adapt_mass_matrix=False)
    MCMC(kernel, num_samples=7, warmup_steps=3, num_chains=2, disable_progbar=True).run(x, y)
    # the second chain restarted its counter: its last step used t = 9, not 19
    assert kernel.state.step == 10
    assert kernel.last_stats["step_size"] == schedule(9)


@pytest.mark.parametrize("kernel_cls", [SGHMC, SGNHT])
def test_stationary_init_momentum_has_the_tempered_variance(kernel_cls):
    # m ~ N(0, mass T / N) per coordinate; 20,000 coordinates: sample variance within 4 * sqrt(2/20000) = 4 %.
    def model():
        pyro.sample("x", dist.Normal(torch.zeros(20_000), 1.0).to_event(1))

    temperature, mass, num_data = 0.3, 2.0, 50
    kernel = kernel_cls(model, temperature=temperature, mass=mass, num_data=num_data, init_momentum="stationary")
    kernel.setup(0)
    variance = kernel.state.momentum.var()
    assert abs(variance / (mass * temperature / num_data) - 1) < 0.04
    cold = kernel_cls(model, temperature=0.0, init_momentum="stationary")
    cold.setup(0)
    assert torch.count_nonzero(cold.state.momentum) == 0
    zero = kernel_cls(model, temperature=1.0)
    zero.setup(0)
    assert torch.count_nonzero(zero.state.momentum) == 0


def test_logging_and_last_stats():
    x, y = _data()
    kernel = SGNHT(regression_model, step_size=1e-3)
    kernel.setup(0, x, y)
    kernel.sample(kernel.initial_params)
    assert list(kernel.logging()) == ["phase", "step size", "lp", "div"]
    assert kernel.logging()["phase"] == "sampling"  # no warmup: sampling from the first step
    assert set(kernel.last_stats) == {
        "lp",
        "step_size",
        "diverging",
        "temperature",
        "num_divergences",
        "kinetic_energy",
        "thermostat",
    }
