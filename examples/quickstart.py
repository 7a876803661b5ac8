"""Quickstart: Bayesian linear regression on scikit-learn's diabetes data, SGHMC against NUTS.

The model (442 patients, 10 standardised features, standardised disease progression ``y``)::

    w     ~ Normal(0, 1)   (10 weights)
    b     ~ Normal(0, 1)
    sigma ~ HalfCauchy(2.5)
    y_n   ~ Normal(x_n . w + b, sigma),  n in a minibatch of B = 128 out of N = 442

``pyro.plate("data", N, subsample_size=B)`` draws a fresh minibatch every time the model runs and
scales its log-likelihood by N / B. :class:`pyro_sgmcmc.SGHMC` runs inside ``pyro.infer.MCMC``
like any kernel. The reference is Pyro's NUTS on the *same* model without subsampling
(``subsample_size=None``: every step sees all 442 rows), and the script prints, per parameter,
the SGHMC and NUTS posterior means and standard deviations and the difference of the means in
units of the NUTS standard deviation.

Run it::

    python examples/quickstart.py              # 2-3 minutes on a 2-core machine
    python examples/quickstart.py --tiny       # a few seconds, smoke test only

Settings and what to expect
---------------------------
``step_size=0.1, friction=1.0, B=128``, 4,000 warmup (burn-in) steps and 60,000 draws, against
NUTS with a dense mass matrix (``full_mass=True``, JIT-compiled), 500 warmup steps and 1,000
draws. The default run (``--seed 0``) prints::

    parameter      SGHMC mean  SGHMC sd  NUTS mean  NUTS sd  diff/sd  sd ratio
    --------------------------------------------------------------------------
    b                   0.000     0.035     -0.001    0.034    +0.03      1.03
    sigma               0.706     0.025      0.705    0.025    +0.05      0.97
    w[0] (age)         -0.005     0.038     -0.007    0.038    +0.04      1.01
    w[1] (sex)         -0.147     0.039     -0.147    0.039    +0.01      0.99
    w[2] (bmi)          0.322     0.042      0.321    0.042    +0.03      1.00
    w[3] (bp)           0.199     0.042      0.200    0.039    -0.03      1.06
    w[4] (s1)          -0.449     0.247     -0.434    0.235    -0.07      1.05
    w[5] (s2)           0.261     0.198      0.251    0.191    +0.05      1.04
    w[6] (s3)           0.047     0.130      0.037    0.120    +0.08      1.08
    w[7] (s4)           0.107     0.101      0.102    0.101    +0.05      1.00
    w[8] (s5)           0.447     0.101      0.444    0.098    +0.04      1.03
    w[9] (s6)           0.043     0.041      0.042    0.040    +0.03      1.04

The means agree to 0.08 NUTS standard deviations or better, and the standard deviations to 8%.
The differences of the collinear weights ``s1``...``s5`` are Monte Carlo error: their effective
sample size is only 60-220 out of the 60,000 draws (see the printed summary), so the standard error
of their means is about 0.07-0.13 NUTS sd, and another seed can give differences of that size
(with 70,000 draws and 5,000 warmup steps, seed 0 gave a largest difference of 0.12). Their
standard deviations are estimated from as few effective draws: ``--seed 1`` gave a largest mean
difference of 0.04 but sd ratios of 0.84-0.89 for ``s1``, ``s2``, ``s3`` and ``s5`` (and 0.96-1.08
for the rest). The other parameters have effective sample sizes near 3,000 in the thinned summary. Before choosing these
settings, a NumPy re-implementation of this update (16 chains per setting, 70,000 draws) gave mean
absolute differences of 0.05 NUTS sd on average over the parameters and 0.11 for the worst one,
with standard deviations at most 12% too wide.

Why these numbers. The posterior is badly conditioned: the blood-serum features ``s1``...``s5`` are
strongly collinear, so the curvature of the mean negative log-likelihood ranges from about 0.02 to about 8
across directions. ``step_size`` is an SGD learning rate on that mean (see ``docs/conventions.rst``),
and with ``friction=1`` the slow directions move like SGLD with step ``step_size / friction``, so
they relax in about ``1 / (0.1 * 0.02) = 500`` steps: that, not the cost of a step, is why the run
needs tens of thousands of steps for an accurate mean of the collinear weights (``s1``...``s5``
have NUTS sds of 0.1-0.24 against 0.04 for the others). A larger ``step_size / friction`` mixes
faster, but the minibatch gradient noise, whose variance relative to the injected noise grows like
``step_size * (N - B) / (friction * B)``, then widens the well-determined directions: in the NumPy
re-implementation, ``step_size=0.2`` (same friction and batch) made the sds of ``b`` and ``sigma``
about 20% too wide, and ``B=64`` with ``step_size=0.1`` about 25%.

Cost. One SGHMC step costs 1.5-2 ms of CPU here, almost all of it Pyro tracing and PyTorch
overhead on this tiny model (see ``docs/benchmarks.rst``); NUTS on all 442 rows takes 10-15 s.
Measured end to end: 2 min 17 s of CPU time, 3 min 17 s of wall time with two other jobs
competing for the two cores. One torch thread is as fast as two for these tiny tensors
(measured), and leaves the second core to other work.

The results are written as JSON to ``--out`` (default ``quickstart_results.json`` in the
current directory).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import print_summary
from sklearn.datasets import load_diabetes

import pyro_sgmcmc


def load_data():
    """The diabetes data, features and target standardised (mean 0, sd 1), as float32 tensors."""
    data = load_diabetes()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = (y - y.mean()) / y.std()
    return x, y, list(data.feature_names)


def model(x, y, subsample_size=None):
    """Bayesian linear regression; ``subsample_size=None`` uses every row (for NUTS)."""
    num_data, num_features = x.shape
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([num_features]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.HalfCauchy(2.5))
    # A fresh minibatch of `subsample_size` rows at every evaluation; Pyro scales its
    # log-likelihood by num_data / subsample_size.
    with pyro.plate("data", num_data, subsample_size=subsample_size) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w + b, sigma), obs=y[idx])


def flatten(samples, feature_names):
    """``{site: (S, *shape)}`` -> ``{label: (S,)}``, one entry per scalar parameter."""
    columns = {}
    for name in sorted(samples):
        value = samples[name]
        if value.dim() == 1:
            columns[name] = value
        else:
            for j in range(value.shape[1]):
                label = f"{name}[{j}]"
                if name == "w":
                    label += f" ({feature_names[j]})"
                columns[label] = value[:, j]
    return columns


def compare(sghmc_samples, nuts_samples, feature_names):
    rows = {}
    sg, ref = flatten(sghmc_samples, feature_names), flatten(nuts_samples, feature_names)
    for label in sg:
        sg_mean, sg_sd = float(sg[label].mean()), float(sg[label].std())
        ref_mean, ref_sd = float(ref[label].mean()), float(ref[label].std())
        rows[label] = {
            "sghmc_mean": sg_mean,
            "sghmc_sd": sg_sd,
            "nuts_mean": ref_mean,
            "nuts_sd": ref_sd,
            "mean_diff_in_nuts_sd": (sg_mean - ref_mean) / ref_sd,
            "sd_ratio": sg_sd / ref_sd,
        }
    return rows


def print_table(rows):
    header = (
        f"{'parameter':<14}{'SGHMC mean':>11}{'SGHMC sd':>10}{'NUTS mean':>11}{'NUTS sd':>9}"
        f"{'diff/sd':>9}{'sd ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for label, r in rows.items():
        print(
            f"{label:<14}{r['sghmc_mean']:>11.3f}{r['sghmc_sd']:>10.3f}{r['nuts_mean']:>11.3f}"
            f"{r['nuts_sd']:>9.3f}{r['mean_diff_in_nuts_sd']:>+9.2f}{r['sd_ratio']:>10.2f}"
        )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=60_000, help="SGHMC draws kept (default 60000)")
    parser.add_argument("--warmup-steps", type=int, default=4_000, help="SGHMC burn-in steps (default 4000)")
    parser.add_argument("--nuts-samples", type=int, default=1_000, help="NUTS draws (default 1000)")
    parser.add_argument("--nuts-warmup", type=int, default=500, help="NUTS warmup steps (default 500)")
    parser.add_argument("--nuts-max-tree-depth", type=int, default=10, help="NUTS max tree depth (default 10)")
    parser.add_argument("--batch-size", type=int, default=128, help="minibatch size B (default 128 of 442)")
    parser.add_argument("--step-size", type=float, default=0.1, help="SGHMC step size (default 0.1)")
    parser.add_argument("--friction", type=float, default=1.0, help="SGHMC friction (default 1.0)")
    parser.add_argument("--summary-thin", type=int, default=10, help="thinning of the printed summary (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a few-second smoke run (tiny sizes, NUTS without JIT)")
    parser.add_argument("--out", type=Path, default=Path("quickstart_results.json"), help="JSON results path")
    parser.add_argument("--progress", action="store_true", help="show Pyro's progress bars")
    args = parser.parse_args(argv)
    if args.tiny:
        args.num_samples, args.warmup_steps = 300, 200
        args.nuts_samples, args.nuts_warmup, args.nuts_max_tree_depth = 50, 50, 4
    return args


def main(argv=None):
    args = parse_args(argv)
    # Tiny tensors: one thread avoids thread start-up and oversubscription (measured: the same
    # speed as two threads on this model, and safer when other jobs share the machine).
    torch.set_num_threads(1)
    pyro.set_rng_seed(args.seed)
    x, y, feature_names = load_data()
    print(f"diabetes: N={x.shape[0]} rows, D={x.shape[1]} features; minibatch B={args.batch_size}")

    # ---------------------------------------------------------------- SGHMC, minibatches
    kernel = pyro_sgmcmc.SGHMC(model, step_size=args.step_size, friction=args.friction)
    mcmc = MCMC(kernel, num_samples=args.num_samples, warmup_steps=args.warmup_steps, disable_progbar=not args.progress)
    start, cpu_start = time.perf_counter(), time.process_time()
    mcmc.run(x, y, args.batch_size)
    sghmc_seconds, sghmc_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    steps = args.num_samples + args.warmup_steps
    print(
        f"\nSGHMC: {steps} steps in {sghmc_seconds:.1f} s wall, {sghmc_cpu:.1f} s CPU "
        f"({1e6 * sghmc_cpu / steps:.0f} CPU us/step)"
    )
    sghmc_samples = mcmc.get_samples()
    # mcmc.summary() would print the same table from all 60,000 draws, but Pyro's effective sample
    # size allocates O(num_samples^2) memory per parameter (tens of GB here), so the table is
    # computed from every 10th draw. (pyro_sgmcmc.MCMC(..., thinning=10) thins while sampling.)
    by_chain = mcmc.get_samples(group_by_chain=True)  # (1 chain, num_samples, ...)
    thinned = {name: value[:, :: args.summary_thin] for name, value in by_chain.items()}
    print(f"summary of every {args.summary_thin}th draw:")
    print_summary(thinned, prob=0.9)
    divergences = len(kernel.diagnostics()["divergences"])
    print(f"SGHMC divergences: {divergences}")

    # ---------------------------------------------------------------- NUTS, full batch
    nuts = NUTS(
        model,
        full_mass=True,  # collinear features: a dense mass matrix makes NUTS ~4x faster here (measured)
        max_tree_depth=args.nuts_max_tree_depth,
        jit_compile=not args.tiny,  # JIT: about 2x faster here; --tiny skips its compile time
        ignore_jit_warnings=True,
    )
    reference = MCMC(
        nuts, num_samples=args.nuts_samples, warmup_steps=args.nuts_warmup, disable_progbar=not args.progress
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    reference.run(x, y, None)
    nuts_seconds, nuts_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(
        f"\nNUTS (full batch): {args.nuts_warmup + args.nuts_samples} iterations in {nuts_seconds:.1f} s wall, "
        f"{nuts_cpu:.1f} s CPU"
    )
    nuts_samples = reference.get_samples()

    # ---------------------------------------------------------------- comparison
    rows = compare(sghmc_samples, nuts_samples, feature_names)
    print("\nSGHMC (minibatch) vs NUTS (full batch); diff/sd = (SGHMC mean - NUTS mean) / NUTS sd\n")
    print_table(rows)
    worst = max(abs(r["mean_diff_in_nuts_sd"]) for r in rows.values())
    print(f"\nlargest |diff/sd| = {worst:.3f}")

    results = {
        "config": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "data": {"name": "diabetes", "num_data": int(x.shape[0]), "num_features": int(x.shape[1])},
        "sghmc": {"seconds": sghmc_seconds, "cpu_seconds": sghmc_cpu, "steps": steps, "divergences": divergences},
        "nuts": {"seconds": nuts_seconds, "cpu_seconds": nuts_cpu, "iterations": args.nuts_warmup + args.nuts_samples},
        "comparison": rows,
        "max_abs_mean_diff_in_nuts_sd": worst,
        "versions": {"torch": torch.__version__, "pyro": pyro.__version__, "pyro_sgmcmc": pyro_sgmcmc.__version__},
    }
    if not all(math.isfinite(v) for r in rows.values() for v in r.values()):
        print("warning: non-finite values in the comparison")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"results written to {args.out}")
    return results


if __name__ == "__main__":
    main()
