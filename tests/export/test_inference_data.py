"""to_inference_data: groups, names, full-data log-likelihood, netCDF round trip, ArviZ functions."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC as PyroMCMC

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT, nested_rhat, to_inference_data

az = pytest.importorskip("arviz")

N = 45  # not a multiple of the subsample size: the last chunk overlaps


def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", x.shape[0], subsample_size=10) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=g)
    return x, x @ torch.tensor([0.5, -1.0]) + 0.5 * torch.randn(N, generator=g)


@pytest.fixture(scope="module")
def run():
    x, y = _data()
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGNHT(model, step_size=0.02), num_samples=30, warmup_steps=100, num_chains=8, num_superchains=4,
                chain_method="vectorized", seed=3, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    return mcmc, x, y


def test_groups_names_and_superchains(run):
    mcmc, x, y = run
    idata = to_inference_data(mcmc, log_likelihood=True, posterior_predictive=True)
    assert set(idata.groups()) >= {
        "posterior",
        "sample_stats",
        "log_likelihood",
        "observed_data",
        "posterior_predictive",
    }
    assert idata.posterior["w"].dims == ("chain", "draw", "w_dim_0")
    assert idata.posterior.superchain.values.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert set(idata.sample_stats.data_vars) == {
        "lp",
        "step_size",
        "diverging",
        "temperature",
        "num_divergences",
        "kinetic_energy",
        "thermostat",
    }
    assert idata.sample_stats["diverging"].dtype == bool
    # observed data: the full data set, in order, with the plate's name as its dim
    assert idata.observed_data["y"].dims == ("data",)
    assert np.allclose(idata.observed_data["y"].values, y.numpy())
    assert idata.posterior_predictive["y"].shape == (8, 30, N)


def test_log_likelihood_is_pointwise_on_the_full_data(run):
    mcmc, x, y = run
    idata = to_inference_data(mcmc, log_likelihood=True, chunk_size=7)  # chunks that split chains
    samples = mcmc.get_samples(group_by_chain=True)
    for chain, draw in [(0, 0), (5, 17), (7, 29)]:
        w, sigma = samples["w"][chain, draw], samples["sigma"][chain, draw]
        expected = dist.Normal(x @ w, sigma).log_prob(y).numpy()
        assert np.allclose(idata.log_likelihood["y"].values[chain, draw], expected, atol=1e-5)


def test_arviz_functions_and_netcdf_round_trip(run, tmp_path):
    mcmc, _, _ = run
    idata = to_inference_data(mcmc, log_likelihood=True)
    summary = az.summary(idata)
    assert "w[0]" in summary.index and "r_hat" in summary.columns
    az.plot_trace(idata)
    az.plot_rank(idata)
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo)
    path = tmp_path / "run.nc"
    idata.to_netcdf(path)
    back = az.from_netcdf(path)
    assert np.array_equal(back.posterior["w"].values, idata.posterior["w"].values)
    assert back.posterior.superchain.values.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert np.allclose(nested_rhat(back)["w"].values, nested_rhat(mcmc)["w"])


def test_pyro_mcmc_runs_export_too():
    x, y = _data()
    pyro.set_rng_seed(0)
    mcmc = PyroMCMC(SGLD(model, step_size=0.01), num_samples=10, warmup_steps=5, disable_progbar=True)
    mcmc.run(x, y)
    idata = to_inference_data(mcmc, log_likelihood=True)
    assert idata.log_likelihood["y"].shape == (1, 10, N)
    assert set(idata.sample_stats.data_vars) == {"diverging"}


def test_nested_plates_are_assembled():
    obs = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))

    def nested(obs):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("groups", 6, subsample_size=4, dim=-2) as g:
            with pyro.plate("members", 5, subsample_size=2, dim=-1) as m:
                pyro.sample("obs", dist.Normal(mu, 1.0), obs=obs[g][:, m])

    mcmc = MCMC(SGHMC(nested, step_size=0.05), num_samples=3, warmup_steps=3, num_chains=2, chain_method="vectorized",
                seed=0, disable_progbar=True)  # fmt: skip
    mcmc.run(obs)
    idata = to_inference_data(mcmc, log_likelihood=True)
    assert idata.observed_data["obs"].dims == ("groups", "members")
    assert np.allclose(idata.observed_data["obs"].values, obs.numpy())
    mu = mcmc.get_samples(group_by_chain=True)["mu"][1, 2]
    assert np.allclose(idata.log_likelihood["obs"].values[1, 2], dist.Normal(mu, 1.0).log_prob(obs).numpy(), atol=1e-5)


def test_needs_a_finished_run():
    with pytest.raises(ValueError, match="call mcmc.run"):
        to_inference_data(MCMC(SGLD(model), num_samples=2, chain_method="vectorized"))
