"""``cuda_graph=True``: the sampling step on static tensors, recorded once and replayed (kernels/capture.py).

On the CPU the static-tensor step runs eagerly (``capture.STATIC_STEP_ON_CPU``): what it must do there is give
exactly the draws of the ordinary step, since both are the same pure step on the same state, minibatches and
keyed noise. On a CUDA device (skipped here) the recorded graph is replayed; its draws agree with the eager
step's to float rounding.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_sgmcmc
from pyro_sgmcmc import SGHMC, SGLD, SGNHT
from pyro_sgmcmc.kernels import capture
from pyro_sgmcmc.schedules import RobbinsMonro

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def regression(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, device=x.device), 1.0).to_event(1))
    noise = pyro.sample("noise", dist.HalfNormal(torch.tensor(2.0, device=x.device)))
    with pyro.plate("data", x.shape[0], subsample_size=20) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, noise), obs=y[i])


def noisy_regression(x, y):
    """A model that draws random numbers of its own: its recorded step cannot equal its eager step."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3, device=x.device), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=20) as i:
        jitter = 1e-2 * torch.randn(20, device=x.device)
        pyro.sample("y", dist.Normal(x[i] @ w + jitter, 0.3), obs=y[i])


def data(device="cpu"):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(200, generator=generator)
    return x.to(device), y.to(device)


def run(kernel, num_chains=1, model_data=None):
    mcmc = pyro_sgmcmc.MCMC(
        kernel, num_samples=150, warmup_steps=100, num_chains=num_chains, seed=1, disable_progbar=True,
        chain_method="vectorized" if num_chains > 1 else "sequential",
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(*(model_data or data()))
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, capture.CaptureFallback)]
    return mcmc, fallbacks


@pytest.fixture
def static_step_on_cpu(monkeypatch):
    monkeypatch.setattr(capture, "STATIC_STEP_ON_CPU", True)


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC, SGNHT])
@pytest.mark.parametrize("num_chains", [1, 3])
def test_the_static_step_gives_the_draws_of_the_ordinary_step(static_step_on_cpu, kernel_class, num_chains):
    eager, _ = run(kernel_class(regression), num_chains)
    static, fallbacks = run(kernel_class(regression, cuda_graph=True), num_chains)
    assert fallbacks == []
    assert static.kernel._sampling.captured is not None  # the static step ran, not the eager one
    for name, draws in eager.get_samples().items():
        assert torch.equal(draws, static.get_samples()[name]), name


def test_a_schedule_reaches_the_static_step(static_step_on_cpu):
    """The scheduled step size is copied in at each step: the draws follow the schedule. The static step multiplies
    by the step size as a float32 tensor, the eager one by a Python float: equal to float32 rounding (1e-6
    relative on draws of order 1)."""
    options = dict(step_size=RobbinsMonro(3e-3, 0.55), adapt_step_size=False, adapt_mass_matrix=False)
    eager, _ = run(SGLD(regression, **options))
    static, fallbacks = run(SGLD(regression, cuda_graph=True, **options))
    assert fallbacks == [] and static.kernel._sampling.captured is not None
    for name, draws in eager.get_samples().items():
        torch.testing.assert_close(draws, static.get_samples()[name], rtol=1e-5, atol=1e-5)
        assert not torch.equal(draws[0], draws[-1])  # the chain moved


def test_divergences_of_recorded_steps_are_named_as_without_recording(static_step_on_cpu):
    """A fixed step far past the stable one (the noise sd is tiny at this step, the drift huge): divergences in
    sampling. The recorded step keeps no proposal, so each is named by replaying its window: the same log."""
    options = dict(step_size=0.5, adapt_step_size=False, adapt_mass_matrix=False)
    eager, _ = run(SGLD(regression, **options))
    static, _ = run(SGLD(regression, cuda_graph=True, **options))
    assert static.kernel._sampling.captured is not None
    sampling = [entry for entry in eager.kernel.divergence_log if entry[2] == "sampling"]
    assert len(sampling) > 0
    assert static.kernel.divergence_log == eager.kernel.divergence_log
    assert static.kernel.divergences == eager.kernel.divergences


def test_a_model_with_its_own_randomness_runs_eagerly_and_says_why(static_step_on_cpu):
    pyro.set_rng_seed(0)
    mcmc, fallbacks = run(SGHMC(noisy_regression, cuda_graph=True))
    assert len(fallbacks) == 1 and "differs from the eager one" in fallbacks[0]
    assert mcmc.kernel._sampling.captured is None
    assert mcmc.get_samples()["w"].shape == (150, 3)


def test_without_a_cuda_device_it_warns_and_steps_as_usual():
    eager, _ = run(SGHMC(regression))
    asked, fallbacks = run(SGHMC(regression, cuda_graph=True))
    assert len(fallbacks) == 1 and "needs the chains on a CUDA device" in fallbacks[0]
    for name, draws in eager.get_samples().items():
        assert torch.equal(draws, asked.get_samples()[name])


def test_cuda_graph_must_be_a_bool():
    with pytest.raises((TypeError, ValueError), match="cuda_graph"):
        SGHMC(regression, cuda_graph="yes")


@CUDA
@pytest.mark.parametrize("num_chains", [1, 4])
def test_on_cuda_the_replayed_graph_gives_the_eager_draws(num_chains):
    """The same kernels replayed: the draws agree with the eager step's to float32 rounding accumulated over 150
    steps of a contracting chain (1e-4)."""
    cuda_data = data("cuda")
    eager, _ = run(SGHMC(regression), num_chains, cuda_data)
    replayed, fallbacks = run(SGHMC(regression, cuda_graph=True), num_chains, cuda_data)
    assert fallbacks == []
    assert replayed.kernel._sampling.captured.graph is not None
    for name, draws in eager.get_samples().items():
        torch.testing.assert_close(draws, replayed.get_samples()[name], rtol=1e-4, atol=1e-4)


def test_constants_made_from_host_values_are_made_once_per_value():
    """A recorded step cannot copy from the host: under ``DeviceConstants`` the model's constants (from Python
    numbers, ``new_tensor`` and ``.to(device)`` of a CPU tensor) are made once per value and then reused. The
    ``meta`` device stands in for a GPU here; CPU tensors are never cached (they need no copy)."""
    mode = capture.DeviceConstants()
    with mode:
        first, again, other = (torch.tensor(v, device="meta") for v in (0.3, 0.3, 0.4))
        scale_a = dist.Normal(torch.zeros(3, device="meta"), 1.0, validate_args=False).scale
        scale_b = dist.Normal(torch.zeros(3, device="meta"), 1.0, validate_args=False).scale
        moved, moved_again = (torch.tensor([1.0, 2.0]).to("meta") for _ in range(2))
        made, made_again = (torch.ones(2, device="meta").new_tensor([5, 6]) for _ in range(2))
        on_cpu, on_cpu_again = torch.tensor(2.0), torch.tensor(2.0)
    assert first is again and first is not other
    assert scale_a.data_ptr() == scale_b.data_ptr() or scale_a._base is scale_b._base  # one tensor, expanded
    assert moved is moved_again and made is made_again
    assert on_cpu is not on_cpu_again
    assert torch.tensor(1, device="meta").dtype == torch.long and len(mode.cache) == 5  # 0.3, 0.4, 1.0, [1,2], [5,6]


def test_a_step_that_reads_values_to_the_host_is_named_before_recording():
    """Checked before recording (a failed recording can leave CUDA's state broken): ``.item()`` and ``bool()`` of a
    tensor are named, even where the code catches the error; a step of tensor operations passes."""
    z = torch.ones(3)
    capture.check_no_host_reads(lambda: (z * 2).sum(), on_cpu=True)

    def swallowed():
        try:
            return bool(z.sum() > 0)
        except RuntimeError:
            return None

    for step in (lambda: z.sum().item(), swallowed):
        with pytest.raises(RuntimeError, match="reads values to the host"):
            capture.check_no_host_reads(step, on_cpu=True)


def test_a_staged_schedule_is_not_recorded_and_says_so(static_step_on_cpu):
    """A cyclical schedule switches the noise off in its exploration steps: not one recorded function."""
    from pyro_sgmcmc.schedules import Cyclical

    schedule = Cyclical(num_cycles=2, num_steps=150, peak=1e-3)
    mcmc, fallbacks = run(SGLD(regression, step_size=schedule, adapt_step_size=False, cuda_graph=True))
    assert len(fallbacks) == 1 and "staged schedule" in fallbacks[0]
    assert mcmc.kernel._sampling.captured is None


def test_the_host_read_check_imports_no_dynamo():
    # a plain TorchDispatchMode subclass is wrapped for Dynamo, whose first call imports torch._dynamo (about 1 s
    # of CPU at the first capture of a process); the check is an EagerDispatchMode (pyro_sgmcmc._compat)
    code = (
        "import sys, torch\n"
        "from pyro_sgmcmc.kernels.capture import check_no_host_reads\n"
        "check_no_host_reads(lambda: torch.ones(3).sum() + 1, on_cpu=True)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
