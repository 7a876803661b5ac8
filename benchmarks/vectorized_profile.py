"""Profile of one vectorised SGHMC step (``vectorized_chains.py --profile``, on by default): where it goes.

At the first ``--threads`` value: CPU time of the pieces of one step of all chains (noise, SGHMC update,
minibatch indices, Pyro model + vmap + autograd, divergence check, the prior and the likelihood the Pyro
way and the plain way, the fixed cost at 2 chains) next to the matching pieces of the hand loop and of a
vmap-without-Pyro variant (:func:`plain_vmap_potential`); cProfile totals by where the code lives and
cumulative times of the functions in question; the top operators under ``torch.profiler`` for both sides.
The step's pieces are timed with :func:`harness.interleaved_best_ms` (CPU time, best of interleaved blocks).
"""

from __future__ import annotations

import cProfile
import io
import math
import pstats
from typing import Dict

import pyro
import pyro.distributions as dist
import torch

from pyro_sgmcmc.kernels.diffusions import underdamped_step

if __package__:
    from . import harness, models
    from . import vectorized_chains as vc
else:
    import harness
    import models

    vc = harness.companion("vectorized_chains", None)

SKIP = vc.SKIP


def warmed_up_pair(x, y, init: torch.Tensor, seed: int):
    """Our vectorised kernel and the hand loop from the same start and seed, both past the first steps."""
    kernel, hand = vc.vectorized_kernel(x, y, init, seed), vc.hand_chains(x, y, init, seed)
    for _ in range(SKIP):
        kernel.step()
        hand.step()
    return kernel, hand


def profile(x, y, init: torch.Tensor, seed: int, number: int, repeat: int) -> dict:
    """Components, cProfile and operators at the current thread count."""
    return {
        "threads": torch.get_num_threads(),
        "components_ms": profile_components(x, y, init, seed, number, repeat),
        "cprofile": profile_python(x, y, init, seed, number * 2),
        "operators": profile_operators(x, y, init, seed, number),
    }


def plain_vmap_potential(x, y, num_inputs: int):
    """vmap(grad(one chain's U)) in plain torch: the vectorised path without Pyro's trace machinery."""
    offsets = models.flat_layout(models.digits_shapes(num_inputs))
    dim = vc.num_weights(num_inputs)
    num_data = x.shape[0]

    def energy(z, idx):
        p = {name: z[o : o + n].reshape(shape) for name, (o, n, shape) in offsets.items()}
        logits = torch.tanh(x[idx] @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
        log_lik = (logits.gather(-1, y[idx].unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)).sum()
        log_prior = -0.5 * (z * z).sum() - dim * 0.5 * math.log(2 * math.pi)
        return -(log_prior + (num_data / vc.BATCH) * log_lik)

    return torch.func.vmap(torch.func.grad_and_value(energy), in_dims=(0, 0))


def profile_components(x, y, init: torch.Tensor, seed: int, number: int, repeat: int) -> dict:
    """CPU ms of the pieces of one step of 256 chains, ours against the hand loop's."""
    num_inputs = x.shape[1]
    offsets = models.flat_layout(models.digits_shapes(num_inputs))
    kernel, hand = warmed_up_pair(x, y, init, seed)
    state = kernel.state
    idx = kernel.minibatches.next()
    pos, grad = state.position, state.grad
    drift = grad * (-1.0 / kernel.potential.num_data)
    noise = kernel.generators.normal(pos.shape[1:], pos.dtype, step=state.step)
    plain = plain_vmap_potential(x, y, num_inputs)
    steps_per_epoch = x.shape[0] // vc.BATCH
    two = {name: v[:2] for name, v in idx.items()}
    logits = torch.randn(init.shape[0], vc.BATCH, 10)
    labels = y[idx["data"]]

    def minibatch_epoch():
        for _ in range(steps_per_epoch):
            kernel.minibatches.next()

    package_stream = vc.hand_chains(x, y, init, seed, minibatches="package")

    def hand_epoch(loop=hand):
        for _ in range(steps_per_epoch):
            loop.next_indices()

    def ours_forward():
        with torch.no_grad():
            potential = lambda z, i: -kernel.potential.log_density(z, i)  # noqa: E731
            return torch.func.vmap(potential, randomness="different")(pos, idx)

    def hand_forward():
        with torch.no_grad():
            return hand.energy(pos, idx["data"])

    def pyro_prior(z):  # the model's four prior sites, as Pyro evaluates them (one chain)
        total = 0.0
        for name, (o, n, shape) in offsets.items():
            prior = dist.Normal(0.0, vc.PRIOR_SCALE).expand(shape).to_event(len(shape))
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
        return pos.add(momentum, alpha=vc.STEP_SIZE)

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
        "ours: noise (ChainGenerators.fill_normal into the kernel's buffer, keyed Philox, 256 chains)": lambda: (
            kernel.generators.fill_normal(noise, step=state.step)
        ),
        "hand: noise (256 generators)": hand.noise,
        "one global torch.randn of the same size (reference)": lambda: torch.randn(pos.shape),
        "ours: SGHMC update (underdamped_step, drift -grad/N scaled in its pass)": lambda: underdamped_step(
            state.position, state.momentum, grad, vc.STEP_SIZE, kernel.noise_temperature, kernel.friction,
            kernel.mass, noise, -1.0 / kernel.potential.num_data,
        ),  # fmt: skip
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
        out = harness.interleaved_best_ms(pieces, number, repeat)
        out["ours: minibatch indices (amortised over an epoch, keyed permutations)"] = (
            harness.best_ms(minibatch_epoch, 1, repeat) / steps_per_epoch
        )
        out["hand: minibatch indices (amortised over an epoch, torch.randperm per chain)"] = (
            harness.best_ms(hand_epoch, 1, repeat) / steps_per_epoch
        )
        out["hand: minibatch indices (amortised over an epoch, the package's epoch_orders)"] = (
            harness.best_ms(lambda: hand_epoch(package_stream), 1, repeat) / steps_per_epoch
        )
    return out


def profile_python(x, y, init: torch.Tensor, seed: int, num_steps: int) -> dict:
    """cProfile of ``num_steps`` vectorised steps, total time by where the code lives."""
    kernel = vc.vectorized_kernel(x, y, init, seed)
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
        elif filename.endswith("models.py"):
            key = "model function body (incl. its operators)"
        else:
            key = "other Python"
        groups[key] = groups.get(key, 0.0) + tottime
    # Cumulative time (operators included) of the functions the question is about.
    wanted = {
        ("base.py", "step"): "SGMCMCKernel.step (everything)",
        ("streams.py", "fill_normal"): "ChainGenerators.fill_normal (keyed Philox draw, all chains at once)",
        ("minibatch.py", "next"): "MinibatchSampler.next (indices of the keyed permutations)",
        ("diffusions.py", "underdamped_step"): "underdamped_step (SGHMC update)",
        ("potential.py", "batched_potential_and_grad"): "batched_potential_and_grad (model, vmap, autograd)",
        ("potential.py", "log_density"): "log_density (trace the model + log_prob_sum), forward",
        ("models.py", "bnn_model"): "the model body: net forward + pyro.sample calls",
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

    kernel, hand = warmed_up_pair(x, y, init, seed)
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


def print_profile(prof: dict) -> None:
    """The profile as text, after the timing table."""
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
