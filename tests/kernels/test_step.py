"""The pure sampling step (``kernels/step.py``) and the kernel's sampling phase (``kernels/sampling.py``).

* the step is pure: its inputs are unchanged, and the divergence rule does on the device what the host-side rule
  of the warmup does (restart: the previous point at rest; freeze: the previous state, once; a jump past the
  threshold);
* one sampling step makes the same number of ATen operator calls for 1, 256 and 4,096 chains, and reads nothing
  back to the host (no ``item``, ``bool``, ``float``, ``int``, ``tolist``, ``nonzero``, ``cpu``);
* the divergence record read every ``FLUSH_EVERY`` steps (replaying the window to name the sites) is the record
  read after every step.
"""

from __future__ import annotations

from collections import Counter

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT, SlowMixingWarning
from pyro_sgmcmc.chains import philox
from pyro_sgmcmc.kernels import sampling
from pyro_sgmcmc.kernels.diffusions import underdamped_step
from pyro_sgmcmc.kernels.state import SGMCMCState
from pyro_sgmcmc.kernels.step import Dynamics, SamplingParameters, sampling_step

DIM, N, BATCH = 50, 1000, 10
HOST_READS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "nonzero", "cpu", "numpy"}


class _AtenCalls(TorchDispatchMode):
    """Counts the ATen operator calls made inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


class _HostReads(TorchFunctionMode):
    """Records the tensor methods that read a value back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def _regression(y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([DIM]).to_event(1))
    with pyro.plate("data", len(y), subsample_size=BATCH) as i:
        pyro.sample("y", dist.Normal(w.sum(), 1.0), obs=y[i])


class _Quadratic:
    """A vectorised estimator of a Gaussian potential on each chain's minibatch (the same operators for any number
    of chains, as the model's vmapped potential has, without its one-chain shortcut)."""

    replayable = True

    def __init__(self, y):
        self.y = y

    def potential_and_grad(self, positions, indices):
        data = self.y[indices["data"]]  # (C, B)
        residual = positions.sum(-1, keepdim=True) - data
        potential = 0.5 * (positions * positions).sum(-1) + 0.5 * N / BATCH * (residual * residual).sum(-1)
        grad = positions + (N / BATCH) * residual.sum(-1, keepdim=True)
        return potential, grad


def _sampling_kernel(kernel_class, num_chains, **options):
    y = torch.randn(N, generator=torch.Generator().manual_seed(0))
    kernel = kernel_class(_regression, step_size=1e-3, adapt_step_size=False, adapt_mass_matrix=False, **options)
    kernel.prepare_chains(0, (y,), num_chains=num_chains, seed=0)
    kernel.minibatches.draw_ahead = 4 * num_chains * 1024  # whole epochs ahead: no block is drawn in the steps counted
    kernel.start_chains()
    kernel.gradient_estimator = _Quadratic(y)
    kernel.state = kernel.state.replace(
        potential=kernel.state.potential.new_zeros(num_chains), grad=torch.zeros_like(kernel.state.position)
    )
    return kernel


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC, SGNHT])
def test_a_sampling_step_makes_the_same_operator_calls_for_any_number_of_chains(kernel_class, monkeypatch):
    """Every sampling step makes the same calls at 1, 256 and 4096 chains. With few chains an int step's noise is
    evaluated for the next steps too (``chains/philox.py``, ``DRAW_AHEAD_BLOCKS``), and those steps copy their
    draw instead (fewer calls, never more: ``tests/chains/test_philox.py``); here that is switched off, so that
    each counted step evaluates its noise as a step at 4096 chains does."""
    monkeypatch.setattr(philox, "DRAW_AHEAD_BLOCKS", 0)
    counts = {}
    for num_chains in (1, 256, 4096):
        kernel = _sampling_kernel(kernel_class, num_chains)
        kernel.step()  # the first sampling step starts the run
        steps = []
        for _ in range(3):
            with _AtenCalls() as counter:
                kernel.step()
            steps.append(counter.calls)
        assert steps[0] == steps[1] == steps[2], num_chains
        counts[num_chains] = steps[0]
    assert counts[1] == counts[256] == counts[4096], {c: sum(v.values()) for c, v in counts.items()}


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC, SGNHT])
@pytest.mark.parametrize("on_divergence", ["restart", "freeze"])
def test_a_sampling_step_reads_nothing_back_to_the_host(kernel_class, on_divergence):
    for num_chains in (1, 4):
        kernel = _sampling_kernel(kernel_class, num_chains, on_divergence=on_divergence)
        kernel.step()
        with _HostReads() as reads:
            for _ in range(sampling.FLUSH_EVERY - 2):  # a window's steps, before its one read
                kernel.step()
        assert reads.reads == [], (num_chains, reads.reads)


def _wall(positions, indices):
    """U = |z|^2 / 2 with an infinite wall at z_0 > 1, and its gradient z."""
    potential = torch.where(positions[:, 0] > 1, float("inf"), 0.5 * (positions * positions).sum(-1))
    return potential, positions.clone()


def _sghmc(state, drift, step_size, noise, drift_scale):
    """SGHMC at T = 0, friction 0.5, mass 1: m' = (1 - 0.5 eps) m + eps * drift_scale * drift, z' = z + eps m'."""
    return (
        *underdamped_step(state.position, state.momentum, drift, step_size, 0.0, 0.5, 1.0, noise, drift_scale),
        None,
    )


def _start(frozen=None):
    """Chain 0 at z = (0.9, 0), m = (4, 0) crosses the wall (m' = 2 - 0.9, z_0' = 2); chain 1 at 0, m = (1, 1)
    goes to z' = m' = (0.5, 0.5)."""
    position = torch.tensor([[0.9, 0.0], [0.0, 0.0]], dtype=torch.float64)
    potential, grad = _wall(position, {})
    momentum = torch.tensor([[4.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    return SGMCMCState(position, momentum, None, potential, grad, 3, frozen)


def test_the_step_is_pure_and_restarts_a_diverging_chain_at_rest():
    state = _start()
    copies = [t.clone() for t in (state.position, state.momentum, state.potential, state.grad)]
    new, info = sampling_step(Dynamics(_sghmc), SamplingParameters(1.0), state, {}, None, _wall)
    for before, after in zip(copies, (state.position, state.momentum, state.potential, state.grad)):
        assert torch.equal(before, after)  # nothing written
    assert info.diverging.tolist() == [True, False] and new.step == 4 and new.frozen is None
    assert new.position.tolist() == [[0.9, 0.0], [0.5, 0.5]]  # chain 0 put back, chain 1 moved
    assert new.momentum.tolist() == [[0.0, 0.0], [0.5, 0.5]]  # put back at rest
    assert new.potential.tolist() == [0.5 * 0.9 * 0.9, 0.25] and torch.equal(new.grad, new.position)


def test_a_frozen_chain_keeps_its_state_and_diverges_once():
    parameters = SamplingParameters(1.0, on_divergence="freeze")
    state, info = sampling_step(Dynamics(_sghmc), parameters, _start(torch.tensor([False, False])), {}, None, _wall)
    assert info.diverging.tolist() == [True, False] and state.frozen.tolist() == [True, False]
    assert state.momentum[0].tolist() == [4.0, 0.0] and state.position[0].tolist() == [0.9, 0.0]
    # chain 0 would cross the wall again (the same move): frozen, it neither moves nor diverges again
    state, info = sampling_step(Dynamics(_sghmc), parameters, state, {}, None, _wall)
    assert info.diverging.tolist() == [False, False] and state.position[0].tolist() == [0.9, 0.0]
    assert state.position[1].tolist() == [0.25, 0.25]  # m' = 0.25 - 0.5, z' = 0.5 - 0.25: chain 1 moves on
    # the same from no mask: the rule makes one
    state, info = sampling_step(Dynamics(_sghmc), parameters, _start(), {}, None, _wall)
    assert state.frozen.tolist() == [True, False]


def test_a_jump_past_the_threshold_puts_the_chain_back():
    state = _start()
    state = state.replace(momentum=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64))  # z_0' = 0.9 - 0.9
    parameters = SamplingParameters(1.0, jump_threshold=torch.tensor([10.0, 0.2], dtype=torch.float64))
    new, info = sampling_step(Dynamics(_sghmc), parameters, state, {}, None, _wall)
    # chain 0's potential falls (0.405 -> 0), chain 1's rises by 0.25 > 0.2: a jump
    assert info.diverging.tolist() == [False, True]
    assert info.potential_change.tolist() == [-0.5 * 0.9 * 0.9, 0.25]
    assert new.position.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_a_diagonal_metric_runs_the_update_in_w_coordinates():
    """z' = z + L (w' - 0), the update from w = 0 with drift L grad (kernels/preconditioning.py)."""
    state = _start().replace(position=torch.tensor([[0.2, 0.1], [0.0, -0.3]], dtype=torch.float64))
    state = state.replace(grad=state.position.clone())
    factor = torch.tensor([[2.0, 0.5], [1.0, 3.0]], dtype=torch.float64)
    new, _ = sampling_step(Dynamics(_sghmc), SamplingParameters(0.1, factor), state, {}, None, _wall)
    momentum = 0.95 * state.momentum - 0.1 * factor * state.grad
    torch.testing.assert_close(new.momentum, momentum, rtol=0, atol=0)
    torch.testing.assert_close(
        new.position, state.position + factor * 0.1 * momentum, rtol=1e-15, atol=0
    )  # one rounding apart at most
    dense = torch.diag_embed(factor)
    again, _ = sampling_step(Dynamics(_sghmc), SamplingParameters(0.1, dense), state, {}, None, _wall)
    torch.testing.assert_close(again.position, new.position, rtol=1e-15, atol=0)  # one rounding apart at most


def _bounded(y):
    w = pyro.sample("w", dist.Normal(5.0, 1.0))
    with pyro.plate("data", len(y), subsample_size=20) as idx:
        pyro.sample("obs", dist.Uniform(w - 10.0, w + 10.0), obs=y[idx])


def _divergent_run(kernel_class, on_divergence, warmup_steps):
    y = 5 + torch.rand(300, generator=torch.Generator().manual_seed(1))
    y[42] = 100.0  # outside the support near the posterior: the minibatches holding it diverge
    kernel = kernel_class(_bounded, step_size=1e-3, on_divergence=on_divergence)
    run = MCMC(kernel, num_samples=60, warmup_steps=warmup_steps, num_chains=3, chain_method="vectorized", seed=0,
               disable_progbar=True)  # fmt: skip
    with pytest.warns(Warning):
        run.run(y)
    return kernel, run


@pytest.mark.parametrize("on_divergence, warmup_steps", [("restart", 30), ("freeze", 0)])
def test_the_record_read_every_few_steps_is_the_record_read_every_step(monkeypatch, on_divergence, warmup_steps):
    """Each chain's minibatches hold the outlier once an epoch (15 steps): several divergences in a window of
    FLUSH_EVERY steps, named by the window's replay, as they are when the masks are read after every step."""
    kernel, run = _divergent_run(SGHMC, on_divergence, warmup_steps)
    monkeypatch.setattr(sampling, "FLUSH_EVERY", 1)
    every_step, again = _divergent_run(SGHMC, on_divergence, warmup_steps)
    sampled = [entry for entry in kernel.divergence_log if entry[2] == "sampling"]
    assert len(sampled) >= 2 and len({entry[1] for entry in sampled}) >= 2  # divergences at several steps
    assert kernel.divergence_log == every_step.divergence_log
    assert kernel.divergences == every_step.divergences
    for name in ("diverging", "num_divergences"):
        assert torch.equal(run.sample_stats[name], again.sample_stats[name]), name
    assert torch.equal(run.get_samples()["w"], again.get_samples()["w"])
    for chain in range(3):
        assert run.sample_stats["diverging"][chain].nonzero().flatten().tolist() == kernel.divergences[chain]


def test_one_chain_keeps_its_adapted_step_size_a_tensor():
    kernel = SGLD(_bounded, step_size=1e-3)
    y = 5 + torch.rand(300, generator=torch.Generator().manual_seed(1))
    kernel.setup_chains(40, (y,), num_chains=1, seed=0)
    with pytest.warns(SlowMixingWarning):  # so short a warmup
        for _ in range(41):
            kernel.step()
    parameters = kernel.warmup.sampling_parameters()
    assert torch.is_tensor(parameters.step_size) and parameters.step_size.shape == (1, 1)
    assert float(parameters.step_size) == kernel.warmup.chain_step_size  # the number the driver froze
    returned = kernel.step()
    assert returned is kernel.state and returned.step == 42  # the kernel holds the state it returns
