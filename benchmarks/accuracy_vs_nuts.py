"""Benchmark: wall time to accurate posterior means, SGHMC, SGLD and SGHMC-CV against full-batch NUTS, as N grows.

Bayesian logistic regression, d = 20 weights with N(0, 1) priors, no intercept; data generated here:
``x ~ N(0, I)``, true weights ``N(0, 0.3^2)``, ``y ~ Bernoulli(sigmoid(x w))``; N = 10^5, 10^6, 10^7.

Reference. The posterior mean is taken to be the MAP (Newton's method on all the data, float64) and the
posterior sd the square roots of the diagonal of the inverse Hessian there (Laplace). For this model the
mean and the mode differ by O(1/N) while the sd is O(N^-1/2): the difference is about ``N^-1/2`` sd, at most
0.003 sd here, 30 times below the 0.1 sd criterion. At N = 10^5 the script also checks the reference
against the long NUTS run's own mean (printed).

Criterion. A sampler "reaches" the posterior means when the running average of its draws after burn-in (over
all its chains) is within 0.1 posterior sd of the reference in all 20 coordinates, and stays within until its
run ends (a run stops when it has stayed within for as many further steps as it took to get there, or at its
step budget). The time is wall-clock from the start of ``mcmc.run`` (set-up, initialisation and burn-in
included) to that point.

Contenders.

``NUTS``
    ``pyro.infer.MCMC(NUTS(model, jit_compile=True))`` on the full data (JIT makes Pyro's NUTS faster on this
    model), 200 warmup iterations (Pyro's adaptation), then draws until the criterion holds.
``SGHMC``, ``SGLD``
    ``pyro_sgmcmc.MCMC(..., chain_method="vectorized")`` with 16 chains, minibatches ``B = N / 100`` (so the
    ratio of gradient noise to injected noise, ``~ eps N / B``, is the same at every N), step sizes
    ``0.3`` (SGHMC, friction 1) and ``0.5`` (SGLD) on the normalised drift, 300 burn-in steps, at most 5,000
    steps or 600 s per run (then "not reached" unless the criterion holds at the end).
``SGHMC-CV``
    SGHMC with ``control_variate="map"`` (SGHMC-CV, after Baker et al. 2019's SGLD-CV): the MAP is found by
    L-BFGS on the full data at set-up, starting from the prior median (``init_to_median``), every chain
    starts there (``init_to_centre=True``, as Baker et al. start SGLD-CV) with a stationary momentum, and
    each minibatch gradient is centred at the MAP, so its noise shrinks with the distance to the MAP instead
    of growing with ``N / B``. ``B = 100``, 32 chains, step 1.0, friction 0.3, 30 burn-in steps, the same at
    every N (the reasoning is beside ``CV_STEP`` below). The MAP search and the full-data gradient at the MAP
    run inside ``mcmc.run``: their time counts.

N = 10^7 with NUTS would take about 20 minutes, so NUTS at 10^7 is **extrapolated**: the number of NUTS
iterations to reach the criterion and the tree sizes do not depend on N for this model (the posterior only
shrinks; the adaptation rescales the step size and mass matrix), which the 10^5 and 10^6 runs confirm (both
printed), and each leapfrog step costs one full-data gradient, whose time is measured at every N. So
``t_NUTS(10^7) = t_NUTS(10^6) * g(10^7) / g(10^6)`` with ``g`` the measured time of one potential-and-gradient
evaluation. ``--nuts-max-n`` changes which N are run in full.

Run::

    python benchmarks/accuracy_vs_nuts.py              # about 20 minutes
    python benchmarks/accuracy_vs_nuts.py --kinds SGHMC-CV   # NUTS and SGHMC-CV only, about 3 minutes
    python benchmarks/accuracy_vs_nuts.py --tiny       # N = 10^4 only, seconds

Writes ``benchmarks/results/accuracy_vs_nuts.json`` and the plot ``docs/_static/accuracy_vs_nuts.png``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import pyro.infer
import torch
import torch._dynamo  # noqa: F401  (torch.func imports it on first use: 1.6 s that would land in the first run)
from pyro.infer.autoguide.initialization import init_to_median

from pyro_sgmcmc import MCMC, SGHMC, SGLD

if __package__:  # imported as benchmarks.accuracy_vs_nuts
    from . import harness
    from .models import logistic_laplace
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    from models import logistic_laplace

ROOT = harness.ROOT
D = 20
TOLERANCE = 0.1  # in posterior sd
CHAINS = 16
BURN_IN = 300
TIME_BUDGET = 600.0  # seconds per stochastic-gradient run
# SGHMC-CV. The normalised curvature H / N of this posterior has eigenvalues 0.095-0.18 at every N (printed,
# stored as curvature_range). Step 1.0: eps * sqrt(lambda_max) = 0.43, well inside symplectic Euler's stability
# limit of 2; its variance bias (about eps^2 lambda / 4 = 5 % on the stiffest direction) does not move the mean
# of a Gaussian posterior, which is all the criterion asks for. Friction 0.3, 0.7-1.0 sqrt(lambda) (under-
# damped): the integrated autocorrelation time of the position, 2 alpha / lambda in normalised time, is 3-6
# steps, against 11-21 at friction 1 (the chains start at the mode, so no damping is needed to get there).
# B = 100: near the centre the control-variate gradient noise is small at any B, so the minibatch only sets
# the cost of a step. 32 chains, 30 burn-in steps (the chains start at the MAP with stationary momenta and
# spread out in about 1 / sqrt(lambda) = 2-3 time units).
CV_STEP, CV_FRICTION, CV_BATCH, CV_CHAINS, CV_BURN_IN = 1.0, 0.3, 100, 32, 30


class Reached(Exception):
    pass


def make_data(num_data: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    w = 0.3 * torch.randn(D, generator=generator)
    x = torch.randn(num_data, D, generator=generator)
    y = torch.bernoulli(torch.sigmoid(x @ w), generator=generator)
    return x, y


def full_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)


def make_minibatch_model(batch: int):
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    return model


def reference(x, y):
    """MAP by Newton's method (float64, chunked), the Laplace sd, and the eigenvalues of the normalised
    Hessian ``H / N`` (the curvature the samplers' step sizes are measured against)."""
    ref = logistic_laplace(x, y, prior_sd=1.0, chunk=1_000_000, tol=1e-12, max_iter=30)
    return ref["mean"], ref["sd"], torch.linalg.eigvalsh(ref["hessian"] / x.shape[0])


class Tracker:
    """Running mean of the draws after burn-in; records (seconds, max error in sd) every ``every`` steps."""

    def __init__(self, ref_mean, ref_sd, burn_in: int, every: int, max_steps: int, time_budget: float = 1e9):
        self.time_budget = time_budget
        self.ref_mean, self.ref_sd = ref_mean.float(), ref_sd.float()
        self.burn_in, self.every, self.max_steps = burn_in, every, max_steps
        self.total, self.count, self.history, self.steps_after_burn_in = None, 0, [], 0
        self.start = None
        self.first_within = None  # index in history where the current within-streak began

    def __call__(self, kernel, params, stage, i):
        if stage == "Warmup":  # Pyro counts i from 0 in each stage; burn-in is the warmup stage
            return
        self.steps_after_burn_in += 1
        t = self.burn_in + self.steps_after_burn_in - 1
        w = params["w"].detach().reshape(-1, D)
        self.total = w.sum(0) if self.total is None else self.total + w.sum(0)
        self.count += w.shape[0]
        if (t + 1) % self.every:
            return
        error = float(((self.total / self.count - self.ref_mean).abs() / self.ref_sd).max())
        self.history.append((time.perf_counter() - self.start, t + 1, error))
        if self.history[-1][0] > self.time_budget:
            raise Reached  # out of time: the result says whether the criterion held

        if error < TOLERANCE:
            if self.first_within is None:
                self.first_within = len(self.history) - 1
            first_step = self.history[self.first_within][1]
            if t + 1 >= 2 * first_step:  # held for as long again as it took to get there
                raise Reached
        else:
            self.first_within = None

    def result(self) -> dict:
        reached = self.first_within is not None
        entry = self.history[self.first_within] if reached else None
        return {
            "reached": reached,
            "seconds": entry[0] if reached else None,
            "steps": entry[1] if reached else None,
            "final_error_sd": self.history[-1][2] if self.history else None,
            "run_seconds": self.history[-1][0] if self.history else None,
            "history": self.history,
        }


SG_KINDS = ("SGHMC", "SGLD", "SGHMC-CV")


def timed_run(mcmc, tracker: Tracker, x, y) -> dict:
    """Run until the tracker stops it (criterion held, or out of time) or the run ends; its result."""
    tracker.start = time.perf_counter()
    try:
        mcmc.run(x, y)
    except Reached:
        pass
    return tracker.result()


def run_sg(kind: str, x, y, ref_mean, ref_sd, max_steps: int, seed: int = 0) -> dict:
    num_data = x.shape[0]
    chains, burn_in = CHAINS, BURN_IN
    if kind == "SGHMC-CV":
        batch, chains, burn_in = CV_BATCH, CV_CHAINS, CV_BURN_IN
        kernel = SGHMC(
            make_minibatch_model(batch), step_size=CV_STEP, friction=CV_FRICTION, init_momentum="stationary",
            control_variate="map", init_to_centre=True, init_strategy=init_to_median,
            adapt_step_size=False, adapt_mass_matrix=False,
        )  # fmt: skip
    else:
        batch = max(num_data // 100, 100)
        model = make_minibatch_model(batch)
        fixed = harness.SAME_MATHS  # as measured in the docs: fixed steps, plain minibatch gradients
        if kind == "SGHMC":
            kernel = SGHMC(model, step_size=0.3, friction=1.0, **fixed)
        else:
            kernel = SGLD(model, step_size=0.5, **fixed)
    tracker = Tracker(ref_mean, ref_sd, burn_in, every=10, max_steps=max_steps, time_budget=TIME_BUDGET)
    mcmc = MCMC(
        kernel, num_samples=max_steps - burn_in, warmup_steps=burn_in, num_chains=chains,
        chain_method="vectorized", keep_last=1, seed=seed, hook_fn=tracker, disable_progbar=True,
    )  # fmt: skip
    out = timed_run(mcmc, tracker, x, y)
    out.update(batch=batch, chains=chains, burn_in=burn_in, divergences=kernel.num_divergences)
    return out


def run_nuts(x, y, ref_mean, ref_sd, max_samples: int, warmup: int = 200) -> dict:
    tracker = Tracker(ref_mean, ref_sd, warmup, every=1, max_steps=warmup + max_samples)
    kernel = pyro.infer.NUTS(full_model, jit_compile=True, ignore_jit_warnings=True)
    mcmc = pyro.infer.MCMC(kernel, num_samples=max_samples, warmup_steps=warmup, hook_fn=tracker, disable_progbar=True)
    out = timed_run(mcmc, tracker, x, y)
    out["iterations"] = out["steps"]
    out["step_size"] = float(kernel.step_size)
    return out


def gradient_seconds(x, y, repeats: int = 5) -> float:
    """Median time of one full-data potential-and-gradient evaluation of the NUTS model (Pyro's way)."""
    from pyro.infer.mcmc.util import initialize_model

    _, potential_fn, _, _ = initialize_model(full_model, (x, y), jit_compile=False)
    z = {"w": torch.zeros(D, requires_grad=True)}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        u = potential_fn(z)
        torch.autograd.grad(u, z["w"])
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, style in (("NUTS", "o-"), ("SGHMC", "s-"), ("SGLD", "^-"), ("SGHMC-CV", "d-")):
        ns, ts, hollow = [], [], []
        for n, entry in results["sizes"].items():
            r = entry.get(name)
            if r and r.get("seconds") is not None:
                ns.append(int(n))
                ts.append(r["seconds"])
                hollow.append(r.get("extrapolated", False))
        if not ns:
            continue
        line = ax.plot(ns, ts, style, label=name)[0]
        for n, t, h in zip(ns, ts, hollow):
            if h:
                ax.plot([n], [t], "o", mfc="white", color=line.get_color(), ms=9)
        for n, entry in results["sizes"].items():  # not reached within the budget: a lower bound
            r = entry.get(name)
            if r and not r.get("extrapolated") and r.get("seconds") is None and r.get("run_seconds"):
                ax.plot([int(n)], [r["run_seconds"]], "^", color=line.get_color(), ms=10, mfc="white")
                ax.annotate(
                    f"{name} not reached\nin {r['run_seconds']:.0f} s",
                    (int(n), r["run_seconds"]),
                    textcoords="offset points",
                    xytext=(-95, -28),
                    fontsize=8,
                    color=line.get_color(),
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (data)")
    ax.set_ylabel("wall seconds to posterior means within 0.1 sd")
    ax.set_title("Bayesian logistic regression, d = 20 (hollow: extrapolated)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = harness.parser(__doc__, harness.RESULTS / "accuracy_vs_nuts.json", "N = 10^4 only (nothing written)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7])
    parser.add_argument("--nuts-max-n", type=int, default=10**6, help="largest N at which NUTS runs in full")
    parser.add_argument("--plain-at-largest", action="store_true",
                        help="also run plain SGHMC and SGLD at N = 10^7 (10 minutes each)")  # fmt: skip
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "_static" / "accuracy_vs_nuts.png")
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from --out's results")
    parser.add_argument("--merge", action="store_true",
                        help="keep the contenders of --out's results that this run does not re-run")  # fmt: skip
    parser.add_argument("--kinds", nargs="+", choices=SG_KINDS, default=list(SG_KINDS),
                        help="stochastic-gradient contenders to run (NUTS always runs)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.plot_only:
        plot(json.loads(args.out.read_text()), args.plot)
        return None
    torch.set_num_threads(1)
    sizes = [10**4] if args.tiny else args.sizes
    context = harness.run_context()
    print(harness.context_line(context), flush=True)
    results = {"context": context, "tolerance_sd": TOLERANCE, "dim": D, "sizes": {}}
    for n in sizes:
        pyro.set_rng_seed(0)
        load = harness.load_average()
        x, y = make_data(n)
        ref_mean, ref_sd, curvature = reference(x, y)
        entry = {"load_before": load, "posterior_sd_median": float(ref_sd.median()),
                 "curvature_range": [float(curvature.min()), float(curvature.max())]}  # fmt: skip
        entry["gradient_seconds"] = gradient_seconds(x, y)
        kinds = [k for k in args.kinds if n < 10**7 or k == "SGHMC-CV" or args.plain_at_largest]
        for kind in kinds:
            entry[kind] = run_sg(kind, x, y, ref_mean, ref_sd, max_steps=400 if args.tiny else 5000)
            r = entry[kind]
            print(
                f"N={n:.0e} {kind}: reached={r['reached']} in {r['seconds']} s ({r['steps']} steps, B={r['batch']}, "
                f"{r['chains']} chains), final error {r['final_error_sd']:.3f} sd"
            )
        if n <= args.nuts_max_n:
            entry["NUTS"] = run_nuts(x, y, ref_mean, ref_sd, max_samples=100 if args.tiny else 2000)
            r = entry["NUTS"]
            print(
                f"N={n:.0e} NUTS: reached={r['reached']} in {r['seconds']} s ({r['iterations']} iterations incl. "
                f"200 warmup), final error {r['final_error_sd']:.3f} sd"
            )
        else:
            base_n = max(m for m in results["sizes"] if m <= args.nuts_max_n)
            base = results["sizes"][base_n]
            factor = entry["gradient_seconds"] / base["gradient_seconds"]
            entry["NUTS"] = {
                "extrapolated": True,
                "from_n": base_n,
                "gradient_time_ratio": factor,
                "seconds": base["NUTS"]["seconds"] * factor if base["NUTS"]["seconds"] else None,
                "iterations": base["NUTS"]["iterations"],
            }
            print(f"N={n:.0e} NUTS: extrapolated {entry['NUTS']['seconds']} s (gradient {factor:.1f}x N={base_n:.0e})")
        entry["load_after"] = harness.load_average()
        for kind in SG_KINDS:
            if kind in entry and entry[kind]["seconds"] and entry["NUTS"].get("seconds"):
                entry[f"NUTS_over_{kind}"] = entry["NUTS"]["seconds"] / entry[kind]["seconds"]
        print(f"N={n:.0e}: gradient {entry['gradient_seconds'] * 1e3:.1f} ms, load {load[0]:.1f} -> "
              f"{entry['load_after'][0]:.1f}; NUTS/SGHMC {entry.get('NUTS_over_SGHMC')}, "
              f"NUTS/SGLD {entry.get('NUTS_over_SGLD')}, NUTS/SGHMC-CV {entry.get('NUTS_over_SGHMC-CV')}")  # fmt: skip
        results["sizes"][n] = entry
        del x, y
    if args.merge and args.out.exists():
        previous = json.loads(args.out.read_text())["sizes"]
        for n, entry in results["sizes"].items():
            for kind, value in previous.get(str(n), {}).items():
                if kind in SG_KINDS and kind not in entry:
                    entry[kind] = value
                    if entry["NUTS"].get("seconds") and value.get("seconds"):
                        entry[f"NUTS_over_{kind}"] = entry["NUTS"]["seconds"] / value["seconds"]
    if not args.tiny:
        harness.write_json(args.out, results, indent=1)
        plot(results, args.plot)
        print(f"written: {args.out}, {args.plot}")
    return results


if __name__ == "__main__":
    main()
