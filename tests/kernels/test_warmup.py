"""The default warmup (``pyro_sgmcmc/kernels/warmup.py``): approach, adaptation, loud divergences."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.autoguide.initialization import init_to_value

from pyro_sgmcmc import SGHMC, SGLD, SGNHT, DivergenceWarning, SlowMixingWarning
from pyro_sgmcmc.kernels.metric import MAX_CONDITION, TRANSIENT_CONDITION, curvature_floor
from pyro_sgmcmc.kernels.warmup import JUMP_Z, MAX_DELTA_ENERGY, approach_length

KERNELS = {"SGLD": SGLD, "SGHMC": SGHMC, "SGNHT": SGNHT}


def _gaussian_mean_model(y: torch.Tensor, batch: int):
    """``mu ~ N(0, 1e4)``, ``y_n ~ N(mu, 1)``: posterior N(sum y / (N + 1e-4), 1 / (N + 1e-4))."""

    def model():
        mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=y.dtype), 100.0))
        with pyro.plate("data", len(y), subsample_size=batch) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    return model


def _raw_regression(num_data: int, batch: int):
    """``y = w x + noise`` with a raw covariate of sd 100 (true w = 1, posterior sd about 1e-3 / sqrt(N / 100)),
    ``w ~ N(0, 10)``, ``sigma ~ HalfNormal(10)``, minibatches of ``batch``."""
    torch.manual_seed(1)
    x = 100.0 * torch.randn(num_data, dtype=torch.float64)
    y = x + torch.randn(num_data, dtype=torch.float64)

    def model():
        w = pyro.sample("w", dist.Normal(torch.tensor(0.0, dtype=torch.float64), 10.0))
        sigma = pyro.sample("sigma", dist.HalfNormal(torch.tensor(10.0, dtype=torch.float64)))
        with pyro.plate("data", num_data, subsample_size=batch) as idx:
            pyro.sample("y", dist.Normal(w * x[idx], sigma), obs=y[idx])

    return model


@pytest.mark.parametrize("name", list(KERNELS))
def test_approach_brings_a_far_start_to_the_mode(name, float64):
    """From 0 to a posterior at 300 (3,000 posterior sds away; a plain SGLD step of 1e-3 would need about
    3,000 steps to cover it, and the gradient there is 300 N): at the end of the approach the chain is
    within 5 posterior sds of the mean. Adam's relative step crosses 300 in ~60 steps; the geometric decay
    to 1e-5 relative (3e-3 = 0.3 sd at 300) then settles it."""
    torch.manual_seed(0)
    y = 300.0 + torch.randn(1000, dtype=torch.float64)
    kernel = KERNELS[name](_gaussian_mean_model(y, 100), init_strategy=init_to_value(values={"mu": torch.tensor(0.0)}))
    warmup = 4000
    kernel.setup_chains(warmup, seed=0)
    assert kernel.phase == "approach"
    for _ in range(approach_length(warmup)):
        kernel.step()
    assert kernel.phase == "adaptation"
    post_mean, post_sd = float(y.sum() / (len(y) + 1e-4)), 1.0 / math.sqrt(len(y))
    mu = float(kernel.state.position[0, 0])
    assert abs(mu - post_mean) < 5 * post_sd, (mu, post_mean, post_sd)


def test_phases_are_shown_in_the_progress_bar_and_diagnostics(float64):
    torch.manual_seed(0)
    y = 3.0 + torch.randn(200, dtype=torch.float64)
    kernel = SGHMC(_gaussian_mean_model(y, 50))
    seen = []
    mcmc = MCMC(
        kernel, num_samples=20, warmup_steps=40, disable_progbar=True, hook_fn=lambda k, *_: seen.append(k.logging())
    )
    mcmc.run()
    phases = [entry["phase"] for entry in seen]
    assert phases[:9] == ["approach"] * 9 and "adaptation" in phases and phases[-1] == "sampling"
    diagnostics = kernel.chain_diagnostics(0)
    assert diagnostics["approach steps"] == approach_length(40) == 10
    assert diagnostics["adaptation steps"] == 30
    assert diagnostics["inverse mass matrix diagonal"].shape == (1,)
    assert diagnostics["jump threshold"] >= MAX_DELTA_ENERGY
    assert math.isfinite(diagnostics["step size"]) and diagnostics["step size"] > 0


def test_each_chain_adapts_alone(float64):
    """Chain 2 of a vectorised run of 4 is bit for bit chain 2 run alone: step sizes and metrics are per chain."""
    torch.manual_seed(0)
    y = 3.0 + torch.randn(200, dtype=torch.float64)
    model = _gaussian_mean_model(y, 50)

    starts = torch.tensor([-1.5, 0.5, 1.0, 1.7], dtype=torch.float64)

    def run(chain_ids):
        kernel = SGHMC(model, jit_compile=False)
        initial = {"mu": starts[chain_ids]}
        kernel.setup_chains(60, num_chains=len(chain_ids), seed=5, chain_ids=chain_ids, initial_params=initial)
        positions = [kernel.step().position.clone() for _ in range(100)]
        return torch.stack(positions, 1), kernel.warmup.chain_step_size

    together, steps_together = run([0, 1, 2, 3])
    alone, step_alone = run([2])
    assert torch.equal(together[2], alone[0])
    # one chain's frozen step is a number after warmup (the scalar update path); the same value
    assert float(steps_together[2]) == step_alone
    assert not torch.equal(steps_together[0], steps_together[2])  # the step sizes really are per chain


def _trapped_gaussian_mean():
    """``mu ~ N(0, 100)``, 200 data read 50 at a time; and a switch ``trap["on"]`` that adds a factor of -1e6 to
    the potential (a jump of 1e6 at the next step)."""
    torch.manual_seed(0)
    y = 3.0 + torch.randn(200, dtype=torch.float64)
    trap = {"on": False}

    def model():
        mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=torch.float64), 10.0))
        if trap["on"]:
            pyro.factor("trap", torch.tensor(-1e6, dtype=torch.float64))
        with pyro.plate("data", len(y), subsample_size=50) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    return model, trap


def test_a_jump_of_the_potential_is_a_divergence(float64):
    """After warmup a step that raises the minibatch potential past max_delta_energy + 10 x the RMS of its
    warmup changes is a divergence: recorded, named, and the chain put back."""
    model, trap = _trapped_gaussian_mean()
    kernel = SGHMC(model, jit_compile=False)
    kernel.setup_chains(200, seed=0)
    for _ in range(210):
        kernel.step()
    threshold = float(kernel.warmup.jump_threshold[0])
    assert MAX_DELTA_ENERGY < threshold < MAX_DELTA_ENERGY + JUMP_Z * 100  # minibatch noise of U: a few units
    before = kernel.state
    trap["on"] = True
    kernel.step()
    assert bool(kernel.divergence_record.last[0])
    assert "a jump of the potential by 1e+06" in kernel.divergence_log[-1][3]
    assert torch.equal(kernel.state.position, before.position)  # on_divergence="restart": put back
    with pytest.warns(DivergenceWarning, match="1 divergent step"):
        kernel.warn_divergences()


def test_the_first_adaptation_steps_are_guarded_against_a_jump(float64):
    """The adaptation's running jump threshold is measured from the approach's second half (where the chain has
    come to rest, and the changes are the minibatch noise: a few units here), so it is in force from the first
    adaptation step. Before, the first 20 adaptation steps had none: on eight schools a step of 0.4 under the
    first metric threw log tau from 6 to -3,400 (a jump of 9e4) at the 17th step, unnoticed, and the run ended
    with tau = 0 in every draw. Here a jump of 1e6 at the first adaptation step is a divergence, and the chain
    is put back."""
    model, trap = _trapped_gaussian_mean()
    kernel = SGHMC(model, jit_compile=False)
    kernel.setup_chains(400, seed=0)
    for _ in range(approach_length(400)):
        kernel.step()
    assert kernel.phase == "adaptation"
    threshold = float(kernel.warmup.jump_threshold[0])
    assert MAX_DELTA_ENERGY < threshold < MAX_DELTA_ENERGY + JUMP_Z * 100  # minibatch noise of U: a few units
    before = kernel.state
    trap["on"] = True
    kernel.step()
    assert bool(kernel.divergence_record.last[0])
    assert "a jump of the potential by 1e+06" in kernel.divergence_log[-1][3]
    assert torch.equal(kernel.state.position, before.position)


def test_a_huge_initial_step_size_is_adapted_away(float64):
    """``SGHMC(model, step_size=50.0)`` on a regression with raw covariates (sd 100): the initial step is only
    the starting value; the adapted chain's draws are sane (the posterior mean of the coefficient, 1, is
    within 1e-2: its posterior sd is 1e-3)."""
    model = _raw_regression(100, 25)

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(model, step_size=50.0), num_samples=500, warmup_steps=1000, disable_progbar=True)
    mcmc.run()
    w = mcmc.get_samples()["w"]
    assert torch.isfinite(w).all() and float((w - 1.0).abs().max()) < 1e-2


def test_a_huge_fixed_step_size_is_loud(float64):
    """Without adaptation the same step of 50 blows up: every blow-up is a counted divergence and the run
    ends with a warning naming the count (never silent draws of 1e100)."""
    torch.manual_seed(1)
    x = 100.0 * torch.randn(100, dtype=torch.float64)
    y = x + torch.randn(100, dtype=torch.float64)

    def model():
        w = pyro.sample("w", dist.Normal(torch.tensor(0.0, dtype=torch.float64), 10.0))
        with pyro.plate("data", 100, subsample_size=25) as idx:
            pyro.sample("y", dist.Normal(w * x[idx], 1.0), obs=y[idx])

    pyro.set_rng_seed(0)
    kernel = SGHMC(model, step_size=50.0, adapt_step_size=False, adapt_mass_matrix=False)
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=100, disable_progbar=True)
    with pytest.warns(DivergenceWarning, match=r"\d+ divergent step\(s\) while sampling"):
        mcmc.run()
    assert len(mcmc.diagnostics()["divergences"]["chain 0"]) > 0


def test_adaptation_arguments_are_checked():
    model = _gaussian_mean_model(torch.zeros(10), 5)
    with pytest.raises(TypeError, match="adapt_step_size must be True or False"):
        SGHMC(model, adapt_step_size=1)
    with pytest.raises(ValueError, match="a step-size schedule cannot be adapted"):
        SGLD(model, step_size=lambda t: 0.1)
    SGLD(model, step_size=lambda t: 0.1, adapt_step_size=False)  # a schedule is fine without adaptation
    optimiser = SGHMC(model, temperature=0.0)  # T = 0: an optimiser, nothing to adapt
    optimiser.setup_chains(40, seed=0)
    assert optimiser.phase == "warmup" and optimiser.warmup.adaptation is None


def test_the_metric_is_bounded():
    """The curvature floor: the largest |eigenvalue| over 1e8 always, and in the initial buffer at least the
    median over 1e2, so a flat direction (curvature 0) cannot take an unbounded variance."""
    curvature = torch.tensor([[1e-30, 1.0, 2.0, 1e4]])
    assert torch.allclose(curvature_floor(curvature, transient=False), torch.tensor([[1e4 / MAX_CONDITION]]))
    assert torch.allclose(curvature_floor(curvature, transient=True), torch.tensor([[1.0 / TRANSIENT_CONDITION]]))


def test_a_step_too_small_to_mix_is_loud(float64):
    """A regression with raw covariates (sd 100), N = 2,000 read 10 at a time, without a control variate:
    the gradient noise caps the step at about 0.035 in preconditioned units (SGHMC, friction 1), so a chain
    needs about 2 / 0.035 = 57 steps to forget its state, close to a fifth of the 300 adaptation steps, and it
    ends the warmup about 11 posterior sds from where its gradients balance: the run warns, whichever of the
    two signs (a relaxation time over a fifth of the adaptation, or the drift) it sees. (With the noise
    measured from 8 minibatches a probe, the step came out smaller and the first sign fired; from 32, the
    second.) With the default control variate (N / B = 200 >= 10) the noise near the mode is about N / B
    times smaller, the step is set by the curvature, and no warning is given."""
    model = _raw_regression(2000, 10)

    pyro.set_rng_seed(0)
    with pytest.warns(SlowMixingWarning, match="needs about|still drifting"):
        MCMC(SGHMC(model, control_variate=None), num_samples=10, warmup_steps=400, disable_progbar=True).run()
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowMixingWarning)
        kernel = SGHMC(model)
        MCMC(kernel, num_samples=10, warmup_steps=400, disable_progbar=True).run()
    assert kernel.chain_diagnostics(0)["control variate"]


@pytest.mark.parametrize("name", ["target_accept_prob", "max_tree_depth", "trajectory_length", "num_steps"])
@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, SGNHT])
def test_nuts_arguments_get_a_clear_error(kernel_cls, name):
    """A Pyro user's NUTS arguments are named in the error with what to do instead."""
    with pytest.raises(TypeError, match=f"{kernel_cls.__name__}: {name} is an argument of Pyro's HMC/NUTS"):
        kernel_cls(lambda: None, **{name: 0.8})


def test_a_chain_the_noise_keeps_far_from_the_posterior_is_loud():
    """A Gaussian mean, N = 10,000 read 10 at a time, no control variate: the approach ends about
    sqrt(N / B) = 30 posterior sds out, the noise-limited step is small and the chain creeps. Before the
    gradient curvature used the covariance of the gradients (not their second moment), the chain's drift
    counted as curvature (58x the true one), the metric shrank, and the run ended 8.7 sds off with no
    warning. Right or loud: either the draws are within 0.5 sd and 20 % of the exact posterior, or the run
    says it has not mixed."""
    n = 10_000
    y = torch.randn(n, generator=torch.Generator().manual_seed(0)) + 3.0

    def model():
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", n, subsample_size=10) as idx:
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    pyro.set_rng_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc = MCMC(SGHMC(model, control_variate=None), num_samples=2000, warmup_steps=1000, disable_progbar=True)
        mcmc.run()
    draws = mcmc.get_samples()["mu"]
    exact_mean, exact_sd = float(y.sum() / (n + 0.01)), 1 / math.sqrt(n + 0.01)
    right = abs(float(draws.mean()) - exact_mean) < 0.5 * exact_sd and abs(float(draws.std()) / exact_sd - 1) < 0.2
    loud = any(issubclass(w.category, SlowMixingWarning) for w in caught)
    assert right or loud, (float(draws.mean()), exact_mean, float(draws.std()), exact_sd)
