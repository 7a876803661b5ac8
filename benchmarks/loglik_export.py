"""Benchmark: the full-data log-likelihood export against the sampling run that produced the draws, time and memory.

A Bayesian logistic regression (``d = 10`` standard-normal features and N(0, 1) priors on the weights and the
bias, ``B = 100`` rows a minibatch through ``pyro.plate("data", N, subsample_size=100)``, float32 data) is
sampled by ``pyro_sgmcmc.MCMC(SGLD(model), chain_method="vectorized")`` on the package's defaults (warmup as
long as the sampling), then exported with ``to_inference_data(mcmc, log_likelihood=True)``: a ``(chains,
draws, N)`` array of :math:`\\log p(y_n \\mid \\theta_s)`. The cases:

``issue``
    issue 26's case: 64 chains x 200 draws, N = 20,000 (the issue measured 454 s for the export, four times
    its sampling run, and 1.7 GB held);
``brief``
    4 chains x 1,000 draws, N = 100,000 (a 1.6 GB float32 log-likelihood);
``small``
    16 chains x 200 draws, N = 20,000: short enough to run on the previous code too (for the before/after);
``tiny`` (``--tiny``)
    2 chains x 10 draws, N = 2,000: a smoke test.

Each case runs in a fresh process (``--child``), so that its memory figure is a first export's. Reported:
the wall-clock and CPU (``time.process_time``, all threads) seconds of ``mcmc.run`` and of the export, their
ratios (the promise: the export takes at most a quarter of the sampling run), the log-likelihood's bytes and
dtype, and the peak memory growth of the export: the process's peak resident set (``VmHWM``) is reset to the
current one by writing 5 to ``/proc/self/clear_refs`` just before the export, and the growth is ``VmHWM``
after minus ``VmRSS`` before (the promise: at most 1.5x the log-likelihood's bytes). ArviZ is imported
before the export is timed (its import takes seconds and is not the export's). The load average before and
after each case is written beside it. So is the floor under the export's time: allocating and filling a
fresh array of the log-likelihood's size just after the export (its output still held), with the CPU ratio
of the export above that floor; and the same export run again in the process once the floor's array is
freed (its output then lands mostly on pages the process has touched before): the code's own cost, the
machine's first touch aside. Both run on ``--threads`` torch threads, one by default: on a shared, loaded
machine torch's parallel operators (the export's are large, the sampling step's small) spend their time
waiting for each other's threads, which measures the machine, not the code; the CPU-time ratio is
the steadier figure.

Run::

    python benchmarks/loglik_export.py --cases issue brief --out loglik_export.json   # ~ 10 min on 2 cores
    python benchmarks/loglik_export.py --tiny                                           # a few seconds

``PYTHONPATH=<another checkout>`` measures that checkout's export with the same script (only
``log_likelihood=True`` is used). The figures are in ``docs/reliability.rst`` ("The log-likelihood export").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__:  # imported as benchmarks.loglik_export
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

CASES = {
    "issue": {"chains": 64, "draws": 200, "data": 20_000},
    "brief": {"chains": 4, "draws": 1_000, "data": 100_000},
    "small": {"chains": 16, "draws": 200, "data": 20_000},
    "tiny": {"chains": 2, "draws": 10, "data": 2_000},
}
FEATURES, BATCH = 10, 100


def make_problem(num_data: int):
    """``(model, x, y)``: the logistic regression of the module docstring, float32, seeded."""
    import pyro
    import pyro.distributions as dist
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, FEATURES, generator=g)
    y = torch.bernoulli(torch.sigmoid(x @ torch.randn(FEATURES, generator=g) - 0.5), generator=g)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([FEATURES]).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0], subsample_size=BATCH) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w + b), obs=y[idx])

    return model, x, y


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def first_touch(shape, dtype) -> dict:
    """Seconds (wall, CPU) to allocate and fill a fresh array of the log-likelihood's shape and dtype, while the
    export's own is still held (so that its memory is not handed back): the floor under any export that writes
    its output once. Measured twice: with torch's allocator, as the export allocates its output (``torch``),
    and with NumPy's (``numpy``), which asks for transparent huge pages on a large array: on the virtual machine
    of these measurements (THP ``defrag`` set to ``madvise``) those cost several times ordinary pages to touch
    first, and how much varies from run to run."""
    import numpy as np
    import torch

    result = {}
    for allocator in ("torch", "numpy"):
        wall, cpu = time.perf_counter(), time.process_time()
        if allocator == "torch":
            array = torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).numpy()
        else:
            array = np.empty(shape, dtype=dtype)
        array.fill(0)
        result[allocator] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        del array
    return {**result["torch"], "numpy": result["numpy"]}


def measure(case: str, threads: int) -> dict:
    """One case, in this process, on ``threads`` torch threads: the sampling run, then the export, timed, with
    the export's peak memory."""
    import warnings

    import arviz  # noqa: F401  (imported before the export is timed)
    import torch

    if threads:
        torch.set_num_threads(threads)

    from pyro_sgmcmc import MCMC, SGLD, to_inference_data

    size = CASES[case]
    model, x, y = make_problem(size["data"])
    load_before = harness.load_average()
    mcmc = MCMC(SGLD(model), num_samples=size["draws"], num_chains=size["chains"], chain_method="vectorized",
                seed=0, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a slow-mixing warning says nothing about the export
        wall, cpu = time.perf_counter(), time.process_time()
        mcmc.run(x, y)
        sampling = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    resettable = os.path.exists("/proc/self/clear_refs")
    if resettable:
        Path("/proc/self/clear_refs").write_text("5")
        before = _status("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    idata = to_inference_data(mcmc, log_likelihood=True)
    export = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    values = idata.log_likelihood["y"].values
    growth = _status("VmHWM") - before if resettable else None
    floor = first_touch(values.shape, values.dtype)
    # the same export again, the floor's pages just handed back: what the export costs when its output's memory
    # is not touched for the first time (the code's own cost, without the machine's first touch)
    wall, cpu = time.perf_counter(), time.process_time()
    to_inference_data(mcmc, log_likelihood=True)
    again = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    return {
        "case": case,
        **size,
        "torch_threads": torch.get_num_threads(),
        "sampling": sampling,
        "export": export,
        "ratio_wall": export["wall_s"] / sampling["wall_s"],
        "ratio_cpu": export["cpu_s"] / sampling["cpu_s"],
        "log_likelihood_bytes": values.nbytes,
        "log_likelihood_dtype": str(values.dtype),
        "peak_growth_bytes": growth,
        "peak_growth_over_output": None if growth is None else growth / values.nbytes,
        "first_touch_floor": floor,
        "ratio_cpu_above_floor": (export["cpu_s"] - floor["cpu_s"]) / sampling["cpu_s"],
        "export_again": again,
        "ratio_cpu_again": again["cpu_s"] / sampling["cpu_s"],
        "load_average_before": load_before,
        "load_average_after": harness.load_average(),
    }


def main() -> None:
    p = harness.parser(__doc__, None)
    p.add_argument("--cases", nargs="+", default=["issue", "brief"], choices=sorted(CASES))
    p.add_argument("--threads", type=int, default=1, help="torch threads for both the run and the export (0: "
                   "torch's default); 1 by default, the steadier figure on a shared machine")  # fmt: skip
    p.add_argument("--child", choices=sorted(CASES), help=argparse_suppress())
    args = p.parse_args()
    if args.child:
        harness.write_json(args.out, measure(args.child, args.threads))
        return
    log = harness.Log()
    results = {"machine": harness.machine_info(), "package": harness.package_fingerprint(), "cases": {}}
    for case in ["tiny"] if args.tiny else args.cases:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "case.json"
            command = [sys.executable, __file__, "--child", case, "--out", str(out), "--threads", str(args.threads)]
            done = subprocess.run(command, text=True, capture_output=True)
            if done.returncode != 0:
                raise SystemExit(f"case {case} failed:\n{done.stderr[-3000:]}")
            result = json.loads(out.read_text())
        results["cases"][case] = result
        growth = result["peak_growth_over_output"]
        log(
            f"{case} ({result['torch_threads']} thread(s)): {result['chains']} chains x {result['draws']} draws, "
            f"N = {result['data']}: sampling "
            f"{result['sampling']['wall_s']:.1f} s wall / {result['sampling']['cpu_s']:.1f} s CPU, export "
            f"{result['export']['wall_s']:.2f} s / {result['export']['cpu_s']:.2f} s (ratio {result['ratio_wall']:.3f}"
            f" wall, {result['ratio_cpu']:.3f} CPU); log-likelihood {result['log_likelihood_bytes'] / 1e6:.0f} MB "
            f"{result['log_likelihood_dtype']}, peak growth "
            + ("n/a" if growth is None else f"{growth:.2f}x")
            + f"; first touch of as many fresh bytes {result['first_touch_floor']['cpu_s']:.2f} s CPU (NumPy's "
            f"allocator {result['first_touch_floor']['numpy']['cpu_s']:.2f} s; export above it:"
            f" {result['ratio_cpu_above_floor']:.3f} of the run); the export again "
            f"{result['export_again']['cpu_s']:.2f} s CPU ({result['ratio_cpu_again']:.3f} of the run)"
            + f"; load {result['load_average_before']} -> {result['load_average_after']}"
        )
    results["log"] = log.lines
    if args.out is not None:
        harness.write_json(args.out, results)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
