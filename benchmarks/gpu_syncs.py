"""Where a sampling step waits for the host on a GPU: synchronisations and the profile of one chain's step.

Issue 25, point 3 asks for a sampling step with no host synchronisation, so that it can be replayed under a
CUDA graph. This script lists, for the two problems of ``benchmarks/gpu.py`` (the NUTS race's logistic
regression, one chain; the MLP 10-50-50-1 at 256 vectorised chains), every synchronising CUDA call made
during the sampling steps (``torch.cuda.set_sync_debug_mode("warn")``), grouped by the line of this package
that made it, and the top operators of a ``torch.profiler`` profile of the one-chain steps.

Run on the GPU machine (see ``benchmarks/gpu.py`` for the wheels)::

    python3 benchmarks/gpu_syncs.py --out syncs.json

On a CPU it runs (``--device cpu``) but finds no synchronisation, by construction.
"""

from __future__ import annotations

import argparse
import collections
import json
import traceback
import warnings
from pathlib import Path

import pyro
import torch

import pyro_sgmcmc
from pyro_sgmcmc import SGHMC

if __package__:
    from . import harness, models, race_nuts
else:
    import harness
    import models
    import race_nuts

PACKAGE = str(Path(pyro_sgmcmc.__file__).resolve().parent)
WARMUP, TRACED = 10, 20


def package_frame() -> str:
    """The innermost frame of the stack inside this package, as ``file:line function``."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(PACKAGE):
            return f"{Path(frame.filename).relative_to(PACKAGE)}:{frame.lineno} {frame.name}: {frame.line}"
    return "outside the package"


def syncs_of(run, device) -> dict:
    """Run ``run(hook)``; count the synchronising calls of steps ``WARMUP`` to ``WARMUP + TRACED``."""
    counts: collections.Counter = collections.Counter()
    steps = [0]

    def hook(*_):
        steps[0] += 1
        if device.type == "cuda" and steps[0] == WARMUP:
            torch.cuda.set_sync_debug_mode("warn")
        if steps[0] == WARMUP + TRACED and device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            counts[package_frame()] += 1

    old = warnings.showwarning
    warnings.showwarning = showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = showwarning
            run(hook)
    finally:
        warnings.showwarning = old
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    return {"steps": TRACED, "per_step": {k: v / TRACED for k, v in counts.most_common()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="syncs.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result: dict = {"torch": torch.__version__, "device": name}

    x, y, _ = race_nuts.make_data(100_000)
    x, y = x.to(device), y.to(device)
    init = {"b": torch.zeros((), device=device), "w": torch.zeros(race_nuts.D, device=device)}

    def one_chain(hook, num_samples=WARMUP + TRACED + 5):
        pyro.set_rng_seed(0)
        kernel = SGHMC(race_nuts.model, step_size=1e-3, **harness.SAME_MATHS)
        pyro_sgmcmc.MCMC(
            kernel, num_samples=num_samples, warmup_steps=0, hook_fn=hook, disable_progbar=True, initial_params=init
        ).run(x, y, race_nuts.BATCH)

    result["one chain, logistic"] = syncs_of(one_chain, device)

    xm, ym = models.make_data()
    xm, ym = xm.to(device), ym.to(device)

    def many_chains(hook):
        pyro.set_rng_seed(0)
        kernel = SGHMC(models.make_model(models.SIZES["small"]), step_size=1e-4, **harness.SAME_MATHS)
        pyro_sgmcmc.MCMC(
            kernel, num_samples=WARMUP + TRACED + 5, warmup_steps=0, hook_fn=hook, disable_progbar=True,
            num_chains=256, chain_method="vectorized", keep_last=1,
        ).run(xm, ym)  # fmt: skip

    try:
        result["256 chains, MLP"] = syncs_of(many_chains, device)
    except Exception as error:  # noqa: BLE001 - a benchmark reports what failed
        result["256 chains, MLP"] = {"error": repr(error)}

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        one_chain(lambda *_: None, num_samples=60)
    table = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    result["profile, 60 steps of one chain (with set-up)"] = table.splitlines()
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("profile")}, indent=1))
    print(table)


if __name__ == "__main__":
    main()
