"""Cyclical SGHMC on a Bayesian MLP on digits, against constant-step SGHMC, a deep ensemble, diagonal Laplace and VI.

The second benchmark of issue 28 (Zhang et al., ICLR 2020, at CPU scale). Data and OOD task as in
``examples/ood_detection.py`` (whose ``load_split``, ``make_model`` and ``mlp_logits`` are used as they are):
scikit-learn's 8x8 digits, a stratified 75/25 split per seed, train on the digits 0-5, test on the test images
of 0-5; the test images of 6-9 are the out-of-distribution (OOD) inputs. Model ``64 -> --hidden (tanh) -> 6``,
``N(0, 1)`` on every weight, minibatches of ``--batch-size`` (the likelihood scaled by ``N / B``).

**Equal budget.** One *gradient evaluation* is one minibatch gradient of one network. The budget ``B`` is what
SGHMC on defaults spends, ``--chains x (--warmup + --steps)`` plus its warmup's curvature probes (each probe
evaluates every chain once; ``probe_evaluations``), and every method gets it:

* ``SGHMC, constant``: ``--chains`` vectorised chains on the package's defaults (adapted step size and diagonal
  metric in ``--warmup`` steps; ``control_variate=None``, so that every step costs one evaluation), then
  ``--steps`` steps, ``--draws`` kept per chain at an equal thinning;
* ``cyclical, peak x F``: the same, with ``step_size=Cyclical(--cycles, --steps, exploration=--exploration,
  peak_factor=F)``, whose peak is ``F`` times each chain's adapted step size (``F = 1``: the package's default;
  ``F = 5, 20``; the adapted metric is kept). Only the sampling stages' draws are kept;
* ``deep ensemble``: ``--chains`` chains at ``temperature=0`` (SGD with momentum; the prior is weight decay),
  step ``--ensemble-step`` fixed (at T = 0 nothing is adapted; 0.2 is ``examples/ood_detection.py``'s step),
  ``B / --chains`` steps each, the last point of each (``keep_last=1``);
* ``diag Laplace``: ``AutoLaplace(curvature="diag_ggn").fit_map`` (Adam, lr 1e-2) for ``min(B - sweep,
  --map-steps)`` steps (less than the budget by default: the MAP has converged well before; the cost is the
  steps taken), the curvature sweep (``ceil(N / batch)`` minibatches, one backward pass per class each: ``sweep``
  evaluations), the scalar prior precision tuned on the evidence (no gradients of the data), GLM predictive
  with the probit link; ``MAP`` is its network alone, no extra cost;
* ``diag VI``: ``AutoDiagVI(temperature=1, sticking_the_landing=True)`` with ``TemperedELBO`` and
  ``--vi-particles`` vectorised particles per step (each a gradient evaluation), ``B / particles`` steps of
  ``ClippedAdam`` (lr 1e-2, decayed to a tenth), ``--vi-draws`` draws of the guide for prediction.

Reported per method and seed: test accuracy, NLL and ECE (15 equal-width bins) of the mean predictive on the
in-distribution test images, and the AUROC of OOD against in-distribution by the predictive entropy (total
uncertainty; every method) and by the epistemic uncertainty (mutual information; methods with more than one
draw), with the gradient evaluations spent and the mean kept step size; and, on the OOD images, the share of
images on which two draws predict different labels, over pairs of draws of one chain and over pairs of draws of
different chains (draws from separated modes disagree; a chain that leaves its mode has a within-chain
disagreement near the across-chain one). Over ``--seeds`` seeds: mean and sd (ddof 1).

Run with one thread (12.5 minutes on the shared 2-core machine at load 10, 2026-11-27; ``--tiny``: 14 s of CPU,
under a minute)::

    OMP_NUM_THREADS=1 python benchmarks/cyclical_digits.py --plot docs/_static/gallery/cyclical_digits.png
"""

from __future__ import annotations

import importlib.util
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pyro
import torch
from pyro.infer import SVI
from pyro.infer.autoguide.initialization import init_to_sample

from pyro_sgmcmc import MCMC, SGHMC, Cyclical, decompose_uncertainty
from pyro_sgmcmc.diagnostics import auroc
from pyro_sgmcmc.guides import AutoDiagVI, AutoLaplace, TemperedELBO

if __package__:  # imported as benchmarks.cyclical_digits
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

OUT = harness.ROOT / "benchmarks" / "cyclical_digits_results.json"
IN_CLASSES = [0, 1, 2, 3, 4, 5]
PEAK_FACTORS = (1.0, 5.0, 20.0)
METRICS = ("accuracy", "nll", "ece", "auroc_total", "auroc_epistemic")
DIVERSITY = ("disagreement_within_chains", "disagreement_across_chains")


def _example():
    """``examples/ood_detection.py`` as a module: its data split, model and forward pass."""
    spec = importlib.util.spec_from_file_location("ood_detection", harness.ROOT / "examples" / "ood_detection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ood = _example()
scores = harness.companion("laplace_digits", __package__).scores  # accuracy, NLL, 15-bin ECE


# ------------------------------------------------------------------------------------ methods
def sghmc_methods(args) -> dict:
    """name -> (SGHMC keyword arguments, MCMC settings) of the chain-based methods."""
    sampling = dict(warmup=args.warmup, num_samples=args.draws, thinning=args.steps // args.draws, keep_last=None)
    methods = {"SGHMC, constant (defaults)": ({}, sampling)}
    for factor in PEAK_FACTORS:
        label = "defaults" if factor == 1 else "x adapted"
        schedule = Cyclical(args.cycles, args.steps, args.exploration, peak_factor=factor)
        methods[f"cyclical, peak {factor:g} ({label})"] = ({"step_size": schedule}, sampling)
    return methods


def ensemble_method(args, budget: int) -> tuple:
    """The deep ensemble's settings: ``budget / chains`` steps per member, the last point kept."""
    settings = dict(warmup=budget // args.chains - 1, num_samples=1, thinning=1, keep_last=1)
    return {"temperature": 0.0, "step_size": args.ensemble_step}, settings


def run_chains(args, model, data, kernel_kwargs: dict, settings: dict, seed: int):
    """One vectorised run; the kept draws as ``(S, ...)`` per site and its cost."""
    pyro.set_rng_seed(seed)
    kernel = SGHMC(model, init_strategy=init_to_sample, control_variate=None, **kernel_kwargs)
    mcmc = MCMC(kernel, num_samples=settings["num_samples"], warmup_steps=settings["warmup"],
                num_chains=args.chains, chain_method="vectorized", thinning=settings["thinning"],
                keep_last=settings["keep_last"], seed=seed, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # slow-mixing warnings: expected for a network's posterior
        mcmc.run(data["x_train"], data["y_train"])
    grouped = mcmc.get_samples(group_by_chain=True)
    draws = {name: value.flatten(0, 1) for name, value in grouped.items()}
    per_chain = next(iter(grouped.values())).shape[1]
    draws["chain"] = torch.arange(args.chains).repeat_interleave(per_chain)  # each draw's chain
    adaptation = kernel.warmup.adaptation
    probes = 0 if adaptation is None else int(adaptation.num_extra_evaluations)  # per chain, each probe all chains
    steps = settings["warmup"] + settings["num_samples"] * settings["thinning"]
    step_size = mcmc.sample_stats.get("step_size")
    return draws, {
        "gradient_evaluations": args.chains * (steps + probes),
        "probe_evaluations": args.chains * probes,
        "mean_kept_step_size": None if step_size is None else float(step_size.float().mean()),
    }


def run_laplace(args, model, data, budget: int, seed: int):
    """Diagonal GGN Laplace at a MAP fitted with the rest of the budget; (MAP probs, Laplace probs, costs)."""
    num_train = len(data["y_train"])
    sweep = math.ceil(num_train / args.batch_size) * len(IN_CLASSES)  # one backward pass per class and minibatch
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    guide = AutoLaplace(model, curvature="diag_ggn", init_loc_fn=init_to_sample, disable_progbar=True)
    map_steps = min(budget - sweep, args.map_steps)
    guide.fit_map(data["x_train"], data["y_train"], num_steps=map_steps, lr=1e-2, seed=seed, jit_compile=True)
    laplace = guide.laplace_approximation(data["x_train"], data["y_train"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        laplace.optimize_prior_precision("scalar")
    logits = lambda params, x: ood.mlp_logits(params, x)  # noqa: E731
    with torch.no_grad():
        point = {name: value.unsqueeze(0) for name, value in laplace.median().items()}
    probs = {
        "MAP": {split: ood.mlp_logits(point, data[split]).softmax(-1) for split in ("x_in", "x_out")},
        "diag Laplace": {
            split: laplace.predict(logits, data[split], link="probit", batch_size=256).unsqueeze(0)
            for split in ("x_in", "x_out")
        },
    }
    precision = float(next(iter(laplace.prior_precision.values())).reshape(-1)[0])
    costs = {"MAP": {"gradient_evaluations": map_steps},
             "diag Laplace": {"gradient_evaluations": map_steps + sweep, "curvature_evaluations": sweep,
                              "prior_precision": precision}}  # fmt: skip
    return probs, costs


def run_vi(args, model, data, budget: int, seed: int):
    """Tempered (T = 1) diagonal VI with vectorised particles; the guide's draws' probabilities and the cost."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    steps = budget // args.vi_particles
    guide = AutoDiagVI(model, init_loc_fn=init_to_sample, sticking_the_landing=True)
    optim = pyro.optim.ClippedAdam({"lr": 1e-2, "lrd": 0.1 ** (1 / steps)})
    elbo = TemperedELBO(num_particles=args.vi_particles, vectorize_particles=True, max_plate_nesting=1)
    svi = SVI(model, guide, optim, elbo)
    for _ in range(steps):
        svi.step(data["x_train"], data["y_train"])
    with torch.no_grad():
        samples = [guide(data["x_train"], data["y_train"]) for _ in range(args.vi_draws)]
        draws = {name: torch.stack([sample[name] for sample in samples]) for name in samples[0]}
    probs = {split: ood.mlp_logits(draws, data[split]).softmax(-1) for split in ("x_in", "x_out")}
    return probs, {"gradient_evaluations": steps * args.vi_particles, "mean_sigma": float(guide.scale.detach().mean())}


# ------------------------------------------------------------------------------------ metrics
@torch.no_grad()
def evaluate(probs_in: torch.Tensor, probs_out: torch.Tensor, y: torch.Tensor) -> dict:
    """Scores of the mean predictive of ``(S, N, K)`` draws; AUROCs of entropy and mutual information."""
    result = {key: scores(probs_in.mean(0), y)[key] for key in ("accuracy", "nll", "ece")}
    u_in, u_out = decompose_uncertainty(probs_in.double()), decompose_uncertainty(probs_out.double())
    result["auroc_total"] = auroc(u_in.total, u_out.total)
    result["auroc_epistemic"] = auroc(u_in.epistemic, u_out.epistemic) if probs_in.shape[0] > 1 else None
    result["num_draws"] = int(probs_in.shape[0])
    return result


@torch.no_grad()
def disagreement(probs: torch.Tensor, chain: torch.Tensor) -> dict:
    """Mean share of images on which two draws predict different labels: pairs within a chain, across chains.

    Draws of separated modes disagree more than draws of one mode; a chain that leaves its mode has a
    within-chain disagreement close to the across-chain one (independent starts: different modes).
    """
    labels = probs.argmax(-1)  # (S, N)
    differ = (labels.unsqueeze(1) != labels.unsqueeze(0)).double().mean(-1)  # (S, S)
    same = chain.unsqueeze(1) == chain.unsqueeze(0)
    within = same & ~torch.eye(len(chain), dtype=torch.bool)
    return {
        "disagreement_within_chains": float(differ[within].mean()) if within.any() else None,
        "disagreement_across_chains": float(differ[~same].mean()) if (~same).any() else None,
    }


def summary(per_seed: list) -> dict:
    """Mean and sd (ddof 1) over seeds of every metric of every method."""
    table = {}
    for method in per_seed[0]:
        row = {}
        keys = ("gradient_evaluations", "num_draws", "mean_kept_step_size", *DIVERSITY)
        for key in (*METRICS, *keys):
            values = [seed[method].get(key) for seed in per_seed]
            if any(v is None for v in values):
                row[key] = None
                continue
            sd = float(np.std(values, ddof=1)) if len(values) > 1 else None
            row[key] = {"mean": float(np.mean(values)), "sd": sd, "values": values}
        table[method] = row
    return table


def _cell(cell, digits: int = 3) -> str:
    if cell is None:
        return "n/a"
    return f"{cell['mean']:.{digits}f}" + ("" if cell["sd"] is None else f" ± {cell['sd']:.{digits}f}")


def table_rows(table: dict) -> list:
    return [[method, f"{row['num_draws']['mean']:.0f}", f"{row['gradient_evaluations']['mean']:,.0f}",
             *(_cell(row[key]) for key in (*METRICS, *DIVERSITY))] for method, row in table.items()]  # fmt: skip


HEADER = ["method", "draws", "gradient evaluations", "accuracy", "NLL", "ECE", "AUROC total", "AUROC epistemic",
          "disagreement within chains", "across chains"]  # fmt: skip


def plot(table: dict, path: Path, num_seeds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    keys = (*METRICS, *DIVERSITY)
    fig, axes = plt.subplots(1, len(keys), figsize=(2.6 * len(keys), 4.2), sharey=True)
    for ax, key in zip(axes, keys):
        for i, name in enumerate(names):
            cell = table[name][key]
            if cell is None:
                continue
            ax.scatter(cell["values"], [i] * len(cell["values"]), s=12, color="C0", alpha=0.6)
            ax.errorbar(cell["mean"], i, xerr=cell["sd"] or 0, fmt="s", color="C3", capsize=3)
        ax.set_title(key.replace("_", " ").replace("disagreement ", "disagreement\n"), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_yticks(range(len(names)))
    axes[0].set_yticklabels(names, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"Digits 0-5, OOD 6-9, equal gradient budget: {num_seeds} seeds (dots), mean ± sd (red)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    p = harness.parser(__doc__, OUT)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--chains", type=int, default=8, help="chains per SGHMC run, ensemble members (default 8)")
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--steps", type=int, default=2000, help="sampling steps per chain (K)")
    p.add_argument("--draws", type=int, default=40, help="draws kept per chain before dropping exploration steps")
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--exploration", type=float, default=0.8, help="share of a cycle without noise (paper: 0.8-0.95)")
    p.add_argument("--ensemble-step", type=float, default=0.2)
    p.add_argument("--map-steps", type=int, default=5000, help="at most this many MAP steps (Adam converges earlier)")
    p.add_argument("--vi-particles", type=int, default=16)
    p.add_argument("--vi-draws", type=int, default=64)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", type=Path, help="write the figure here (PNG)")
    args = p.parse_args(argv)
    if args.tiny:
        args.hidden, args.chains, args.warmup, args.steps, args.draws, args.seeds = 8, 2, 100, 200, 20, 1
        args.vi_draws, args.map_steps = 8, 300
    if args.steps % args.draws:
        p.error("--steps must be a multiple of --draws (an equal thinning)")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    log, start, cpu_start = harness.Log(), time.perf_counter(), time.process_time()
    info = harness.machine_info(load_average=harness.load_average())
    log(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {info['cpu']}, {info['cpus']} cores, load "
        f"{info['load_average']}, {info['torch_threads']} torch thread(s); {args.chains} chains x {args.warmup} + "
        f"{args.steps} steps; {args.seeds} seeds")  # fmt: skip
    budgets = []
    per_seed = []
    for k in range(args.seeds):
        seed = args.seed + k
        data = ood.load_split(IN_CLASSES, seed)
        model, _ = ood.make_model(64, args.hidden, len(IN_CLASSES), 1.0, args.batch_size)
        results, probs, costs = {}, {}, {}
        chain_methods = sghmc_methods(args)
        for m, name in enumerate([*chain_methods, "deep ensemble"]):
            if name == "deep ensemble":  # the budget: what SGHMC on defaults spent, its warmup's probes included
                budget = costs["SGHMC, constant (defaults)"]["gradient_evaluations"]
                budgets.append(budget)
            kernel_kwargs, settings = ensemble_method(args, budget) if name == "deep ensemble" else chain_methods[name]
            tic = time.perf_counter()
            draws, costs[name] = run_chains(args, model, data, kernel_kwargs, settings, 1000 * seed + m)
            chain = draws.pop("chain")
            with torch.no_grad():
                probs[name] = {s: ood.mlp_logits(draws, data[s]).softmax(-1) for s in ("x_in", "x_out")}
            costs[name].update(disagreement(probs[name]["x_out"], chain))
            costs[name]["seconds"] = time.perf_counter() - tic
        for runner in (run_laplace, run_vi):
            tic = time.perf_counter()
            more_probs, more_costs = runner(args, model, data, budget, 1000 * seed + 99)
            if runner is run_vi:  # independent draws: each its own "chain"
                more_costs.update(disagreement(more_probs["x_out"], torch.arange(args.vi_draws)))
                more_probs, more_costs = {"diag VI": more_probs}, {"diag VI": more_costs}
            for name in more_costs:
                more_costs[name]["seconds"] = time.perf_counter() - tic
            probs.update(more_probs)
            costs.update(more_costs)
        for name in probs:
            results[name] = {**evaluate(probs[name]["x_in"], probs[name]["x_out"], data["y_in"]), **costs[name]}
            r = results[name]
            epistemic = "n/a" if r["auroc_epistemic"] is None else f"{r['auroc_epistemic']:.3f}"
            log(f"seed {seed} {name:32s} {r['num_draws']:4d} draws, {r['gradient_evaluations']:7,d} grads: acc "
                f"{r['accuracy']:.3f} NLL {r['nll']:.3f} ECE {r['ece']:.3f} AUROC total {r['auroc_total']:.3f} "
                f"epistemic {epistemic} ({r['seconds']:.1f} s)")  # fmt: skip
        per_seed.append(results)
    table = summary(per_seed)
    log("\n" + harness.text_table(HEADER, table_rows(table)))
    if args.plot is not None:
        plot(table, args.plot, args.seeds)
        log(f"figure: {args.plot}")
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    meta = {"tiny": args.tiny, "budgets": budgets, "config": config, "machine": info,
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "seconds": round(time.perf_counter() - start, 1),
            "cpu_seconds": round(time.process_time() - cpu_start, 1)}  # fmt: skip
    output = {"meta": meta, "summary": table, "per_seed": per_seed, "log": log.lines}
    harness.write_json(args.out, output)
    log(f"results: {args.out} ({meta['seconds']} s)")
    return output


if __name__ == "__main__":
    main()
