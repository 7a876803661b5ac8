"""The kernels' shared keyword signature (kernels/arguments.py) and the previous release's spellings."""

import inspect

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_median

from pyro_sgmcmc import SGHMC, SGLD, SGNHT

SHARED = [
    "model", "step_size", "adapt_step_size", "adapt_mass_matrix", "full_mass", "init_strategy", "temperature",
    "num_data", "control_variate", "init_to_centre", "on_divergence", "jit_compile", "cuda_graph", "gradient_estimator",
]  # fmt: skip


def model():
    pyro.sample("z", dist.Normal(0.0, 1.0))


@pytest.mark.parametrize(
    "kernel,own",
    [(SGLD, []), (SGHMC, ["friction", "mass", "init_momentum"]),
     (SGNHT, ["diffusion", "mass", "init_thermostat", "init_momentum"])],
)  # fmt: skip
def test_one_introspectable_signature(kernel, own):
    parameters = inspect.signature(kernel).parameters
    assert list(parameters) == SHARED + own
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(parameters.values())[2:])
    assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in parameters.values())


@pytest.mark.parametrize(
    "make,old,new,value",
    [
        (lambda: SGHMC(model, initial_momentum="stationary"), "initial_momentum", "init_momentum", "stationary"),
        (lambda: SGNHT(model, initial_momentum="stationary"), "initial_momentum", "init_momentum", "stationary"),
        (lambda: SGNHT(model, initial_thermostat=0.5), "initial_thermostat", "init_thermostat", 0.5),
        (lambda: SGLD(model, control_variate={"z": torch.tensor(0.0)}, start_at_centre=True), "start_at_centre",
         "init_to_centre", True),
    ],
    ids=["SGHMC-initial_momentum", "SGNHT-initial_momentum", "initial_thermostat", "start_at_centre"],
)  # fmt: skip
def test_renamed_arguments_warn_and_still_work(make, old, new, value):
    with pytest.warns(FutureWarning, match=rf"{old}= \(now {new}=\)"):
        kernel = make()
    assert getattr(kernel, new) == value
    with pytest.warns(FutureWarning, match=f"{old} is deprecated: read {new}"):
        assert getattr(kernel, old) == value


def test_arguments_by_position_warn_and_keep_their_old_meaning():
    moved = "temperature, num_data, friction, mass, init_momentum, init_strategy, on_divergence"
    with pytest.warns(FutureWarning, match=f"passing {moved} by position"):
        kernel = SGHMC(model, 0.01, 0.5, 100, 2.0, 3.0, "stationary", init_to_median, "freeze")
    assert (kernel.temperature, kernel.num_data, kernel.friction, kernel.mass) == (0.5, 100, 2.0, 3.0)
    assert kernel.init_momentum == "stationary" and kernel.init_strategy is init_to_median
    assert kernel.on_divergence == "freeze"
    with pytest.warns(FutureWarning, match="by position"):
        sgnht = SGNHT(model, 0.01, 1.0, None, 2.0, 1.0, 0.25)
    assert (sgnht.diffusion, sgnht.init_thermostat) == (2.0, 0.25)
    with pytest.warns(FutureWarning, match="by position"):
        assert SGLD(model, 0.01, 0.5).temperature == 0.5


def test_errors_name_the_spelling_the_caller_used():
    with pytest.raises(ValueError, match=r"initial_momentum must be one of"), pytest.warns(FutureWarning):
        SGHMC(model, initial_momentum="random")
    with pytest.raises(ValueError, match=r"init_momentum must be one of"):
        SGHMC(model, init_momentum="random")
    with pytest.raises(TypeError, match="got multiple values for argument 'init_momentum'"):
        SGHMC(model, init_momentum="zero", initial_momentum="zero")
    with pytest.raises(TypeError, match="takes 2 positional arguments"):
        SGLD(model, 0.01, 1.0, None, init_to_median, "restart", "extra")
    with pytest.raises(TypeError, match="unexpected keyword argument 'friction'"):
        SGLD(model, friction=1.0)


def test_nuts_only_arguments_keep_their_clear_error():
    with pytest.raises(TypeError, match="target_accept_prob is an argument of Pyro's HMC/NUTS"):
        SGHMC(model, target_accept_prob=0.8)
