"""Benchmark: 256 vectorised SGHMC chains on a Bayesian MLP against a hand-written batched loop.

The requirement measured here: ``pyro_sgmcmc.MCMC(..., chain_method="vectorized")`` running 256
chains of SGHMC on a small Bayesian neural network written as an ordinary Pyro model must

* take at most 1.5x the time per step of a hand-written batched PyTorch loop that does the same
  maths for all chains at once, and
* be at least 10x faster than running the 256 chains one after the other with the same kernel.

Model (``models.py``): scikit-learn's ``load_digits`` (N = 1797 images, 64 pixels scaled to [0, 1], 10
classes), a 64 -> 40 (tanh) -> 10 MLP with N(0, 1) priors on all 3,010 weights and biases, minibatches of
B = 128 through ``pyro.plate("data", N, subsample_size=128)``.

Three ways to run the same 256 chains (same start, same step size, friction, temperature):

``ours``
    ``pyro_sgmcmc.MCMC(SGHMC(model), num_chains=256, chain_method="vectorized", keep_last=1)``:
    the Pyro model runs once per step under ``torch.func.vmap``.
``hand``
    ``harness.HandChains`` on ``models.digits_energy``: plain PyTorch. Per-chain minibatch gather
    ``x[idx]`` with ``idx`` of shape ``(256, 128)``, ``torch.bmm`` for both layers, log prior +
    N/B-scaled log-likelihood, one ``autograd.grad`` for all chains, the SGHMC update, per-chain noise
    from one ``torch.Generator`` per chain seeded exactly as the package seeds its chains, and
    minibatches as a user draws them (``torch.randperm`` per chain per epoch from that generator). With
    the package's minibatch stream instead (``minibatches="package"``: ``epoch_orders``, the keyed
    permutations) it reproduces our trajectories to float round-off (checked at the start of the run),
    so both sides really do the same work; the timed loop draws ``torch.randperm``, so that the cost of
    the package's permutations is not hidden in the baseline.
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

Profiling (``vectorized_profile.py``; on by default, ``--no-profile`` to skip) times the pieces of one
step against the hand loop's, with cProfile and ``torch.profiler``. PROTOTYPES (``vectorized_prototypes.py``;
on by default, ``--no-prototypes`` to skip) are *not* package code: the package's step with pieces swapped,
to show what a change to ``pyro_sgmcmc/`` would buy; each must reproduce the package's trajectory.

Run it::

    python benchmarks/vectorized_chains.py                    # 4-12 minutes on 2 cores, by load
    python benchmarks/vectorized_chains.py --tiny             # seconds, smoke test only
    python benchmarks/vectorized_chains.py --threads 1 --repeats 7 --steps 100 --no-profile --no-prototypes

The results, the machine and the reading are in ``docs/benchmarks_vectorized.rst``.

Results: a table on stdout and JSON in ``--out`` (default
``benchmarks/results/vectorized_chains.json``).
"""
from __future__ import annotations

import json
import math
import statistics
import time
from typing import Dict, List

import pyro
import pyro.infer
import torch

from pyro_sgmcmc import MCMC, SGHMC, retain_freed_cpu_memory
from pyro_sgmcmc.model.potential import JitMode

if __package__:  # imported as benchmarks.vectorized_chains
    from . import harness, models
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    import models

HIDDEN, BATCH, PRIOR_SCALE = models.DIGITS_HIDDEN, models.DIGITS_BATCH, models.DIGITS_PRIOR_SCALE
STEP_SIZE = 0.05
FRICTION = 1.0
MASS = 1.0
TEMPERATURE = 1.0
SKIP = 5  # first steps of every run not timed (allocator and dispatch warm-up)
load_data, bnn_model = models.load_digits, models.bnn_model


def num_weights(num_inputs: int) -> int:
    return sum(math.prod(shape) for shape in models.digits_shapes(num_inputs).values())


def as_params(position: torch.Tensor, num_inputs: int) -> Dict[str, torch.Tensor]:
    """The sites' values from flat positions ``(..., D)`` (the package orders sites by name)."""
    return models.unflatten(position, models.digits_shapes(num_inputs))


def hand_chains(x, y, init: torch.Tensor, seed: int, minibatches: str = "randperm") -> harness.HandChains:
    """The hand-written batched SGHMC on the same maths and start as ours (``minibatches="package"``: and
    the same streams)."""
    return harness.HandChains(
        models.digits_energy(x, y), x.shape[0], BATCH, init, seed, method="SGHMC",
        step_size=STEP_SIZE, friction=FRICTION, mass=MASS, temperature=TEMPERATURE, minibatches=minibatches,
    )  # fmt: skip


def make_kernel(jit_compile: JitMode = "auto") -> SGHMC:
    return SGHMC(  # the hand loop's maths: a fixed step, no mass matrix, plain minibatches
        bnn_model, step_size=STEP_SIZE, friction=FRICTION, mass=MASS, temperature=TEMPERATURE,
        jit_compile=jit_compile, **harness.SAME_MATHS,
    )  # fmt: skip


def vectorized_kernel(x, y, init: torch.Tensor, seed: int) -> SGHMC:
    """Our kernel set up for all chains at once (``setup_chains``), as ``MCMC`` sets it up."""
    kernel = make_kernel()
    kernel.setup_chains(0, (x, y), {}, num_chains=init.shape[0], initial_params=as_params(init, x.shape[1]), seed=seed)
    return kernel


def initial_positions(num_chains: int, dim: int, seed: int) -> torch.Tensor:
    """Dispersed starts: N(0, 0.1^2) per weight (the same for every side)."""
    return 0.1 * torch.randn(num_chains, dim, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- runs
def _hooked_run(mcmc_class, kernel, x, y, init: torch.Tensor, num_steps: int, **options) -> tuple:
    """One MCMC run with a time stamp after every step (``hook_fn``): its step summary and the run."""
    stamps: List[harness.Stamp] = []
    mcmc = mcmc_class(
        kernel, num_samples=num_steps, warmup_steps=0, initial_params=as_params(init, x.shape[1]),
        hook_fn=lambda *_: stamps.append(harness.now()), disable_progbar=True, **options,
    )  # fmt: skip
    start = harness.now()
    mcmc.run(x, y)
    return harness.step_summary(stamps, start, SKIP), mcmc


def run_ours(x, y, init: torch.Tensor, num_steps: int, seed: int) -> dict:
    kernel = make_kernel()
    out, mcmc = _hooked_run(
        MCMC, kernel, x, y, init, num_steps, num_chains=init.shape[0], chain_method="vectorized", keep_last=1, seed=seed
    )
    out["divergences"] = kernel.num_divergences
    out["final_mean_lp"] = float(mcmc.sample_stats["lp"][:, -1].mean())
    return out


def run_hand(x, y, init: torch.Tensor, num_steps: int, seed: int) -> dict:
    start = harness.now()
    hand = hand_chains(x, y, init, seed)
    stamps = harness.stepped(hand.step, num_steps)()
    out = harness.step_summary(stamps, start, SKIP)
    out["setup_s"] = stamps[0][0] - start[0]
    out["final_mean_lp"] = float(-hand.potential.mean())
    return out


def run_one_by_one_pyro(x, y, init: torch.Tensor, num_chains: int, num_steps: int, jit: JitMode = "auto") -> dict:
    """``pyro.infer.MCMC(SGHMC(model, jit_compile=jit), num_chains=1)``, one run per chain."""
    runs = [
        _hooked_run(pyro.infer.MCMC, make_kernel(jit), x, y, init[c], num_steps, num_chains=1)[0]
        for c in range(num_chains)
    ]
    return _one_by_one(runs, num_chains, num_steps)


def run_one_by_one_kernel(x, y, init: torch.Tensor, num_chains: int, num_steps: int, seed: int) -> dict:
    """``kernel.setup_chains(num_chains=1)`` + ``kernel.step()``: the lean one-chain path."""
    runs = []
    kernel = make_kernel()
    for c in range(num_chains):
        start = harness.now()
        params = as_params(init[c : c + 1], x.shape[1])
        with pyro.validation_enabled(False):  # as MCMC runs it
            kernel.setup_chains(0, (x, y), {}, num_chains=1, initial_params=params, seed=seed, chain_ids=[c])
            stamps = harness.stepped(kernel.step, num_steps)()
        runs.append(harness.step_summary(stamps, start, SKIP))
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


def check_same_maths(x, y, init: torch.Tensor, seed: int, num_steps: int = 3) -> dict:
    """Run both sides from the same start and seed; their states must agree to round-off."""
    kernel = vectorized_kernel(x, y, init, seed)
    hand = hand_chains(x, y, init, seed, minibatches="package")
    out = {"potential_rel_diff_at_start": harness.max_rel_diff(kernel.state.potential, hand.potential)}
    out["grad_rel_diff_at_start"] = harness.max_rel_diff(kernel.state.grad, hand.grad)
    for _ in range(num_steps):
        kernel.step()
        hand.step()
    out[f"position_max_abs_diff_after_{num_steps}_steps"] = harness.max_abs_diff(kernel.state.position, hand.position)
    out[f"momentum_rel_diff_after_{num_steps}_steps"] = harness.max_rel_diff(kernel.state.momentum, hand.momentum)
    out["ok"] = out["grad_rel_diff_at_start"] < 1e-4 and out[f"momentum_rel_diff_after_{num_steps}_steps"] < 1e-3
    return out


def time_threads(x, y, init: torch.Tensor, args) -> dict:
    """ours and hand interleaved (alternating which goes first), then the one-by-one runs; per clock the
    best run of each side, their ratio (and the median ratio over adjacent pairs) and the speed-ups."""
    ours_runs, hand_runs = [], []
    for r in range(args.repeats):
        for side in ("ours", "hand") if r % 2 == 0 else ("hand", "ours"):
            run = run_ours if side == "ours" else run_hand
            (ours_runs if side == "ours" else hand_runs).append(run(x, y, init, args.steps + SKIP, args.seed))
    serial = {
        "pyro_mcmc": run_one_by_one_pyro(x, y, init, args.serial_chains, args.serial_steps + SKIP),
        "setup_chains": run_one_by_one_kernel(x, y, init, args.serial_chains, args.serial_steps + SKIP, args.seed),
        "pyro_mcmc_eager": run_one_by_one_pyro(x, y, init, args.serial_chains, args.serial_steps + SKIP, jit=False),
    }
    entry = {}
    for clock, key in (("wall", "median_ms"), ("cpu", "cpu_median_ms")):
        ours_ms, hand_ms = min(r[key] for r in ours_runs), min(r[key] for r in hand_runs)
        per_chain = "per_chain_step_ms" if clock == "wall" else "per_chain_step_cpu_ms"
        e = entry[clock] = {
            "ours_ms_per_step": ours_ms,
            "hand_ms_per_step": hand_ms,
            "ratio_ours_over_hand": ours_ms / hand_ms,
            "ratio_ours_over_hand_paired_median": harness.paired_median(
                [o[key] for o in ours_runs], [h[key] for h in hand_runs]
            ),
        }
        for name, run in serial.items():
            serial_ms = args.chains * run[per_chain]
            e[f"one_by_one_{name}_ms_per_step_extrapolated"] = serial_ms
            e[f"speedup_vs_one_by_one_{name}"] = serial_ms / ours_ms
        e["pass_within_1.5x_of_hand"] = e["ratio_ours_over_hand"] <= 1.5
        e["pass_10x_over_one_by_one"] = (
            min(e["speedup_vs_one_by_one_pyro_mcmc"], e["speedup_vs_one_by_one_setup_chains"]) >= 10
        )
    entry.update(
        ours_setup_s=min(r["setup_s"] for r in ours_runs),
        hand_setup_s=min(r["setup_s"] for r in hand_runs),
        one_by_one_pyro_mcmc_setup_per_chain_s=serial["pyro_mcmc"]["setup_per_chain_s"],
        ours_runs=ours_runs,
        hand_runs=hand_runs,
        **{f"one_by_one_{name}": run for name, run in serial.items()},
    )
    return entry


# ------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    parser = harness.parser(__doc__, harness.RESULTS / "vectorized_chains.json", "a few chains and steps: smoke test")
    parser.add_argument("--chains", type=int, default=256)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per run, ours and hand alike")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved ours/hand run pairs per thread count")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--serial-chains", type=int, default=4, help="chains timed one by one (x --chains / this)")
    parser.add_argument("--serial-steps", type=int, default=60, help="steps per chain timed one by one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--no-prototypes", dest="prototypes", action="store_false")
    parser.add_argument(
        "--retain-memory",
        action="store_true",
        help="call pyro_sgmcmc.retain_freed_cpu_memory() first (process-wide: every contender gets it)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.chains, args.steps, args.repeats, args.serial_chains, args.serial_steps = 8, 12, 1, 2, 10

    retained = retain_freed_cpu_memory() if args.retain_memory else False
    x, y = load_data()
    dim = num_weights(x.shape[1])
    init = initial_positions(args.chains, dim, args.seed)
    started = time.perf_counter()
    result = {
        "machine": harness.machine_info(retain_freed_cpu_memory=retained),
        "load_average_at_start": harness.load_average(),
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
        entry = result["threads"][str(threads)] = time_threads(x, y, init, args)
        w = entry["wall"]
        serial = [
            w[f"one_by_one_{k}_ms_per_step_extrapolated"] for k in ("pyro_mcmc", "setup_chains", "pyro_mcmc_eager")
        ]
        print(f"threads={threads}: ours {w['ours_ms_per_step']:.1f} ms/step, hand {w['hand_ms_per_step']:.1f} ms/step, "
              f"one-by-one {serial[0]:.0f} / {serial[1]:.0f} / eager {serial[2]:.0f} ms/step (extrapolated)",
              flush=True)  # fmt: skip

    number, repeat = (2, 2) if args.tiny else (5, 8)
    profiling = harness.companion("vectorized_profile", __package__)
    prototypes = harness.companion("vectorized_prototypes", __package__)
    if args.profile:
        torch.set_num_threads(args.threads[0])
        result["profile"] = profiling.profile(x, y, init, args.seed, number, repeat)
    if args.prototypes:
        result["prototypes"] = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            result["prototypes"][str(threads)] = prototypes.run_prototypes(x, y, init, args.seed, number, repeat)
    result["load_average_at_end"] = harness.load_average()
    result["wall_time_s"] = time.perf_counter() - started

    print_report(result)
    print(f"\nwrote {harness.write_json(args.out, result)}")
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
    header = ["threads", "clock", "ours", "hand", "ours/hand", "paired", "1-by-1 MCMC", "1-by-1 kern",
              "1-by-1 eager", "speed-up M/k/eager", "<=1.5x", ">=10x"]  # fmt: skip
    rows = []
    for threads, entry in result["threads"].items():
        for clock in ("wall", "cpu"):
            e = entry[clock]
            rows.append([
                threads, clock, f"{e['ours_ms_per_step']:.1f}", f"{e['hand_ms_per_step']:.1f}",
                f"{e['ratio_ours_over_hand']:.2f}", f"{e['ratio_ours_over_hand_paired_median']:.2f}",
                *(f"{e[f'one_by_one_{k}_ms_per_step_extrapolated']:.0f}"
                  for k in ("pyro_mcmc", "setup_chains", "pyro_mcmc_eager")),
                " / ".join(f"{e[f'speedup_vs_one_by_one_{k}']:5.1f}"
                           for k in ("pyro_mcmc", "setup_chains", "pyro_mcmc_eager")),
                "pass" if e["pass_within_1.5x_of_hand"] else "FAIL",
                "pass" if e["pass_10x_over_one_by_one"] else "FAIL",
            ])  # fmt: skip
    print(harness.text_table(header, rows))
    for threads, entry in result["threads"].items():
        print(
            f"threads={threads}: set-up ours {entry['ours_setup_s']:.2f} s, hand {entry['hand_setup_s']:.2f} s, "
            f"one-by-one (pyro.infer.MCMC) {entry['one_by_one_pyro_mcmc_setup_per_chain_s']:.3f} s per chain"
        )
    if "profile" in result:
        harness.companion("vectorized_profile", __package__).print_profile(result["profile"])
    if "prototypes" in result:
        harness.companion("vectorized_prototypes", __package__).print_prototypes(result["prototypes"])
    print(f"\nload average at start {result['load_average_at_start']}, at end {result['load_average_at_end']}; "
          f"wall time {result['wall_time_s']:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
