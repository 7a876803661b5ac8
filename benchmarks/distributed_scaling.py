"""Benchmark: 1 against 2 processes (torchrun, gloo, loopback) for the two distributed modes.

Workload: Bayesian logistic regression, ``D`` features (N(0, 1) priors), ``N`` synthetic data.

``chains``
    :class:`pyro_sgmcmc.distributed.DistributedMCMC`, SGHMC, ``--chains`` chains in total (each
    rank runs its block vectorised), minibatches of ``--chain-batch``. Strong scaling: the same
    chains on 1 or 2 processes.
``data``
    :func:`pyro_sgmcmc.distributed.data_parallel`, SGHMC, ``--dp-chains`` chains replicated on
    every rank, a combined minibatch of ``--dp-batch`` split over the ranks (each holds ``N / P``
    data). Strong scaling: the same combined minibatch on 1 or 2 processes.

Timing: every rank stamps the wall clock and its own CPU time after every step (``hook_fn``); a
run's cost is the median step after the first ``--skip`` steps (set-up and the first steps
excluded), wall time from rank 0, CPU time the largest over the ranks. Runs with 1 and 2
processes are interleaved and repeated ``--repeats`` times; the table gives the medians over
repeats and the speed-up ``t(1) / t(2)``. Each process uses one thread (``OMP_NUM_THREADS=1``),
so 2 processes use 2 cores. The machine is shared: background load inflates wall times, the CPU
times show the work done.

Run it (it starts ``torchrun`` itself)::

    python benchmarks/distributed_scaling.py                  # about 2-4 minutes on 2 cores
    python benchmarks/distributed_scaling.py --tiny           # seconds, smoke test only

Worker mode (what each torchrun process runs)::

    torchrun --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=29511 \\
        benchmarks/distributed_scaling.py --worker --mode chains --out /tmp/x.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package, also when another copy is installed

if __package__:  # imported as benchmarks.distributed_scaling
    from . import harness  # noqa: E402
else:  # run as a script (or by torchrun): benchmarks/ is on sys.path
    import harness  # noqa: E402


def logistic_model(x, y, batch):
    import pyro
    import pyro.distributions as dist
    import torch

    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def make_data(n: int, d: int):
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d**0.5
    y = torch.bernoulli(torch.sigmoid(x @ w), generator=g)
    return x, y


def worker(args) -> None:
    """One torchrun process: run the mode, write rank 0's timings to ``args.out``."""
    import faulthandler

    faulthandler.enable()  # a crash in native code prints the Python stacks
    import torch
    import torch.distributed as dist

    from pyro_sgmcmc import MCMC, SGHMC
    from pyro_sgmcmc.distributed import DistributedMCMC, data_parallel, init_distributed, shard

    torch.set_num_threads(1)
    rank, world = init_distributed("gloo")
    x, y = make_data(args.num_data, args.features)
    stamps = []

    def hook(kernel, params, phase, step):
        stamps.append(harness.now())

    steps = args.skip + args.steps
    kernel = SGHMC(logistic_model, step_size=1e-2, friction=1.0, **harness.SAME_MATHS)  # as measured in the docs
    if args.mode == "chains":
        mcmc = DistributedMCMC(kernel, num_samples=steps, warmup_steps=0, num_chains=args.chains, seed=0,
                               hook_fn=hook, disable_progbar=True, keep_last=1)  # fmt: skip
        mcmc.run(x, y, args.chain_batch)
    else:
        x, y = shard((x, y))
        mcmc = MCMC(data_parallel(kernel), num_samples=steps, warmup_steps=0, num_chains=args.dp_chains,
                    chain_method="vectorized", seed=0, hook_fn=hook, disable_progbar=True, keep_last=1)  # fmt: skip
        mcmc.run(x, y, args.dp_batch // world)
    step = harness.step_summary(stamps, stamps[0], args.skip)  # the median step after the first ``skip``
    timing = torch.tensor([step["median_ms"] / 1e3, step["cpu_median_ms"] / 1e3], dtype=torch.float64)
    gathered = [torch.zeros_like(timing) for _ in range(world)]
    dist.all_gather(gathered, timing)
    if rank == 0:
        timings = {"wall": float(gathered[0][0]), "cpu": max(float(t[1]) for t in gathered), "world": world}
        harness.write_json(args.out, timings)
    dist.barrier()  # everyone is done before the group goes away
    dist.destroy_process_group()
    # torch 2.13 + gloo: a process that used collectives sometimes aborts during interpreter
    # shutdown (SIGABRT, "terminate called without an active exception") after its work is done;
    # leave without finalisation (the timings are written and flushed).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_once(args, mode: str, nprocs: int) -> dict:
    from pyro_sgmcmc.distributed import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timing.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nprocs}", "--nnodes=1",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, "--worker", "--mode", mode,
               "--out", str(out)] + args.forward  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"torchrun failed:\n{done.stdout}\n{done.stderr}")
        result = json.loads(out.read_text())
        result["launch_seconds"] = time.perf_counter() - start
        return result


def main() -> None:
    parser = harness.parser(__doc__, ROOT / "benchmarks" / "distributed_scaling_results.json",
                            "small sizes, 1 repeat: a smoke test")  # fmt: skip
    parser.add_argument("--worker", action="store_true", help="run as one torchrun process")
    parser.add_argument("--mode", choices=["chains", "data"], default="chains")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-data", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=200)
    parser.add_argument("--chains", type=int, default=256)
    parser.add_argument("--chain-batch", type=int, default=256)
    parser.add_argument("--dp-chains", type=int, default=16)
    parser.add_argument("--dp-batch", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5)
    args = parser.parse_args()
    if args.tiny:
        args.repeats, args.num_data, args.features, args.chains, args.chain_batch = 1, 2000, 10, 8, 32
        args.dp_chains, args.dp_batch, args.steps, args.skip = 2, 64, 5, 2
    if args.worker:
        return worker(args)
    args.forward = [
        f"--num-data={args.num_data}", f"--features={args.features}", f"--chains={args.chains}",
        f"--chain-batch={args.chain_batch}", f"--dp-chains={args.dp_chains}", f"--dp-batch={args.dp_batch}",
        f"--steps={args.steps}", f"--skip={args.skip}",
    ]  # fmt: skip
    context = harness.run_context(worker_torch_threads=1)  # each worker runs on one thread (its launch sets it)
    print(harness.context_line(context, threads=1), flush=True)
    runs = {mode: {1: [], 2: []} for mode in ("chains", "data")}
    for repeat in range(args.repeats):
        for mode in runs:
            order = (1, 2) if repeat % 2 == 0 else (2, 1)  # alternate which goes first
            for nprocs in order:
                result = run_once(args, mode, nprocs)
                runs[mode][nprocs].append(result)
                wall, cpu, launch = 1e3 * result["wall"], 1e3 * result["cpu"], result["launch_seconds"]
                print(f"repeat {repeat} {mode:6s} P={nprocs}: {wall:.1f} ms/step wall, {cpu:.1f} ms/step CPU "
                      f"(launch {launch:.1f} s)", flush=True)  # fmt: skip
    summary = {}
    for mode, by_procs in runs.items():
        row = {}
        for nprocs, results in by_procs.items():
            row[f"wall_ms_{nprocs}"] = 1e3 * statistics.median(r["wall"] for r in results)
            row[f"cpu_ms_{nprocs}"] = 1e3 * statistics.median(r["cpu"] for r in results)
        row["speedup_wall"] = row["wall_ms_1"] / row["wall_ms_2"]
        row["speedup_cpu"] = row["cpu_ms_1"] / row["cpu_ms_2"]
        summary[mode] = row
    print(f"\n{'mode':8s} {'1 proc ms/step':>15s} {'2 procs ms/step':>16s} {'speed-up':>9s}   (wall; CPU in brackets)")
    for mode, row in summary.items():
        print(f"{mode:8s} {row['wall_ms_1']:9.1f} ({row['cpu_ms_1']:.1f}) {row['wall_ms_2']:9.1f} "
              f"({row['cpu_ms_2']:.1f}) {row['speedup_wall']:6.2f}x ({row['speedup_cpu']:.2f}x)")  # fmt: skip
    settings = {k: v for k, v in vars(args).items() if k not in ("forward", "worker", "out", "mode")}
    load = harness.load_average()
    result = {"context": context, "settings": settings, "summary": summary, "runs": runs, "load_average_at_end": load}
    print(harness.context_line(context, load, threads=1))
    print(f"wrote {harness.write_json(args.out, result)}")


if __name__ == "__main__":
    main()
