"""Cyclical against constant-step SGLD on a 2-D mixture of 25 Gaussians, at an equal number of gradient evaluations.

The synthetic case of Zhang et al. (ICLR 2020): 25 equally weighted Gaussians, means on the grid
``{-4, -2, 0, 2, 4}^2``, variance 0.03 per coordinate (modes 2 apart, 11.5 sds: a constant-step chain rarely
crosses). Exact gradients (no data: ``N = 1``), so the only difference between the samplers is the schedule.
Every sampler runs ``--chains`` vectorised chains from the same starting points (Pyro's ``init_to_uniform``, one
seed) for ``--warmup`` + ``--steps`` steps, one gradient evaluation each (the default warmup adds its curvature
probes: counted in ``gradient_evaluations``):

* ``constant 0.05``: SGLD at the paper's step 0.05, no adaptation (``warmup`` steps are burn-in). In a mode the
  normalised curvature is :math:`\\lambda = 1 / 0.03 = 33`, so :math:`\\epsilon \\lambda = 1.7`: close to the
  stability limit 2, with a stationary variance :math:`0.03 / (1 - \\epsilon \\lambda / 2)`, six times the
  target's;
* ``constant 0.01``: an accurate step (:math:`\\epsilon \\lambda = 0.33`, variance 1.2 times the target's);
* ``constant, adapted``: SGLD on defaults (the warmup adapts the step size and the metric);
* ``cyclical 0.09, beta 0.25``: ``Cyclical(num_cycles=steps / 1000, exploration=0.25, peak=0.09)``, no
  adaptation (the paper's peak and exploration share; at the peak :math:`\\epsilon \\lambda = 3 > 2`: gradient
  descent is unstable in a mode's basin, which is what throws the chain out of it);
* ``cyclical 0.09, beta 0.5``: the same with half of each cycle exploring (sampling steps below 0.045);
* ``cyclical, adapted peak``: ``exploration=0.25`` on defaults (the peak is each chain's adapted step size).

Reported per sampler, from the draws it returns (a cyclical run returns its sampling stages' only):
the modes visited (a mode counts when a draw lies within 0.5, about 2.9 sds, of its mean), per chain (mean and
range) and over all chains; the MMD to the target (squared, unbiased, Gaussian kernel of bandwidth 1, which
mostly sees the modes' weights, and of bandwidth 0.2, which also sees their shapes; between 2,000 draws spread
evenly over the run and 2,000 exact draws; the sd of the bandwidth-1 figure between two exact samples is
``mmd2_noise``); and the root mean square distance per coordinate of the draws to their nearest mode's mean
(``within_mode_sd``; the target's is ``sqrt(0.03)`` = 0.173), which shows the discretisation's excess spread.
With ``--plot PATH`` it draws the samples of each sampler over the target's modes.

Run with one thread (about 6 minutes on an idle 2-core machine; ``--tiny``: a few seconds)::

    OMP_NUM_THREADS=1 python benchmarks/cyclical_mixture.py [--plot docs/_static/cyclical_mixture.png]
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path
from typing import Dict

import pyro
import pyro.distributions as dist
import torch
from torch.distributions import constraints

from pyro_sgmcmc import MCMC, SGLD, Cyclical

if __package__:  # imported as benchmarks.cyclical_mixture
    from . import harness
else:  # run as a script
    import harness

GRID = torch.tensor([-4.0, -2.0, 0.0, 2.0, 4.0], dtype=torch.float64)
MEANS = torch.cartesian_prod(GRID, GRID)  # (25, 2)
VARIANCE = 0.03
MODE_RADIUS = 0.5
STEPS_PER_CYCLE = 1000
MMD_DRAWS = 2000
OUT = harness.ROOT / "benchmarks" / "cyclical_mixture_results.json"


def mixture() -> dist.MixtureSameFamily:
    components = dist.Normal(MEANS.float(), math.sqrt(VARIANCE)).to_event(1)
    return dist.MixtureSameFamily(dist.Categorical(logits=torch.zeros(25)), components)


def model() -> None:
    # a flat site and the mixture's log density as a factor: Pyro has no transform for a mixture's support
    x = pyro.sample("x", dist.ImproperUniform(constraints.real_vector, (), (2,)))
    pyro.factor("mixture", mixture().log_prob(x))


def target_draws(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    which = torch.randint(25, (n,), generator=g)
    return MEANS[which] + math.sqrt(VARIANCE) * torch.randn(n, 2, generator=g, dtype=torch.float64)


def modes_of(draws: torch.Tensor) -> set:
    """The modes (indices into MEANS) with a draw within ``MODE_RADIUS`` of their mean."""
    distance = torch.cdist(draws.double(), MEANS)
    nearest, index = distance.min(dim=1)
    return set(index[nearest < MODE_RADIUS].tolist())


def mmd2(x: torch.Tensor, y: torch.Tensor, bandwidth: float = 1.0) -> float:
    """Unbiased squared MMD with the kernel ``exp(-|a - b|^2 / (2 bandwidth^2))``."""
    x, y = x.double(), y.double()

    def gram(a, b):
        return torch.exp(-torch.cdist(a, b).pow(2) / (2 * bandwidth**2))

    n, m = len(x), len(y)
    kxx, kyy = gram(x, x), gram(y, y)
    within_x = (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
    within_y = (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    return float(within_x + within_y - 2 * gram(x, y).mean())


def samplers(steps: int) -> Dict[str, dict]:
    cycles = max(1, steps // STEPS_PER_CYCLE)
    fixed = dict(adapt_step_size=False, adapt_mass_matrix=False)
    return {
        "constant 0.05": dict(step_size=0.05, **fixed),
        "constant 0.01": dict(step_size=0.01, **fixed),
        "constant, adapted": dict(),
        "cyclical 0.09, beta 0.25": dict(step_size=Cyclical(cycles, steps, exploration=0.25, peak=0.09), **fixed),
        "cyclical 0.09, beta 0.5": dict(step_size=Cyclical(cycles, steps, exploration=0.5, peak=0.09), **fixed),
        "cyclical, adapted peak": dict(step_size=Cyclical(cycles, steps, exploration=0.25)),
    }


def run_one(name: str, settings: dict, chains: int, warmup: int, steps: int, seed: int) -> dict:
    pyro.set_rng_seed(seed)
    kernel = SGLD(model, num_data=1, control_variate=None, **settings)
    mcmc = MCMC(kernel, num_samples=steps, warmup_steps=warmup, num_chains=chains, chain_method="vectorized",
                seed=seed, disable_progbar=True)  # fmt: skip
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # slow-mixing warnings: the point of the comparison
        mcmc.run()
    seconds = time.perf_counter() - start
    draws = mcmc.get_samples(group_by_chain=True)["x"].double()  # (C, S, 2)
    per_chain = [len(modes_of(chain)) for chain in draws]
    pooled = draws.reshape(-1, 2)
    spread = pooled[torch.linspace(0, len(pooled) - 1, min(MMD_DRAWS, len(pooled))).long()]
    exact = target_draws(len(spread), seed + 1)
    offset = pooled - MEANS[torch.cdist(pooled, MEANS).argmin(dim=1)]  # from the nearest mode's mean
    adaptation = kernel.warmup.adaptation
    extra = 0 if adaptation is None else int(adaptation.num_extra_evaluations)
    step_size = mcmc.sample_stats["step_size"]
    return {
        "sampler": name,
        "draws_per_chain": draws.shape[1],
        "gradient_evaluations_per_chain": warmup + steps + extra,  # each probe evaluates every chain once
        "modes_per_chain_mean": sum(per_chain) / len(per_chain),
        "modes_per_chain_min": min(per_chain),
        "modes_per_chain_max": max(per_chain),
        "modes_all_chains": len(modes_of(pooled)),
        "mmd2": mmd2(spread, exact),
        "mmd2_bandwidth_0.2": mmd2(spread, exact, bandwidth=0.2),
        "within_mode_sd": float(offset.pow(2).mean().sqrt()),
        "largest_kept_step_size": float(step_size.max(dim=1).values.mean()),
        "seconds": round(seconds, 2),
        "_draws": pooled,
    }


def plot(results: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = -(-len(results) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.7 * rows), sharex=True, sharey=True)
    for ax in axes.flat[len(results) :]:
        ax.set_visible(False)
    for ax, result in zip(axes.flat, results):
        draws = result["_draws"]
        shown = draws[torch.linspace(0, len(draws) - 1, min(20000, len(draws))).long()]
        ax.scatter(shown[:, 0], shown[:, 1], s=1, alpha=0.3, color="C0", rasterized=True)
        ax.scatter(MEANS[:, 0], MEANS[:, 1], s=12, marker="x", color="C3")
        title = (f"{result['sampler']}\n{result['modes_all_chains']}/25 modes, MMD$^2$ {result['mmd2']:.4f}, "
                 f"sd {result['within_mode_sd']:.2f}")  # fmt: skip
        ax.set_title(title, fontsize=9)
        ax.set_xlim(-6, 6)
        ax.set_ylim(-6, 6)
        ax.set_aspect("equal")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = harness.parser(__doc__, OUT)
    p.add_argument("--chains", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--steps", type=int, default=20000, help="sampling steps per chain (K)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, help="write a picture of the draws here (PNG)")
    args = p.parse_args()
    if args.tiny:
        args.chains, args.warmup, args.steps = 2, 60, 600
    torch.set_num_threads(1)
    log, start = harness.Log(), time.perf_counter()
    info = harness.machine_info(load_average=harness.load_average())
    log(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {info['cpu']}, {info['cpus']} cores, "
        f"load {info['load_average']}; {args.chains} chains, {args.warmup} + {args.steps} steps, "
        f"seed {args.seed}")  # fmt: skip
    noise = [mmd2(target_draws(MMD_DRAWS, s), target_draws(MMD_DRAWS, 100 + s)) for s in range(5)]
    mmd2_noise = float(torch.tensor(noise).std())
    log(f"MMD^2 between two exact samples of {MMD_DRAWS}: sd {mmd2_noise:.2e} (5 pairs)")
    results = []
    for name, settings in samplers(args.steps).items():
        result = run_one(name, settings, args.chains, args.warmup, args.steps, args.seed)
        results.append(result)
        log(f"{name:24s} modes per chain {result['modes_per_chain_mean']:5.1f} "
            f"[{result['modes_per_chain_min']}, {result['modes_per_chain_max']}], all chains "
            f"{result['modes_all_chains']:2d}/25, MMD^2 {result['mmd2']:.4f} (bandwidth 0.2: "
            f"{result['mmd2_bandwidth_0.2']:.4f}), sd within a mode {result['within_mode_sd']:.3f} (target "
            f"{math.sqrt(VARIANCE):.3f}), {result['draws_per_chain']} draws "
            f"per chain, {result['gradient_evaluations_per_chain']} gradients per chain, largest kept step "
            f"{result['largest_kept_step_size']:.3g}, {result['seconds']} s")  # fmt: skip
    if args.plot is not None:
        plot(results, args.plot)
        log(f"picture: {args.plot}")
    meta = {"tiny": args.tiny, "chains": args.chains, "warmup": args.warmup, "steps": args.steps, "seed": args.seed,
            "mmd2_noise": mmd2_noise, "seconds": round(time.perf_counter() - start, 1), "machine": info}  # fmt: skip
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    harness.write_json(args.out, {"meta": meta, "results": rows, "log": log.lines})
    log(f"results: {args.out}")


if __name__ == "__main__":
    main()
