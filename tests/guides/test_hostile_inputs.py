"""Hostile inputs for the guides: every public argument works or fails with a clear, named error.

The contract and the hostile values are those of ``tests/test_hostile_inputs.py`` (whose helpers
are reused): a valid value is accepted and gives finite results, an invalid one raises
``ValueError``/``TypeError`` whose message names the argument, never another exception, a hang
(``SIGALRM`` limit per test) or a silent NaN. The arguments covered are those of
:class:`~pyro_sgmcmc.guides.AutoLaplace` (constructor), of the
:class:`~pyro_sgmcmc.guides.LaplaceApproximation` methods (``set_prior_precision``,
``log_marginal_likelihood``, ``optimize_prior_precision``, ``predict``), of
:class:`~pyro_sgmcmc.guides.AutoDiagVI` (constructor, ``temperature`` setter,
``sample_posterior``) and of :class:`~pyro_sgmcmc.guides.TemperedELBO`. The approximation is built
once per module (a tiny linear regression, milliseconds per call); the file runs in a few seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch._dynamo  # noqa: F401  (torch.func imports it lazily: never inside a test's time limit)
from hypothesis import assume, given
from hypothesis import strategies as st
from pyro.infer import SVI, Trace_ELBO

from pyro_sgmcmc import ModelPotential
from pyro_sgmcmc.guides import AutoDiagVI, AutoLaplace, TemperedELBO
from pyro_sgmcmc.guides.curvature import likelihood_curvature
from tests.test_hostile_inputs import (  # noqa: F401  (_time_limit: the per-test alarm, autouse)
    EITHER,
    FAST,
    INVALID,
    VALID,
    _time_limit,
    check,
    choice_verdict,
    expect_named_error,
    float_verdict,
    hostile,
    int_verdict,
)

GUIDES = FAST.__class__(FAST, max_examples=40)

X = torch.randn(12, 2, generator=torch.Generator().manual_seed(0))
Y = X @ torch.tensor([1.0, -1.0]) + 0.3 * torch.randn(12, generator=torch.Generator().manual_seed(1))


def model(x, y):
    b = pyro.sample("b", dist.Normal(0.0, 2.0))
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", len(y), subsample_size=4) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w + b, 0.5), obs=y[idx])


def linear_model(x, y):
    """The same regression written as one F.linear layer (weight (1, 2), bias (1,)): curvature="kron"."""
    b = pyro.sample("b", dist.Normal(0.0, 2.0).expand([1]).to_event(1))
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([1, 2]).to_event(2))
    plate = pyro.plate("data", len(y), subsample_size=4)
    mean = torch.nn.functional.linear(x[plate.indices], w, b).squeeze(-1)
    with plate:
        pyro.sample("y", dist.Normal(mean, 0.5), obs=y[plate.indices])


@pytest.fixture(autouse=True)
def _fresh_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _laplace(curvature="diag_ggn"):
    pyro.clear_param_store()
    guide = AutoLaplace(linear_model if curvature == "kron" else model, curvature=curvature, disable_progbar=True)
    guide(X, Y)
    return guide.laplace_approximation(X, Y)


@pytest.fixture(scope="module")
def laplace():
    return _laplace()


@pytest.fixture(scope="module")
def dense_laplace():
    return _laplace("full")


@pytest.fixture(scope="module")
def kron_laplace():
    return _laplace("kron")


@pytest.fixture(params=["diagonal", "dense", "kron"])
def approximation(request, laplace, dense_laplace, kron_laplace):
    return {"diagonal": laplace, "dense": dense_laplace, "kron": kron_laplace}[request.param]


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def bool_verdict(value) -> str:
    if isinstance(value, bool):
        return VALID
    return EITHER if isinstance(value, np.bool_) else INVALID


def precision_verdict(value) -> str:
    """A positive finite real number (not bool); a 0-d floating tensor may go either way, and so may
    a number near the limits of the model's dtype (float32 here), where the value itself, the
    covariance or the marginal variances overflow or underflow: then it is refused with its name."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and value.is_floating_point() and math.isfinite(value) and value > 0:
            return EITHER
        return INVALID
    verdict = float_verdict(value, strict=True)
    if verdict == VALID and not (1e-30 <= float(value) <= 1e30):
        return EITHER  # near float32's range the covariance or the variances may underflow: a named error
    return verdict


def precision_argument_verdict(value, allow_none: bool = True) -> str:
    """A precision (see above) or ``{site: precision}`` over the sites ``b`` and ``w``."""
    if value is None:
        return VALID if allow_none else INVALID
    if isinstance(value, dict):
        verdicts = [precision_verdict(v) for v in value.values()]
        verdicts.append(VALID if set(value) <= {"b", "w"} else INVALID)
        return INVALID if INVALID in verdicts else (EITHER if EITHER in verdicts else VALID)
    return precision_verdict(value)


def _assert_finite(tensor):
    assert torch.isfinite(torch.as_tensor(tensor)).all(), tensor


# ====================================================================== AutoLaplace
@GUIDES
@given(value=hostile())
def test_autolaplace_curvature(value):
    check(lambda: AutoLaplace(model, curvature=value), choice_verdict(value, {"diag_ggn", "diag_ef", "full",
          "full_ggn", "kron"}), "curvature")  # fmt: skip


@GUIDES
@given(value=hostile())
def test_autolaplace_num_mc_samples(value):
    check(lambda: AutoLaplace(model, num_mc_samples=value), int_verdict(value, 1), "num_mc_samples")


@pytest.mark.parametrize("argument", ["monte_carlo_fisher", "mc_fisher", "disable_progbar"])
@pytest.mark.filterwarnings("ignore:mc_fisher= is deprecated:FutureWarning")
@GUIDES
@given(value=hostile())
def test_autolaplace_flags(argument, value):
    check(lambda: AutoLaplace(model, **{argument: value}), bool_verdict(value), argument)


@GUIDES
@given(value=st.one_of(hostile(), st.dictionaries(st.sampled_from(["b", "w", "z"]), hostile(), max_size=2)))
def test_autolaplace_prior_precision(value):
    """Checked in the constructor; an unknown site name is refused when the sites are known."""
    verdict = precision_argument_verdict(value)
    if isinstance(value, dict) and verdict == INVALID and all(precision_verdict(v) != INVALID for v in value.values()):
        verdict = VALID  # unknown site names are only known (and refused) in laplace_approximation
    guide = check(lambda: AutoLaplace(model, prior_precision=value, disable_progbar=True), verdict, "prior_precision")
    if isinstance(guide, AutoLaplace):
        guide(X, Y)
        unknown = isinstance(value, dict) and not set(value) <= {"b", "w"}
        later = INVALID if unknown else verdict  # a value beyond float32 is refused only here
        approximation = check(lambda: guide.laplace_approximation(X, Y), later, "z", "prior_precision")
        if not isinstance(approximation, Exception):
            _assert_finite(approximation.precision)
            assert not torch.isnan(approximation.log_marginal_likelihood())  # -inf is honest for 1e38


@GUIDES
@given(value=hostile())
def test_autolaplace_model_and_init_loc_fn_must_be_callable(value):
    check(lambda: AutoLaplace(value), INVALID, "model")
    check(lambda: AutoLaplace(model, init_loc_fn=value), INVALID, "init_loc_fn")


def test_laplace_approximation_of_a_diverged_fit_is_an_error():
    """A NaN MAP (a diverged SVI fit) must not give a Gaussian with a NaN mean without a word."""
    guide = AutoLaplace(model, disable_progbar=True)
    guide(X, Y)
    guide.loc.data[1] = math.nan
    expect_named_error(lambda: guide.laplace_approximation(X, Y), "w")


# ====================================================================== LaplaceApproximation
@GUIDES
@given(value=hostile())
def test_set_prior_precision(approximation, value):
    verdict = precision_argument_verdict(value)
    check(lambda: approximation.set_prior_precision(value), verdict, "prior_precision")
    _assert_finite(approximation.precision)
    _assert_finite(approximation.scale)
    approximation.set_prior_precision(None)


@GUIDES
@given(value=st.one_of(hostile(), st.dictionaries(st.sampled_from(["b", "w", "z"]), hostile(), max_size=2)))
def test_log_marginal_likelihood(approximation, value):
    verdict = precision_argument_verdict(value)
    if approximation.is_kron and isinstance(value, dict) and verdict != INVALID:
        several = [v for v in value.values() if isinstance(v, torch.Tensor) and v.numel() > 1 and (v != v[0]).any()]
        verdict = INVALID if several else verdict  # kron: one precision per site
    result = check(lambda: approximation.log_marginal_likelihood(value), verdict, "prior_precision")
    if isinstance(result, torch.Tensor):
        assert not torch.isnan(result), value  # -inf is an honest answer for an extreme precision


@GUIDES
@given(mode=hostile(), max_iter=st.one_of(st.just(20), hostile()), init=st.one_of(st.none(), hostile()))
def test_optimize_prior_precision(approximation, mode, max_iter, init):
    laplace = approximation
    verdicts = {
        "mode": choice_verdict(mode, {"scalar", "site"}),
        "max_iter": int_verdict(max_iter, 1),
        "init": precision_argument_verdict(init),
    }
    verdict = INVALID if INVALID in verdicts.values() else (EITHER if EITHER in verdicts.values() else VALID)
    names = [name for name, v in verdicts.items() if v != VALID] or list(verdicts)
    result = check(lambda: laplace.optimize_prior_precision(mode, init=init, max_iter=max_iter), verdict, *names)
    if not isinstance(result, Exception):
        values = list(result.values()) if isinstance(result, dict) else [result]
        assert all(torch.isfinite(v) and v > 0 for v in values), result
        _assert_finite(laplace.log_marginal_likelihood())
    laplace.set_prior_precision(None)


def _net(params, x):
    return x @ params["w"].reshape(-1) + params["b"].reshape(())


@GUIDES
@given(
    link=st.one_of(st.sampled_from([None, "identity", "probit", "mc"]), hostile()),
    num_samples=st.one_of(st.just(10), hostile(big_ints=False)),
    batch_size=st.one_of(st.just(5), hostile(big_ints=False)),
)
def test_predict_arguments(approximation, link, num_samples, batch_size):
    laplace = approximation
    verdicts = {
        "link": VALID if link is None else choice_verdict(link, {"identity", "probit", "mc"}),
        "num_samples": int_verdict(num_samples, 1),
        "batch_size": int_verdict(batch_size, 1),
    }
    verdict = INVALID if INVALID in verdicts.values() else (EITHER if EITHER in verdicts.values() else VALID)
    names = [name for name, v in verdicts.items() if v != VALID] or list(verdicts)
    if isinstance(num_samples, int) and num_samples > 10_000:
        num_samples = 10_000  # a valid but slow value: keep the test fast
    result = check(
        lambda: laplace.predict(_net, X, link=link, num_samples=num_samples, batch_size=batch_size), verdict, *names
    )
    if not isinstance(result, Exception):
        _assert_finite(result.mean if hasattr(result, "mean") and not isinstance(result, torch.Tensor) else result)


@GUIDES
@given(value=hostile(big_ints=False))
def test_predict_inputs_and_generator(laplace, value):
    if not isinstance(value, torch.Tensor):  # a tensor of the wrong shape is an error of fn (the user's network)
        check(lambda: laplace.predict(_net, value), INVALID, "x")
    check(lambda: laplace.predict(value, X), INVALID, "fn")
    check(lambda: laplace.predict(_net, X, link="mc", generator=value), VALID if value is None else INVALID,
          "generator")  # fmt: skip


# ====================================================================== AutoDiagVI and TemperedELBO
@GUIDES
@given(value=hostile())
def test_autodiagvi_temperature_and_init_scale(value):
    verdict = float_verdict(value, strict=True)
    check(lambda: AutoDiagVI(model, temperature=value), verdict, "temperature")
    check(lambda: AutoDiagVI(model, init_scale=value), verdict, "init_scale")
    guide = AutoDiagVI(model)
    check(lambda: setattr(guide, "temperature", value), verdict, "temperature")
    check(lambda: AutoDiagVI(model, kl_weight=value), verdict, "kl_weight")
    check(lambda: TemperedELBO(kl_weight=value), VALID if value is None else verdict, "kl_weight")  # None: the guide's


@GUIDES
@given(value=hostile())
@pytest.mark.filterwarnings("ignore:stl= is deprecated:FutureWarning")
def test_autodiagvi_sticking_the_landing_model_and_init_loc_fn(value):
    check(lambda: AutoDiagVI(model, sticking_the_landing=value), bool_verdict(value), "sticking_the_landing")
    check(lambda: AutoDiagVI(model, stl=value), bool_verdict(value), "stl")
    check(lambda: AutoDiagVI(value), INVALID, "model")
    check(lambda: AutoDiagVI(model, init_loc_fn=value), INVALID, "init_loc_fn")


@GUIDES
@given(value=hostile())
def test_autodiagvi_sample_posterior(value):
    guide = AutoDiagVI(model)
    guide(X, Y)
    verdict = int_verdict(value, 1)
    assume(verdict == INVALID or int(value) <= 10_000)  # a valid huge count only costs memory
    result = check(lambda: guide.sample_posterior(value), verdict, "num_samples")
    if isinstance(result, dict):
        assert all(torch.isfinite(v).all() for v in result.values())


@GUIDES
@given(value=st.one_of(hostile()))
def test_tempered_elbo_temperature(value):
    verdict = VALID if value is None else float_verdict(value, strict=True)
    check(lambda: TemperedELBO(temperature=value), verdict, "temperature")


@pytest.mark.parametrize("argument", ["num_particles", "max_plate_nesting"])
@GUIDES
@given(value=hostile())
def test_tempered_elbo_counts(argument, value):
    low = 1 if argument == "num_particles" else 0
    verdict = int_verdict(value, low)
    if argument == "max_plate_nesting" and isinstance(value, float) and value == math.inf:
        verdict = VALID  # Pyro's default: work it out from the model
    check(lambda: TemperedELBO(**{argument: value}), verdict, argument)


def test_tempered_elbo_with_a_disagreeing_guide_temperature_names_it():
    guide = AutoDiagVI(model, temperature=0.5)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), TemperedELBO(temperature=2.0))
    expect_named_error(lambda: svi.step(X, Y), "temperature")


# ====================================================================== errors inside the user's model
def bad_model(x, y):
    """``w`` has 3 entries for 2 features: a shape mismatch inside the model."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with pyro.plate("data", len(y), subsample_size=4) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, 0.5), obs=y[idx])


@pytest.mark.parametrize("make", [lambda m: AutoLaplace(m, disable_progbar=True), AutoDiagVI],
                         ids=["AutoLaplace", "AutoDiagVI"])  # fmt: skip
def test_a_shape_mismatch_in_the_model_names_the_site(make):
    """The error surfaces on the guide's first call (SVI's first step) with the table of the sites
    traced so far, so the site at fault (``w``, shape 3) can be read off."""
    guide = make(bad_model)
    svi = SVI(bad_model, guide, pyro.optim.Adam({"lr": 0.01}), TemperedELBO() if make is AutoDiagVI else Trace_ELBO())
    with pytest.raises((RuntimeError, ValueError)) as info:
        svi.step(X, Y)
    assert " w " in str(info.value) or "'w'" in str(info.value), str(info.value)


def test_a_model_that_hard_codes_the_minibatch_size_runs_on_the_per_example_route():
    """The model runs only with the SVI minibatch size: the per-example route runs it on chunks of
    that size (the last chunk overlapping), so it needs no fallback; the result is finite and
    equals the Jacobian route's."""

    def fragile(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", len(y), subsample_size=4) as idx:
            mean = (x[idx] @ w).reshape(4)  # hard-codes the minibatch size
            pyro.sample("y", dist.Normal(mean, 0.5), obs=y[idx])

    guide = AutoLaplace(fragile, disable_progbar=True)
    guide(X, Y)
    laplace = guide.laplace_approximation(X, Y)
    _assert_finite(laplace.precision)
    potential = ModelPotential(fragile, (X, Y))
    position = torch.zeros(potential.dim)
    per_example = likelihood_curvature(potential, position, "diag_ggn", disable_progbar=True)
    jacobian = likelihood_curvature(potential, position, "diag_ggn", disable_progbar=True, path="jacobian")
    assert per_example.method == "per-example"
    assert torch.allclose(per_example.curvature, jacobian.curvature, rtol=1e-5)
