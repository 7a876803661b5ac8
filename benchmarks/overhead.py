"""Per-step overhead of the SG-MCMC kernels against a hand-written PyTorch loop.

For two models, the time of one step (minibatch draw, log density, gradient, update) of:

* ``hand``: a plain PyTorch loop (``harness.HandChains``, one chain): ``torch.randperm`` minibatches (one
  permutation per epoch, as a user writes it), the log density written by hand with ``torch.distributions``
  (validation off), ``torch.autograd.grad`` on a flat parameter vector, and the SGLD / SGHMC update written out;
* ``direct``: ``kernel.setup(...)`` once, then ``params = kernel.sample(params)`` in a loop, with
  Pyro's distribution validation on (Pyro's default outside ``MCMC``) and off;
* ``MCMC``: ``pyro.infer.MCMC(kernel, ...).run(...)`` with ``disable_progbar=True`` (MCMC turns
  validation off by default), the whole run divided by its steps, set-up and sample storage included.

Models:

* ``linreg``: Bayesian linear regression, D = 10 features, N = 10,000, B = 100: ``w ~ N(0, 1)``,
  ``b ~ N(0, 1)``, ``sigma ~ HalfCauchy(2.5)`` (12 unconstrained numbers);
* ``mlp``: a ``PyroModule`` MLP classifier 64 -> 128 (tanh) -> 10, ``N(0, 1)`` weights
  (9,610 numbers), N = 10,000 synthetic points, B = 100, written with the plate pattern of
  ``examples/bnn_digits.py``.

Before timing, the script checks that the hand loop and the kernel take the *same* steps: at
temperature 0 on the full data, from the same point, their trajectories agree to float32 rounding.
(There the minibatch is the whole data set, so the permutations do not enter.)

Each timing is repeated (``--repeats``, default 12, interleaving the variants). Both the CPU time of
this process (``time.process_time``: robust when other jobs share the cores) and the wall time are
recorded; the table shows the *minimum* per-step time over the repeats, the estimate least
disturbed by other processes, and the JSON holds medians and every repeat. A ``cProfile`` run of
``kernel.sample`` attributes the per-step time to its parts. ``docs/benchmarks.rst`` shows the
results and reads them.

Reproduce (about 2 minutes on an idle 2-core machine)::

    python benchmarks/overhead.py --out overhead_results.json --rst overhead_table.rst

Options: ``--steps-scale 0.1 --repeats 3`` for a quick, rough run; ``--threads`` (default 1).
"""

from __future__ import annotations

import cProfile
import math
import os
import pstats
import statistics
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
import torch.distributions as tdist
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroSample

import pyro_sgmcmc

if __package__:  # imported as benchmarks.overhead
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

STEP_SIZE, FRICTION, TEMPERATURE = 1e-3, 1.0, 1.0


# ====================================================================================== models
class LinReg:
    name = "linreg"
    description = "linear regression, D=10, N=10,000, B=100"

    def __init__(self, num_data=10_000, num_features=10, batch_size=100):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(num_data, num_features, generator=g)
        w = torch.randn(num_features, generator=g)
        self.y = self.x @ w + 0.5 + 0.7 * torch.randn(num_data, generator=g)
        self.num_data, self.batch_size = num_data, batch_size
        self.args = (self.x, self.y)
        self.dim = num_features + 2

    def model(self, x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        sigma = pyro.sample("sigma", dist.HalfCauchy(2.5))
        with pyro.plate("data", len(y), subsample_size=self.batch_size) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w + b, sigma), obs=y[idx])

    # The hand-written log density on the kernel's flat layout: sites in sorted order (b, sigma, w),
    # sigma as log(sigma) with its log-Jacobian.
    def hand_log_density(self, z, idx):
        b, log_sigma, w = z[0], z[1], z[2:]
        sigma = log_sigma.exp()
        prior = (
            tdist.Normal(0.0, 1.0, validate_args=False).log_prob(w).sum()
            + tdist.Normal(0.0, 1.0, validate_args=False).log_prob(b)
            + tdist.HalfCauchy(2.5, validate_args=False).log_prob(sigma)
            + log_sigma  # log |d sigma / d log_sigma|
        )
        mean = self.x[idx] @ w + b
        lik = tdist.Normal(mean, sigma, validate_args=False).log_prob(self.y[idx]).sum()
        return prior + (self.num_data / self.batch_size) * lik


class MLP(PyroModule):
    def __init__(self, num_in, num_hidden, num_out):
        super().__init__()
        self.fc1 = PyroModule[torch.nn.Linear](num_in, num_hidden)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([num_hidden, num_in]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([num_hidden]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](num_hidden, num_out)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([num_out, num_hidden]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([num_out]).to_event(1))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class MLPClassifier:
    name = "mlp"
    description = "MLP 64-128-10 (9,610 weights), N=10,000, B=100"

    def __init__(self, num_data=10_000, num_in=64, num_hidden=128, num_out=10, batch_size=100):
        g = torch.Generator().manual_seed(2)
        self.x = torch.randn(num_data, num_in, generator=g)
        teacher = torch.randn(num_in, num_out, generator=g)
        self.y = (self.x @ teacher + torch.randn(num_data, num_out, generator=g)).argmax(-1)
        self.num_data, self.batch_size = num_data, batch_size
        self.shapes = {  # sorted site names, as the kernel lays them out
            "fc1.bias": (num_hidden,),
            "fc1.weight": (num_hidden, num_in),
            "fc2.bias": (num_out,),
            "fc2.weight": (num_out, num_hidden),
        }
        self.dim = sum(math.prod(s) for s in self.shapes.values())
        self.net = MLP(num_in, num_hidden, num_out)
        self.args = (self.x, self.y)

    def model(self, x, y):
        plate = pyro.plate("data", len(y), subsample_size=self.batch_size)
        idx = plate.indices
        logits = self.net(x[idx])  # weights sampled outside the plate
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[idx])

    def hand_log_density(self, z, idx):
        views, offset = {}, 0
        for name, shape in self.shapes.items():
            n = math.prod(shape)
            views[name] = z[offset : offset + n].view(shape)
            offset += n
        prior = tdist.Normal(0.0, 1.0, validate_args=False).log_prob(z).sum()
        hidden = torch.tanh(torch.nn.functional.linear(self.x[idx], views["fc1.weight"], views["fc1.bias"]))
        logits = torch.nn.functional.linear(hidden, views["fc2.weight"], views["fc2.bias"])
        lik = tdist.Categorical(logits=logits, validate_args=False).log_prob(self.y[idx]).sum()
        return prior + (self.num_data / self.batch_size) * lik


# ====================================================================================== hand loop
def hand_loop(problem, method, position, step_size=STEP_SIZE, temperature=TEMPERATURE) -> harness.HandChains:
    """SGLD / SGHMC written out in PyTorch (``harness.HandChains``, one chain) on the problem's hand-written
    log density, in the kernels' step order (noise, move, re-evaluate), ``torch.randperm`` minibatches."""

    def energy(z, idx):
        return -problem.hand_log_density(z[0], idx[0]).unsqueeze(0)

    return harness.HandChains(
        energy, problem.num_data, problem.batch_size, position.unsqueeze(0), seed=0, method=method,
        step_size=step_size, friction=FRICTION, temperature=temperature,
    )  # fmt: skip


def make_kernel(problem, method, step_size=STEP_SIZE, temperature=TEMPERATURE):
    if method == "SGLD":
        return pyro_sgmcmc.SGLD(problem.model, step_size=step_size, temperature=temperature, **harness.SAME_MATHS)
    return pyro_sgmcmc.SGHMC(
        problem.model, step_size=step_size, friction=FRICTION, temperature=temperature, **harness.SAME_MATHS
    )


def check_same_steps(problem_class, method, steps=50, step_size=0.05):
    """Max |difference| between the kernel's and the hand loop's positions after ``steps`` steps.

    Run at temperature 0 on the full data (``B = N``), so that neither noise nor minibatch draws
    enter: the two trajectories must then agree to float32 rounding, which checks the log density,
    its gradient and the update. (The noise scale ``sqrt(2 eps T / N)``, resp. ``sqrt(2 eps alpha T / N)``,
    is the documented one; the package's own tests check it.)
    """
    problem = problem_class(num_data=2000, batch_size=2000)
    kernel = make_kernel(problem, method, step_size=step_size, temperature=0.0)
    pyro.set_rng_seed(0)
    kernel.setup(0, *problem.args)
    start = kernel.state.position[0].clone()
    hand = hand_loop(problem, method, start, step_size=step_size, temperature=0.0)
    params = kernel.initial_params
    for _ in range(steps):
        params = kernel.sample(params)
        hand.step()
    position = kernel.state.position[0]
    return harness.max_abs_diff(position, hand.position[0]), harness.max_abs_diff(position, start)


# ====================================================================================== timers
def timed(run, steps: int) -> dict:
    """Seconds per step of ``run()`` (which takes ``steps`` steps): CPU time of this process and wall time."""
    start = harness.now()
    run()
    end = harness.now()
    return {"cpu": (end[1] - start[1]) / steps, "wall": (end[0] - start[0]) / steps}


def time_hand(problem, method, steps):
    pyro.set_rng_seed(0)
    loop = hand_loop(problem, method, 0.1 * torch.randn(problem.dim))  # same cost anywhere
    harness.stepped(loop.step, 10)()
    return timed(harness.stepped(loop.step, steps), steps)


def time_direct(problem, method, steps, validation):
    pyro.set_rng_seed(0)
    with pyro.validation_enabled(validation):
        kernel = make_kernel(problem, method)
        kernel.setup(0, *problem.args)
        params = [kernel.initial_params]

        def sample():
            params[0] = kernel.sample(params[0])

        harness.stepped(sample, 10)()
        return timed(harness.stepped(sample, steps), steps)


def time_mcmc(problem, method, steps):
    pyro.set_rng_seed(0)
    kernel = make_kernel(problem, method)
    mcmc = MCMC(kernel, num_samples=steps // 2, warmup_steps=steps - steps // 2, disable_progbar=True)
    return timed(lambda: mcmc.run(*problem.args), steps)


VARIANTS = ["hand", "direct (validation on)", "direct (validation off)", "MCMC"]


def run_timings(problem, method, steps, repeats):
    times = {v: [] for v in VARIANTS}
    for _ in range(repeats):  # interleaved, so slow phases of the machine hit every variant
        times["hand"].append(time_hand(problem, method, steps))
        times["direct (validation on)"].append(time_direct(problem, method, steps, True))
        times["direct (validation off)"].append(time_direct(problem, method, steps, False))
        times["MCMC"].append(time_mcmc(problem, method, steps))
    out = {}
    for variant, results in times.items():
        out[variant] = {}
        for clock in ("cpu", "wall"):
            values = [1e6 * r[clock] for r in results]
            out[variant].update({f"{clock}_min_us": min(values), f"{clock}_median_us": statistics.median(values)})
        out[variant].update({f"{clock}_all_us": [1e6 * r[clock] for r in results] for clock in ("cpu", "wall")})
    return out


# ====================================================================================== profile
CATEGORIES = [  # (label, predicate on (filename, function name)); first match wins
    ("autograd backward", lambda f, n: "run_backward" in n or "/torch/autograd/" in f),
    (
        "Pyro validation checks (warn_if_nan/inf)",
        lambda f, n: f.endswith("pyro/util.py") and n in ("warn_if_nan", "warn_if_inf"),
    ),
    ("distribution construction & log_prob", lambda f, n: "/distributions/" in f),
    (
        "Pyro tracing (poutine, primitives, plate)",
        lambda f, n: "/pyro/poutine/" in f or f.endswith("pyro/primitives.py") or "/pyro/nn/" in f,
    ),
    ("pyro_sgmcmc (kernel, potential)", lambda f, n: "/pyro_sgmcmc/" in f),
    ("model code (forward pass)", lambda f, n: "/torch/nn/" in f),
]


def _category(filename, name):
    label = next((lab for lab, pred in CATEGORIES if pred(filename, name)), None)
    if label is not None:
        return label
    if filename.endswith("overhead.py"):
        return "model code (forward pass)"
    if "/pyro/infer/" in filename or filename.endswith("pyro/util.py"):
        return "Pyro tracing (poutine, primitives, plate)"
    return "other"


def profile_kernel(problem, method, steps, validation=False):
    """cProfile ``kernel.sample``; the self time by category (fractions) and the top functions.

    The time spent inside C functions (tensor operations, ``{built-in method ...}``) is charged to
    the category of the Python function that called them, so that e.g. the matrix products of the
    forward pass count as model code and the arithmetic of ``log_prob`` as distributions.
    """
    with pyro.validation_enabled(validation):
        kernel = make_kernel(problem, method)
        kernel.setup(0, *problem.args)
        params = kernel.initial_params
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            params = kernel.sample(params)
        profiler.disable()
    stats = pstats.Stats(profiler)
    by_category, total, rows = {}, 0.0, []
    for (filename, _line, name), (_cc, _nc, tottime, cumtime, callers) in stats.stats.items():
        total += tottime
        rows.append((cumtime, f"{Path(filename).name}:{name}"))
        if filename == "~" and callers:  # a C function: charge each caller's share to the caller
            for (caller_file, _l, caller_name), edge in callers.items():
                label = _category(caller_file, caller_name) if caller_file != "~" else "other"
                by_category[label] = by_category.get(label, 0.0) + edge[2]
            continue
        label = _category(filename, name)
        by_category[label] = by_category.get(label, 0.0) + tottime
    rows.sort(reverse=True)
    return {
        "self_time_fraction": {k: v / total for k, v in sorted(by_category.items(), key=lambda kv: -kv[1])},
        "top_cumulative": [(name, 1e6 * cum / steps) for cum, name in rows[:25]],
        "profiled_us_per_step": 1e6 * total / steps,
    }


# ====================================================================================== main
def main(argv=None):
    parser = harness.parser(__doc__, Path("overhead_results.json"), tiny=None)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiply the steps per timing (0.1: quick run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile-steps", type=int, default=300)
    parser.add_argument("--rst", type=Path, default=None, help="also write the table as reStructuredText here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    problems = [(LinReg(), 500), (MLPClassifier(), 200)]
    results = {"machine": harness.machine_info(), "load_average_start": harness.load_average(), "models": {}}
    print(f"torch {torch.__version__}, pyro {pyro.__version__}, {os.cpu_count()} CPUs, {args.threads} torch thread(s)")
    print(f"load average at start: {harness.load_average()}")

    for problem, base_steps in problems:
        steps = max(20, int(base_steps * args.steps_scale))
        entry = {"description": problem.description, "dim": problem.dim, "steps_per_timing": steps, "kernels": {}}
        for method in ("SGLD", "SGHMC"):
            diff, moved = check_same_steps(type(problem), method)
            timings = run_timings(problem, method, steps, args.repeats)
            for t in timings.values():
                t["cpu_ratio_to_hand"] = t["cpu_min_us"] / timings["hand"]["cpu_min_us"]
                t["wall_ratio_to_hand"] = t["wall_min_us"] / timings["hand"]["wall_min_us"]
            entry["kernels"][method] = {"timings": timings, "max_abs_diff_vs_hand": diff, "distance_moved": moved}
            print(f"{problem.name} {method}: same steps as the hand loop: max |dz| = {diff:.1e} (moved {moved:.1e})")
        entry["profile_SGHMC"] = profile_kernel(problem, "SGHMC", args.profile_steps)
        results["models"][problem.name] = entry

    results["load_average_end"] = harness.load_average()
    print_table(results)
    print(f"\nresults written to {harness.write_json(args.out, results)}")
    if args.rst is not None:
        args.rst.write_text(rst_table(results))
        print(f"reStructuredText table written to {args.rst}")
    return results


def rst_table(results) -> str:
    """The CPU-time table as a reStructuredText ``list-table`` (pasted into docs/benchmarks.rst)."""
    rows = []
    for name, entry in results["models"].items():
        for method, k in entry["kernels"].items():
            t = k["timings"]
            cells = [f"{t[v]['cpu_min_us']:.0f} ({t[v]['cpu_ratio_to_hand']:.1f}x)" for v in VARIANTS]
            rows.append([name, method, *cells])
    caption = "CPU microseconds per step (ratio to the hand-written loop)"
    return harness.rst_list_table(caption, ["model", "kernel", *VARIANTS], rows)


def print_table(results):
    header = (
        f"{'model':<8}{'kernel':<7}{'variant':<26}{'CPU us/step':>12}{'x hand':>8}{'wall us/step':>14}{'x hand':>8}"
    )
    print("\n(minimum over repeats; CPU = this process's CPU time)\n" + header + "\n" + "-" * len(header))
    for name, entry in results["models"].items():
        for method, k in entry["kernels"].items():
            for variant, t in k["timings"].items():
                print(
                    f"{name:<8}{method:<7}{variant:<26}{t['cpu_min_us']:>12.0f}{t['cpu_ratio_to_hand']:>8.1f}"
                    f"{t['wall_min_us']:>14.0f}{t['wall_ratio_to_hand']:>8.1f}"
                )
    for name, entry in results["models"].items():
        prof = entry["profile_SGHMC"]
        print(
            f"\n{name}: cProfile of SGHMC kernel.sample (validation off), self time by category "
            f"({prof['profiled_us_per_step']:.0f} us/step under the profiler)"
        )
        for label, frac in prof["self_time_fraction"].items():
            print(f"  {frac:6.1%}  {label}")
        print("  top cumulative (us/step):")
        for fn, us in prof["top_cumulative"][:15]:
            print(f"  {us:8.0f}  {fn}")


if __name__ == "__main__":
    main()
