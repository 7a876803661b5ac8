"""Observations outside a discrete support, named at set-up when Pyro's validation is on (issue 26 point 2).

The oracle is the data themselves: one value outside the support, planted at a known row. The set-up traces
one random minibatch of ``B = 20`` of ``N = 200`` rows, which holds the planted row with probability 0.1; the
check must name it at every one of several set-ups (whole data), with the site, the distribution, the row and
the value, and accept the same data with the row put back in the support (no false alarm). With validation off
nothing is checked, as Pyro checks nothing then.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_sgmcmc.model.trace as trace_module
from pyro_sgmcmc import MCMC, SGLD, ModelError, ModelPotential

N, B, BAD_ROW = 200, 20, 137
SET_UPS = 6  # the planted row is in none of 6 random set-up minibatches with probability 0.9^6 = 0.53


def _features():
    return torch.randn(N, generator=torch.Generator().manual_seed(0))


def _regression(likelihood):
    """A one-weight regression whose observed site ``y`` has the distribution ``likelihood(eta)``."""

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N, subsample_size=B) as idx:
            pyro.sample("y", likelihood(x[idx] * w), obs=y[idx])

    return model


# (name, likelihood, a value in its support, a value outside it)
CASES = [
    ("Poisson", lambda eta: dist.Poisson(eta.exp()), 3.0, 2.5),
    ("Poisson", lambda eta: dist.Poisson(eta.exp()), 3.0, -1.0),
    ("Bernoulli", lambda eta: dist.Bernoulli(logits=eta), 1.0, 2.0),
    ("Binomial", lambda eta: dist.Binomial(5, logits=eta), 5.0, 6.0),
    ("Categorical", lambda eta: dist.Categorical(logits=eta.unsqueeze(-1) * torch.arange(3.0)), 2, 3),
    ("NegativeBinomial", lambda eta: dist.NegativeBinomial(3.0, logits=eta), 4.0, 0.5),
    ("Geometric", lambda eta: dist.Geometric(logits=eta), 0.0, -2.0),
]
IDS = [f"{name}-{bad}" for name, _, _, bad in CASES]


def _data(good, bad=None):
    dtype = torch.long if isinstance(good, int) else torch.float32
    y = torch.full((N,), good, dtype=dtype)
    if bad is not None:
        y[BAD_ROW] = bad
    return y


@pytest.mark.parametrize("name, likelihood, good, bad", CASES, ids=IDS)
def test_a_value_outside_the_support_anywhere_in_the_data_is_named_at_set_up(name, likelihood, good, bad):
    model, x, y = _regression(likelihood), _features(), _data(good, bad)
    for seed in range(SET_UPS):  # each set-up traces another minibatch: the whole data are checked every time
        pyro.set_rng_seed(seed)
        with pyro.validation_enabled(True), pytest.raises(ModelError) as caught:
            ModelPotential(model, (x, y))
        message = str(caught.value)
        assert f"observed site 'y' ({name}, support" in message
        assert "1 of 200 data points outside its support" in message
        assert f"data index {BAD_ROW} = {bad}" in message
        # read from the argument, or (Binomial: its bounds have the minibatch's shape) every minibatch walked
        assert ("by argument 1 ('y')" in message and "all its 200 rows checked" in message) == (name != "Binomial")
        assert ("every minibatch of the full data checked" in message) == (name == "Binomial")


@pytest.mark.parametrize("name, likelihood, good, bad", CASES, ids=IDS)
def test_values_in_the_support_are_accepted(name, likelihood, good, bad):
    with pyro.validation_enabled(True):
        potential = ModelPotential(_regression(likelihood), (_features(), _data(good)))
    assert potential.site_names == ["w"]


def test_with_validation_off_nothing_is_checked_as_in_pyro():
    """Pyro checks a value against its support only with validation on; MCMC turns it off by default
    (``disable_validation=True``), and the run then proceeds, scoring the value as Pyro would."""
    model, x, y = _regression(CASES[0][1]), _features(), _data(3.0, 2.5)
    with pyro.validation_enabled(False):
        ModelPotential(model, (x, y))
    mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=5, warmup_steps=5, num_chains=2, chain_method="vectorized",
                seed=0, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    assert mcmc.get_samples()["w"].shape == (10,)


def test_mcmc_with_validation_on_refuses_before_any_step():
    model, x, y = _regression(CASES[0][1]), _features(), _data(3.0, 2.5)
    steps = []
    for chain_method in ("vectorized", "sequential", "parallel"):
        options = {} if chain_method == "parallel" else {"seed": 0}
        mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=5, warmup_steps=5, chain_method=chain_method,
                    disable_validation=False, hook_fn=lambda *a: steps.append(a), disable_progbar=True,
                    **options)  # fmt: skip
        with pytest.raises(ModelError, match=f"observed site 'y' .*data index {BAD_ROW} = 2.5"):
            mcmc.run(x, y)
    assert steps == []


def test_data_read_from_a_dict_by_index_select_and_as_events_are_named_by_where_they_are():
    x = _features()
    counts = torch.ones(N, 2)
    counts[BAD_ROW, 1] = 1.5

    def model(x, data):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N, subsample_size=B) as idx:
            rate = (x[idx] * w).exp().unsqueeze(-1).expand(B, 2)
            pyro.sample("y", dist.Poisson(rate).to_event(1), obs=data["counts"].index_select(0, idx))

    with pyro.validation_enabled(True), pytest.raises(ModelError) as caught:
        ModelPotential(model, (x, {"counts": counts}))
    message = str(caught.value)
    assert "(Independent(Poisson), support" in message
    assert "by argument 1 ('data')['counts']" in message and f"data index {BAD_ROW} = [1.0, 1.5]" in message


def test_a_model_without_subsampling_is_checked_on_its_whole_value():
    x, y = _features(), _data(3.0, 0.5)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N):
            pyro.sample("y", dist.Poisson((x * w).exp()), obs=y)

    with pyro.validation_enabled(True), pytest.raises(ModelError, match=rf"1 of 200 values .* at \[{BAD_ROW}\] = 0.5"):
        ModelPotential(model, (x, y))


def test_a_support_that_depends_on_the_minibatch_is_checked_over_every_minibatch():
    """``Binomial(n[idx])``: the bounds are the minibatch's, so the model is traced over all the data's
    minibatches (vectorised) and the one bad row is named wherever it is."""
    x, trials = _features(), torch.arange(N) % 5.0
    y = trials.clone()
    y[BAD_ROW] = trials[BAD_ROW] + 1

    def model(x, n, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N, subsample_size=B) as idx:
            pyro.sample("y", dist.Binomial(n[idx], logits=x[idx] * w), obs=y[idx])

    for seed in range(SET_UPS):
        pyro.set_rng_seed(seed)
        with pyro.validation_enabled(True), pytest.raises(ModelError) as caught:
            ModelPotential(model, (x, trials, y))
        message = str(caught.value)
        assert "observed site 'y' (Binomial, support IntegerInterval)" in message
        assert f"1 of {N} data points outside its support (plate 'data'; every minibatch" in message
        assert f"data index {BAD_ROW} = {float(y[BAD_ROW])}" in message
    with pyro.validation_enabled(True):
        ModelPotential(model, (x, trials, trials))


def test_a_model_that_cannot_be_walked_is_checked_on_its_minibatch_and_says_so():
    """A value computed from the data (not read from an argument) in a model that cannot run under vmap (a Python
    branch on the data): only the set-up's minibatch can be checked; every row is bad here, so it holds some."""
    x = _features()

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", N, subsample_size=B) as idx:
            counts = y[idx] + 0.5 if float(y[idx].sum()) >= 0 else y[idx]
            pyro.sample("y", dist.Poisson((x[idx] * w).exp()), obs=counts)

    with pyro.validation_enabled(True), pytest.raises(ModelError) as caught:
        ModelPotential(model, (x, torch.ones(N)))
    message = str(caught.value)
    assert f"{B} data points outside its support in the minibatch of plate 'data'" in message
    assert f"({B} of {N} data points checked: the model could not be traced over the full data" in message


def test_the_check_runs_at_set_up_only(monkeypatch):
    """Once per set-up, whatever the number of steps; not at all with validation off."""
    calls = []
    check = trace_module.support_violations
    monkeypatch.setattr(trace_module, "support_violations", lambda *a: calls.append(1) or check(*a))
    model, x, y = _regression(CASES[0][1]), _features(), _data(3.0)
    counts = []
    for steps, disable_validation in ((10, False), (60, False), (60, True)):
        calls.clear()
        mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=steps, warmup_steps=steps, num_chains=2, seed=0,
                    chain_method="vectorized", disable_validation=disable_validation, disable_progbar=True)  # fmt: skip
        mcmc.run(x, y)
        counts.append(len(calls))
    assert counts[0] == counts[1] >= 1 and counts[2] == 0
