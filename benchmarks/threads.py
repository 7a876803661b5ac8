"""Threads: the quickstart's SGHMC run and the BNN example's SGHMC step, one torch thread against torch's default.

torch runs its CPU operators on ``torch.get_num_threads()`` threads, by default one a core. The models of the
quickstart and of the BNN example are small (a minibatch of ``1,000 x 10`` numbers; an MLP of 2,410 weights on
100 images). This script measures what torch's default costs on them against one thread, in one process, with
``torch.set_num_threads`` switched between the counts compared (1 and the default read at start, or
``--threads``); the package itself never sets the count (it changes no process-wide state):

* ``quickstart``: a whole ``MCMC(SGHMC(model)).run`` on the package's defaults, on the model and data of
  ``examples/quickstart.py`` (imported from it: ``model``, ``make_data``; minibatches of ``B = 1,000``, 10,000
  rows here instead of 100,000 and 50 + 50 steps, to keep the default-thread runs short). A hook stamps
  (wall clock, CPU time of the process) after every step: the *step* figures are the sampling phase's time
  divided by its steps (what a step costs once warmup is over), the *run* figures the whole ``mcmc.run``
  (set-up included: the trace, the control variate's search, the adaptation) divided by all its steps;
* ``bnn``: one sampling step of the posterior kernel of ``examples/bnn_digits.py`` (imported: ``load_data``,
  ``BayesianMLP``, ``make_model``; the 64-32-10 MLP on the digits, ``B = 100``,
  ``SGHMC(model, friction=1.0, step_size=0.1, init_strategy=init_to_sample)`` on the package's defaults),
  ``kernel.sample`` as :class:`pyro.infer.MCMC` calls it; the kernel is set up and warmed up (100 steps) at
  one thread, then timed over blocks of 20 steps at each thread count (one untimed step after each switch).

The CPU time counts every thread of the process. Each figure is the median of ``--repeats`` (3) runs or blocks,
the thread counts interleaved (the order rotating every repeat) so that changes in the background load hit
them alike; an untimed short quickstart run comes first (imports, first-call costs). The date, the machine,
the load average (1, 5 and 15 minutes; the 1-minute one before every run) and the thread counts are printed
beside every figure and written with them, every repeat included, to ``--out``.

Run it::

    python benchmarks/threads.py --out threads.json   # under a minute on a 2-core machine
    python benchmarks/threads.py --tiny                 # a few seconds, smoke test only

``OMP_NUM_THREADS`` set before Python starts becomes torch's default, so leave it unset to compare against
torch's own default. The figures are in ``docs/benchmarks.rst`` ("Threads").
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Tuple

import pyro
import torch
from pyro.infer import MCMC
from pyro.infer.autoguide.initialization import init_to_sample

if __package__:
    from . import harness
else:
    import harness

from pyro_sgmcmc import SGHMC

sys.path.insert(0, str(harness.ROOT / "examples"))
import bnn_digits  # noqa: E402  (examples/ is not a package: imported from its folder)
import quickstart  # noqa: E402

Stamp = Tuple[float, float]  # (wall clock, CPU time of this process), seconds

SIZES = {  # quickstart: rows N, warmup and sampling steps of a run; bnn: hidden units, warmup steps, timed steps
    "full": {"quickstart": (10_000, 50, 50), "bnn": (32, 100, 20), "repeats": 3},
    "tiny": {"quickstart": (2_000, 10, 10), "bnn": (16, 10, 5), "repeats": 1},
}
FIGURES = ("step_wall_ms", "step_cpu_ms", "run_wall_ms", "run_cpu_ms")


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """``torch.set_num_threads(threads)`` inside the block, the count before it restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def quickstart_run(num_data: int, warmup_steps: int, num_samples: int, threads: int) -> dict:
    """One ``MCMC(SGHMC(model)).run`` of the quickstart's regression (minibatches of 1,000) at ``threads``
    torch threads: ms per sampling step (after warmup) and per step of the whole run (set-up included)."""
    x, y = quickstart.make_data(num_data, seed=0)
    stamps: List[Stamp] = []
    with torch_threads(threads), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a run this short warns that it mixes slowly: not what is measured
        pyro.set_rng_seed(0)
        mcmc = MCMC(SGHMC(quickstart.model), num_samples=num_samples, warmup_steps=warmup_steps,
                    hook_fn=lambda *_: stamps.append(harness.now()), disable_progbar=True)  # fmt: skip
        load_before = harness.load_average()
        start = harness.now()
        mcmc.run(x, y, 1_000)
        end = harness.now()
    steps = warmup_steps + num_samples
    assert len(stamps) == steps, (len(stamps), steps)
    last_warmup = stamps[warmup_steps - 1]
    return {
        "step_wall_ms": 1e3 * (stamps[-1][0] - last_warmup[0]) / num_samples,
        "step_cpu_ms": 1e3 * (stamps[-1][1] - last_warmup[1]) / num_samples,
        "run_wall_ms": 1e3 * (end[0] - start[0]) / steps,
        "run_cpu_ms": 1e3 * (end[1] - start[1]) / steps,
        "load_before": load_before,
        "load_after": harness.load_average(),
    }


def bnn_kernel(hidden: int, warmup_steps: int) -> Callable[[], None]:
    """The BNN example's posterior kernel (``T = 1``, the package's defaults) on the digits, set up and warmed
    up at one thread; returns one sampling step of it (``kernel.sample``, as :class:`pyro.infer.MCMC` calls it)."""
    x_train, y_train, _, _ = bnn_digits.load_data(seed=0)
    pyro.set_rng_seed(0)
    net = bnn_digits.BayesianMLP(x_train.shape[1], hidden, int(y_train.max()) + 1)
    model = bnn_digits.make_model(net, 100)
    # as run() in examples/bnn_digits.py at T = 1 on the package's defaults (0.1 only starts the adaptation)
    kernel = SGHMC(model, friction=1.0, init_strategy=init_to_sample, step_size=0.1)
    state = {}
    with torch_threads(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel.setup(warmup_steps, x_train, y_train)
        state["params"] = kernel.initial_params
        for _ in range(warmup_steps):
            state["params"] = kernel.sample(state["params"])

    def step() -> None:
        state["params"] = kernel.sample(state["params"])

    return step


def bnn_steps(step: Callable[[], None], steps: int, threads: int) -> dict:
    """ms per sampling step of the BNN over a block of ``steps`` steps at ``threads`` torch threads."""
    with torch_threads(threads):
        load_before = harness.load_average()
        step()  # the first step at a new thread count is not timed
        stamps = harness.stepped(step, steps)()
    return {
        "step_wall_ms": 1e3 * (stamps[-1][0] - stamps[0][0]) / steps,
        "step_cpu_ms": 1e3 * (stamps[-1][1] - stamps[0][1]) / steps,
        "load_before": load_before,
        "load_after": harness.load_average(),
    }


def compare(measure: Callable[[int], dict], thread_counts: List[int], repeats: int) -> dict:
    """Per thread count: every repeat's figures and their medians; the counts interleaved, order rotating."""
    runs: Dict[int, List[dict]] = {n: [] for n in thread_counts}
    for r in range(repeats):
        for n in thread_counts[r % len(thread_counts) :] + thread_counts[: r % len(thread_counts)]:
            runs[n].append(measure(n))
    out = {}
    for n, repeats_n in runs.items():
        median = {key: statistics.median(run[key] for run in repeats_n) for key in FIGURES if key in repeats_n[0]}
        loads = [run["load_before"][0] for run in repeats_n if run["load_before"]]
        median["load_1min_range"] = [min(loads), max(loads)] if loads else None
        out[str(n)] = {"median": median, "repeats": repeats_n}
    return out


def machine_line(meta: dict) -> str:
    """The date, the machine, the load and the thread counts, one line (printed beside the figures)."""
    return (f"{meta['date_utc']}; {meta['cpu']}, os.cpu_count() = {meta['cpus']}; load average {meta['load_start']} "
            f"(1/5/15 min) at start; torch {meta['torch']} default threads {meta['default_threads']} "
            f"(OMP_NUM_THREADS={meta['omp_num_threads']}); compared: {meta['thread_counts']} threads")  # fmt: skip


def fmt(value) -> str:
    """A figure in ms to three decimals, ``-`` where it was not measured."""
    return "-" if value is None else f"{value:.3f}"


def report(name: str, results: dict, meta: dict, log: harness.Log) -> dict:
    """Print a case's table (thread count and load beside every figure) and its ratios to one thread."""
    rows = []
    for n, entry in results.items():
        m = entry["median"]
        load = m["load_1min_range"]
        rows.append([name, n, *(fmt(m.get(key)) for key in FIGURES),
                     "-" if load is None else f"{load[0]:.2f}-{load[1]:.2f}"])  # fmt: skip
    header = ["case", "threads", "step wall ms", "step CPU ms", "run wall ms/step", "run CPU ms/step",
              "load (1 min)"]  # fmt: skip
    log(harness.text_table(header, rows))
    ratios = {}
    one = results.get("1")
    for n, entry in results.items():
        if one is None or n == "1":
            continue
        ratios[n] = {key: entry["median"][key] / one["median"][key] for key in FIGURES if key in one["median"]}
        r = ratios[n]
        run = (f"; {r['run_wall_ms']:.2f}x wall, {r['run_cpu_ms']:.2f}x CPU per step of the whole run (set-up "
               "included)") if "run_wall_ms" in r else ""  # fmt: skip
        log(f"{name}: {n} threads / 1 thread = {r['step_wall_ms']:.2f}x wall, {r['step_cpu_ms']:.2f}x CPU per "
            f"sampling step{run} (torch's default {meta['default_threads']} threads, os.cpu_count() = "
            f"{meta['cpus']}, 1-min load {entry['median']['load_1min_range']}, {meta['date_utc']})")  # fmt: skip
    return ratios


def main(argv=None) -> dict:
    p = harness.parser(__doc__, None, tiny="tiny sizes, one repeat: a smoke test only (a few seconds)")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="thread counts to compare (default: 1 and torch's default at start)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=None, help="runs per thread count (default 3; 1 with --tiny)")
    args = p.parse_args(argv)
    default_threads = torch.get_num_threads()
    thread_counts = sorted(set(args.threads or [1, default_threads]))
    if any(n < 1 for n in thread_counts):
        p.error(f"--threads must be positive integers, got {thread_counts}")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be a positive integer, got {args.repeats}")
    sizes = SIZES["tiny" if args.tiny else "full"]
    repeats = args.repeats or sizes["repeats"]
    machine = harness.machine_info()
    meta = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": machine["cpu"],
        "cpus": os.cpu_count(),
        "load_start": harness.load_average(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "pyro_sgmcmc": machine["pyro_sgmcmc"],
        "default_threads": default_threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "thread_counts": thread_counts,
        "repeats": repeats,
        "tiny": args.tiny,
        "sizes": {
            "quickstart": dict(zip(("num_data", "warmup_steps", "num_samples"), sizes["quickstart"])),
            "bnn": dict(zip(("hidden", "warmup_steps", "timed_steps"), sizes["bnn"])),
        },
    }
    log = harness.Log()
    log(machine_line(meta))
    start = time.perf_counter()
    num_data, warmup_steps, num_samples = sizes["quickstart"]
    quickstart_run(num_data, min(warmup_steps, 10), 10, 1)  # untimed: first-call costs of the process
    results = {"quickstart": compare(lambda n: quickstart_run(num_data, warmup_steps, num_samples, n),
                                     thread_counts, repeats)}  # fmt: skip
    hidden, warmup_steps, steps = sizes["bnn"]
    step = bnn_kernel(hidden, warmup_steps)
    results["bnn"] = compare(lambda n: bnn_steps(step, steps, n), thread_counts, repeats)
    ratios = {name: report(name, entry, meta, log) for name, entry in results.items()}
    meta["load_end"] = harness.load_average()
    meta["seconds"] = time.perf_counter() - start
    log(f"load average at the end {meta['load_end']}; {meta['seconds']:.1f} s in all")
    out = {"meta": meta, "results": results, "ratios_to_one_thread": ratios, "log": log.lines}
    if args.out:
        log(f"results written to {harness.write_json(args.out, out)}")
    return out


if __name__ == "__main__":
    main()
