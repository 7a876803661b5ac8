"""float32 and float64, CPU (and CUDA when present): every tensor follows the model's data.

For all three kernels, under ``pyro.infer.MCMC`` and under ``pyro_sgmcmc.MCMC(chain_method="vectorized")``:

* the draws have the dtype and device of the model's data and prior tensors, whatever the default
  dtype is;
* the state (positions, momenta, thermostats, potential energies, gradients), the injected noise,
  the random generators, the minibatch streams' keys and positions and the minibatch indices live
  on the data's device, in the data's dtype (keys, positions and indices: ``torch.long``);
* to_inference_data and checkpoint/resume keep float64 runs in float64.

The CUDA variants run only where CUDA is available; on the CPU the same checks compare devices and
dtypes of every tensor the kernel keeps. Statistics that could overflow the data's dtype
(``kinetic_energy``, ``step_size``, ``temperature``) are kept in float64 on the data's device.
"""

from __future__ import annotations

import inspect
import re
import signal

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC as PyroMCMC
from torch.distributions import constraints

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT, DivergenceWarning, ModelPotential, to_inference_data
from pyro_sgmcmc.chains.minibatch import MinibatchSampler, draw
from pyro_sgmcmc.chains.permutation import KeyedPermutation, epoch_keys
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.kernels import diffusions
from pyro_sgmcmc.kernels.base import SGMCMCKernel

TIME_LIMIT = 60

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
DTYPES = [torch.float32, torch.float64]
KERNELS = {
    "SGLD": lambda model, **kw: SGLD(model, step_size=1e-3, **kw),
    "SGHMC": lambda model, **kw: SGHMC(model, step_size=1e-3, init_momentum="stationary", **kw),
    "SGNHT": lambda model, **kw: SGNHT(model, step_size=1e-3, init_momentum="stationary", **kw),
}


@pytest.fixture(autouse=True)
def _time_limit():
    def on_alarm(signum, frame):
        raise TimeoutError(f"the test ran for more than {TIME_LIMIT} s (a hang?)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIME_LIMIT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------- model, data and runs
def make_data(dtype, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 2, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -1.0], dtype=torch.float64) + 0.5 * torch.randn(20, generator=g, dtype=torch.float64)
    return x.to(dtype=dtype, device=device), y.to(dtype=dtype, device=device)


def make_model(dtype, device):
    """Prior tensors and data in ``dtype`` on ``device``; a positive site to exercise a transform."""

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=dtype, device=device), 1.0).to_event(1))
        s = pyro.sample("s", dist.LogNormal(torch.tensor(0.0, dtype=dtype, device=device), 1.0))
        with pyro.plate("data", x.shape[0], subsample_size=5) as idx:
            pyro.sample("obs", dist.Normal(x[idx] @ w, s), obs=y[idx])

    return model


def run(runner, kernel, x, y, **kwargs):
    if runner == "pyro":
        mcmc = PyroMCMC(kernel, num_samples=4, warmup_steps=3, disable_progbar=True, **kwargs)
    else:
        mcmc = MCMC(
            kernel,
            num_samples=4,
            warmup_steps=3,
            num_chains=3,
            chain_method="vectorized",
            seed=0,
            disable_progbar=True,
            **kwargs,
        )
    mcmc.run(x, y)
    return mcmc


def without_crash(call):
    """Run ``call``; an exception is a failed expectation (an AssertionError), not a crash of the test."""
    try:
        return call()
    except Exception as error:
        raise AssertionError(f"{type(error).__name__}: {error}") from error


@pytest.fixture
def recorder(monkeypatch):
    """Record every noise draw and every minibatch the kernels ask for."""
    record = {"noise": [], "indices": []}
    fill_normal, next_indices = ChainGenerators.fill_normal, MinibatchSampler.next

    def recording_fill_normal(self, out, **options):  # every draw (ChainGenerators.normal fills through it too)
        out = fill_normal(self, out, **options)
        record["noise"].append(out.clone())  # the kernel's noise buffer is refilled at the next step
        return out

    def recording_next(self):
        out = next_indices(self)
        record["indices"].append(out)
        return out

    monkeypatch.setattr(ChainGenerators, "fill_normal", recording_fill_normal)
    monkeypatch.setattr(MinibatchSampler, "next", recording_next)
    return record


def _same_device(tensor, device) -> bool:
    return tensor.device.type == torch.device(device).type


# ---------------------------------------------------------------------- the main check
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel_name", KERNELS)
@pytest.mark.parametrize("runner", ["pyro", "vectorized"])
def test_draws_state_noise_and_minibatches_follow_the_data(runner, kernel_name, dtype, device, recorder):
    x, y = make_data(dtype, device)
    kernel = KERNELS[kernel_name](make_model(dtype, device))
    mcmc = run(runner, kernel, x, y)

    num_chains = 1 if runner == "pyro" else 3
    for name, draws in mcmc.get_samples(group_by_chain=True).items():
        assert draws.dtype == dtype and _same_device(draws, device), name
        assert draws.shape[:2] == (num_chains, 4) and torch.isfinite(draws).all(), name

    potential = kernel.potential
    assert potential.dtype == dtype and _same_device(torch.empty(0, device=potential.device), device)
    state = kernel.state
    for field in ("position", "momentum", "thermostat", "potential", "grad"):
        value = getattr(state, field)
        if value is None:
            assert (field, kernel_name) in {("momentum", "SGLD"), ("thermostat", "SGLD"), ("thermostat", "SGHMC")}
            continue
        assert value.dtype == dtype and _same_device(value, device), field
    assert state.position.shape == (num_chains, 3)

    # noise: drawn every step (T = 1), plus the stationary initial momentum for SGHMC/SGNHT
    assert len(recorder["noise"]) >= 7
    for noise in recorder["noise"]:
        assert noise.dtype == dtype and _same_device(noise, device) and noise.shape[0] == num_chains
    # minibatches: one per model evaluation, on the data's device
    assert len(recorder["indices"]) >= 8
    for indices in recorder["indices"]:
        assert list(indices) == ["data"]
        batch = indices["data"]
        assert batch.dtype == torch.long and _same_device(batch, device) and batch.shape == (num_chains, 5)
        assert int(batch.min()) >= 0 and int(batch.max()) < 20
    assert _same_device(torch.empty(0, device=kernel.generators.device), device)
    assert _same_device(kernel.generators.normal((1,), torch.float32, step=0), device)  # keys on the device
    # the minibatch streams' state (keyed permutations: per chain, the keys of the current epoch and the position
    # in the permutation's domain) is integer, on the chains' device
    minibatches = kernel.minibatches
    for name, keys in minibatches.keys.items():
        position = minibatches.positions[name]
        assert keys.dtype == torch.long and _same_device(keys, device) and keys.shape[0] == num_chains, name
        assert position.dtype == torch.long and _same_device(position, device) and position.shape == (num_chains,)

    # the floating statistics that are functions of the state have the state's dtype, except those kept
    # in float64 so that they stay finite whenever the state is (kinetic energy, step size, temperature)
    stats = kernel.last_stats
    for name in ("lp", "thermostat"):
        if name in stats:
            assert stats[name].dtype == dtype, name
    for name in ("kinetic_energy", "step_size", "temperature"):
        if name in stats:
            assert stats[name].dtype == torch.float64 and _same_device(stats[name], device), name


# ---------------------------------------------------------------------- default dtype vs data dtype
@pytest.mark.parametrize("kernel_name", KERNELS)
@pytest.mark.parametrize("runner", ["pyro", "vectorized"])
def test_float32_model_under_a_float64_default(float64, runner, kernel_name, recorder):
    """The default dtype is float64; the model's tensors are float32: the chains run in float32."""
    x, y = make_data(torch.float32, "cpu")
    kernel = KERNELS[kernel_name](make_model(torch.float32, "cpu"))
    mcmc = run(runner, kernel, x, y)
    for name, draws in mcmc.get_samples().items():
        assert draws.dtype == torch.float32, name
    for field in ("position", "momentum", "thermostat", "grad"):
        value = getattr(kernel.state, field)
        assert value is None or value.dtype == torch.float32, field
    assert all(noise.dtype == torch.float32 for noise in recorder["noise"])


@pytest.mark.parametrize("runner", ["pyro", "vectorized"])
def test_potential_energy_has_the_model_dtype_under_a_float64_default(float64, runner):
    x, y = make_data(torch.float32, "cpu")
    kernel = SGLD(make_model(torch.float32, "cpu"), step_size=1e-3)
    mcmc = run(runner, kernel, x, y)
    assert kernel.state.potential.dtype == torch.float32
    if runner == "vectorized":
        assert mcmc.sample_stats["lp"].dtype == torch.float32


@pytest.mark.parametrize(
    "default,model_dtype",
    [
        (torch.float32, torch.float32),
        pytest.param(
            torch.float32,
            torch.float64,
        ),
        (torch.float64, torch.float32),
        (torch.float64, torch.float64),
    ],
    ids=["default32-model32", "default32-model64", "default64-model32", "default64-model64"],
)
def test_hyperparameter_statistics_are_not_narrower_than_the_model(default, model_dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        x, y = make_data(model_dtype, "cpu")
        mcmc = run("vectorized", SGHMC(make_model(model_dtype, "cpu"), step_size=1e-3), x, y)
    finally:
        torch.set_default_dtype(previous)
    for name in ("step_size", "temperature"):
        stat = mcmc.sample_stats[name]
        assert torch.finfo(stat.dtype).bits >= torch.finfo(model_dtype).bits, (name, stat.dtype)


# ---------------------------------------------------------------------- init strategies and odd sites
def _improper_model(x, y):
    """A float64 model with an ImproperUniform site (initialised by the package at zeros)."""
    a = pyro.sample("a", dist.ImproperUniform(constraints.real, (), ()))
    w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=torch.float64), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=5) as idx:
        pyro.sample("obs", dist.Normal(x[idx] @ w + a, 1.0), obs=y[idx])


def test_improper_uniform_site_in_a_float64_model_runs_in_float64():
    x, y = make_data(torch.float64, "cpu")
    mcmc = run("vectorized", SGLD(_improper_model, step_size=1e-3), x, y)
    assert all(draws.dtype == torch.float64 for draws in mcmc.get_samples().values())


def test_improper_uniform_site_with_initial_params_keeps_float64():
    x, y = make_data(torch.float64, "cpu")
    kernel = SGLD(_improper_model, step_size=1e-3)
    params = {"a": torch.zeros(3, dtype=torch.float64), "w": torch.zeros(3, 2, dtype=torch.float64)}
    mcmc = without_crash(lambda: run("vectorized", kernel, x, y, initial_params=params))
    assert kernel.potential.dtype == torch.float64
    assert all(draws.dtype == torch.float64 for draws in mcmc.get_samples().values())


def test_initial_params_are_cast_to_the_model_dtype():
    x, y = make_data(torch.float64, "cpu")
    params = {"s": torch.zeros(3), "w": torch.zeros(3, 2)}  # float32 values, float64 model
    mcmc = run("vectorized", SGHMC(make_model(torch.float64, "cpu"), step_size=1e-3), x, y, initial_params=params)
    assert all(draws.dtype == torch.float64 for draws in mcmc.get_samples().values())


# ---------------------------------------------------------------------- downstream of a float64 run
def test_float64_run_to_inference_data():
    x, y = make_data(torch.float64, "cpu")
    mcmc = run("vectorized", SGNHT(make_model(torch.float64, "cpu"), step_size=1e-3), x, y)
    idata = to_inference_data(mcmc, log_likelihood=True, posterior_predictive=True)
    assert idata.posterior["w"].dtype == "float64" and idata.posterior["w"].shape == (3, 4, 2)
    assert idata.log_likelihood["obs"].shape == (3, 4, 20)
    assert idata.posterior_predictive["obs"].shape == (3, 4, 20)
    assert bool(idata.log_likelihood["obs"].notnull().all())


def test_float64_checkpoint_resume_is_bit_identical(tmp_path):
    x, y = make_data(torch.float64, "cpu")

    def go(path=None, hook=None):
        pyro.set_rng_seed(0)
        kernel = SGHMC(make_model(torch.float64, "cpu"), step_size=1e-3, init_momentum="stationary")
        mcmc = MCMC(
            kernel,
            4,
            3,
            num_chains=3,
            chain_method="vectorized",
            seed=1,
            checkpoint_path=path,
            checkpoint_every=None if path is None else 2,
            hook_fn=hook,
            disable_progbar=True,
        )
        mcmc.run(x, y)
        return mcmc

    class Stop(Exception):
        pass

    def stop(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn); state.step is the run's
        if kernel.state.step - 1 == 4:
            raise Stop

    reference = go()
    with pytest.raises(Stop):
        go(tmp_path / "run.ckpt", stop)
    resumed = go(tmp_path / "run.ckpt")
    assert resumed.kernel.state.position.dtype == torch.float64
    assert resumed.kernel.state.momentum.dtype == torch.float64
    for name, draws in reference.get_samples(group_by_chain=True).items():
        assert draws.dtype == torch.float64 and torch.equal(draws, resumed.get_samples(group_by_chain=True)[name])
    for name, stat in reference.sample_stats.items():
        assert torch.equal(stat, resumed.sample_stats[name]), name


# ---------------------------------------------------------------------- devices
def _kernel_tensors(kernel: SGMCMCKernel):
    """Every tensor a set-up kernel keeps per chain."""
    found = {f"state.{k}": v for k, v in kernel.state._asdict().items() if isinstance(v, torch.Tensor)}
    for name in ("_num_warmup_divergences", "_num_divergences", "_last_diverging", "_frozen"):
        value = getattr(kernel, name, None)
        if isinstance(value, torch.Tensor):
            found[name] = value
    found.update({f"minibatches.keys.{k}": v for k, v in kernel.minibatches.keys.items()})
    found.update({f"minibatches.positions.{k}": v for k, v in kernel.minibatches.positions.items()})
    found.update({f"last_stats.{k}": v for k, v in kernel.last_stats.items()})
    return found


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[CUDA],
        ),
    ],
)
@pytest.mark.parametrize("policy", ["restart", "freeze"])
def test_every_kernel_tensor_lives_on_the_data_device_through_divergences(device, policy):
    x, y = make_data(torch.float32, device)
    # a fixed step of 1e6 diverges at once (adapted, the step would be a stable one)
    model = make_model(torch.float32, device)
    kernel = SGHMC(model, step_size=1e6, on_divergence=policy, adapt_step_size=False, adapt_mass_matrix=False)
    with pytest.warns(DivergenceWarning):
        run("vectorized", kernel, x, y)
    assert kernel.num_divergences > 0
    for name, tensor in _kernel_tensors(kernel).items():
        assert _same_device(tensor, device), name


@CUDA
def test_cuda_resume(tmp_path):
    x, y = make_data(torch.float32, "cuda")

    def go(hook=None):
        pyro.set_rng_seed(0)
        mcmc = MCMC(
            SGLD(make_model(torch.float32, "cuda"), step_size=1e-3),
            4,
            3,
            num_chains=2,
            chain_method="vectorized",
            seed=0,
            checkpoint_path=tmp_path / "run.ckpt",
            checkpoint_every=2,
            hook_fn=hook,
            disable_progbar=True,
        )
        mcmc.run(x, y)
        return mcmc

    def stop(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn); state.step is the run's
        if kernel.state.step - 1 == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        go(stop)
    resumed = go()
    for tensor in _kernel_tensors(resumed.kernel).values():
        assert tensor.is_cuda


HOT_PATH = [
    SGMCMCKernel.step,
    ModelPotential.log_density,
    ModelPotential.potential_and_grad,
    ModelPotential.batched_potential_and_grad,
    ChainGenerators.normal,
    MinibatchSampler.next,
    draw,  # the minibatch indices: keyed permutations evaluated on the chains' device
    KeyedPermutation.__call__,
    epoch_keys,
    diffusions.langevin_step,
    diffusions.underdamped_step,
    diffusions.nose_hoover_step,
]


@pytest.mark.parametrize("function", HOT_PATH, ids=lambda f: f.__qualname__)
def test_hot_path_has_no_host_round_trips(function):
    """No ``.cpu()``, ``.numpy()``, ``.tolist()`` or hard-coded CPU device in the per-step code."""
    source = inspect.getsource(function)
    code = "\n".join(line.split("#")[0] for line in source.splitlines() if not line.strip().startswith(('"', "'")))
    for pattern in (r"\.cpu\(\)", r"\.numpy\(\)", r"\.tolist\(\)", r"device\(\s*['\"]cpu", r"device\s*=\s*['\"]cpu"):
        assert not re.search(pattern, code), (function.__qualname__, pattern)
