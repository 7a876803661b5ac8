"""Bad input gets a clear error naming the argument or site and what is accepted."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sgmcmc import SGHMC, SGLD, SGNHT, ModelError, RobbinsMonro, make_schedule


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y), subsample_size=2) as idx:
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


Y = torch.arange(6.0)


def test_unknown_schedule():
    with pytest.raises(ValueError, match=r"step_size must be a positive float, a Schedule.*make_schedule"):
        SGLD(model, step_size="cosine")
    with pytest.raises(
        ValueError, match=r"unknown step-size schedule 'cosine'; accepted: \['constant', 'cyclical', 'robbins_monro'\]"
    ):
        make_schedule("cosine")
    with pytest.raises(ValueError, match=r"gamma must be in \(0.5, 1\]"):
        RobbinsMonro(a=0.1, gamma=0.4)
    with pytest.raises(ValueError, match="schedule gives step size -1"):
        SGLD(model, step_size=lambda t: -1.0)


def test_friction_mass_and_options():
    with pytest.raises(ValueError, match="friction must be a finite float >= 0"):
        SGHMC(model, friction=-1.0)
    with pytest.raises(ValueError, match="diffusion must be a finite float >= 0"):
        SGNHT(model, diffusion=-1.0)
    with pytest.raises(ValueError, match="mass must be a finite float > 0"):
        SGHMC(model, mass=0.0)
    with pytest.raises(ValueError, match=r"initial_momentum must be one of \('zero', 'stationary'\)"):
        SGHMC(model, initial_momentum="random")
    with pytest.raises(ValueError, match=r"on_divergence must be one of \('restart', 'freeze', 'raise'\)"):
        SGLD(model, on_divergence="ignore")
    with pytest.raises(ValueError, match="num_data must be a positive integer"):
        SGLD(model, num_data=0)


def _run(kernel_model, *args, **kwargs):
    MCMC(SGLD(kernel_model, **kwargs), num_samples=2, warmup_steps=0, disable_progbar=True).run(*args)


def test_discrete_latent_sites_are_named():
    def discrete(y):
        pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("k", dist.Poisson(3.0))
        pyro.sample("c", dist.Bernoulli(0.5))

    with pytest.raises(ModelError, match=r"discrete latent sites \['k', 'c'\]"):
        _run(discrete, Y)


def test_subsample_larger_than_plate():
    def too_big(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y), subsample_size=10) as idx:
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    with pytest.raises(ModelError, match=r"plate 'data' has subsample_size=10 larger than its size=6"):
        _run(too_big, Y)


def test_model_without_latent_sites():
    def no_latent(y):
        pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(ModelError, match="no latent sample sites"):
        _run(no_latent, Y)


def test_local_latent_in_subsampled_plate():
    def local(y):
        with pyro.plate("data", len(y), subsample_size=2) as idx:
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("y", dist.Normal(z, 1.0), obs=y[idx])

    with pytest.raises(ModelError, match=r"latent sites 'z' \(in \['data'\]\) are inside a subsampled plate"):
        _run(local, Y)


def test_initial_params_with_wrong_names_or_shapes():
    with pytest.raises(ValueError, match=r"missing \['mu'\], unknown \['nu'\]"):
        MCMC(SGLD(model), num_samples=1, initial_params={"nu": torch.tensor(0.0)}, disable_progbar=True).run(Y)
    with pytest.raises(ValueError, match=r"initial_params\['mu'\] must have the unconstrained shape \(\)"):
        MCMC(SGLD(model), num_samples=1, initial_params={"mu": torch.zeros(3)}, disable_progbar=True).run(Y)


def test_model_must_be_callable_and_init_strategy_too():
    with pytest.raises(ValueError, match="model must be a callable"):
        SGLD("model")
    with pytest.raises(ValueError, match="init_strategy must be a Pyro init strategy"):
        SGLD(model, init_strategy="uniform")
