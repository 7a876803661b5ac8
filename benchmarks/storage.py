"""Benchmark: resident memory of the kept draws, and the cost of checkpoints (issue #20 points 1-2).

Model: a Bayesian logistic regression with ``D = 144`` weights (N = 2,000, B = 32), the size of the
issue's measurements (0.59 GB for 256 chains x 4,000 draws of float32 positions). Step-size and
mass-matrix adaptation are off and warmup is 10 steps, so the run is the storage path only.

``memory``
    Each configuration runs in a fresh process. The resident set size (``/proc/self/statm``) is read
    in ``hook_fn`` every ``steps / 40`` steps; the growth from the first reading after warmup to the
    last one (inside the run, before ``run()`` builds its result) is divided by the bytes of the draws
    kept in between (positions and statistics). 1.0 is the ideal; the issue measured 6.6-7.4 before.
    After ``run()``, ``get_samples()`` makes the one final copy (constrained values), reported apart.
``checkpoint``
    2,000 steps of 16 chains without checkpoints, with ``checkpoint=CheckpointSettings(path, every=10)``
    (200 writes, each file fsync-ed) and with ``sync=False`` too, interleaved, the fastest of 3 runs each: the ratios
    of the wall times, the last index write's time and the files' sizes.

Run::

    python benchmarks/storage.py                # about 3 minutes on a quiet machine
    python benchmarks/storage.py --tiny         # smoke test
    python benchmarks/storage.py --plot docs/_static/storage_rss.png
    PYRO_SGMCMC_PATH=/path/to/old/checkout python benchmarks/storage.py --out old.json   # another version
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch

if __package__:  # imported as benchmarks.storage
    from . import harness
else:  # run as a script (or with benchmarks/ on sys.path, as tests/test_storage.py imports it)
    import harness

ROOT = harness.ROOT
DIM, N, B = 144, 2000, 32
REPEATS = 3


def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([DIM]).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=B) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, DIM, generator=g) / DIM**0.5
    y = (x @ torch.randn(DIM, generator=g) > 0).float()
    return x, y


def make_mcmc(chains: int, draws: int, hook=None, **options):
    from pyro_sgmcmc import MCMC, SGLD

    kernel = SGLD(model, step_size=1e-3, adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)
    return MCMC(kernel, num_samples=draws, warmup_steps=10, num_chains=chains, chain_method="vectorized",
                seed=0, hook_fn=hook, disable_progbar=True, **options)  # fmt: skip


def measure_memory(chains: int, draws: int) -> dict:
    """One run; RSS read in the hook (inside the run) and after get_samples (the final copy)."""
    torch.set_num_threads(1)
    every = max(1, draws // 40)
    readings = []

    def hook(kernel, params, stage, t):
        if stage == "Sample" and t % every == 0:  # t counts the draws (from 0), as in Pyro's hook_fn
            readings.append((t + 1, harness.rss_bytes()))  # (draws kept so far, RSS)

    mcmc = make_mcmc(chains, draws, hook)
    mcmc.run(*data())
    after_run = harness.rss_bytes()
    samples = mcmc.get_samples(group_by_chain=True)
    after_copy = harness.rss_bytes()
    per_draw = chains * DIM * 4 + sum(v[:, 0].nelement() * v.element_size() for v in mcmc.sample_stats.values())
    (k0, r0), (k1, r1) = readings[0], readings[-1]
    return {
        "chains": chains,
        "draws": draws,
        "draw_bytes": per_draw * draws,
        "bytes_per_draw": per_draw,
        "rss_growth_in_run": r1 - r0,
        "draw_bytes_in_run": per_draw * (k1 - k0),
        "ratio": (r1 - r0) / (per_draw * (k1 - k0)),
        "final_copy_bytes": after_copy - after_run,
        "samples_bytes": sum(v.nelement() * v.element_size() for v in samples.values()),
        "readings": [(k, r) for k, r in readings],
    }


def _checkpoint_options(path: Path, every: int, sync: bool) -> dict:
    """``MCMC``'s keywords for a checkpoint at ``path`` every ``every`` steps (``sync``: ``fsync`` each write)."""
    try:
        from pyro_sgmcmc import CheckpointSettings
    except ImportError:  # an older version (to compare with): the previous release's keywords
        return {"checkpoint_path": path, "checkpoint_every": every, **({} if sync else {"checkpoint_sync": False})}
    return {"checkpoint": CheckpointSettings(path, every=every, sync=sync)}


def measure_checkpoint(steps: int, chains: int, every: int) -> dict:
    """Wall time of ``steps`` steps without checkpoints, with ``CheckpointSettings(path, every=every)``
    (fsync-ed), and with ``sync=False``; the last index write's time and the files' sizes."""
    torch.set_num_threads(1)
    x, y = data()
    import pyro_sgmcmc.mcmc as mcmc_module

    writes = []
    try:  # the run's checkpoint class; older versions (to compare with) kept it in mcmc.py, or had one function
        from pyro_sgmcmc.run.checkpoint import RunCheckpoint as checkpoint_class
    except ImportError:
        checkpoint_class = getattr(mcmc_module, "_RunCheckpoint", None)
    owner, attribute = (checkpoint_class, "write") if checkpoint_class else (mcmc_module, "save_checkpoint")
    original = getattr(owner, attribute)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        original(*args, **kwargs)
        writes.append(time.perf_counter() - start)

    setattr(owner, attribute, timed)
    out = {"draw_bytes": chains * (steps - 10) * DIM * 4, "repeats": REPEATS}
    runs = [name for _ in range(REPEATS) for name in ("plain", "checkpointed", "checkpointed_nosync")]
    for name in runs:  # interleaved, the fastest of REPEATS kept: the machine is shared
        with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks") as tmp:  # on the disk, not a tmpfs
            path = Path(tmp) / "run.ckpt"
            options = {} if name == "plain" else _checkpoint_options(path, every, sync=name == "checkpointed")
            writes.clear()
            try:
                mcmc = make_mcmc(chains, steps - 10, **options)
            except TypeError:  # a version without checkpoint_sync
                out[name] = math.nan
                continue
            start = time.perf_counter()
            mcmc.run(x, y)
            out[name] = min(out.get(name, math.inf), time.perf_counter() - start)
            if name == "checkpointed":
                directory = path.with_name(path.name + ".draws")
                files = list(directory.iterdir()) if directory.is_dir() else []  # (before #20: one file)
                # blob-*: the permutation tables of checkpoint format 2 (an older package); none since format 3
                chunks = [p for p in files if not p.name.startswith("blob-")]
                out["table_files"] = len(files) - len(chunks)
                out["index_bytes"] = path.stat().st_size
                out["chunk_bytes"] = sum(p.stat().st_size for p in chunks)
                out["num_chunks"] = len(chunks)
                out["last_write_s"] = writes[-1]
    out["ratio"] = out["checkpointed"] / out["plain"]
    out["ratio_nosync"] = out["checkpointed_nosync"] / out["plain"]
    return out


def _child(kind: str, *numbers: int) -> dict:
    """Run one measurement in a fresh process (clean RSS), return its JSON."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, *map(str, numbers)],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYRO_SGMCMC_PATH", str(ROOT))},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = harness.parser(__doc__, ROOT / "benchmarks" / "storage_results.json", "smaller runs (nothing written)")
    parser.add_argument("--child", nargs="+", help="KIND NUMBERS...: one measurement (in this process)")
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    if args.child:
        kind, *numbers = args.child
        result = measure_memory(*map(int, numbers)) if kind == "memory" else measure_checkpoint(*map(int, numbers))
        print(json.dumps(result))
        return result
    memory_runs = [(1, 2000), (256, 100)] if args.tiny else [(1, 50_000), (256, 4000)]
    steps = 200 if args.tiny else 2000
    # each measurement runs in a child process on one torch thread (it sets it)
    results = {"context": harness.run_context(child_torch_threads=1), "memory": [], "checkpoint": None}
    print(harness.context_line(results["context"], threads=1), flush=True)
    for chains, draws in memory_runs:
        r = _child("memory", chains, draws)
        results["memory"].append(r)
        print(
            f"memory  {chains:4d} chains x {draws:6d} draws: draws {r['draw_bytes'] / 2**20:8.1f} MB, "
            f"RSS growth in the run / draw bytes = {r['ratio']:.2f}; "
            f"final copy {r['final_copy_bytes'] / 2**20:7.1f} MB "
            f"(samples {r['samples_bytes'] / 2**20:.1f} MB)"
        )
    r = _child("checkpoint", steps, 16, 10)
    results["checkpoint"] = r
    print(
        f"checkpoint {steps} steps x 16 chains: plain {r['plain']:.2f} s, "
        f"every=10 {r['checkpointed']:.2f} s (ratio {r['ratio']:.2f}; without fsync "
        f"{r['checkpointed_nosync']:.2f} s, ratio {r['ratio_nosync']:.2f}); "
        f"last write {1e3 * r['last_write_s']:.1f} ms, index "
        f"{r['index_bytes'] / 1e3:.1f} kB, {r['num_chunks']} chunks {r['chunk_bytes'] / 1e6:.2f} MB for "
        f"{r['draw_bytes'] / 1e6:.2f} MB of draws"
    )
    results["load_after"] = harness.load_average()
    print(harness.context_line(results["context"], results["load_after"], threads=1))
    if not args.tiny:
        harness.write_json(args.out, results, indent=1)
    if args.plot:
        plot(results, args.plot)
    return results


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results["memory"]), figsize=(5 * len(results["memory"]), 3.6))
    for ax, r in zip(axes, results["memory"]):
        kept = [k for k, _ in r["readings"]]
        rss = [(m - r["readings"][0][1]) / 2**20 for _, m in r["readings"]]
        ax.plot(kept, rss, "o-", ms=3, label="RSS growth")
        ax.plot(kept, [(k - kept[0]) * r["bytes_per_draw"] / 2**20 for k in kept], "k--", label="bytes of the draws")
        ax.set(xlabel="draws kept", ylabel="MB", title=f"{r['chains']} chain(s): ratio {r['ratio']:.2f}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
