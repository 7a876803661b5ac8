"""Benchmark: 256 vectorised SGHMC chains on a Bayesian MLP against a hand-written batched loop.

The requirement measured here: ``pyro_sgmcmc.MCMC(..., chain_method="vectorized")`` running 256
chains of SGHMC on a small Bayesian neural network written as an ordinary Pyro model must

* take at most 1.5x the time per step of a hand-written batched PyTorch loop that does the same
  maths for all chains at once, and
* be at least 10x faster than running the 256 chains one after the other with the same kernel.

Model: scikit-learn's ``load_digits`` (N = 1797 images, 64 pixels scaled to [0, 1], 10 classes), a
64 -> 40 (tanh) -> 10 MLP with N(0, 1) priors on all 3,010 weights and biases, minibatches of
B = 128 through ``pyro.plate("data", N, subsample_size=128)``.

Three ways to run the same 256 chains (same start, same step size, friction, temperature):

``ours``
    ``pyro_sgmcmc.MCMC(SGHMC(model), num_chains=256, chain_method="vectorized", keep_last=1)``:
    the Pyro model runs once per step under ``torch.func.vmap``.
``hand``
    :class:`HandBatchedSGHMC`: plain PyTorch. Per-chain minibatch gather ``x[idx]`` with ``idx``
    of shape ``(256, 128)``, ``torch.bmm`` for both layers, log prior + N/B-scaled log-likelihood,
    one ``autograd.grad`` for all chains, the SGHMC update, per-chain noise and per-chain epoch
    permutations from one ``torch.Generator`` per chain seeded exactly as the package seeds its
    chains. It reproduces our trajectories to float round-off (checked at the start of the run),
    so both sides really do the same work.
``one-by-one``
    The same kernel, one chain at a time: (a) ``pyro.infer.MCMC(SGHMC(model), num_chains=1)``
    per chain and (b) the leaner ``kernel.setup_chains(num_chains=1)`` + ``kernel.step()`` (Pyro's
    validation off, as ``MCMC`` has it), both with the default ``jit_compile="auto"``, which compiles
    the one-chain potential; and (c) ``pyro.infer.MCMC`` with ``SGHMC(model, jit_compile=False)``, the
    model's Python run at every step (the default before compilation became automatic).
    Running 256 chains x all steps this way would take minutes, so a few chains are timed for
    fewer steps and the per-step cost is multiplied by 256 (an extrapolation: reported as such).

Timing. Per-step times come from time stamps taken after every step (through ``hook_fn`` for the
MCMC runs), so set-up (tracing the model, checking 256 starting points) is excluded and reported
apart; the first 5 steps of every run are not timed. Every stamp holds the wall clock and the CPU
time of the process: on a shared machine the CPU time (at one thread) is the better estimate of the
idle wall time. The ``ours`` and ``hand`` runs are interleaved (alternating which goes first) and
repeated; a run's cost is its median step and the reported cost is the best over repeats; the
ratio is also given per adjacent pair of runs (median over pairs), which cancels slow drifts in
the background load. Everything is done for each ``--threads`` value (``torch.set_num_threads``).

Profiling (on by default, ``--no-profile`` to skip), at the first ``--threads`` value: CPU time of
the pieces of one step (noise, SGHMC update, minibatch indices, Pyro model + vmap + autograd,
divergence check, the prior and the likelihood the Pyro way and the plain way, the fixed cost at
2 chains) next to the matching pieces of the hand loop and of a vmap-without-Pyro variant;
cProfile totals by library and cumulative times of the functions in question; the top operators
under ``torch.profiler`` for both sides.

PROTOTYPES (on by default, ``--no-prototypes`` to skip) are *not* package code: they show what a
change to ``pyro_sgmcmc/`` would buy, by timing the package's step with pieces swapped
(:class:`PrototypeStep`): ``cheap-finite`` (``isfinite(U + grad.sum(-1))`` instead of
``isfinite(U) & isfinite(grad).all(-1)``), ``fused-update`` (the SGHMC update with in-place ops
on a new momentum tensor), ``split-unpack`` (``position.split`` in ``log_density`` instead of one
slice per site) and all three; each must reproduce the package's trajectory.

Run it::

    python benchmarks/vectorized_chains.py                    # 4-12 minutes on 2 cores, by load
    python benchmarks/vectorized_chains.py --tiny             # seconds, smoke test only
    python benchmarks/vectorized_chains.py --threads 1 --repeats 7 --steps 100 --no-profile --no-prototypes

The results, the machine and the reading are in ``docs/benchmarks_vectorized.rst``.

Results: a table on stdout and JSON in ``--out`` (default
``benchmarks/results/vectorized_chains.json``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import platform
import pstats
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pyro
import pyro.distributions as dist
import pyro.infer
import torch

from pyro_sgmcmc import MCMC, SGHMC, retain_freed_cpu_memory
from pyro_sgmcmc.chains.streams import chain_seed
from pyro_sgmcmc.kernels.diffusions import underdamped_step
from pyro_sgmcmc.model.potential import JitMode

HIDDEN = 40
BATCH = 128
PRIOR_SCALE = 1.0
STEP_SIZE = 0.05
FRICTION = 1.0
MASS = 1.0
TEMPERATURE = 1.0
SKIP = 5  # first steps of every run not timed (allocator and dispatch warm-up)


# ---------------------------------------------------------------------------------------- data
def load_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return x, y


# ---------------------------------------------------------------------------------- Pyro model
def bnn_model(x, y):
    """64 -> 40 (tanh) -> 10 Bayesian MLP, N(0, 1) priors; the minibatch pattern of the requirement."""
    num_data, num_inputs = x.shape
    num_classes = 10
    W1 = pyro.sample("W1", dist.Normal(0.0, PRIOR_SCALE).expand([num_inputs, HIDDEN]).to_event(2))
    b1 = pyro.sample("b1", dist.Normal(0.0, PRIOR_SCALE).expand([HIDDEN]).to_event(1))
    W2 = pyro.sample("W2", dist.Normal(0.0, PRIOR_SCALE).expand([HIDDEN, num_classes]).to_event(2))
    b2 = pyro.sample("b2", dist.Normal(0.0, PRIOR_SCALE).expand([num_classes]).to_event(1))
    plate = pyro.plate("data", num_data, subsample_size=BATCH)
    idx = plate.indices
    logits = torch.tanh(x[idx] @ W1 + b1) @ W2 + b2
    with plate:
        pyro.sample("y", dist.Categorical(logits=logits), obs=y[idx])


# Flat layout shared by both sides: the package orders sites by name (W1, W2, b1, b2).
def layout(num_inputs: int, num_classes: int = 10):
    shapes = {"W1": (num_inputs, HIDDEN), "W2": (HIDDEN, num_classes), "b1": (HIDDEN,), "b2": (num_classes,)}
    offsets, offset = {}, 0
    for name, shape in shapes.items():
        numel = math.prod(shape)
        offsets[name] = (offset, numel, shape)
        offset += numel
    return offsets, offset


# ------------------------------------------------------------------------- hand-written baseline
class HandBatchedSGHMC:
    """All chains at once in plain PyTorch: the baseline the vectorised path is measured against.

    Same random streams as the package (one ``torch.Generator`` per chain, seeded with
    ``chain_seed(seed, c)``; per-chain epoch permutations, reshuffled when fewer than ``B`` indices
    remain; noise drawn row by row), same step order (noise, move with the cached gradient, new
    minibatch, new gradient), same SGHMC update.
    """

    def __init__(self, x, y, initial_position: torch.Tensor, seed: int, step_size: float = STEP_SIZE):
        self.x, self.y = x, y
        self.num_data, num_inputs = x.shape
        self.offsets, self.dim = layout(num_inputs)
        self.num_chains = initial_position.shape[0]
        self.step_size = step_size
        self.generators = [torch.Generator().manual_seed(chain_seed(seed, c)) for c in range(self.num_chains)]
        self.permutation = torch.empty((self.num_chains, self.num_data), dtype=torch.long)
        self.cursor = self.num_data
        self.position = initial_position.clone()
        self.momentum = torch.zeros_like(self.position)
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())

    def next_indices(self) -> torch.Tensor:
        if self.cursor + BATCH > self.num_data:
            for row, generator in zip(self.permutation, self.generators):
                row.copy_(torch.randperm(self.num_data, generator=generator))
            self.cursor = 0
        idx = self.permutation[:, self.cursor : self.cursor + BATCH]
        self.cursor += BATCH
        return idx

    def unpack(self, z: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {name: z[:, o : o + n].reshape((z.shape[0],) + shape) for name, (o, n, shape) in self.offsets.items()}

    def energy(self, z: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """U(z) = -(log prior + N/B * minibatch log-likelihood), shape (num_chains,)."""
        p = self.unpack(z)
        xb = self.x[idx]  # (K, B, 64): each chain its own rows
        hidden = torch.tanh(torch.bmm(xb, p["W1"]) + p["b1"].unsqueeze(1))
        logits = torch.bmm(hidden, p["W2"]) + p["b2"].unsqueeze(1)
        # gather - logsumexp: on this CPU 4x faster than torch.log_softmax over 10 classes
        log_lik = (logits.gather(-1, self.y[idx].unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)).sum(-1)
        log_prior = (-0.5 / PRIOR_SCALE**2) * (z * z).sum(-1) - self.dim * (
            math.log(PRIOR_SCALE) + 0.5 * math.log(2 * math.pi)
        )
        return -(log_prior + (self.num_data / BATCH) * log_lik)

    def potential_and_grad(self, z: torch.Tensor, idx: torch.Tensor):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            energy = self.energy(z, idx)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        return energy.detach(), grad

    def noise(self) -> torch.Tensor:
        out = torch.empty((self.num_chains, self.dim))
        for row, generator in zip(out, self.generators):
            row.normal_(generator=generator)
        return out

    def step(self) -> None:
        eps, n = self.step_size, self.num_data
        noise = self.noise()
        self.momentum = (
            (1.0 - eps * FRICTION / MASS) * self.momentum
            - (eps / n) * self.grad
            + math.sqrt(2.0 * eps * TEMPERATURE / n * FRICTION) * noise
        )
        self.position = self.position + (eps / MASS) * self.momentum
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())


# ---------------------------------------------------------------------------------------- runs
def now() -> Tuple[float, float]:
    """(wall clock, CPU time of this process), in seconds."""
    return time.perf_counter(), time.process_time()


def initial_positions(num_chains: int, dim: int, seed: int) -> torch.Tensor:
    """Dispersed starts: N(0, 0.1^2) per weight (the same for every side)."""
    generator = torch.Generator().manual_seed(seed)
    return 0.1 * torch.randn(num_chains, dim, generator=generator)


def as_params(position: torch.Tensor, num_inputs: int) -> Dict[str, torch.Tensor]:
    offsets, _ = layout(num_inputs)
    lead = position.shape[:-1]
    return {name: position[..., o : o + n].reshape(lead + shape) for name, (o, n, shape) in offsets.items()}


def step_summary(stamps: List[Tuple[float, float]], start: Tuple[float, float], skip: int = SKIP) -> dict:
    """Median wall and CPU ms per step from per-step stamps (the first ``skip`` steps dropped)."""
    wall = [b[0] - a[0] for a, b in zip(stamps[:-1], stamps[1:])]
    cpu = [b[1] - a[1] for a, b in zip(stamps[:-1], stamps[1:])]
    if len(wall) > skip + 2:
        wall, cpu = wall[skip:], cpu[skip:]
    median_wall = statistics.median(wall)
    return {
        "median_ms": 1e3 * median_wall,
        "mean_ms": 1e3 * statistics.fmean(wall),
        "cpu_median_ms": 1e3 * statistics.median(cpu),
        # set-up: from the start to the first stamp, minus the first step itself
        "setup_s": stamps[0][0] - start[0] - median_wall,
        "total_s": stamps[-1][0] - start[0],
    }


def make_kernel(jit_compile: JitMode = "auto") -> SGHMC:
    return SGHMC(  # the hand loop's maths: a fixed step, no mass matrix, plain minibatches
        bnn_model, step_size=STEP_SIZE, friction=FRICTION, mass=MASS, temperature=TEMPERATURE, jit_compile=jit_compile,
        adapt_step_size=False, adapt_mass_matrix=False, control_variate=None,
    )  # fmt: skip


def run_ours(x, y, init: torch.Tensor, num_steps: int, seed: int) -> dict:
    stamps: List[Tuple[float, float]] = []

    def hook(kernel, params, stage, i):
        stamps.append(now())

    kernel = make_kernel()
    mcmc = MCMC(
        kernel,
        num_samples=num_steps,
        warmup_steps=0,
        initial_params=as_params(init, x.shape[1]),
        num_chains=init.shape[0],
        chain_method="vectorized",
        keep_last=1,
        seed=seed,
        hook_fn=hook,
        disable_progbar=True,
    )
    start = now()
    mcmc.run(x, y)
    out = step_summary(stamps, start)
    out["divergences"] = kernel.num_divergences
    out["final_mean_lp"] = float(mcmc.sample_stats["lp"][:, -1].mean())
    return out


def run_hand(x, y, init: torch.Tensor, num_steps: int, seed: int) -> dict:
    start = now()
    hand = HandBatchedSGHMC(x, y, init, seed)
    stamps = [now()]
    for _ in range(num_steps):
        hand.step()
        stamps.append(now())
    out = step_summary(stamps[1:], start)
    out["setup_s"] = stamps[0][0] - start[0]
    out["final_mean_lp"] = float(-hand.potential.mean())
    return out


def run_one_by_one_pyro(x, y, init: torch.Tensor, num_chains: int, num_steps: int, jit: JitMode = "auto") -> dict:
    """``pyro.infer.MCMC(SGHMC(model, jit_compile=jit), num_chains=1)``, one run per chain."""
    runs = []
    for c in range(num_chains):
        stamps: List[Tuple[float, float]] = []

        def hook(kernel, params, stage, i):
            stamps.append(now())

        mcmc = pyro.infer.MCMC(
            make_kernel(jit),
            num_samples=num_steps,
            warmup_steps=0,
            initial_params=as_params(init[c], x.shape[1]),
            num_chains=1,
            hook_fn=hook,
            disable_progbar=True,
        )
        start = now()
        mcmc.run(x, y)
        runs.append(step_summary(stamps, start))
    return _one_by_one(runs, num_chains, num_steps)


def run_one_by_one_kernel(x, y, init: torch.Tensor, num_chains: int, num_steps: int, seed: int) -> dict:
    """``kernel.setup_chains(num_chains=1)`` + ``kernel.step()``: the lean one-chain path."""
    runs = []
    kernel = make_kernel()
    for c in range(num_chains):
        start = now()
        params = as_params(init[c : c + 1], x.shape[1])
        with pyro.validation_enabled(False):  # as MCMC runs it
            kernel.setup_chains(0, (x, y), {}, num_chains=1, initial_params=params, seed=seed, chain_ids=[c])
            stamps = [now()]
            for _ in range(num_steps):
                kernel.step()
                stamps.append(now())
        runs.append(step_summary(stamps, start))
        runs[-1]["setup_s"] = stamps[0][0] - start[0]
    return _one_by_one(runs, num_chains, num_steps)


def _one_by_one(runs: List[dict], num_chains: int, num_steps: int) -> dict:
    return {
        "chains_timed": num_chains,
        "steps_timed": num_steps,
        "per_chain_step_ms": statistics.median(r["median_ms"] for r in runs),
        "per_chain_step_cpu_ms": statistics.median(r["cpu_median_ms"] for r in runs),
        "setup_per_chain_s": statistics.median(r["setup_s"] for r in runs),
    }


# ------------------------------------------------------------------------- same-maths check
def check_same_maths(x, y, init: torch.Tensor, seed: int, num_steps: int = 3) -> dict:
    """Run both sides from the same start and seed; their states must agree to round-off."""
    kernel = make_kernel()
    kernel.setup_chains(0, (x, y), {}, num_chains=init.shape[0], initial_params=as_params(init, x.shape[1]), seed=seed)
    hand = HandBatchedSGHMC(x, y, init, seed)
    out = {"potential_rel_diff_at_start": _rel(kernel.state.potential, hand.potential)}
    out["grad_rel_diff_at_start"] = _rel(kernel.state.grad, hand.grad)
    for _ in range(num_steps):
        kernel.step()
        hand.step()
    out[f"position_max_abs_diff_after_{num_steps}_steps"] = float((kernel.state.position - hand.position).abs().max())
    out[f"momentum_rel_diff_after_{num_steps}_steps"] = _rel(kernel.state.momentum, hand.momentum)
    out["ok"] = out["grad_rel_diff_at_start"] < 1e-4 and out[f"momentum_rel_diff_after_{num_steps}_steps"] < 1e-3
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# -------------------------------------------------------------------------------- profiling
def best_ms(fn: Callable, number: int, repeat: int, clock: Callable[[], float] = time.process_time) -> float:
    """Best over ``repeat`` blocks of the mean time of ``number`` calls, in ms (CPU time by default:
    at one thread it equals the wall time on an idle machine and is barely touched by other jobs)."""
    best = math.inf
    for _ in range(repeat):
        start = clock()
        for _ in range(number):
            fn()
        best = min(best, (clock() - start) / number)
    return 1e3 * best


def interleaved_best_ms(fns: Dict[str, Callable], number: int, repeat: int) -> Dict[str, float]:
    """``best_ms`` for several functions, block by block in turn, so background load hits them alike."""
    best = {name: math.inf for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            best[name] = min(best[name], best_ms(fn, number, 1))
    return best


def plain_vmap_potential(x, y, num_inputs: int):
    """vmap(grad(one chain's U)) in plain torch: the vectorised path without Pyro's trace machinery."""
    offsets, dim = layout(num_inputs)
    num_data = x.shape[0]

    def energy(z, idx):
        p = {name: z[o : o + n].reshape(shape) for name, (o, n, shape) in offsets.items()}
        logits = torch.tanh(x[idx] @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
        log_lik = (logits.gather(-1, y[idx].unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)).sum()
        log_prior = -0.5 * (z * z).sum() - dim * 0.5 * math.log(2 * math.pi)
        return -(log_prior + (num_data / BATCH) * log_lik)

    return torch.func.vmap(torch.func.grad_and_value(energy), in_dims=(0, 0))


def profile_components(x, y, init: torch.Tensor, seed: int, number: int, repeat: int) -> dict:
    """CPU ms of the pieces of one step of 256 chains, ours against the hand loop's."""
    num_inputs = x.shape[1]
    offsets, dim = layout(num_inputs)
    kernel = make_kernel()
    kernel.setup_chains(0, (x, y), {}, num_chains=init.shape[0], initial_params=as_params(init, num_inputs), seed=seed)
    hand = HandBatchedSGHMC(x, y, init, seed)
    for _ in range(SKIP):
        kernel.step()
        hand.step()
    state = kernel.state
    idx = kernel.minibatches.next()
    pos, grad = state.position, state.grad
    drift = grad * (-1.0 / kernel.potential.num_data)
    noise = kernel.generators.normal(pos.shape[1:], pos.dtype)
    plain = plain_vmap_potential(x, y, num_inputs)
    steps_per_epoch = x.shape[0] // BATCH
    two = {name: v[:2] for name, v in idx.items()}
    logits = torch.randn(init.shape[0], BATCH, 10)
    labels = y[idx["data"]]

    def minibatch_epoch():
        for _ in range(steps_per_epoch):
            kernel.minibatches.next()

    def hand_epoch():
        for _ in range(steps_per_epoch):
            hand.next_indices()

    def ours_forward():
        with torch.no_grad():
            return torch.func.vmap(kernel.potential._potential, randomness="different")(pos, idx)

    def hand_forward():
        with torch.no_grad():
            return hand.energy(pos, idx["data"])

    def pyro_prior(z):  # the model's four prior sites, as Pyro evaluates them (one chain)
        total = 0.0
        for name, (o, n, shape) in offsets.items():
            prior = dist.Normal(0.0, PRIOR_SCALE).expand(shape).to_event(len(shape))
            total = total + prior.log_prob(z[o : o + n].view(shape))
        return total

    pyro_prior_grad = torch.func.vmap(torch.func.grad(pyro_prior))
    plain_prior_grad = torch.func.vmap(torch.func.grad(lambda z: -0.5 * (z * z).sum()))

    def categorical_grad():
        with torch.enable_grad():
            logits_ = logits.detach().requires_grad_(True)
            torch.autograd.grad(dist.Categorical(logits=logits_).log_prob(labels).sum(), logits_)

    def gather_lse_grad():
        with torch.enable_grad():
            logits_ = logits.detach().requires_grad_(True)
            log_lik = logits_.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - logits_.logsumexp(-1)
            torch.autograd.grad(log_lik.sum(), logits_)

    def fused_update():
        momentum = state.momentum.clone()  # the clone stands in for the new tensor the update returns
        momentum.mul_(0.95).add_(grad, alpha=-1e-5).add_(noise, alpha=1e-3)
        return pos.add(momentum, alpha=STEP_SIZE)

    pieces = {
        "ours: full step (kernel.step)": kernel.step,
        "hand: full step": hand.step,
        "ours: potential + grad (Pyro model, vmap, autograd)": lambda: kernel.potential.batched_potential_and_grad(
            pos, idx
        ),
        "no-Pyro: vmap(grad(plain torch U)), same maths": lambda: plain(pos, idx["data"]),
        "hand: potential + grad (bmm + autograd)": lambda: hand.potential_and_grad(pos, idx["data"]),
        "ours: potential only (Pyro model under vmap, no grad)": ours_forward,
        "hand: potential only (no grad)": hand_forward,
        "ours: potential + grad, 2 chains (fixed cost: Pyro trace + vmap)": lambda: (
            kernel.potential.batched_potential_and_grad(pos[:2], two)
        ),
        "no-Pyro: vmap(grad(U)), 2 chains (fixed cost of vmap)": lambda: plain(pos[:2], two["data"]),
        "hand: potential + grad, 2 chains": lambda: hand.potential_and_grad(pos[:2], two["data"]),
        "prior, Pyro way: 4 x Normal.expand.to_event.log_prob, vmap(grad)": lambda: pyro_prior_grad(pos),
        "prior, plain: -0.5 z.z, vmap(grad)": lambda: plain_prior_grad(pos),
        "likelihood, Pyro way: Categorical(logits).log_prob, fwd+bwd": categorical_grad,
        "likelihood, plain: gather - logsumexp, fwd+bwd": gather_lse_grad,
        "ours: noise (ChainGenerators.fill_normal into the kernel's buffer, 256 generators)": lambda: (
            kernel.generators.fill_normal(noise)
        ),
        "hand: noise (256 generators)": hand.noise,
        "one global torch.randn of the same size (reference)": lambda: torch.randn(pos.shape),
        "ours: SGHMC update (underdamped_step, drift -grad/N scaled in its pass)": lambda: kernel._transition(
            state, grad, STEP_SIZE, noise, -1.0 / kernel.potential.num_data
        ),
        "in-place fused SGHMC update (reference)": fused_update,
        "ours: finite check, one sum and one read: isfinite(float(grad.sum() + U.sum()))": lambda: math.isfinite(
            float(grad.sum() + state.potential.sum())
        ),
        "exact per-chain check isfinite(U) & isfinite(grad).all(-1) (reference)": lambda: (
            torch.isfinite(state.potential) & torch.isfinite(grad).all(-1)
        ),
        "position.clone() (MCMC keeps the last draw)": pos.clone,
    }
    del drift
    with pyro.validation_enabled(False):
        out = interleaved_best_ms(pieces, number, repeat)
        out["ours: minibatch indices (amortised over an epoch, incl. 256 randperm)"] = (
            best_ms(minibatch_epoch, 1, repeat) / steps_per_epoch
        )
        out["hand: minibatch indices (amortised over an epoch, incl. 256 randperm)"] = (
            best_ms(hand_epoch, 1, repeat) / steps_per_epoch
        )
    return out


def profile_python(x, y, init: torch.Tensor, seed: int, num_steps: int) -> dict:
    """cProfile of ``num_steps`` vectorised steps, total time by where the code lives."""
    kernel = make_kernel()
    kernel.setup_chains(0, (x, y), {}, num_chains=init.shape[0], initial_params=as_params(init, x.shape[1]), seed=seed)
    for _ in range(SKIP):
        kernel.step()
    profiler = cProfile.Profile()
    with pyro.validation_enabled(False):
        profiler.enable()
        for _ in range(num_steps):
            kernel.step()
        profiler.disable()
    stats = pstats.Stats(profiler)
    groups: Dict[str, float] = {}
    total = 0.0
    for (filename, _, funcname), (_, _, tottime, _, _) in stats.stats.items():
        total += tottime
        if filename == "~":  # built-ins: the torch operators (their C++ time) and Python built-ins
            key = "torch operators and builtins (C++)"
            if funcname == "<method 'run_backward' of 'torch._C._EngineBase' objects>":
                key = "autograd backward (C++)"
        elif "/pyro_sgmcmc/" in filename:
            key = "pyro_sgmcmc (Python)"
        elif "/pyro/" in filename:
            key = "pyro: trace/messenger/distributions (Python)"
        elif "/torch/_functorch/" in filename or "/torch/utils/_pytree" in filename:
            key = "functorch vmap/grad wrappers (Python)"
        elif "/torch/distributions/" in filename:
            key = "torch.distributions (Python)"
        elif "/torch/" in filename:
            key = "other torch Python"
        elif filename.endswith("vectorized_chains.py"):
            key = "model function body (incl. its operators)"
        else:
            key = "other Python"
        groups[key] = groups.get(key, 0.0) + tottime
    # Cumulative time (operators included) of the functions the question is about.
    wanted = {
        ("base.py", "step"): "SGMCMCKernel.step (everything)",
        ("streams.py", "fill_normal"): "ChainGenerators.fill_normal (per-chain noise loop)",
        ("minibatch.py", "next"): "MinibatchSampler.next (indices + epoch permutations)",
        ("diffusions.py", "underdamped_step"): "underdamped_step (SGHMC update)",
        ("potential.py", "batched_potential_and_grad"): "batched_potential_and_grad (model, vmap, autograd)",
        ("potential.py", "log_density"): "log_density (trace the model + log_prob_sum), forward",
        ("vectorized_chains.py", "bnn_model"): "the model body: net forward + pyro.sample calls",
        ("trace_struct.py", "log_prob_sum"): "Trace.log_prob_sum (all sites' log_prob, scaled)",
        ("normal.py", "log_prob"): "Normal.log_prob (the 4 prior sites)",
        ("categorical.py", "__init__"): "Categorical construction (logits normalised)",
        ("categorical.py", "log_prob"): "Categorical.log_prob",
        ("trace_messenger.py", "get_trace"): "poutine.trace(...).get_trace",
        ("<built-in method torch.isfinite>", ""): "torch.isfinite (divergence check)",
        ("run_backward", ""): "autograd backward (C++)",
    }
    cumulative: Dict[str, float] = {}
    for (filename, _, funcname), (_, _, _, cumtime, _) in stats.stats.items():
        for (file_part, func), label in wanted.items():
            hit = (filename.endswith(file_part) and funcname == func) if func else (file_part in funcname)
            if hit:
                cumulative[label] = cumulative.get(label, 0.0) + cumtime
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    return {
        "ms_per_step_under_cprofile": 1e3 * total / num_steps,
        "ms_per_step_by_group": {k: 1e3 * v / num_steps for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "cumulative_ms_per_step": {
            label: 1e3 * cumulative[label] / num_steps for label in wanted.values() if label in cumulative
        },
        "top_functions": text.getvalue(),
    }


def profile_operators(x, y, init: torch.Tensor, seed: int, num_steps: int, top: int = 12) -> dict:
    """torch.profiler: self CPU time per operator, ours vs hand, per step."""
    from torch.profiler import ProfilerActivity, profile

    kernel = make_kernel()
    kernel.setup_chains(0, (x, y), {}, num_chains=init.shape[0], initial_params=as_params(init, x.shape[1]), seed=seed)
    hand = HandBatchedSGHMC(x, y, init, seed)
    for _ in range(SKIP):
        kernel.step()
        hand.step()
    out = {}
    for name, fn in (("ours", kernel.step), ("hand", hand.step)):
        with pyro.validation_enabled(False), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(num_steps):
                fn()
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in rows)
        out[name] = {
            "self_cpu_ms_per_step": total / 1e3 / num_steps,
            "num_operator_calls_per_step": sum(e.count for e in rows) / num_steps,
            "top": [
                {
                    "op": e.key,
                    "ms_per_step": e.self_cpu_time_total / 1e3 / num_steps,
                    "calls_per_step": e.count / num_steps,
                }
                for e in rows[:top]
            ],
        }
    return out


# ------------------------------------------------------------------------------- prototypes
class PrototypeStep:
    """PROTOTYPE, not package code: ``SGMCMCKernel.step`` for SGHMC with pieces swapped.

    fused_update
        The SGHMC update in place (``mul_``/``add_`` on the momentum, one ``add`` for the position)
        instead of ``drift = grad * (-1/N)`` and ``underdamped_step``'s five new tensors.
    cheap_finite
        ``isfinite(U + grad.sum(-1))`` instead of ``isfinite(U) & isfinite(grad).all(-1)``: NaN and
        inf propagate through the sum, and ``isfinite`` runs on 256 numbers instead of 770,560.
    split_unpack
        ``ModelPotential.log_density`` splitting the flat position with ``position.split(sizes)``
        (backward: one ``cat``) instead of one slice per site (backward: a zero-filled full-size
        gradient per site, then added up).
    """

    def __init__(self, kernel, fused_update: bool = False, cheap_finite: bool = False, split_unpack: bool = False):
        self.kernel, self.fused_update, self.cheap_finite = kernel, fused_update, cheap_finite
        if split_unpack:
            potential = kernel.potential
            potential.log_density = _split_log_density.__get__(potential)  # this instance only

    def __call__(self):
        k = self.kernel
        state = k.state
        eps = k.step_size(state.step)
        noise = k.generators.normal(state.position.shape[1:], state.position.dtype)
        if self.fused_update:
            momentum = state.momentum.mul(1.0 - eps * k.friction / k.mass)
            momentum.add_(state.grad, alpha=-eps * k._inverse_num_data)
            momentum.add_(noise, alpha=math.sqrt(2.0 * eps * k.noise_temperature * k.friction))
            position = state.position.add(momentum, alpha=eps / k.mass)
        else:
            drift = state.grad * (-k._inverse_num_data)
            position, momentum = underdamped_step(
                state.position, state.momentum, drift, eps, k.noise_temperature, k.friction, k.mass, noise
            )
        energy, grad = k.potential.batched_potential_and_grad(position, k.minibatches.next())
        if self.cheap_finite:
            finite = torch.isfinite(energy + grad.sum(-1))
        else:
            finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1)
        if not bool(finite.all()):
            raise RuntimeError("divergence in the prototype benchmark")
        k.state = state._replace(position=position, momentum=momentum, potential=energy, grad=grad, step=state.step + 1)
        return k.state


def _split_log_density(self, position, indices=None):
    """PROTOTYPE of ``ModelPotential.log_density``: ``position.split`` instead of per-site slices."""
    values = self._values
    values.clear()
    if indices:
        values.update(indices)
    log_det = position.new_zeros(())
    for site, part in zip(self.sites, position.split([site.numel for site in self.sites], -1)):
        u = part.view(site.unconstrained_shape)
        value = site.transform(u)
        values[site.name] = value
        if site.has_jacobian:
            log_det = log_det + site.transform.log_abs_det_jacobian(u, value).sum()
    trace = pyro.poutine.trace(self._conditioned_model).get_trace(*self.model_args, **self.model_kwargs)
    return trace.log_prob_sum() + log_det


PROTOTYPES = {
    "PROTOTYPE cheap-finite": {"cheap_finite": True},
    "PROTOTYPE fused-update": {"fused_update": True},
    "PROTOTYPE split-unpack": {"split_unpack": True},
    "PROTOTYPE all three": {"cheap_finite": True, "fused_update": True, "split_unpack": True},
}


def run_prototypes(x, y, init: torch.Tensor, seed: int, number: int, repeat: int) -> dict:
    """CPU ms per step of the package's step, each prototype and the hand loop, interleaved."""
    params = as_params(init, x.shape[1])
    fns: Dict[str, Callable] = {}
    kernels = {}
    for name in ["package step", *PROTOTYPES]:
        kernel = make_kernel()
        kernel.setup_chains(0, (x, y), {}, num_chains=init.shape[0], initial_params=params, seed=seed)
        kernels[name] = kernel
        fns[name] = kernel.step if name == "package step" else PrototypeStep(kernel, **PROTOTYPES[name])
    hand = HandBatchedSGHMC(x, y, init, seed)
    fns["hand"] = hand.step
    with pyro.validation_enabled(False):
        for fn in fns.values():
            for _ in range(SKIP):
                fn()
        # same seed, same start: every prototype must reproduce the package's trajectory
        reference = kernels["package step"].state.position
        agreement = {name: float((k.state.position - reference).abs().max()) for name, k in kernels.items()}
        wall = {name: math.inf for name in fns}
        cpu = {name: math.inf for name in fns}
        for _ in range(repeat):  # interleaved blocks, best block per variant and clock
            for name, fn in fns.items():
                start = now()
                for _ in range(number):
                    fn()
                end = now()
                wall[name] = min(wall[name], 1e3 * (end[0] - start[0]) / number)
                cpu[name] = min(cpu[name], 1e3 * (end[1] - start[1]) / number)
    out = {}
    for name in fns:
        out[name] = {
            "wall_ms_per_step": wall[name],
            "cpu_ms_per_step": cpu[name],
            "wall_ratio_to_hand": wall[name] / wall["hand"],
            "cpu_ratio_to_hand": cpu[name] / cpu["hand"],
        }
        if name in agreement:
            out[name][f"max_abs_position_diff_to_package_after_{SKIP}_steps"] = agreement[name]
    return out


# ------------------------------------------------------------------------------------- main
def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "platform": platform.platform(),
    }


def load_average() -> Optional[List[float]]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=256)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per run, ours and hand alike")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved ours/hand run pairs per thread count")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--serial-chains", type=int, default=4, help="chains timed one by one (x --chains / this)")
    parser.add_argument("--serial-steps", type=int, default=60, help="steps per chain timed one by one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--no-prototypes", dest="prototypes", action="store_false")
    parser.add_argument("--tiny", action="store_true", help="a few chains and steps: smoke test only")
    parser.add_argument(
        "--retain-memory",
        action="store_true",
        help="call pyro_sgmcmc.retain_freed_cpu_memory() first (process-wide: every contender gets it)",
    )
    default_out = Path(__file__).resolve().parent / "results" / "vectorized_chains.json"
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args(argv)
    if args.tiny:
        args.chains, args.steps, args.repeats, args.serial_chains, args.serial_steps = 8, 12, 1, 2, 10

    retained = retain_freed_cpu_memory() if args.retain_memory else False
    x, y = load_data()
    _, dim = layout(x.shape[1])
    init = initial_positions(args.chains, dim, args.seed)
    started = time.perf_counter()
    result = {
        "machine": {**machine_info(), "retain_freed_cpu_memory": retained},
        "load_average_at_start": load_average(),
        "config": {
            "data": f"sklearn load_digits, N={x.shape[0]}, {x.shape[1]} inputs, 10 classes",
            "network": f"{x.shape[1]} -> {HIDDEN} (tanh) -> 10, N(0, {PRIOR_SCALE}) priors",
            "num_weights": dim,
            "batch_size": BATCH,
            "num_chains": args.chains,
            "timed_steps_per_run": args.steps,
            "untimed_first_steps": SKIP,
            "repeats": args.repeats,
            "step_size": STEP_SIZE,
            "friction": FRICTION,
            "temperature": TEMPERATURE,
            "serial_chains_timed": args.serial_chains,
            "serial_steps_timed": args.serial_steps,
            "tiny": args.tiny,
        },
        "threads": {},
    }
    torch.set_num_threads(args.threads[0])
    result["same_maths_check"] = check_same_maths(x, y, init, args.seed)
    print("same-maths check (ours vs hand, same start and seed):", json.dumps(result["same_maths_check"]))

    for threads in args.threads:
        torch.set_num_threads(threads)
        ours_runs, hand_runs = [], []
        for r in range(args.repeats):
            order = ("ours", "hand") if r % 2 == 0 else ("hand", "ours")
            for side in order:
                if side == "ours":
                    ours_runs.append(run_ours(x, y, init, args.steps + SKIP, args.seed))
                else:
                    hand_runs.append(run_hand(x, y, init, args.steps + SKIP, args.seed))
        serial_pyro = run_one_by_one_pyro(x, y, init, args.serial_chains, args.serial_steps + SKIP)
        serial_kernel = run_one_by_one_kernel(x, y, init, args.serial_chains, args.serial_steps + SKIP, args.seed)
        serial_eager = run_one_by_one_pyro(x, y, init, args.serial_chains, args.serial_steps + SKIP, jit=False)
        entry = {}
        for clock, key in (("wall", "median_ms"), ("cpu", "cpu_median_ms")):
            ours_ms = min(r[key] for r in ours_runs)
            hand_ms = min(r[key] for r in hand_runs)
            per_chain = "per_chain_step_ms" if clock == "wall" else "per_chain_step_cpu_ms"
            serial_pyro_ms = args.chains * serial_pyro[per_chain]
            serial_kernel_ms = args.chains * serial_kernel[per_chain]
            serial_eager_ms = args.chains * serial_eager[per_chain]
            entry[clock] = {
                "ours_ms_per_step": ours_ms,
                "hand_ms_per_step": hand_ms,
                "ratio_ours_over_hand": ours_ms / hand_ms,
                "ratio_ours_over_hand_paired_median": statistics.median(
                    o[key] / h[key] for o, h in zip(ours_runs, hand_runs)
                ),
                "one_by_one_pyro_mcmc_ms_per_step_extrapolated": serial_pyro_ms,
                "one_by_one_setup_chains_ms_per_step_extrapolated": serial_kernel_ms,
                "speedup_vs_one_by_one_pyro_mcmc": serial_pyro_ms / ours_ms,
                "speedup_vs_one_by_one_setup_chains": serial_kernel_ms / ours_ms,
                "one_by_one_pyro_mcmc_eager_ms_per_step_extrapolated": serial_eager_ms,
                "speedup_vs_one_by_one_pyro_mcmc_eager": serial_eager_ms / ours_ms,
            }
            entry[clock]["pass_within_1.5x_of_hand"] = entry[clock]["ratio_ours_over_hand"] <= 1.5
            entry[clock]["pass_10x_over_one_by_one"] = (
                min(entry[clock]["speedup_vs_one_by_one_pyro_mcmc"], entry[clock]["speedup_vs_one_by_one_setup_chains"])
                >= 10
            )
        entry.update(
            ours_setup_s=min(r["setup_s"] for r in ours_runs),
            hand_setup_s=min(r["setup_s"] for r in hand_runs),
            one_by_one_pyro_mcmc_setup_per_chain_s=serial_pyro["setup_per_chain_s"],
            ours_runs=ours_runs,
            hand_runs=hand_runs,
            one_by_one_pyro_mcmc=serial_pyro,
            one_by_one_setup_chains=serial_kernel,
            one_by_one_pyro_mcmc_eager=serial_eager,
        )
        result["threads"][str(threads)] = entry
        w = entry["wall"]
        serial = [
            w[f"one_by_one_{k}_ms_per_step_extrapolated"] for k in ("pyro_mcmc", "setup_chains", "pyro_mcmc_eager")
        ]
        print(f"threads={threads}: ours {w['ours_ms_per_step']:.1f} ms/step, hand {w['hand_ms_per_step']:.1f} ms/step, "
              f"one-by-one {serial[0]:.0f} / {serial[1]:.0f} / eager {serial[2]:.0f} ms/step (extrapolated)",
              flush=True)  # fmt: skip

    profile_threads = args.threads[0]
    torch.set_num_threads(profile_threads)
    number, repeat = (2, 2) if args.tiny else (5, 8)
    if args.profile:
        result["profile"] = {
            "threads": profile_threads,
            "components_ms": profile_components(x, y, init, args.seed, number, repeat),
            "cprofile": profile_python(x, y, init, args.seed, number * 2),
            "operators": profile_operators(x, y, init, args.seed, number),
        }
    if args.prototypes:
        result["prototypes"] = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            result["prototypes"][str(threads)] = run_prototypes(x, y, init, args.seed, number, repeat)
    result["load_average_at_end"] = load_average()
    result["wall_time_s"] = time.perf_counter() - started

    print_report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {args.out}")
    return result


def print_report(result: dict) -> None:
    cfg = result["config"]
    print(
        f"\n{cfg['num_chains']} chains of SGHMC, Bayesian MLP with {cfg['num_weights']} weights, "
        f"B={cfg['batch_size']}. "
        f"ms per step of all chains: median step of a run, best of {cfg['repeats']} runs of "
        f"{cfg['timed_steps_per_run']} steps. One-by-one: {cfg['serial_chains_timed']} chains x "
        f"{cfg['serial_steps_timed']} steps timed, per-chain step x {cfg['num_chains']} (extrapolated). "
        "wall = wall clock; cpu = CPU time of the process (load-robust at 1 thread)."
    )
    header = (
        f"{'threads':>7} | {'clock':>5} | {'ours':>7} | {'hand':>7} | {'ours/hand':>9} | {'paired':>6} | "
        f"{'1-by-1 MCMC':>11} | {'1-by-1 kern':>11} | {'1-by-1 eager':>12} | {'speed-up M/k/eager':>19} | "
        f"{'<=1.5x':>6} | {'>=10x':>5}"
    )
    print(header)
    print("-" * len(header))
    for threads, entry in result["threads"].items():
        for clock in ("wall", "cpu"):
            e = entry[clock]
            print(
                f"{threads:>7} | {clock:>5} | {e['ours_ms_per_step']:7.1f} | {e['hand_ms_per_step']:7.1f} | "
                f"{e['ratio_ours_over_hand']:9.2f} | {e['ratio_ours_over_hand_paired_median']:6.2f} | "
                f"{e['one_by_one_pyro_mcmc_ms_per_step_extrapolated']:11.0f} | "
                f"{e['one_by_one_setup_chains_ms_per_step_extrapolated']:11.0f} | "
                f"{e['one_by_one_pyro_mcmc_eager_ms_per_step_extrapolated']:12.0f} | "
                f"{e['speedup_vs_one_by_one_pyro_mcmc']:5.1f} / {e['speedup_vs_one_by_one_setup_chains']:5.1f} / "
                f"{e['speedup_vs_one_by_one_pyro_mcmc_eager']:5.1f} | "
                f"{'pass' if e['pass_within_1.5x_of_hand'] else 'FAIL':>6} | "
                f"{'pass' if e['pass_10x_over_one_by_one'] else 'FAIL':>5}"
            )
    for threads, entry in result["threads"].items():
        print(
            f"threads={threads}: set-up ours {entry['ours_setup_s']:.2f} s, hand {entry['hand_setup_s']:.2f} s, "
            f"one-by-one (pyro.infer.MCMC) {entry['one_by_one_pyro_mcmc_setup_per_chain_s']:.3f} s per chain"
        )
    if "profile" in result:
        prof = result["profile"]
        print(f"\nComponents, threads={prof['threads']}: CPU ms, best of interleaved repeats (256 chains):")
        for name, ms in prof["components_ms"].items():
            print(f"  {ms:8.2f}  {name}")
        print(f"\ncProfile of the vectorised step, self time by where the code lives (ms/step; "
              f"{prof['cprofile']['ms_per_step_under_cprofile']:.1f} ms/step under the profiler):")  # fmt: skip
        for name, ms in prof["cprofile"]["ms_per_step_by_group"].items():
            print(f"  {ms:8.2f}  {name}")
        print("cProfile, cumulative time of selected functions (ms/step, operators included):")
        for name, ms in prof["cprofile"]["cumulative_ms_per_step"].items():
            print(f"  {ms:8.2f}  {name}")
        for side in ("ours", "hand"):
            ops = prof["operators"][side]
            print(f"\ntorch.profiler, {side}: {ops['self_cpu_ms_per_step']:.1f} ms self CPU per step, "
                  f"{ops['num_operator_calls_per_step']:.0f} operator calls per step; top operators:")  # fmt: skip
            for row in ops["top"]:
                print(f"  {row['ms_per_step']:8.2f} ms  {row['calls_per_step']:7.1f} calls  {row['op']}")
    for threads, rows in result.get("prototypes", {}).items():
        print(f"\nPROTOTYPE variants of the step (NOT package code), threads={threads}: ms, ratio to hand")
        for name, row in rows.items():
            diff = {k: v for k, v in row.items() if k.startswith("max_abs")}
            agree = f"  (max |dz| vs package {next(iter(diff.values())):.1e})" if diff else ""
            print(
                f"  wall {row['wall_ms_per_step']:7.2f} (x{row['wall_ratio_to_hand']:.2f})  cpu "
                f"{row['cpu_ms_per_step']:7.2f} (x{row['cpu_ratio_to_hand']:.2f})  {name}{agree}"
            )
    print(f"\nload average at start {result['load_average_at_start']}, at end {result['load_average_at_end']}; "
          f"wall time {result['wall_time_s']:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
