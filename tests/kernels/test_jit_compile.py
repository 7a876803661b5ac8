"""The kernels' jit_compile flag: the compiled one-chain potential gives the plain kernel's trajectory."""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import SGHMC, SGLD, SGNHT


def _model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", x.shape[0], subsample_size=16) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, SGNHT])
def test_jit_compiled_kernel_follows_the_plain_trajectory(kernel_cls):
    """Same seed, same start: the compiled and the plain kernel draw the same minibatches and noise, so
    after 30 steps their positions differ only by float32 round-off of the replayed operations (the
    potential is ~1e2, its gradient ~1e2: relative 1e-5 allows a few ulps per step over 30 steps)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=generator)
    y = x @ torch.tensor([1.0, -0.5, 2.0]) + 0.3 * torch.randn(200, generator=generator)
    paths = []
    for jit in (False, True):
        kernel = kernel_cls(_model, step_size=1e-2, jit_compile=jit)
        kernel.setup_chains(
            0, (x, y), {}, num_chains=1, seed=3, initial_params={"w": torch.zeros(1, 3), "sigma": torch.zeros(1)}
        )
        for _ in range(30):
            kernel.step()
        paths.append(kernel.state.position.clone())
        if jit:
            assert kernel.potential._jitted is not None  # really compiled (otherwise this checks nothing)
    moved = float((paths[0] - torch.tensor([[0.0, 0.0, 0.0, 0.0]])).abs().max())
    assert moved > 1e-2
    assert torch.allclose(paths[1], paths[0], rtol=1e-5, atol=1e-6), (paths[1] - paths[0]).abs().max()


def test_jit_compile_must_be_a_bool_or_auto():
    with pytest.raises(TypeError, match='jit_compile must be True, False or "auto"'):
        SGHMC(_model, jit_compile="yes")


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=generator)
    return x, x @ torch.tensor([1.0, -0.5, 2.0]) + 0.3 * torch.randn(200, generator=generator)


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, SGNHT])
def test_mcmc_compiles_by_default_and_draws_what_the_plain_model_draws(kernel_cls):
    """``pyro.infer.MCMC`` switches Pyro's validation off, so the default ``jit_compile="auto"``
    compiles this deterministic model; its 40 draws follow the uncompiled run's (same seeds, same
    minibatches and noise) to float32 round-off, as in the test above."""
    draws, compiled = [], []
    for jit in ("auto", False):
        pyro.set_rng_seed(5)
        kernel = kernel_cls(_model, step_size=1e-2, jit_compile=jit)
        mcmc = pyro.infer.MCMC(kernel, num_samples=40, warmup_steps=0, disable_progbar=True,
                               initial_params={"w": torch.zeros(3), "sigma": torch.zeros(())})  # fmt: skip
        mcmc.run(*_data())
        draws.append(mcmc.get_samples()["w"])
        compiled.append(kernel.potential.compiled)
    assert compiled == [True, False]
    assert float((draws[1][-1] - draws[1][0]).abs().max()) > 1e-2  # the chain moved
    assert torch.allclose(draws[0], draws[1], rtol=1e-5, atol=1e-6), (draws[0] - draws[1]).abs().max()


def test_python_side_effects_run_once_compiled_and_every_step_with_jit_compile_false():
    """The documented cost of compiling: the model's Python runs during set-up and tracing only. A
    model that counts its calls sees a fixed number of them under ``"auto"`` whatever the run's length,
    and one per step at least with ``jit_compile=False`` (the choice for models with side effects)."""
    calls = []

    def counting(x, y):
        calls.append(1)
        _model(x, y)

    counts = {}
    for jit, steps in (("auto", 20), ("auto", 60), (False, 20)):
        calls.clear()
        kernel = SGHMC(counting, step_size=1e-2, jit_compile=jit)
        pyro.infer.MCMC(kernel, num_samples=steps, warmup_steps=0, disable_progbar=True).run(*_data())
        counts[jit, steps] = len(calls)
    assert counts["auto", 20] == counts["auto", 60] < 20
    assert counts[False, 20] >= 20


def test_a_second_run_of_the_same_kernel_traces_the_model_afresh():
    """Compiled, a model's Python runs only while tracing. A global the model reads, changed between two
    runs of one kernel on the same data (a prior's location, say), must be seen by the second run: each
    set-up drops the previous run's compiled potential (checked: without that, this fails with the second
    mean at 0.1). Prior N(shift, 0.1^2) on w with 200 weak data (sd 30): the data's precision per weight
    (~200/30^2 = 0.2) is 1/500 of the prior's (100), so the posterior mean of w[0] is ``shift`` to 1e-2 and
    its sd 0.1. SGLD at step 0.05 contracts w by 0.05 * 100/200 = 0.025 per step: an autocorrelation time
    of ~80 steps, so 1,800 draws give an ESS of ~20 and a Monte Carlo sd of the mean of ~0.02; the bound
    0.1 is 5 sd. A stale trace would leave the second run at 0, 5 away."""
    settings = {"shift": 0.0}

    def model(x, y):
        w = pyro.sample("w", dist.Normal(settings["shift"], 0.1).expand([3]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=16) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, 30.0), obs=y[idx])

    x, y = _data()
    kernel = SGLD(model, step_size=0.05)
    means = []
    for shift in (0.0, 5.0):  # the same kernel and arguments: set-up reuses its potential
        settings["shift"] = shift
        with pyro.validation_enabled(False):  # as MCMC runs it (which passes detached copies of the data)
            kernel.setup_chains(0, (x, y), {}, num_chains=1, seed=0)
            draws = []
            for step in range(2000):
                kernel.step()
                draws.append(kernel.state.position[0, 0])
        assert kernel.potential.compiled
        means.append(float(torch.stack(draws[200:]).mean()))
    assert abs(means[0]) < 0.1 and abs(means[1] - 5.0) < 0.1, means
