"""Data checked against the plates at set-up (:mod:`pyro_sgmcmc.model.data_shapes`).

* an observed value that broadcasts its site beyond the plate's batch shape (``y`` of shape ``(N, 1)``
  under a ``Normal`` of batch shape ``(B,)``, which used to give ``(B, B)`` terms and a silently wrong
  posterior) is a ``ModelError`` naming the site, the plate and both shapes;
* an argument shorter than the plate that indexes it is a ``ModelError`` naming it, the plate and both
  sizes, at set-up and every time (it used to be a bare ``IndexError``, on the minibatches that
  happened to hold a missing row);
* legitimate shapes still run and sample the right posterior: ``.to_event(1)`` observations of shape
  ``(B, K)``, nested plates, an observation broadcast over a batch dimension the distribution has.
"""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, ModelError, ModelPotential

N, B, TRUTH = 400, 40, torch.tensor([1.0, -2.0])
NOISE = 0.5


def regression_data(n=N):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    return x, x @ TRUTH + NOISE * torch.randn(n, generator=g)


def regression(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    with pyro.plate("data", len(x), subsample_size=B) as idx:
        pyro.sample("obs", dist.Normal(x[idx] @ w, NOISE), obs=y[idx])


def posterior_mean(model, *args, site="w"):
    """The mean of 4 chains x 300 draws of SGHMC (fixed seed)."""
    kernel = SGHMC(model, step_size=2e-4)
    mcmc = MCMC(kernel, num_samples=300, warmup_steps=300, num_chains=4, chain_method="vectorized", seed=0,
                disable_progbar=True)  # fmt: skip
    mcmc.run(*args)
    return mcmc.get_samples()[site].mean(0)


def exact_posterior_mean(x, y):
    """The conjugate posterior mean of ``w`` (prior N(0, 10^2 I), noise 0.5): a ridge regression."""
    precision = x.T @ x / NOISE**2 + torch.eye(2) / 100.0
    return torch.linalg.solve(precision, x.T @ y / NOISE**2)


# Posterior sd of each coefficient ~ NOISE / sqrt(N) = 0.025; the chain mean of 1,200 correlated draws has a
# Monte Carlo error well under that, and SGHMC's discretisation bias at this step is of the same order:
# 0.05 (2 posterior sd) is met by a correct sampler and missed by a posterior off by a fraction of the truth.
TOLERANCE = 0.05


# ---------------------------------------------------------------------- an observed value that widens its site
def test_an_observation_of_shape_n_by_1_is_refused_naming_site_plate_and_shapes():
    x, y = regression_data()
    with pytest.raises(ModelError) as error:
        ModelPotential(regression, (x, y.unsqueeze(-1)))
    message = str(error.value)
    for expected in ["'obs'", "'data'", f"({B}, 1)", f"({B},)", f"({B}, {B})", ".squeeze(-1)", ".to_event(1)"]:
        assert expected in message, (expected, message)


def test_an_observation_with_replicates_left_of_the_plate_is_refused():
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        with pyro.plate("data", len(x), subsample_size=B) as idx:
            pyro.sample("obs", dist.Normal(x[idx] @ w, NOISE), obs=y[:, idx])

    x, y = regression_data()
    with pytest.raises(ModelError, match=r"'obs' in plate 'data' .* shape \(3, 40\)"):
        ModelPotential(model, (x, y.expand(3, N)))


def test_to_event_observations_of_shape_b_by_k_sample_the_posterior():
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        with pyro.plate("data", len(x), subsample_size=B) as idx:
            loc = (x[idx] @ w).unsqueeze(-1).expand(B, 3)
            pyro.sample("obs", dist.Normal(loc, NOISE).to_event(1), obs=y[idx])

    x, y = regression_data()
    ys = torch.stack([y, y + 0.1, y - 0.1], dim=-1)  # three replicates with mean y: the same posterior mean
    exact = exact_posterior_mean(x.repeat(3, 1), ys.T.reshape(-1))
    assert torch.allclose(posterior_mean(model, x, ys), exact, atol=TOLERANCE)


def test_nested_plates_sample_the_posterior():
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        with pyro.plate("data", len(x), subsample_size=B, dim=-2) as idx:
            with pyro.plate("replicates", 3, dim=-1):
                pyro.sample("obs", dist.Normal((x[idx] @ w).unsqueeze(-1), NOISE), obs=y[idx])

    x, y = regression_data()
    ys = torch.stack([y, y + 0.1, y - 0.1], dim=-1)
    exact = exact_posterior_mean(x.repeat(3, 1), ys.T.reshape(-1))
    assert torch.allclose(posterior_mean(model, x, ys), exact, atol=TOLERANCE)


def test_an_observation_broadcast_over_a_batch_dimension_the_distribution_has_samples_the_posterior():
    """``obs`` of shape ``(B,)`` against a distribution of batch shape ``(2, B)`` (two noise scales): the
    value is broadcast over the distribution's first dimension, which the log-density then sums over."""

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        scales = torch.tensor([[NOISE], [NOISE]])
        with pyro.plate("data", len(x), subsample_size=B) as idx:
            pyro.sample("obs", dist.Normal(x[idx] @ w, scales), obs=y[idx])

    x, y = regression_data()
    exact = exact_posterior_mean(x.repeat(2, 1), y.repeat(2))
    assert torch.allclose(posterior_mean(model, x, y), exact, atol=TOLERANCE)


def test_the_regression_itself_samples_the_posterior():
    x, y = regression_data()
    assert torch.allclose(posterior_mean(regression, x, y), exact_posterior_mean(x, y), atol=TOLERANCE)


# ---------------------------------------------------------------------- an argument shorter than its plate
@pytest.mark.parametrize("seed", range(5))
def test_an_argument_shorter_than_its_plate_is_named_at_set_up_every_time(seed):
    """``y`` has 10 rows fewer than the plate (``len(x)``): a random minibatch misses them ~2/3 of the time, so
    the set-up used to pass or fail at random; the probe on the last rows names ``y`` every time."""
    x, y = regression_data()
    torch.manual_seed(seed)
    with pytest.raises(ModelError) as error:
        ModelPotential(regression, (x, y[:-10]))
    message = str(error.value)
    assert f"argument 1 ('y') has {N - 10} rows, plate 'data' has size {N}" in message, message
    assert "argument 0" not in message, message
    assert isinstance(error.value.__cause__, IndexError)


def test_a_short_keyword_argument_is_named_by_keyword():
    def model(x, *, y):
        regression(x, y)

    x, y = regression_data()
    with pytest.raises(ModelError, match=rf"argument 'y' has {N - 1} rows, plate 'data' has size {N}"):
        ModelPotential(model, (x,), {"y": y[:-1]})


def test_an_index_error_no_argument_explains_is_left_alone():
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        with pyro.plate("data", len(x), subsample_size=B) as idx:
            pyro.sample("obs", dist.Normal(x[idx] @ w[[0, 5]], NOISE), obs=y[idx])

    x, y = regression_data()
    with pytest.raises(IndexError) as error:
        ModelPotential(model, (x, y))
    assert not isinstance(error.value, ModelError)


# ---------------------------------------------------------------------- an argument longer than its plate
def test_an_argument_longer_than_the_plate_that_indexes_it_is_named_in_a_warning():
    """The plate is ``len(y)``; ``x`` has 10 rows more, which no minibatch ever reaches."""

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=B) as idx:
            pyro.sample("obs", dist.Normal(x[idx] @ w, NOISE), obs=y[idx])

    x, y = regression_data()
    with pytest.warns(RuntimeWarning) as record:
        ModelPotential(model, (x, y[:-10]))
    messages = [str(w.message) for w in record]
    expected = f"argument 0 ('x') has {N} rows but is indexed by plate 'data' of size {N - 10}: its last 10 rows"
    assert any(expected in m for m in messages), messages
    assert not any("argument 1" in m for m in messages), messages


@pytest.mark.parametrize("indexing", ["tuple", "index_select"])
def test_other_ways_of_indexing_by_the_plate_are_seen(indexing):
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=B) as idx:
            rows = x[idx, :] if indexing == "tuple" else x.index_select(0, idx)
            pyro.sample("obs", dist.Normal(rows @ w, NOISE), obs=y[idx])

    x, y = regression_data()
    with pytest.warns(RuntimeWarning, match=rf"argument 0 \('x'\) has {N} rows but is indexed by plate 'data'"):
        ModelPotential(model, (x, y[:-1]))


def test_a_longer_argument_the_plate_does_not_index_is_not_named():
    """A table of another length (looked up by a column of the data, not by the plate) is legitimate."""

    def model(x, y, table):
        w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=B) as idx:
            offset = table[(x[idx, 0] > 0).long()]
            pyro.sample("obs", dist.Normal(x[idx] @ w + offset, NOISE), obs=y[idx])

    x, y = regression_data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ModelPotential(model, (x, y, torch.zeros(2 * N)))
        ModelPotential(regression, (x, y))
