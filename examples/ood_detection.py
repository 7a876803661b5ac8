"""Out-of-distribution detection with epistemic uncertainty (the seed paper's Table 1 and Figure 7, at CPU scale).

A Bayesian MLP is trained on the digits 0-5 of scikit-learn's 8x8 digits; the test images of the
digits 6-9, which the network never saw, are the out-of-distribution (OOD) inputs. Each method
gives, for every test image, ``S`` draws of the class probabilities (``S = 1`` for a point
estimate), and :func:`pyro_sgmcmc.decompose_uncertainty` splits their predictive entropy into

* **total** uncertainty :math:`H[\\bar p]`, the entropy of the mean prediction,
* **aleatoric** uncertainty :math:`\\frac1S \\sum_s H[p_s]`, and
* **epistemic** uncertainty, total minus aleatoric: the disagreement between draws.

A score that is higher on OOD images than on in-distribution ones detects them;
:func:`pyro_sgmcmc.diagnostics.auroc` measures how well (1 = perfect, 0.5 = chance).

Methods (all ``pyro_sgmcmc.MCMC(SGHMC(...), chain_method="vectorized")``, same model, same
step size; the table reports the gradient evaluations each one spent):

* **MAP / SGD**: one chain at ``temperature=0`` (SGHMC at T = 0 is SGD with momentum; the prior is
  weight decay), its last point. One network, so its epistemic uncertainty is 0 for every image
  and only the total uncertainty (the softmax entropy) can score.
* **deep ensemble**: ``--chains`` chains at T = 0 from independent random initialisations, the last
  point of each (``keep_last=1``).
* **serial SGHMC**: one chain at ``--temperature`` (default 1, the Bayesian posterior), burn-in then
  every ``--thin``-th draw.
* **parallel SGHMC**: ``--chains`` independent chains at ``--temperature`` from independent
  initialisations, vectorised, the last point of each (``keep_last=1``) after ``--parallel-steps``.

The model
---------
``64 -> --hidden (tanh) -> 6`` with ``Normal(0, --prior-scale)`` on every weight and bias, written with
plain ``pyro.sample`` statements and a forward pass (:func:`mlp_logits`) that broadcasts over leading
dimensions, so the same function serves the model (one network) and the prediction (all draws at
once). The weights are sampled outside the data plate and only the likelihood is inside it (the
pattern explained in ``examples/bnn_digits.py``), with minibatches of ``--batch-size``.

Defaults: 3 seeds (each its own train/test split, initialisations and noise); prior ``N(0, 1)``,
32 hidden units, minibatch 100, ``step_size=0.2``, ``friction=1``; MAP and each of the 32 ensemble
members 2,000 steps; the serial chain 1,000 burn-in steps and then 5,000 more, every 100th kept
(50 draws); 32 parallel chains of 1,000 steps each, the last point of each kept (32 draws).

Run it::

    python examples/ood_detection.py            # 35 s of CPU; 50 s wall on a shared 2-core machine (2026-11-26)
    python examples/ood_detection.py --tiny     # seconds, smoke test only

It writes ``ood_detection.json`` (every number), ``ood_detection.md`` (the table) and
``ood_detection.png`` (the histograms of seed ``--seed``) to ``--out`` (default ``ood_detection_results/``).
Results and how they compare with the paper are in the gallery page ``docs/gallery/ood_detection.rst``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_sample
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import pyro_sgmcmc
from pyro_sgmcmc import MCMC, SGHMC, decompose_uncertainty
from pyro_sgmcmc.diagnostics import auroc

METHODS = ("MAP / SGD", "deep ensemble", "serial SGHMC", "parallel SGHMC")


# ------------------------------------------------------------------------------------ data
def load_split(in_classes: list[int], seed: int):
    """Digits scaled to [0, 1], a stratified 75/25 split; train on ``in_classes`` only.

    Returns the training images and labels of the in-distribution classes (labels renumbered
    ``0 .. len(in_classes) - 1``), the in-distribution test images and labels, and the test images
    of the other classes (OOD).
    """
    digits = load_digits()
    x = digits.data.astype("float32") / 16.0
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=seed, stratify=digits.target
    )
    relabel = {c: i for i, c in enumerate(in_classes)}
    train = np.isin(y_train, in_classes)
    test_in = np.isin(y_test, in_classes)
    return {
        "x_train": torch.tensor(x_train[train]),
        "y_train": torch.tensor([relabel[c] for c in y_train[train]], dtype=torch.long),
        "x_in": torch.tensor(x_test[test_in]),
        "y_in": torch.tensor([relabel[c] for c in y_test[test_in]], dtype=torch.long),
        "x_out": torch.tensor(x_test[~test_in]),
    }


# ------------------------------------------------------------------------------------ model
def mlp_logits(weights: dict, x: torch.Tensor) -> torch.Tensor:
    """Logits of the MLP; weights may carry leading (draw) dimensions: ``(*S, N, K)`` out."""
    hidden = torch.tanh(x @ weights["w1"].transpose(-1, -2) + weights["b1"].unsqueeze(-2))
    return hidden @ weights["w2"].transpose(-1, -2) + weights["b2"].unsqueeze(-2)


def make_model(num_in: int, num_hidden: int, num_classes: int, prior_scale: float, batch_size: int):
    shapes = {"w1": (num_hidden, num_in), "b1": (num_hidden,), "w2": (num_classes, num_hidden), "b2": (num_classes,)}

    def model(x, y):
        # the weights: global sites, outside the data plate, prior counted once
        weights = {
            name: pyro.sample(name, dist.Normal(0.0, prior_scale).expand(shape).to_event(len(shape)))
            for name, shape in shapes.items()
        }
        plate = pyro.plate("data", len(y), subsample_size=min(batch_size, len(y)))
        idx = plate.indices
        logits = mlp_logits(weights, x[idx])
        with plate:  # only the likelihood is scaled by N / B
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[idx])

    return model, sum(math.prod(s) for s in shapes.values())


# ------------------------------------------------------------------------------------ methods
def run_sghmc(args, model, data, *, temperature, chains, warmup, num_samples, thinning, keep_last, seed):
    """One vectorised run; returns the kept draws flattened to ``(S, ...)`` per site and its cost."""
    kernel = SGHMC(
        model,
        step_size=args.step_size,
        friction=args.friction,
        temperature=temperature,
        init_strategy=init_to_sample,  # a random network initialisation (a draw of the prior)
        # the paper's protocol: every method (T = 0 ensembles, serial and parallel chains) at one fixed step,
        # so they differ only in how they use it; on the package's defaults each run would adapt its own step
        adapt_step_size=False,
        adapt_mass_matrix=False,
        control_variate=None,
    )
    mcmc = MCMC(
        kernel,
        num_samples=num_samples,
        warmup_steps=warmup,
        num_chains=chains,
        chain_method="vectorized",
        thinning=thinning,
        keep_last=keep_last,
        seed=seed,
        disable_progbar=not args.progress,
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    mcmc.run(data["x_train"], data["y_train"])
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    draws = {name: value.flatten(0, 1) for name, value in mcmc.get_samples(group_by_chain=True).items()}
    steps = warmup + num_samples * thinning
    divergences = kernel.num_divergences  # over all chains, warmup included
    return draws, {"seconds": seconds, "cpu_seconds": cpu_seconds, "steps_per_chain": steps,
                   "gradient_evaluations": chains * steps, "divergences": divergences}  # fmt: skip


def method_settings(args, name: str) -> dict:
    if name == "MAP / SGD":
        return dict(temperature=0.0, chains=1, warmup=args.map_steps - 1, num_samples=1, thinning=1, keep_last=1)
    if name == "deep ensemble":
        return dict(
            temperature=0.0, chains=args.chains, warmup=args.map_steps - 1, num_samples=1, thinning=1, keep_last=1
        )
    if name == "serial SGHMC":
        return dict(
            temperature=args.temperature,
            chains=1,
            warmup=args.serial_burn_in,
            num_samples=args.serial_draws,
            thinning=args.thin,
            keep_last=None,
        )
    if name == "parallel SGHMC":
        return dict(
            temperature=args.temperature,
            chains=args.chains,
            warmup=args.parallel_steps - 1,
            num_samples=1,
            thinning=1,
            keep_last=1,
        )
    raise ValueError(name)


@torch.no_grad()
def evaluate(draws: dict, data: dict) -> dict:
    """Accuracy/NLL on the in-distribution test images; uncertainties and AUROCs for in vs OOD."""
    probs_in = mlp_logits(draws, data["x_in"]).softmax(-1)  # (S, N_in, K)
    probs_out = mlp_logits(draws, data["x_out"]).softmax(-1)  # (S, N_out, K)
    mean_in = probs_in.mean(0)
    y = data["y_in"]
    u_in = decompose_uncertainty(probs_in)
    u_out = decompose_uncertainty(probs_out)
    result = {
        "num_draws": int(probs_in.shape[0]),
        "accuracy": float((mean_in.argmax(-1) == y).double().mean()),
        "nll": float(-mean_in[torch.arange(len(y)), y].clamp_min(1e-12).log().mean()),
    }
    for kind in ("total", "aleatoric", "epistemic"):
        scores_in, scores_out = getattr(u_in, kind), getattr(u_out, kind)
        result[f"auroc_{kind}"] = auroc(scores_in, scores_out)
        result[f"mean_{kind}_in"] = float(scores_in.mean())
        result[f"mean_{kind}_out"] = float(scores_out.mean())
    if result["num_draws"] == 1:  # one network: epistemic is 0 everywhere, its AUROC (0.5, all ties) is meaningless
        result["auroc_epistemic"] = None
    # the paper's claim is epistemic > total; the paired difference on the same draws and images
    result["auroc_epistemic_minus_total"] = (
        None if result["auroc_epistemic"] is None else result["auroc_epistemic"] - result["auroc_total"]
    )
    scores = {kind: (getattr(u_in, kind).tolist(), getattr(u_out, kind).tolist()) for kind in ("total", "epistemic")}
    return result, scores


# ------------------------------------------------------------------------------------ reporting
def summarise(per_seed: list[dict]) -> dict:
    """Mean and standard error over seeds of every number of every method."""
    table = {}
    for method in METHODS:
        rows = [seed_result[method] for seed_result in per_seed]
        table[method] = {}
        for key in rows[0]:
            values = [r[key] for r in rows]
            if any(v is None for v in values) or not all(isinstance(v, (int, float)) for v in values):
                table[method][key] = None
                continue
            mean = float(np.mean(values))
            se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
            table[method][key] = {"mean": mean, "se": se, "values": values}
    return table


def _fmt(cell, digits=3) -> str:
    if cell is None:
        return "n/a"
    if cell["se"] is None:
        return f"{cell['mean']:.{digits}f}"
    return f"{cell['mean']:.{digits}f} ± {cell['se']:.{digits}f}"


def markdown_table(table: dict, num_seeds: int) -> str:
    lines = [
        f"AUROC for telling digits 6-9 (OOD) from 0-5; mean ± standard error over {num_seeds} seed(s).",
        "",
        "| method | draws | gradient evaluations | test accuracy | test NLL | AUROC total | AUROC epistemic "
        "| epistemic - total |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, row in table.items():
        lines.append(
            f"| {method} | {row['num_draws']['mean']:.0f} | {row['gradient_evaluations']['mean']:.0f} "
            f"| {_fmt(row['accuracy'])} | {_fmt(row['nll'])} | {_fmt(row['auroc_total'])} "
            f"| {_fmt(row['auroc_epistemic'])} | {_fmt(row['auroc_epistemic_minus_total'])} |"
        )
    return "\n".join(lines) + "\n"


def plot_histograms(scores: dict, results: dict, path: Path, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(METHODS), figsize=(3.3 * len(METHODS), 5.6))
    for j, method in enumerate(METHODS):
        for i, kind in enumerate(("total", "epistemic")):
            ax = axes[i, j]
            scores_in, scores_out = scores[method][kind]
            value = results[method][f"auroc_{kind}"]
            if value is None:
                ax.text(0.5, 0.5, "one network:\nepistemic = 0", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                top = max(max(scores_in), max(scores_out), 1e-6)
                bins = np.linspace(0.0, top, 31)
                ax.hist(scores_in, bins=bins, density=True, alpha=0.6, label="in (0-5)", color="tab:blue")
                ax.hist(scores_out, bins=bins, density=True, alpha=0.6, label="OOD (6-9)", color="tab:red")
                ax.set_title(f"AUROC {value:.3f}", fontsize=9)
            if i == 0:
                ax.set_title(f"{method}\n" + ax.get_title(), fontsize=10)
            if j == 0:
                ax.set_ylabel(f"{kind} uncertainty\n(density)")
            ax.set_xlabel(f"{kind} (nats)" if value is not None else "")
    axes[0, -1].legend(fontsize=8)
    fig.suptitle(f"Digits: train on 0-5, detect 6-9 (seed {seed})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--in-classes", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5], help="training classes")
    parser.add_argument("--hidden", type=int, default=32, help="hidden units (default 32)")
    parser.add_argument("--prior-scale", type=float, default=1.0, help="prior sd of every weight (default 1)")
    parser.add_argument("--batch-size", type=int, default=100, help="minibatch size (default 100)")
    parser.add_argument("--step-size", type=float, default=0.2, help="SGHMC step size (default 0.2)")
    parser.add_argument("--friction", type=float, default=1.0, help="SGHMC friction (default 1)")
    parser.add_argument("--temperature", type=float, default=1.0, help="temperature of the SGHMC runs (default 1)")
    parser.add_argument("--map-steps", type=int, default=2000, help="steps of MAP and of each ensemble member")
    parser.add_argument("--serial-burn-in", type=int, default=1000, help="burn-in of the serial chain")
    parser.add_argument("--serial-draws", type=int, default=50, help="kept draws of the serial chain")
    parser.add_argument("--thin", type=int, default=100, help="serial chain: keep every THIN-th step")
    parser.add_argument("--chains", type=int, default=32, help="ensemble members / parallel chains")
    parser.add_argument("--parallel-steps", type=int, default=1000, help="steps of each parallel chain")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (--seed, --seed + 1, ...)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a few-second smoke run")
    parser.add_argument("--out", type=Path, default=Path("ood_detection_results"), help="output directory")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bars, shown by default as Pyro's MCMC shows them (--no-progress hides them)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.hidden, args.map_steps, args.serial_burn_in, args.serial_draws, args.thin = 8, 50, 20, 5, 5
        args.chains, args.parallel_steps, args.seeds = 4, 50, 1
    if not set(args.in_classes) < set(range(10)) or len(set(args.in_classes)) < 2:
        parser.error("--in-classes must be at least two and not all of the digits 0-9")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    in_classes = sorted(set(args.in_classes))
    started, cpu_started = time.perf_counter(), time.process_time()
    per_seed, first_scores = [], None
    for k in range(args.seeds):
        seed = args.seed + k
        pyro.set_rng_seed(seed)
        data = load_split(in_classes, seed)
        model, num_weights = make_model(64, args.hidden, len(in_classes), args.prior_scale, args.batch_size)
        if k == 0:
            print(
                f"digits: train on {in_classes} ({len(data['y_train'])} images, "
                f"MLP 64-{args.hidden}-{len(in_classes)}, {num_weights} weights); "
                f"test {len(data['y_in'])} in-distribution, {len(data['x_out'])} OOD images"
            )
        results, scores = {}, {}
        for m, method in enumerate(METHODS):
            draws, cost = run_sghmc(args, model, data, **method_settings(args, method), seed=1000 * seed + m)
            results[method], scores[method] = evaluate(draws, data)
            results[method].update(cost)
            r = results[method]
            epistemic = "n/a" if r["auroc_epistemic"] is None else f"{r['auroc_epistemic']:.3f}"
            print(
                f"seed {seed} {method:<15} {r['num_draws']:>4} draws  acc {r['accuracy']:.3f}  NLL {r['nll']:.3f}  "
                f"AUROC total {r['auroc_total']:.3f}  epistemic {epistemic}  "
                f"({cost['seconds']:.1f} s, {cost['cpu_seconds']:.1f} s CPU)"
            )
        per_seed.append(results)
        if first_scores is None:
            first_scores = scores
            plot_histograms(scores, results, args.out / "ood_detection.png", seed)

    table = summarise(per_seed)
    markdown = markdown_table(table, args.seeds)
    print("\n" + markdown)
    output = {
        "config": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "data": {
            "in_classes": in_classes,
            "out_classes": sorted(set(range(10)) - set(in_classes)),
            "num_train": len(data["y_train"]),
            "num_test_in": len(data["y_in"]),
            "num_test_out": len(data["x_out"]),
            "num_weights": num_weights,
        },
        "per_seed": per_seed,
        "summary": table,
        "seconds": time.perf_counter() - started,
        "png": str(args.out / "ood_detection.png"),
        "versions": {"torch": torch.__version__, "pyro": pyro.__version__, "pyro_sgmcmc": pyro_sgmcmc.__version__},
    }
    (args.out / "ood_detection.md").write_text(markdown)
    output["cpu_seconds"] = time.process_time() - cpu_started
    (args.out / "ood_detection.json").write_text(json.dumps(output, indent=2))
    print(
        f"results written to {args.out}/ (ood_detection.json, .md, .png) in {output['seconds']:.0f} s "
        f"({output['cpu_seconds']:.0f} s CPU)"
    )
    return output


if __name__ == "__main__":
    main()
