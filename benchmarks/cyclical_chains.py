"""256 cyclical SGLD chains in one vectorised run on 25 Gaussians: nested R-hat overall and per mode basin.

The many-chains workload of issue 28. The target is ``cyclical_mixture.py``'s (25 equal Gaussians on the grid
``{-4, -2, 0, 2, 4}^2``, variance 0.03, exact gradients). Each sampler is ONE
``pyro_sgmcmc.MCMC(SGLD(...), num_chains=--chains, num_superchains=--superchains, chain_method="vectorized")``
run; the chains of a superchain start from one point, the superchains' points uniform on ``[-5, 5]^2``
(over-dispersed: every basin can be a start), and differ by their random streams only. Samplers, all
``Cyclical(num_cycles=--steps / 1000, num_steps=--steps, exploration=0.25)``:

* ``cyclical, defaults``: the peak is each chain's adapted step size (``peak_factor=1``);
* ``cyclical, peak_factor 20``: the peak is 20 times the adapted step (near the stability limit of gradient
  descent in a mode, where the cycles start to cross);
* ``cyclical, peak 0.09``: the paper's fixed peak, no adaptation (``cyclical_mixture.py``'s crossing run).

Every returned draw (sampling stages only) is assigned to its *basin*, the nearest mode (the grid point nearest
in each coordinate). Reported per sampler: the time of the run (kernel and ``MCMC`` set-up included); the basins
each chain visits; per basin, how many chains and superchains have draws in it, its share of the draws (the
target's: 1/25), and the nested R-hat of the draws *within* it (``within_basin_rhat``, the largest over the two
coordinates); and overall, the nested R-hat of the draws (``rhat_x``) and of each basin's indicator
``1[draw in basin]`` (``rhat_weights``: do the superchains agree on the modes' weights?), with the root mean
square distance of the draws to their mode's mean (``within_mode_sd``; the target's is 0.173, which R-hat
cannot see: chains that agree on a wrong spread have an R-hat of 1).

Nested R-hat within a basin needs a balanced array (``pyro_sgmcmc.nested_rhat``: ``K`` superchains of ``M``
chains of ``N`` draws): the chains with at least ``MIN_DRAWS`` draws in the basin count; ``M`` is chosen to
make ``K M`` largest with ``K >= 2`` superchains holding ``M`` such chains (their first ``M``), and ``N`` is the
fewest draws any of them has there (each keeps ``N`` of its draws in the basin, evenly spaced). A basin that
only one superchain reaches has no within-basin R-hat (``None``): nested R-hat compares superchains.

Run with one thread (4.6 minutes on the shared 2-core machine at load 6.5, 2026-11-27; ``--tiny``: seconds)::

    OMP_NUM_THREADS=1 python benchmarks/cyclical_chains.py --plot docs/_static/gallery/cyclical_chains.png
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pyro
import torch

from pyro_sgmcmc import MCMC, SGLD, Cyclical
from pyro_sgmcmc.diagnostics import nested_rhat

if __package__:  # imported as benchmarks.cyclical_chains
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

mixture = harness.companion("cyclical_mixture", __package__)  # the target: model, MEANS, VARIANCE
OUT = harness.ROOT / "benchmarks" / "cyclical_chains_results.json"
NUM_BASINS = 25
MIN_DRAWS = 100  # draws in a basin for a chain to count in its within-basin R-hat
START_BOX = 5.0


def samplers(steps: int) -> Dict[str, dict]:
    cycles = max(1, steps // mixture.STEPS_PER_CYCLE)
    fixed = dict(adapt_step_size=False, adapt_mass_matrix=False)
    return {
        "cyclical, defaults": dict(step_size=Cyclical(cycles, steps, exploration=0.25)),
        "cyclical, peak_factor 20": dict(step_size=Cyclical(cycles, steps, exploration=0.25, peak_factor=20.0)),
        "cyclical, peak 0.09": dict(step_size=Cyclical(cycles, steps, exploration=0.25, peak=0.09), **fixed),
    }


def basin_of(draws: torch.Tensor) -> torch.Tensor:
    """Index into ``MEANS`` of the nearest mode: on a product grid, the nearest grid value per coordinate."""
    index = ((draws.double() + 4.0) / 2.0).round().clamp(0, 4).long()
    return index[..., 0] * 5 + index[..., 1]


def within_basin_rhat(draws: np.ndarray, basins: np.ndarray, superchains: np.ndarray, basin: int) -> dict:
    """Nested R-hat of the draws in ``basin`` on a balanced subset (module docstring); ``rhat`` None if fewer
    than two superchains have a chain with ``MIN_DRAWS`` draws there."""
    counts = (basins == basin).sum(axis=1)  # (C,)
    eligible = counts >= MIN_DRAWS
    labels = np.unique(superchains)
    per_superchain = {s: np.flatnonzero(eligible & (superchains == s)) for s in labels}
    best, size = None, 0
    for m in range(1, max(len(v) for v in per_superchain.values()) + 1):
        k = sum(len(v) >= m for v in per_superchain.values())
        if k >= 2 and k * m > size:
            best, size = m, k * m
    if best is None:
        return {"rhat": None, "superchains": 0, "chains_per_superchain": 0, "draws_per_chain": 0}
    chosen = [v[:best] for v in per_superchain.values() if len(v) >= best]
    chains = np.concatenate(chosen)
    n = int(counts[chains].min())
    subset = np.stack(
        [draws[c][basins[c] == basin][np.linspace(0, counts[c] - 1, n).round().astype(int)] for c in chains]
    )
    ids = np.repeat(np.arange(len(chosen)), best)
    rhat = nested_rhat(subset, ids)
    return {
        "rhat": float(np.max(rhat)),
        "superchains": len(chosen),
        "chains_per_superchain": best,
        "draws_per_chain": n,
    }


def finite_or_text(value) -> object:
    """A float, or ``"inf"`` (JSON has no infinity): R-hat is infinite when every superchain stays in its own
    basins, so that the indicator of a basin does not vary within any superchain (``W = 0``)."""
    return float(value) if np.isfinite(value) else "inf"


def analyse(draws: torch.Tensor, superchains: torch.Tensor) -> dict:
    """Per-basin and overall figures of ``draws`` ``(C, S, 2)`` (module docstring)."""
    basins = basin_of(draws).numpy()  # (C, S)
    x, ids = draws.double().numpy(), superchains.numpy()
    per_basin = []
    for b in range(NUM_BASINS):
        inside = basins == b
        visiting = inside.any(axis=1)
        per_basin.append({
            "basin": b,
            "mode": mixture.MEANS[b].tolist(),
            "chains_visiting": int(visiting.sum()),
            "superchains_visiting": len(np.unique(ids[visiting])),
            "share_of_draws": float(inside.mean()),
            **{k if k != "rhat" else "within_basin_rhat": v for k, v in within_basin_rhat(x, basins, ids, b).items()},
        })  # fmt: skip
    indicators = np.stack([basins == b for b in range(NUM_BASINS)], axis=-1).astype(np.float64)  # (C, S, 25)
    visited = indicators.any(axis=(0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a basin no draw reaches: a constant indicator
        rhat_weights = nested_rhat(indicators[..., visited], ids)
    # W = 0 exactly where no superchain's indicator varies (each stays in or out of the basin): R-hat is infinite,
    # which the centring in floating point would give as a huge finite number
    by_superchain = [indicators[ids == s][..., visited] for s in np.unique(ids)]
    constant = np.all([group.min(axis=(0, 1)) == group.max(axis=(0, 1)) for group in by_superchain], axis=0)
    rhat_weights = np.where(constant, np.inf, rhat_weights)
    offset = x - mixture.MEANS.numpy()[basins]
    rhats = [r["within_basin_rhat"] for r in per_basin if r["within_basin_rhat"] is not None]
    basins_per_chain = [len(np.unique(row)) for row in basins]
    return {
        "draws_per_chain": int(draws.shape[1]),
        "basins_per_chain_mean": float(np.mean(basins_per_chain)),
        "basins_per_chain_min": int(np.min(basins_per_chain)),
        "basins_per_chain_max": int(np.max(basins_per_chain)),
        "basins_visited": int(visited.sum()),
        "rhat_x": float(np.max(nested_rhat(x, ids))),
        "rhat_weights_max": finite_or_text(np.nanmax(rhat_weights)),
        "rhat_weights_median": finite_or_text(np.nanmedian(rhat_weights)),
        "within_basin_rhat_max": max(rhats) if rhats else None,
        "within_basin_rhat_median": float(np.median(rhats)) if rhats else None,
        "basins_with_within_rhat": len(rhats),
        "share_of_draws_max": max(r["share_of_draws"] for r in per_basin),
        "within_mode_sd": float(np.sqrt((offset**2).mean())),
        "per_basin": per_basin,
    }


def run_one(name: str, settings: dict, args, starts: torch.Tensor) -> dict:
    """One vectorised run of all the chains, timed from the kernel's construction to the last draw."""
    start = time.perf_counter()
    pyro.set_rng_seed(args.seed)
    kernel = SGLD(mixture.model, num_data=1, control_variate=None, **settings)
    mcmc = MCMC(kernel, num_samples=args.steps, warmup_steps=args.warmup, num_chains=args.chains,
                num_superchains=args.superchains, chain_method="vectorized", seed=args.seed,
                initial_params={"x": starts}, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # slow-mixing warnings: chains that stay in a mode are the point
        mcmc.run()
    seconds = time.perf_counter() - start
    draws = mcmc.get_samples(group_by_chain=True)["x"]
    started = time.perf_counter()
    result = {"sampler": name, **analyse(draws, mcmc.superchain_ids)}
    step_size = mcmc.sample_stats["step_size"]
    result.update(
        seconds=round(seconds, 2),
        steps_per_second=round((args.warmup + args.steps) / seconds, 1),
        analysis_seconds=round(time.perf_counter() - started, 2),
        largest_step_size_mean=float(step_size.max(dim=1).values.mean()),
    )
    return result


def plot(results: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(3.6 * len(results), 7.0), squeeze=False)
    for column, result in enumerate(results):
        rows = result["per_basin"]
        share = np.array([r["share_of_draws"] for r in rows]).reshape(5, 5).T  # rows: second coordinate
        rhat = np.array([np.nan if r["within_basin_rhat"] is None else r["within_basin_rhat"] for r in rows])
        top, bottom = axes[0, column], axes[1, column]
        image = top.imshow(share * NUM_BASINS, origin="lower", extent=(-5, 5, -5, 5), cmap="viridis", vmin=0)
        fig.colorbar(image, ax=top, shrink=0.8, label="share of draws x 25 (target 1)")
        top_value = float(np.nanmax(rhat)) if np.isfinite(rhat).any() else 1.1
        image = bottom.imshow(rhat.reshape(5, 5).T, origin="lower", extent=(-5, 5, -5, 5), cmap="magma_r",
                              vmin=1.0, vmax=max(1.1, top_value))  # fmt: skip
        fig.colorbar(image, ax=bottom, shrink=0.8, label="nested R-hat within the basin")
        for r in rows:
            x, y = r["mode"]
            top.text(x, y, str(r["chains_visiting"]), ha="center", va="center", fontsize=7, color="w")
            label = "-" if r["within_basin_rhat"] is None else f"{r['within_basin_rhat']:.3f}"
            bottom.text(x, y, label, ha="center", va="center", fontsize=6.5, color="tab:blue")
        top.set_title(f"{result['sampler']}\nchains visiting; overall R-hat {result['rhat_x']:.2f}", fontsize=9)
        weights = _number(result["rhat_weights_max"])
        bottom.set_title(f"nested R-hat within each basin\nbasin weights' R-hat: max {weights}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _number(value) -> str:
    return value if isinstance(value, str) else f"{value:.3f}"


def describe(result: dict) -> str:
    within = result["within_basin_rhat_max"]
    within = "none" if within is None else f"median {result['within_basin_rhat_median']:.3f}, max {within:.3f}"
    return (f"{result['sampler']:24s} basins per chain {result['basins_per_chain_mean']:.1f} "
            f"[{result['basins_per_chain_min']}, {result['basins_per_chain_max']}], all chains "
            f"{result['basins_visited']}/25, largest share of draws {result['share_of_draws_max']:.3f} (target 0.04); "
            f"nested R-hat: x {result['rhat_x']:.3f}, basin weights median {_number(result['rhat_weights_median'])} "
            f"max {_number(result['rhat_weights_max'])}, within a basin ({result['basins_with_within_rhat']} basins) "
            f"{within}; sd within a mode {result['within_mode_sd']:.3f} (target {math.sqrt(mixture.VARIANCE):.3f}); "
            f"{result['seconds']} s with set-up ({result['steps_per_second']} steps/s)")  # fmt: skip


def main(argv: Optional[list] = None) -> None:
    p = harness.parser(__doc__, OUT)
    p.add_argument("--chains", type=int, default=256)
    p.add_argument("--superchains", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--steps", type=int, default=20000, help="sampling steps per chain (K)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, help="write the per-basin picture here (PNG)")
    args = p.parse_args(argv)
    if args.tiny:
        args.chains, args.superchains, args.warmup, args.steps = 32, 4, 60, 600
    torch.set_num_threads(1)
    log, start = harness.Log(), time.perf_counter()
    info = harness.machine_info(load_average=harness.load_average())
    log(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {info['cpu']}, {info['cpus']} cores, "
        f"load {info['load_average']}, {info['torch_threads']} thread; {args.chains} chains in "
        f"{args.superchains} superchains, {args.warmup} + {args.steps} steps, seed {args.seed}")  # fmt: skip
    generator = torch.Generator().manual_seed(args.seed)
    starts = (2 * torch.rand(args.superchains, 2, generator=generator) - 1) * START_BOX
    results = []
    for name, settings in samplers(args.steps).items():
        results.append(run_one(name, settings, args, starts))
        log(describe(results[-1]))
    if args.plot is not None:
        plot(results, args.plot)
        log(f"picture: {args.plot}")
    meta = {"tiny": args.tiny, "chains": args.chains, "superchains": args.superchains, "warmup": args.warmup,
            "steps": args.steps, "seed": args.seed, "min_draws": MIN_DRAWS, "starts": starts.tolist(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "seconds": round(time.perf_counter() - start, 1), "load_end": harness.load_average(),
            "machine": info}  # fmt: skip
    harness.write_json(args.out, {"meta": meta, "results": results, "log": log.lines})
    log(f"results: {args.out}")


if __name__ == "__main__":
    main()
