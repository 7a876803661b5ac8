"""Bad data and bad plates are named: the site, the plate, how many values, which data indices.

* non-finite data reaching the likelihood: ``ModelError`` at set-up naming the argument, the observed
  site, the count and the first indices (before any step);
* a likelihood that is ``-inf`` on some minibatches: each divergence record names the observed site
  and the data indices, ``on_divergence="raise"`` says so before suggesting a smaller step;
* every plate size and ``subsample_size``: ``ModelError`` naming the plate;
* data passed as a list, a tuple, a string or a NumPy array, which the model's plate cannot index (or
  whose rows fail in the model's arithmetic): ``ModelError`` naming the argument (position and name, or
  keyword) and saying to pass tensors, with the model's own error as its cause. Only the argument that
  breaks the model is named: a string flag or a list of sizes the model uses as such runs, and a
  model that fails for another reason keeps its own error.
"""

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_sgmcmc import MCMC, SGHMC, SGLD, DivergenceError, DivergenceWarning, ModelError
from pyro_sgmcmc.guides import AutoDiagVI, AutoLaplace


def regression(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y), subsample_size=20) as idx:
        pyro.sample("obs", dist.Normal(w * x[idx], 1.0), obs=y[idx])


def data(n=300):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g)
    return x, x + 0.1 * torch.randn(n, generator=g)


def run(model, *args, steps=3, hook=None, **kernel):
    mcmc = MCMC(SGLD(model, step_size=kernel.pop("step_size", 0.01), **kernel), steps, steps, num_chains=2,
                chain_method="vectorized", seed=0, disable_progbar=True, hook_fn=hook)  # fmt: skip
    mcmc.run(*args)
    return mcmc


# ---------------------------------------------------------------------- non-finite data, at set-up
@settings(max_examples=15, deadline=None)
@given(
    where=st.sets(st.integers(0, 299), min_size=1, max_size=6),
    value=st.sampled_from([float("nan"), float("inf"), -float("inf")]),
    argument=st.sampled_from(["x", "y"]),
)
def test_non_finite_data_is_named_at_set_up_with_site_count_and_indices(where, value, argument):
    x, y = data()
    (x if argument == "x" else y)[sorted(where)] = value
    steps = []
    with pytest.raises(ModelError) as error:
        run(regression, x, y, hook=lambda *a: steps.append(a))
    message = str(error.value)
    assert f"({argument!r})" in message  # the argument, by name
    assert "observed site 'obs'" in message and f"has {len(where)} of 300 data points" in message
    assert str(sorted(where)[:5]) in message  # the first indices at fault
    assert steps == []  # before any step


def test_non_finite_values_the_likelihood_never_sees_are_accepted():
    def model(x, y, unused):
        regression(x, y)

    x, y = data()
    run(model, x, y, torch.tensor([float("nan")]))


def test_masked_non_finite_observations_are_accepted():
    def model(y, mask):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y), subsample_size=20) as idx:
            pyro.sample("obs", dist.Normal(w, 1.0).mask(mask[idx]), obs=y[idx].nan_to_num())

    _, y = data()
    y[[4, 9]] = float("nan")
    run(model, y, torch.isfinite(y))


def test_the_data_check_runs_once_at_set_up_not_per_step(monkeypatch):
    """The check is one isfinite pass over each argument, at set-up: counted, it runs once per run."""
    import pyro_sgmcmc.model.checks as checks

    calls = []
    original = checks.nonfinite_arguments
    monkeypatch.setattr(checks, "nonfinite_arguments", lambda *a: calls.append(1) or original(*a))
    run(regression, *data(), steps=20)
    assert len(calls) == 1


# ------------------------------------------------ -inf likelihood on some minibatches, at run time
def bounded(y):
    w = pyro.sample("w", dist.Normal(5.0, 1.0))
    with pyro.plate("data", len(y), subsample_size=20) as idx:
        pyro.sample("obs", dist.Uniform(w - 10.0, w + 10.0), obs=y[idx])


def outlier_data():
    y = 5 + torch.rand(300, generator=torch.Generator().manual_seed(1))
    y[42] = 100.0  # outside the support of every w near the posterior: -inf on the minibatches holding it
    return y


def test_minus_inf_likelihood_on_a_minibatch_is_named_by_site_and_data_index():
    with pytest.raises(DivergenceError) as error:
        run(bounded, outlier_data(), steps=30, step_size=0.001, on_divergence="raise")
    message = str(error.value)
    assert "observed site 'obs'" in message and "-inf" in message and "data indices [42]" in message
    # the data are named before the step size is blamed
    assert message.index("check them") < message.index("reduce step_size")


def test_the_divergence_records_and_warning_name_the_site():
    with pytest.warns(DivergenceWarning, match=r"observed site 'obs'.*data indices \[42\]"):
        mcmc = run(bounded, outlier_data(), steps=30, step_size=0.001)
    assert mcmc.kernel.divergence_log
    for _, _, _, what in mcmc.kernel.divergence_log:
        assert "observed site 'obs'" in what and "[42]" in what


def test_a_non_finite_gradient_names_the_site():
    """A divergence of the dynamics (huge step) names the latent site's value or gradient, not the data."""

    def model(y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y), subsample_size=20) as idx:
            pyro.sample("obs", dist.Normal(w**3, 1.0), obs=y[idx])

    with pytest.raises(DivergenceError, match="site 'w'") as error:
        MCMC(SGHMC(model, step_size=10.0, adapt_step_size=False, on_divergence="raise"), 20, 20, num_chains=2,
             chain_method="vectorized", seed=0, disable_progbar=True).run(data()[1])  # fmt: skip
    assert "check them" not in str(error.value)  # not the data: the step


# ---------------------------------------------------------------------- plates
def plate_model(size, subsample_size):
    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data_plate", size, subsample_size=subsample_size) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    return model


@pytest.mark.parametrize(
    "subsample_size",
    [0, -3, 32.0, True, False, 101, np.int64(5), "10", torch.tensor(5.0)],
    ids=["zero", "negative", "float", "True", "False", "too-large", "numpy-int", "string", "float-tensor"],
)
def test_every_bad_subsample_size_names_the_plate(subsample_size):
    with pytest.raises(ModelError, match="plate 'data_plate' has subsample_size=") as error:
        run(plate_model(100, subsample_size), torch.randn(100))
    assert "subsample_size <=" in str(error.value) or "integer >= 1" in str(error.value)


@pytest.mark.parametrize("size", [0, -1, 10.0, True], ids=["empty", "negative", "float", "bool"])
def test_a_bad_plate_size_names_the_plate(size):
    with pytest.raises(ModelError, match="plate 'data_plate' has size="):
        run(plate_model(size, None), torch.randn(100))


def test_an_empty_data_set_names_the_plate():
    with pytest.raises(ModelError, match="plate 'data' has size=0.*empty plate"):
        run(regression, torch.randn(0), torch.randn(0))


@pytest.mark.parametrize("subsample_size", [1, 100, None, torch.tensor(7)], ids=str)
def test_valid_subsample_sizes_run(subsample_size):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = run(plate_model(100, subsample_size), torch.randn(100))
    assert torch.isfinite(mcmc.get_samples()["mu"]).all()


def test_a_model_that_cannot_run_under_vmap_falls_back_to_one_chain_at_a_time():
    """``.item()`` (or data-dependent branching) in the model: the chains are evaluated one by one with a
    warning that says so, and the run gives finite draws (not functorch's RuntimeError)."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        scale = 1.0 if mu.item() > -100.0 else 2.0  # a Python branch on a tensor's value
        with pyro.plate("data", len(y), subsample_size=10) as idx:
            pyro.sample("obs", dist.Normal(mu, scale), obs=y[idx])

    with pytest.warns(RuntimeWarning, match="cannot run under torch.func.vmap"):
        mcmc = run(model, torch.randn(50), steps=5)
    assert torch.isfinite(mcmc.get_samples()["mu"]).all()


# ---------------------------------------------------------------------- data that are not tensors
X, Y = data()
CSV = ",".join(f"{v:.3f}" for v in Y.tolist())  # the data as text, as read from a file and not parsed


@pytest.mark.parametrize(
    "args,label,kind,cause",
    [
        ((X, Y.tolist()), "argument 1 ('y')", "a list", TypeError),
        ((tuple(X.tolist()), Y), "argument 0 ('x')", "a tuple", TypeError),
        ((X.numpy(), Y), "argument 0 ('x')", "a NumPy array", RuntimeError),  # indexed; fails in w * x[idx]
        ((X, Y.numpy()), "argument 1 ('y')", "a NumPy array", TypeError),  # indexed; fails in log_prob
    ],
    ids=["list", "tuple", "numpy-x", "numpy-y"],
)
def test_data_that_are_not_tensors_are_named(args, label, kind, cause):
    with pytest.raises(ModelError) as error:
        run(regression, *args)
    message = str(error.value)
    assert f"the data must be torch tensors: {label} is {kind}." in message, message
    assert "torch.as_tensor" in message and cause.__name__ in message, message
    assert isinstance(error.value.__cause__, cause)  # the model's own error, chained
    other = "argument 0" if label.startswith("argument 1") else "argument 1"
    assert other not in message  # only the argument at fault


def test_data_given_as_a_string_are_named():
    with pytest.raises(ModelError, match=r"argument 1 \('y'\) is a str, not a torch.Tensor: if it holds data") as error:
        run(regression, X, CSV)
    assert isinstance(error.value.__cause__, IndexError)  # len(CSV) rows of x: out of range


def test_keyword_data_that_are_not_tensors_are_named_by_keyword():
    def model(x, *, y):
        regression(x, y)

    mcmc = MCMC(SGLD(model, step_size=0.01), 2, 2, num_chains=2, chain_method="vectorized", seed=0,
                disable_progbar=True)  # fmt: skip
    with pytest.raises(ModelError, match=r"the data must be torch tensors: argument 'y' is a list\."):
        mcmc.run(X, y=Y.tolist())


@pytest.mark.parametrize("guide_class", [AutoLaplace, AutoDiagVI])
def test_the_guides_name_data_that_are_not_tensors(guide_class):
    pyro.clear_param_store()
    with pytest.raises(ModelError, match=r"the data must be torch tensors: argument 1 \('y'\) is a list\."):
        guide_class(regression)(X, Y.tolist())
    pyro.clear_param_store()


def test_a_string_flag_and_a_list_of_sizes_that_the_model_does_not_index_run():
    def model(x, y, link, sizes):
        assert link == "identity" and sizes == [1, 1]
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand(sizes).to_event(2))
        with pyro.plate("data", len(y), subsample_size=20) as idx:
            pyro.sample("obs", dist.Normal(w[0, 0] * x[idx], 1.0), obs=y[idx])

    mcmc = run(model, X, Y, "identity", [1, 1])
    assert mcmc.get_samples()["w"].shape[-2:] == (1, 1)


def test_a_list_of_sizes_beside_list_data_is_not_named():
    """Both lists can be made tensors; only the data need to be (the sizes work either way)."""

    def model(x, y, sizes):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand(sizes).to_event(1))
        with pyro.plate("data", len(y), subsample_size=20) as idx:
            pyro.sample("obs", dist.Normal(w.sum() * x[idx], 1.0), obs=y[idx])

    with pytest.raises(ModelError) as error:
        run(model, X, Y.tolist(), [2])
    message = str(error.value)
    assert "argument 1 ('y') is a list." in message and "sizes" not in message, message


def test_a_string_flag_is_not_blamed_for_a_failure_elsewhere():
    """Non-finite ``initial_params`` fail the set-up, and the model takes a string: the model runs on its
    arguments as given, so the error is the one about ``initial_params``, not a ``ModelError`` on the string."""

    def model(x, y, link):
        assert link == "identity"
        regression(x, y)

    mcmc = pyro.infer.MCMC(SGLD(model), num_samples=1, initial_params={"w": torch.tensor(float("nan"))},
                           disable_progbar=True)  # fmt: skip
    with pytest.raises(ValueError, match="initial_params give a non-finite") as error:
        mcmc.run(X, Y, "identity")
    assert not isinstance(error.value, ModelError)


def test_a_model_failing_for_another_reason_keeps_its_own_error():
    """A list of sizes (convertible to a tensor) is present, but the model fails on something else: made
    a tensor, the list does not make it run, so it is not blamed."""

    def model(x, y, sizes):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand(sizes).to_event(1))
        with pyro.plate("data", len(y), subsample_size=20) as idx:
            pyro.sample("obs", dist.Normal(w.sum() * x[idx] + undefined_offset, 1.0), obs=y[idx])  # noqa: F821

    with pytest.raises(NameError, match="undefined_offset"):
        run(model, X, Y, [2])
