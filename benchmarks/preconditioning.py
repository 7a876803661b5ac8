"""Mass-matrix adaptation on posteriordb regressions, against Pyro's NUTS; control variates at N = 100,000.

Part 1 (``--part posteriordb``). For each posterior (``sblrc-blr``, ``kidiq-kidscore_interaction``,
``earnings-logearn_interaction_z``, ``diamonds-diamonds``), written as in Stan (no
reparametrisation, ``tests/posteriordb_plain.py``), full batch, started at the least-squares fit:

* ``SGHMC(model, adapt_mass_matrix=True)`` and ``SGLD(model, adapt_mass_matrix=True)``: default
  settings (no step size given), 16 vectorised chains;
* Pyro's ``NUTS`` (``full_mass=False``, its default, and ``full_mass=True``), one chain.

Reported per run: the largest error of the mean over the parameters in reference sds, the largest
relative error of the sd, the smallest bulk ESS (:func:`pyro.ops.stats.effective_sample_size`
over chains), and the *gradient evaluations per effective sample* (all evaluations, warmup and
adaptation probes included, divided by the smallest ESS). NUTS's evaluations are counted by
counting executions of the model (each potential-and-gradient evaluation runs it once); ours are
``steps x chains`` plus the adaptation probes.

Part 2 (``--part cv``). Bayesian linear regression, N = 100,000, D = 10, B = 100, conjugate (known
noise sd), so the exact posterior is known: SGLD with ``control_variate="map"`` at step 0.01, and
without it at steps 0.01 and 0.001, 4 chains started 3 posterior sds from the mean, 500 warmup +
2000 steps each; largest error of the posterior mean (in posterior sds) and of the sd
(relative), and wall time (all in one process, interleaved, medians over ``--repeats``; the CV
time includes the MAP search and the full-data gradient).

Reproduce::

    python benchmarks/preconditioning.py --out preconditioning_results.json

``--tiny`` runs a few steps of each (smoke check).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC as PyroMCMC
from pyro.infer import NUTS
from pyro.infer.autoguide.initialization import init_to_value
from pyro.ops.stats import effective_sample_size

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from posteriordb_plain import build, least_squares_init, reference  # noqa: E402

from pyro_sgmcmc import MCMC, SGHMC, SGLD  # noqa: E402

if __package__:  # imported as benchmarks.preconditioning
    from . import harness  # noqa: E402
else:  # run as a script: benchmarks/ is on sys.path
    import harness  # noqa: E402

FOLDERS = ["sblrc-blr", "kidiq-kidscore_interaction", "earnings-logearn_interaction_z", "diamonds-diamonds"]


def _summary(folder, names, samples_by_chain):
    ref = reference(folder)
    worst_mean = worst_sd = 0.0
    min_ess = math.inf
    for name, f in names.items():
        x = f(samples_by_chain).double()
        m, s = float(x.mean()), float(x.reshape(-1).std())
        r = ref[name]
        worst_mean = max(worst_mean, abs(m - r["mean"]) / r["sd"])
        worst_sd = max(worst_sd, abs(s / r["sd"] - 1))
        min_ess = min(min_ess, float(effective_sample_size(x.unsqueeze(-1), chain_dim=0, sample_dim=1)))
    return {"max_mean_error_sd": worst_mean, "max_sd_rel_error": worst_sd, "min_ess": min_ess}


def run_ours(folder, kernel_name, warmup, samples, chains, seed):
    model, n, names = build(folder, None)
    K = {"SGHMC": SGHMC, "SGLD": SGLD}[kernel_name]
    kernel = K(model, adapt_mass_matrix=True, init_strategy=init_to_value(values=least_squares_init(folder)))
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=warmup, num_chains=chains, chain_method="vectorized",
                seed=seed, disable_progbar=True)  # fmt: skip
    start = time.perf_counter()
    mcmc.run()
    elapsed = time.perf_counter() - start
    out = _summary(folder, names, mcmc.get_samples(group_by_chain=True))
    evaluations = chains * (warmup + samples + 1 + kernel.warmup.adaptation.num_extra_evaluations)
    out.update(
        method=f"{kernel_name}(adapt_mass_matrix=True)",
        step_size=kernel.step_size(0),
        dense=kernel.warmup.adaptation.full_mass,
        gradient_evaluations=evaluations,
        evaluations_per_ess=evaluations / out["min_ess"],
        seconds=elapsed,
        divergences=kernel.num_divergences,
    )
    return out


def run_nuts(folder, full_mass, warmup, samples, seed):
    model, n, names = build(folder, None, proper=True)  # NUTS's set-up samples the prior: no ImproperUniform
    counter = {"calls": 0}

    def counted(*args, **kwargs):
        counter["calls"] += 1
        return model(*args, **kwargs)

    pyro.set_rng_seed(seed)
    kernel = NUTS(counted, full_mass=full_mass, init_strategy=init_to_value(values=least_squares_init(folder)))
    mcmc = PyroMCMC(kernel, num_samples=samples, warmup_steps=warmup, num_chains=1, disable_progbar=True)
    start = time.perf_counter()
    mcmc.run()
    elapsed = time.perf_counter() - start
    out = _summary(folder, names, mcmc.get_samples(group_by_chain=True))
    out.update(
        method=f"NUTS(full_mass={full_mass})",
        gradient_evaluations=counter["calls"],
        evaluations_per_ess=counter["calls"] / out["min_ess"],
        seconds=elapsed,
    )
    return out


# ---------------------------------------------------------------------------- control variates
def cv_problem(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    w_true = torch.randn(d, generator=g, dtype=torch.float64)
    y = X @ w_true + torch.randn(n, generator=g, dtype=torch.float64)
    precision = torch.eye(d, dtype=torch.float64) + X.T @ X  # prior N(0, 1), noise sd 1
    cov = torch.linalg.inv(precision)
    mean = cov @ (X.T @ y)
    return X, y, mean, cov.diagonal().sqrt()


def cv_run(X, y, mean, sd, cv, steps, warmup, step_size, batch, seed):
    n, d = X.shape

    def model():
        w = pyro.sample("w", dist.Normal(torch.zeros(d, dtype=torch.float64), 1.0).to_event(1))
        with pyro.plate("data", n, subsample_size=batch) as idx:
            pyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])

    start = mean + 3 * sd * torch.tensor([(-1.0) ** j for j in range(d)], dtype=torch.float64)  # 3 sds away
    kernel = SGLD(model, step_size=step_size, control_variate="map" if cv else None, adapt_step_size=False,
                  adapt_mass_matrix=False,
                  init_strategy=init_to_value(values={"w": start}))  # fmt: skip
    mcmc = MCMC(kernel, num_samples=steps, warmup_steps=warmup, num_chains=4, chain_method="vectorized", seed=seed,
                disable_progbar=True)  # fmt: skip
    start = time.perf_counter()
    mcmc.run()
    elapsed = time.perf_counter() - start
    w = mcmc.get_samples()["w"]
    return {
        "control_variate": cv,
        "seconds": elapsed,
        "max_mean_error_sd": float(((w.mean(0) - mean).abs() / sd).max()),
        "max_sd_rel_error": float((w.std(0) / sd - 1).abs().max()),
    }


def main(argv=None):
    parser = harness.parser(__doc__, Path("preconditioning_results.json"), "a few steps of each (smoke check)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--part", choices=["all", "posteriordb", "cv"], default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folders", nargs="*", default=FOLDERS)
    parser.add_argument("--methods", nargs="*", default=["SGHMC", "SGLD", "NUTS"], help="which samplers to run")
    args = parser.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    results = {"config": vars(args) | {"out": str(args.out)}, "context": harness.run_context(), "posteriordb": {},
               "cv": []}  # fmt: skip
    print(harness.context_line(results["context"]), flush=True)
    warmup, samples, chains = (20, 20, 2) if args.tiny else (600, 1000, 16)
    nuts_warmup, nuts_samples = (10, 10) if args.tiny else (500, 1000)
    if args.part in ("all", "posteriordb"):
        for folder in args.folders:
            rows = []
            for name in [m for m in ("SGHMC", "SGLD") if m in args.methods]:
                rows.append(run_ours(folder, name, warmup, samples, chains, args.seed))
                print(folder, rows[-1], flush=True)
            for full in (False, True) if "NUTS" in args.methods else ():
                if folder == "diamonds-diamonds" and not full and not args.tiny:
                    continue  # diagonal NUTS hits the tree-depth limit at every draw here: hours
                rows.append(run_nuts(folder, full, nuts_warmup, nuts_samples, args.seed))
                print(folder, rows[-1], flush=True)
            results["posteriordb"][folder] = rows
            harness.write_json(args.out, results, indent=1)
    if args.part in ("all", "cv"):
        n, d, batch = (2000, 5, 20) if args.tiny else (100_000, 10, 100)
        steps, cv_warmup = (50, 20) if args.tiny else (2000, 500)
        X, y, mean, sd = cv_problem(n, d, args.seed)
        configs = [(False, 0.01), (False, 0.001), (True, 0.01)]
        timings = {c: [] for c in configs}
        for repeat in range(1 if args.tiny else args.repeats):
            for cv, step in configs:  # interleaved, so machine load hits all alike
                row = cv_run(X, y, mean, sd, cv, steps, cv_warmup, step, batch, args.seed + repeat)
                row.update(repeat=repeat, step_size=step)
                timings[(cv, step)].append(row["seconds"])
                results["cv"].append(row)
                print(row, flush=True)
        results["cv_median_seconds"] = {f"cv={c} step={e}": statistics.median(v) for (c, e), v in timings.items()}
    results["load_average_end"] = harness.load_average()
    print(harness.context_line(results["context"], results["load_average_end"]))
    harness.write_json(args.out, results, indent=1)


if __name__ == "__main__":
    main()
