"""Quickstart: ``SGHMC(model)`` on defaults against Pyro's NUTS, on a regression with 100,000 data.

The model (synthetic data, generated here with a fixed seed; 10 raw features whose scales are spread
log-uniformly over 0.3-3, not standardised)::

    w     ~ Normal(0, 10)   (10 weights)
    b     ~ Normal(0, 10)
    sigma ~ HalfNormal(5)
    y_n   ~ Normal(x_n . w + b, sigma),  n in a minibatch of B = 1,000 out of N = 100,000

``pyro.plate("data", N, subsample_size=B)`` draws a fresh minibatch every time the model runs and scales its
log-likelihood by N / B. The kernel is ``pyro_sgmcmc.SGHMC(model)`` with *no* argument: no step size, no
mass, no friction, no initial point. Its defaults do the tuning in warmup (``kernels/warmup.py``): a sign-based
"approach" from Pyro's default initialisation (the first 25 % of warmup), a control variate centred at the
full-data MAP (``control_variate="auto"``: N >= 10 B), then a per-chain adaptation of the mass matrix and
step size, then sampling. NUTS runs the same model with ``subsample_size=None`` (every step sees all the
data), on Pyro's defaults (``NUTS(model)``).

Both are scored against the exact-enough reference for this model: the MAP (Newton's method, float64) and
the Laplace covariance (the inverse Hessian of the potential in unconstrained space, ``log sigma`` for sigma);
for this linear-Gaussian model with N = 10^5 it differs from the posterior by far less than the Monte Carlo
error of either run. The script prints, per parameter, both samplers' means and sds, each side's largest mean
error (in reference sds) and largest relative sd error, and the wall time of each ``mcmc.run`` (set-up,
warmup and sampling included).

Run it::

    python examples/quickstart.py              # about 90 s on a quiet 2-core machine
    python examples/quickstart.py --tiny       # a few seconds, smoke test only

What to expect (``--seed 0``, one torch thread; measured on 2026-11-27 with ``python
benchmarks/example_costs.py quickstart`` on a quiet 2-core AMD EPYC, load average 0.65 at the start and 0.92
at the end, 92.3 s for the whole script)::

                                 wall time  max |mean err|  max |sd err|
    SGHMC(model), minibatches       18.8 s        0.044 sd         9.3%
    NUTS(model), full data          70.6 s        0.054 sd        12.0%

The errors are the same in every run (fixed seeds); the times grow with the load of a shared machine (two
runs the same day at load 3.6 and 4.3: SGHMC 19.1 and 16.7 s wall, NUTS 78 and 90 s wall). NUTS
keeps 500 draws (after 500 warmup iterations), with a bulk ESS of 163-1,349 over the parameters against
1,001-1,218 for SGHMC's 8,000 draws: its sds are estimated from fewer effective draws, and more draws would
cost proportionally more time (``benchmarks/race_nuts.py`` races the two to a fixed accuracy, means and
sds, on a logistic regression).

The results are written as JSON to ``--out`` (a directory, default ``./quickstart_out``;
``quickstart_results.json`` inside it), or to ``--out`` itself when it ends in ``.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS

import pyro_sgmcmc
from pyro_sgmcmc import SGHMC

NUM_FEATURES = 10


def make_data(num_data: int, seed: int = 0):
    """Raw features with scales from 0.3 to 3, a linear target with noise sd 0.7; float32 tensors."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.exp(torch.empty(NUM_FEATURES).uniform_(math.log(0.3), math.log(3.0), generator=generator))
    w = torch.randn(NUM_FEATURES, generator=generator) / scales
    x = torch.randn(num_data, NUM_FEATURES, generator=generator) * scales
    y = x @ w + 1.0 + 0.7 * torch.randn(num_data, generator=generator)
    return x, y


def model(x, y, subsample_size=None):
    """Bayesian linear regression; ``subsample_size=None`` uses every row (for NUTS)."""
    w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 10.0))
    sigma = pyro.sample("sigma", dist.HalfNormal(5.0))
    # a fresh minibatch of `subsample_size` rows at every evaluation, its log-likelihood scaled by N / B
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w + b, sigma), obs=y[idx])


LABELS = ["b", "sigma"] + [f"w[{j}]" for j in range(NUM_FEATURES)]


def columns(samples) -> dict:
    """``{site: (S, *shape)}`` -> ``{label: (S,) float64}``, one entry per scalar parameter."""
    out = {"b": samples["b"].reshape(-1), "sigma": samples["sigma"].reshape(-1)}
    for j in range(NUM_FEATURES):
        out[f"w[{j}]"] = samples["w"].reshape(-1, NUM_FEATURES)[:, j]
    return {k: v.double() for k, v in out.items()}


def laplace_reference(x, y) -> dict:
    """Posterior mean and sd of every parameter by Newton's method and the Laplace approximation (float64).

    Unconstrained coordinates ``(w, b, log sigma)``; the potential includes the Jacobian of ``sigma = exp(s)``
    (as the samplers' does). ``sigma``'s mean and sd are the log-normal ones of the Gaussian in ``s``.
    """
    x, y = x.double(), y.double()

    def potential(theta):
        w, b, s = theta[:NUM_FEATURES], theta[NUM_FEATURES], theta[NUM_FEATURES + 1]
        sigma = s.exp()
        u = -dist.Normal(0.0, 10.0).log_prob(w).sum() - dist.Normal(0.0, 10.0).log_prob(b)
        u = u - dist.HalfNormal(5.0).log_prob(sigma) - s  # prior of sigma and the Jacobian
        return u - dist.Normal(x @ w + b, sigma).log_prob(y).sum()

    # start at least squares (a quadratic in (w, b) given sigma), then Newton on everything
    design = torch.cat([x, torch.ones(len(y), 1, dtype=x.dtype)], 1)
    coef = torch.linalg.lstsq(design, y.unsqueeze(-1)).solution.squeeze(-1)
    residual_sd = (y - design @ coef).std()
    theta = torch.cat([coef, residual_sd.log().reshape(1)])
    for _ in range(50):
        grad = torch.autograd.functional.jacobian(potential, theta)
        hess = torch.autograd.functional.hessian(potential, theta)
        step = torch.linalg.solve(hess, grad)
        theta = theta - step
        if float(step.abs().max()) < 1e-12:
            break
    cov = torch.linalg.inv(torch.autograd.functional.hessian(potential, theta))
    sd = cov.diagonal().sqrt()
    s, s_var = theta[-1], cov[-1, -1]
    ref = {f"w[{j}]": (float(theta[j]), float(sd[j])) for j in range(NUM_FEATURES)}
    ref["b"] = (float(theta[NUM_FEATURES]), float(sd[NUM_FEATURES]))
    sigma_mean = math.exp(float(s) + 0.5 * float(s_var))
    ref["sigma"] = (sigma_mean, sigma_mean * math.sqrt(math.expm1(float(s_var))))
    return {label: {"mean": ref[label][0], "sd": ref[label][1]} for label in LABELS}


def accuracy(draws: dict, ref: dict) -> dict:
    """Per parameter, ``(mean - ref mean) / ref sd`` and ``sd / ref sd - 1``; and the largest of each."""
    rows = {}
    for label in LABELS:
        mean, sd = float(draws[label].mean()), float(draws[label].std())
        rows[label] = {
            "mean_error_sd": (mean - ref[label]["mean"]) / ref[label]["sd"],
            "sd_error": sd / ref[label]["sd"] - 1,
        }
    return {
        "per_parameter": rows,
        "max_abs_mean_error_sd": max(abs(r["mean_error_sd"]) for r in rows.values()),
        "max_abs_sd_error": max(abs(r["sd_error"]) for r in rows.values()),
    }


def timed_run(kernel, args, num_samples: int, warmup_steps: int, progress: bool):
    """``mcmc.run`` timed (wall and CPU), with the warnings it raised."""
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=not progress)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start, cpu_start = time.perf_counter(), time.process_time()
        mcmc.run(*args)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return mcmc, seconds, cpu, [f"{w.category.__name__}: {w.message}" for w in caught]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-data", type=int, default=100_000, help="N (default 100000)")
    parser.add_argument("--batch-size", type=int, default=1_000, help="minibatch size B (default 1000)")
    parser.add_argument("--num-samples", type=int, default=8_000, help="SGHMC draws kept (default 8000)")
    parser.add_argument("--warmup-steps", type=int, default=2_000, help="SGHMC warmup steps (default 2000)")
    parser.add_argument("--nuts-samples", type=int, default=500, help="NUTS draws (default 500)")
    parser.add_argument("--nuts-warmup", type=int, default=500, help="NUTS warmup iterations (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a few-second smoke run (tiny sizes)")
    parser.add_argument("--out", type=Path, default=Path("quickstart_out"),
                        help="results directory (or a .json file path); default ./quickstart_out")  # fmt: skip
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress bars, shown by default as Pyro's MCMC shows them (--no-progress hides them)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.num_data, args.num_samples, args.warmup_steps = 10_000, 300, 200
        args.nuts_samples, args.nuts_warmup = 50, 50
    return args


def main(argv=None):
    args = parse_args(argv)
    # One thread for both samplers (the same for both; leaves the second core to other work).
    torch.set_num_threads(1)
    x, y = make_data(args.num_data, args.seed)
    print(f"synthetic regression: N = {args.num_data:,} rows, {NUM_FEATURES} raw features; SGHMC minibatch "
          f"B = {args.batch_size:,}")  # fmt: skip
    start = time.perf_counter()
    ref = laplace_reference(x, y)
    print(f"reference (Newton + Laplace, float64): {time.perf_counter() - start:.1f} s")

    # ---------------------------------------------------------------- SGHMC on defaults, minibatches
    pyro.set_rng_seed(args.seed)
    kernel = SGHMC(model)
    mcmc, sg_seconds, sg_cpu, sg_warnings = timed_run(
        kernel, (x, y, args.batch_size), args.num_samples, args.warmup_steps, args.progress
    )
    sg_steps = args.warmup_steps + args.num_samples
    diagnostics = kernel.diagnostics()
    divergences = len(diagnostics["divergences"]) + diagnostics["warmup divergences"]
    print(f"SGHMC(model): {sg_steps:,} steps in {sg_seconds:.1f} s wall ({sg_cpu:.1f} s CPU); adapted step size "
          f"{diagnostics['step size']:.3f}, control variate: {diagnostics['control variate']}, "
          f"divergences: {divergences}")  # fmt: skip
    sg_draws = columns(mcmc.get_samples())

    # ---------------------------------------------------------------- NUTS on defaults, full data
    pyro.set_rng_seed(args.seed)
    nuts, nuts_seconds, nuts_cpu, nuts_warnings = timed_run(
        NUTS(model), (x, y, None), args.nuts_samples, args.nuts_warmup, args.progress
    )
    nuts_divergences = len(nuts.diagnostics()["divergences"]["chain 0"])
    print(f"NUTS(model), full data: {args.nuts_warmup + args.nuts_samples:,} iterations in {nuts_seconds:.1f} s "
          f"wall ({nuts_cpu:.1f} s CPU); divergences: {nuts_divergences}")  # fmt: skip
    nuts_draws = columns(nuts.get_samples())

    # ---------------------------------------------------------------- side by side
    sg_acc, nuts_acc = accuracy(sg_draws, ref), accuracy(nuts_draws, ref)
    header = (f"{'parameter':<10}{'reference':>20}{'SGHMC(model)':>20}{'NUTS(model)':>20}"
              f"{'SGHMC err':>16}{'NUTS err':>16}")  # fmt: skip
    print("\nposterior mean (sd); err = (mean - reference) / reference sd, sd / reference sd - 1\n")
    print(header)
    print("-" * len(header))
    comparison = {}
    for label in LABELS:
        r, s, n = ref[label], sg_draws[label], nuts_draws[label]
        se, ne = sg_acc["per_parameter"][label], nuts_acc["per_parameter"][label]
        print(f"{label:<10}{r['mean']:>11.4f} ({r['sd']:.4f}){float(s.mean()):>11.4f} ({float(s.std()):.4f})"
              f"{float(n.mean()):>11.4f} ({float(n.std()):.4f}){se['mean_error_sd']:>+8.2f} {se['sd_error']:>+7.0%}"
              f"{ne['mean_error_sd']:>+9.2f} {ne['sd_error']:>+6.0%}")  # fmt: skip
        comparison[label] = {
            "sghmc_mean": float(s.mean()),
            "sghmc_sd": float(s.std()),
            "nuts_mean": float(n.mean()),
            "nuts_sd": float(n.std()),
            "mean_diff_in_nuts_sd": float((s.mean() - n.mean()) / n.std()),
            "sd_ratio": float(s.std() / n.std()),
        }
    print(f"\n{'':<26}{'wall time':>12}{'max |mean err|':>16}{'max |sd err|':>14}")
    for name, seconds, acc in (("SGHMC(model), minibatches", sg_seconds, sg_acc),
                               ("NUTS(model), full data", nuts_seconds, nuts_acc)):  # fmt: skip
        print(f"{name:<26}{seconds:>10.1f} s{acc['max_abs_mean_error_sd']:>13.3f} sd"
              f"{acc['max_abs_sd_error']:>13.1%}")  # fmt: skip

    results = {
        "config": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "data": {"name": "synthetic linear regression", "num_data": args.num_data, "num_features": NUM_FEATURES},
        "reference": ref,
        "sghmc": {
            "seconds": sg_seconds,
            "cpu_seconds": sg_cpu,
            "steps": sg_steps,
            "divergences": divergences,
            "step_size": diagnostics["step size"],
            "control_variate": diagnostics["control variate"],
            "accuracy": sg_acc,
            "warnings": sg_warnings,
        },  # fmt: skip
        "nuts": {
            "seconds": nuts_seconds,
            "cpu_seconds": nuts_cpu,
            "iterations": args.nuts_warmup + args.nuts_samples,
            "divergences": nuts_divergences,
            "accuracy": nuts_acc,
            "warnings": nuts_warnings,
        },  # fmt: skip
        "comparison": comparison,
        "max_abs_mean_diff_in_nuts_sd": max(abs(r["mean_diff_in_nuts_sd"]) for r in comparison.values()),
        "versions": {"torch": torch.__version__, "pyro": pyro.__version__, "pyro_sgmcmc": pyro_sgmcmc.__version__},
    }
    path = args.out if args.out.suffix == ".json" else args.out / "quickstart_results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"\nresults written to {path}")
    return results


if __name__ == "__main__":
    main()
