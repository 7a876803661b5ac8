"""Benchmark: a race against Pyro's NUTS on defaults, to posterior means *and* sds.

Problem. Bayesian logistic regression with an intercept and d = 20 raw (not standardised) features whose
scales are spread log-uniformly over 0.3-3, data generated here with a fixed seed (:func:`make_data`)::

    w_j ~ Normal(0, 10)  (j = 1..20),   b ~ Normal(0, 10),
    y_n ~ Bernoulli(sigmoid(x_n . w + b)),  x_nj = s_j * Normal(0, 1),  s_j log-uniform on [0.3, 3],

with true weights ``w_j = 0.4 z_j / s_j`` (``z_j ~ N(0, 1)``) and ``b = -0.5``; N = 10^5 and 10^6. The model
is written once, with ``pyro.plate("data", N, subsample_size=B)``: ``B = 1000`` for the stochastic-gradient
kernels, ``B = None`` (all the data at every evaluation) for NUTS. Everything runs in float32 on one torch
thread (``torch.set_num_threads(1)``, both sides).

Reference. The MAP by Newton's method in float64 (on the same float32 data, cast up) and the Laplace
covariance (the inverse Hessian there). It is validated once against a long NUTS run at N = 10^4 (float64,
JIT-compiled, 1,000 warmup iterations and 10,000 draws): the script reports the largest
``|mean diff| / sd`` and the largest relative sd difference between the two.

Criterion (both sides, from the draws kept after warmup): every posterior mean within 0.1 reference sd of
the reference mean AND every posterior sd within 10 % of the reference sd (all 21 coordinates).

Contenders, all from Pyro's default initialisation (``init_to_uniform``), one chain, ``pyro.infer.MCMC``:

* ``NUTS``: ``pyro.infer.NUTS(model)`` on defaults (no JIT, diagonal mass matrix, Pyro's adaptation), full
  data;
* ``SGHMC``: ``SGHMC(model)`` on defaults: the three-phase warmup (an approach from the initial point by
  sign-based descent, then per-chain adaptation of the mass matrix and step size) and
  ``control_variate="auto"`` (here: N >= 10 B, so the gradients are centred at the full-data MAP, found by
  L-BFGS after the approach and kept where it lowers the gradient noise, inside the timed run);
* ``SGHMC, CV from set-up``: ``SGHMC(model, control_variate="map")``: the MAP is searched at set-up, from
  the initial point, and the approach already runs on centred gradients;
* ``SGHMC, no CV``: ``SGHMC(model, control_variate=None)``: plain minibatch gradients.

Time to criterion. Each side runs a ladder of budgets that double, each a fresh run with the same seed
(``pyro.set_rng_seed(0)`` before each): NUTS with ``warmup_steps = num_samples`` = 250, 500, 1000, ...;
the SGHMC lines with ``num_samples`` = 2000, 4000, 8000, ... and ``warmup_steps = num_samples / 4``. The
time to criterion is the wall time of ``mcmc.run`` (set-up, initialisation, warmup including the approach
and the MAP search, sampling) of the *first* budget that meets the criterion; the errors of every budget are
recorded, and so is the ladder's total (what a user who doubles until it passes pays). Each side has a cap
on the ladder's total time (``--caps``: 15 minutes at N = 10^5, 60 minutes at N = 10^6); a budget whose
predicted time (twice the previous one) would take the total past the cap is not run, and the side is then
reported as "not reached within" the cap.

One seed can pass or fail by Monte Carlo luck (the sds need an effective sample size of several hundred to be
within 10 %), so the budget at which a side first passes is then run again with seeds 1-4 (``--repeats``),
if those runs take at most 5 minutes in all, and the table reports how many of them also pass.

Before the clock starts, each side runs once, untimed, on a small problem (imports and lazy initialisation
land there, not in whichever contender runs first); ``torch._dynamo`` is imported up front for the same
reason.

Run::

    python benchmarks/race_nuts.py            # the full race; about an hour on a 2-core machine
    python benchmarks/race_nuts.py --tiny     # N = 2e4, short budgets: under a minute (smoke test)

Writes ``benchmarks/race_nuts_results.json`` (``--out``).
"""

from __future__ import annotations

import math
import time
import warnings

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import torch
import torch._dynamo  # noqa: F401  (torch.func imports it on first use: seconds that would land in one contender)
from pyro.infer import MCMC, NUTS

from pyro_sgmcmc import SGHMC

if __package__:  # imported as benchmarks.race_nuts
    from . import harness
    from .models import logistic_laplace
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    from models import logistic_laplace

ROOT = harness.ROOT
D = 20
PRIOR_SD = 10.0
BATCH = 1000
MEAN_TOLERANCE = 0.1  # in reference sds
SD_TOLERANCE = 0.1  # relative
SEED = 0
DATA_SEED = 0
THREADS = 1
#: the other-seed repeats of a side's passing budget run only if they take at most this long in all (seconds)
REPEAT_BUDGET = 300.0

#: the SGHMC lines: label -> keyword arguments of SGHMC (nothing else is set)
SG_LINES = {
    "SGHMC": {},
    "SGHMC, CV from set-up": {"control_variate": "map"},
    "SGHMC, no CV": {"control_variate": None},
}


# ---------------------------------------------------------------------------------------------- problem
def make_data(num_data: int, seed: int = DATA_SEED):
    """``(x float32 (N, D), y float32 (N,), truth)``; the same seed gives the same scales and weights at any N."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.exp(torch.empty(D, dtype=torch.float64).uniform_(math.log(0.3), math.log(3.0), generator=generator))
    w = 0.4 * torch.randn(D, dtype=torch.float64, generator=generator) / scales
    b = -0.5
    data = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(num_data, D, dtype=torch.float64, generator=data) * scales).float()
    y = torch.bernoulli(torch.sigmoid(x.double() @ w + b), generator=data).float()
    return x, y, {"w": w.tolist(), "b": b, "scales": scales.tolist()}


def model(x, y, subsample_size=None):
    """The model both sides run; ``subsample_size=None``: every datum at every evaluation (NUTS)."""
    zero = x.new_zeros(())  # the prior in the data's dtype (float32 in the race, float64 in the check)
    w = pyro.sample("w", dist.Normal(zero, PRIOR_SD).expand([D]).to_event(1))
    b = pyro.sample("b", dist.Normal(zero, PRIOR_SD))
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w + b), obs=y[idx])


def labels():
    return [f"w[{j}]" for j in range(D)] + ["b"]


def flat(samples) -> torch.Tensor:
    """``(S, D + 1)`` draws in the order of :func:`labels` (float64)."""
    return torch.cat([samples["w"].reshape(-1, D), samples["b"].reshape(-1, 1)], dim=1).double()


# ---------------------------------------------------------------------------------------------- reference
def newton_reference(x, y) -> dict:
    """MAP (Newton's method with step halving, float64) and the Laplace covariance, order ``w[0..19], b``."""
    start = time.perf_counter()
    ref = logistic_laplace(x, y, PRIOR_SD, intercept=True, chunk=250_000, tol=1e-10, max_iter=50)
    return {**ref, "seconds": time.perf_counter() - start}


def errors(draws: torch.Tensor, ref: dict) -> dict:
    """Largest ``|mean - ref mean| / ref sd`` and ``|sd / ref sd - 1|`` over the coordinates, and where."""
    mean_err = (draws.mean(0) - ref["mean"]).abs() / ref["sd"]
    sd_err = (draws.std(0) / ref["sd"] - 1).abs()
    names = labels()
    return {
        "max_mean_error_sd": float(mean_err.max()),
        "worst_mean": names[int(mean_err.argmax())],
        "max_sd_error": float(sd_err.max()),
        "worst_sd": names[int(sd_err.argmax())],
        "meets": bool(mean_err.max() <= MEAN_TOLERANCE and sd_err.max() <= SD_TOLERANCE),
    }


def min_ess(draws: torch.Tensor) -> float:
    """Smallest bulk ESS over the coordinates (ArviZ, one chain)."""
    values = az.ess(az.convert_to_dataset(draws.numpy()[None]))  # (chain, draw, dim)
    return float(np.min(values["x"].values))


# ---------------------------------------------------------------------------------------------- runs
def run_once(side: str, x, y, warmup: int, samples: int, seed: int = SEED) -> dict:
    """One fresh, timed run of ``side``; its draws' errors are added by the caller."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    if side == "NUTS":
        kernel = NUTS(model)
        subsample = None
    else:
        kernel = SGHMC(model, **SG_LINES[side])
        subsample = BATCH
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=True)
    load = harness.load_average()[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        mcmc.run(x, y, subsample)
        seconds = time.perf_counter() - start
    out = {
        "warmup_steps": warmup,
        "num_samples": samples,
        "seconds": seconds,
        "load_before": load,
        "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught}),
    }
    if side == "NUTS":
        diagnostics = mcmc.diagnostics()
        out["divergences"] = len(diagnostics.get("divergences", {}).get("chain 0", []))
        out["acceptance_rate"] = float(diagnostics.get("acceptance rate", {}).get("chain 0", float("nan")))
        out["step_size"] = float(kernel.step_size)
    else:
        diagnostics = kernel.diagnostics()
        out["divergences"] = len(diagnostics["divergences"])
        out["warmup_divergences"] = diagnostics["warmup divergences"]
        out["step_size"] = diagnostics["step size"]
        out["control_variate"] = diagnostics["control variate"]
    draws = flat(mcmc.get_samples())
    return out, draws


def scored_run(side: str, x, y, warmup: int, samples: int, ref: dict, seed: int = SEED) -> dict:
    """:func:`run_once` with its draws' errors against the reference and their smallest ESS."""
    run, draws = run_once(side, x, y, warmup, samples, seed)
    return {**run, **errors(draws, ref), "min_ess": min_ess(draws), "seed": seed}


def ladder(side: str, sizes, cap: float, x, y, ref: dict, log, repeats: int = 0) -> dict:
    """Budgets that double until the criterion holds or the cap would be passed; then, if it held and
    ``repeats`` runs of that budget fit in :data:`REPEAT_BUDGET` seconds, the same budget with seeds 1..repeats."""
    runs, total, reached = [], 0.0, None
    stopped = "ladder exhausted"
    for warmup, samples in sizes:
        if runs and total + 2 * runs[-1]["seconds"] > cap:
            stopped = "cap"
            log(f"  {side}: next budget ({warmup} + {samples}) predicted to pass the cap of {cap:.0f} s; stopped")
            break
        run = scored_run(side, x, y, warmup, samples, ref)
        total += run["seconds"]
        runs.append(run)
        log(
            f"  {side:<22} warmup {warmup:>6} samples {samples:>6}: {run['seconds']:7.1f} s  "
            f"mean err {run['max_mean_error_sd']:.3f} sd ({run['worst_mean']})  sd err {run['max_sd_error']:.3f} "
            f"({run['worst_sd']})  min ESS {run['min_ess']:.0f}  div {run['divergences']}  "
            f"{'MEETS' if run['meets'] else 'fails'}  (load {run['load_before']:.1f})"
        )
        if run["meets"]:
            reached = run
            break
    again = []
    if reached is not None and repeats and repeats * reached["seconds"] <= REPEAT_BUDGET:
        for seed in range(SEED + 1, SEED + 1 + repeats):
            run = scored_run(side, x, y, reached["warmup_steps"], reached["num_samples"], ref, seed)
            again.append(run)
            log(
                f"    same budget, seed {seed}: {run['seconds']:7.1f} s  mean err {run['max_mean_error_sd']:.3f} sd  "
                f"sd err {run['max_sd_error']:.3f}  {'MEETS' if run['meets'] else 'fails'}"
            )
    return {
        "runs": runs,
        "reached": reached is not None,
        "time_to_criterion": None if reached is None else reached["seconds"],
        "budget": None if reached is None else [reached["warmup_steps"], reached["num_samples"]],
        "ladder_total_seconds": total,
        "cap_seconds": cap,
        "stopped_by": "criterion met" if reached is not None else stopped,
        "other_seeds": again,
    }


def validate_reference(num_data: int, warmup: int, samples: int, log) -> dict:
    """Newton/Laplace against a long float64 NUTS run (JIT) at ``num_data``."""
    x, y, _ = make_data(num_data)
    x, y = x.double(), y.double()
    ref = newton_reference(x, y)
    pyro.set_rng_seed(SEED)
    mcmc = MCMC(NUTS(model, jit_compile=True, ignore_jit_warnings=True), num_samples=samples, warmup_steps=warmup,
                disable_progbar=True)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(x, y, None)
    seconds = time.perf_counter() - start
    draws = flat(mcmc.get_samples())
    mean_diff = (draws.mean(0) - ref["mean"]).abs() / draws.std(0)
    sd_diff = (ref["sd"] / draws.std(0) - 1).abs()
    ess = min_ess(draws)
    out = {
        "num_data": num_data,
        "nuts": {"warmup_steps": warmup, "num_samples": samples, "jit_compile": True, "dtype": "float64",
                 "seconds": seconds, "min_ess": ess},  # fmt: skip
        "max_abs_mean_diff_in_nuts_sd": float(mean_diff.max()),
        "max_rel_sd_diff": float(sd_diff.max()),
        # Monte Carlo error of the NUTS estimates (one sd): of a mean, 1/sqrt(ESS) sd; of an sd, 1/sqrt(2 ESS)
        "nuts_monte_carlo_se_mean_sd": 1 / math.sqrt(ess),
        "nuts_monte_carlo_se_rel_sd": 1 / math.sqrt(2 * ess),
    }
    log(
        f"reference check at N = {num_data}: Laplace vs NUTS ({samples} draws, min ESS {ess:.0f}, "
        f"{seconds:.0f} s): max |mean diff| = {out['max_abs_mean_diff_in_nuts_sd']:.3f} sd, "
        f"max rel sd diff = {out['max_rel_sd_diff']:.3f} "
        f"(NUTS Monte Carlo se: {out['nuts_monte_carlo_se_mean_sd']:.3f} sd, {out['nuts_monte_carlo_se_rel_sd']:.3f})"
    )
    return out


def warm_up(log) -> None:
    """Untimed small runs of every side: imports and lazy initialisation do not land in a timed run."""
    x, y, _ = make_data(20_000)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for side in ["NUTS", *SG_LINES]:
            run_once(side, x, y, 40, 40)
    log(f"warm-up runs: {time.perf_counter() - start:.1f} s (untimed)")


def parse_args(argv=None):
    parser = harness.parser(__doc__, ROOT / "benchmarks" / "race_nuts_results.json", "N = 2e4 only, short budgets")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6], help="N values (default 1e5 1e6)")
    parser.add_argument("--caps", type=float, nargs="+", default=[900.0, 3600.0],
                        help="cap on each side's ladder total, seconds, per N (default 900 3600)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=4,
                        help="re-runs of each side's passing budget, other seeds (default 4; --tiny: 0)")  # fmt: skip
    parser.add_argument("--sides", nargs="+", default=["NUTS", *SG_LINES], help="which contenders")
    parser.add_argument("--no-validation", action="store_true", help="skip the reference check at N = 1e4")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(THREADS)
    if args.tiny:
        sizes, caps = [20_000], [15.0]
        nuts_ladder = [(100, 100), (200, 200)]
        sg_ladder = [(250, 1000), (500, 2000)]
        validation = (2_000, 200, 1_000)
        args.repeats = 0
    else:
        sizes, caps = [int(n) for n in args.sizes], args.caps
        nuts_ladder = [(n, n) for n in (250, 500, 1000, 2000, 4000, 8000)]
        sg_ladder = [(n // 4, n) for n in (2000, 4000, 8000, 16000, 32000, 64000, 128000)]
        validation = (10_000, 1_000, 10_000)
    if len(caps) != len(sizes):
        raise SystemExit("--caps needs one value per --sizes value")

    log = harness.Log()
    results = {
        "config": {
            "tiny": args.tiny, "d": D, "prior": f"w_j, b ~ Normal(0, {PRIOR_SD})", "batch_size": BATCH,
            "dtype": "float32 (both sides); reference float64", "torch_threads": THREADS, "seed": SEED,
            "data_seed": DATA_SEED,
            "criterion": f"every mean within {MEAN_TOLERANCE} reference sd and every sd within "
            f"{100 * SD_TOLERANCE:.0f} % of the reference sd (21 coordinates), from the draws after warmup",
            "nuts_ladder": nuts_ladder, "sghmc_ladder": sg_ladder, "caps_seconds": dict(zip(map(str, sizes), caps)),
            "sides": args.sides, "repeats": args.repeats, "repeat_budget_seconds": REPEAT_BUDGET,
            "sghmc_lines": {k: {kk: repr(vv) for kk, vv in v.items()} for k, v in SG_LINES.items()},
        },  # fmt: skip
        "machine": harness.machine_info(load_at_start=harness.load_average()),
        "package": harness.package_fingerprint(),
    }
    warm_up(log)
    if not args.no_validation:
        results["validation"] = validate_reference(*validation, log)

    results["races"] = {}
    for num_data, cap in zip(sizes, caps):
        x, y, truth = make_data(num_data)
        ref = newton_reference(x, y)
        log(f"\nN = {num_data}: Newton reference in {ref['seconds']:.1f} s ({ref['newton_iterations']} iterations); "
            f"reference sds {float(ref['sd'].min()):.2e} .. {float(ref['sd'].max()):.2e}")  # fmt: skip
        race = {
            "reference": {"mean": ref["mean"].tolist(), "sd": ref["sd"].tolist(),
                          **{k: ref[k] for k in ("newton_iterations", "max_abs_grad", "seconds")}},  # fmt: skip
            "truth": truth,
            "positives": float(y.mean()),
            "sides": {},
        }
        for side in args.sides:
            ladder_sizes = nuts_ladder if side == "NUTS" else sg_ladder
            race["sides"][side] = ladder(side, ladder_sizes, cap, x, y, ref, log, args.repeats)
        results["races"][str(num_data)] = race
        del x, y

    results["machine"]["load_at_end"] = harness.load_average()
    log("\n" + table(results))
    results["log"] = log.lines
    print(f"results written to {harness.write_json(args.out, results)}")
    return results


def table(results: dict) -> str:
    """Per N and side: time to criterion (NUTS's over this side's in brackets), its budget, errors, the
    ladder's total and how many other seeds pass at that budget."""
    rows = []
    for n, race in results["races"].items():
        nuts = race["sides"].get("NUTS", {})
        for side, entry in race["sides"].items():
            runs = entry["runs"]
            last = next((r for r in runs if r["meets"]), runs[-1] if runs else None)
            if entry["reached"]:
                when = f"{entry['time_to_criterion']:.1f} s"
                if side != "NUTS" and nuts.get("reached"):
                    when += f" ({nuts['time_to_criterion'] / entry['time_to_criterion']:.1f}x)"
                budget = f"{entry['budget'][0]}+{entry['budget'][1]}"
            elif entry["stopped_by"] == "cap":
                when, budget = f"not within {entry['cap_seconds']:.0f} s", "-"
            else:
                when, budget = f"not by {runs[-1]['warmup_steps']}+{runs[-1]['num_samples']}", "-"
            again = entry.get("other_seeds", [])
            rows.append([
                n, side, when, budget, f"{last['max_mean_error_sd']:.3f}" if last else "-",
                f"{last['max_sd_error']:.3f}" if last else "-", f"{entry['ladder_total_seconds']:.1f} s",
                f"{sum(r['meets'] for r in again)}/{len(again)}" if again else "-",
            ])  # fmt: skip
    header = ["N", "side", "time to criterion", "budget", "mean err (sd)", "sd err", "ladder total", "other seeds pass"]
    return harness.text_table(header, rows)


if __name__ == "__main__":
    main()
