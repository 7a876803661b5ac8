"""Benchmark: resident memory over 20,000 SGHMC steps stays flat (beyond the draws that are kept).

Three runs on the small Bayesian MLP of ``benchmarks/peers.py`` (``models.py``; 3,151 weights, N = 10,000, B = 128):

``kernel``
    one chain, ``kernel.setup_chains`` then 20,000 ``kernel.step()`` calls: nothing is kept, so any growth
    would come from the step itself (traces, autograd graphs, caches);
``vectorized keep_last=1``
    ``pyro_sgmcmc.MCMC(..., num_chains=16, chain_method="vectorized", keep_last=1)``, 20,000 steps;
``vectorized thinning=100``
    the same keeping every 100th draw: 200 draws of 16 chains, whose size (positions and statistics) is
    the growth to expect.

The resident set size (``/proc/self/statm``) is read every 500 steps (through ``hook_fn`` for the MCMC
runs). Reported: RSS after the first 1,000 steps (allocator warm-up done), at the end, the growth, the
growth expected from the kept draws, and the slope of a least-squares line through the second half of
the readings (MB per 10,000 steps). The verdict "flat" requires the unexplained growth to stay under
5 MB (the allocator's granularity on this machine is a few MB).

Run::

    python benchmarks/memory.py            # about 3 minutes on a quiet machine
    python benchmarks/memory.py --tiny     # 2,000 steps: smoke test
"""

from __future__ import annotations

import time

import pyro
import torch

from pyro_sgmcmc import MCMC, SGHMC

if __package__:  # imported as benchmarks.memory
    from . import harness
    from .models import FRICTION, SIZES, STEP_SIZE, dim, make_data, make_model
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    from models import FRICTION, SIZES, STEP_SIZE, dim, make_data, make_model

EVERY = 500


def rss_mb() -> float:
    return harness.rss_bytes() / 2**20


def summarise(readings, expected_mb: float) -> dict:
    """RSS after 1,000 steps and at the end, the growth against ``expected_mb``, and the least-squares slope
    through the second half of the readings."""
    steps = [s for s, _ in readings]
    values = [m for _, m in readings]
    start = next(m for s, m in readings if s >= 1000)
    half = [(s, m) for s, m in readings if s >= steps[-1] / 2]
    n = len(half)
    mean_s = sum(s for s, _ in half) / n
    mean_m = sum(m for _, m in half) / n
    slope = sum((s - mean_s) * (m - mean_m) for s, m in half) / max(sum((s - mean_s) ** 2 for s, _ in half), 1e-12)
    growth = values[-1] - start
    return {
        "rss_after_1000_steps_mb": start,
        "rss_end_mb": values[-1],
        "growth_mb": growth,
        "expected_growth_mb": expected_mb,
        "unexplained_growth_mb": growth - expected_mb,
        "slope_second_half_mb_per_10k_steps": 1e4 * slope,
        "flat": abs(growth - expected_mb) < 5.0,
        "readings": readings,
    }


def make_kernel(hidden: int) -> SGHMC:
    return SGHMC(make_model(hidden), step_size=STEP_SIZE, friction=FRICTION, **harness.SAME_MATHS)


def run_kernel(x, y, hidden, steps):
    kernel = make_kernel(hidden)
    readings = []
    with pyro.validation_enabled(False):
        kernel.setup_chains(0, (x, y), {}, num_chains=1, seed=0)
        for t in range(1, steps + 1):
            kernel.step()
            if t % EVERY == 0:
                readings.append((t, rss_mb()))
    return summarise(readings, 0.0)


def run_vectorized(x, y, hidden, steps, chains, thinning, keep_last):
    readings = []

    def hook(kernel, params, stage, t):
        if kernel.state.step % EVERY == 0:  # steps of the whole run (t restarts at sampling)
            readings.append((t + 1, rss_mb()))

    mcmc = MCMC(
        make_kernel(hidden), num_samples=steps // thinning, warmup_steps=0, num_chains=chains,
        chain_method="vectorized", thinning=thinning, keep_last=keep_last, seed=0, hook_fn=hook,
        disable_progbar=True,
    )  # fmt: skip
    mcmc.run(x, y)
    kept = (steps // thinning) if keep_last is None else min(keep_last, steps // thinning)
    # each kept draw: the positions (chains x dim) and the statistics (a handful of per-chain scalars)
    stats_bytes = sum(v[:, 0].element_size() * chains for v in mcmc.sample_stats.values())
    expected = kept * (chains * dim(hidden) * 4 + stats_bytes) / 2**20
    return summarise(readings, expected)


def main(argv=None):
    parser = harness.parser(__doc__, harness.RESULTS / "memory.json", "2,000 steps: smoke test (nothing written)")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--chains", type=int, default=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    steps = 2000 if args.tiny else args.steps
    x, y = make_data()
    hidden = SIZES["small"]
    results = {"steps": steps, "chains": args.chains, "context": harness.run_context(), "runs": {}}
    for name, fn in (
        ("kernel (1 chain)", lambda: run_kernel(x, y, hidden, steps)),
        ("vectorized keep_last=1", lambda: run_vectorized(x, y, hidden, steps, args.chains, 1, 1)),
        ("vectorized thinning=100", lambda: run_vectorized(x, y, hidden, steps, args.chains, 100, None)),
    ):
        start = time.perf_counter()
        r = fn()
        r["seconds"] = time.perf_counter() - start
        results["runs"][name] = r
        print(
            f"{name:<26} RSS {r['rss_after_1000_steps_mb']:7.1f} -> {r['rss_end_mb']:7.1f} MB "
            f"(growth {r['growth_mb']:+6.1f}, expected {r['expected_growth_mb']:5.1f}, "
            f"slope {r['slope_second_half_mb_per_10k_steps']:+5.2f} MB/10k steps) "
            f"{'flat' if r['flat'] else 'GROWS'}  [{r['seconds']:.0f} s]"
        )
    results["load_after"] = harness.load_average()
    print(harness.context_line(results["context"], results["load_after"]))
    if not args.tiny:
        harness.write_json(args.out, results, indent=1)
    return results


if __name__ == "__main__":
    main()
