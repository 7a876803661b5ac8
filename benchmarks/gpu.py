"""GPU benchmark: the package's SGHMC against hand-written loops on one GPU, every part capped in time.

How to run it on the GPU machine (torch is there, Pyro is not). Here, once::

    bash benchmarks/gpu_setup.sh           # wheels of pyro-ppl, arviz and their pure-Python needs -> benchmarks/wheels/

There (the folder ``benchmarks/wheels`` carried along with the working tree), from the repository root::

    bash benchmarks/gpu_setup.sh install && export PYTHONPATH=/tmp/site:. && python3 benchmarks/gpu.py --out gpu.json

(add ``--commit <hash>`` where the copy of the working tree there has no ``.git``: the JSON records it).

On a CPU, as a smoke test (under a minute): ``python benchmarks/gpu.py --device cpu --tiny --out gpu.json``.

Parts (each with its own time budget, ``--budget`` scaling all of them; a part that runs out keeps what it
measured and says ``"timed_out": true``; the whole script stays under 8 minutes):

(a) one chain, the NUTS race's logistic regression (``race_nuts.py``: N = 10^6, d = 20 raw features and an
    intercept, B = 1,000, float32): seconds per step of ``SGHMC`` through ``pyro_sgmcmc.MCMC`` (a fixed step,
    no adaptation: ``harness.SAME_MATHS``; every draw kept) against the same SGHMC written by hand
    (``hand_loops.DeviceHandSGHMC``), eager, and captured in a CUDA graph (10 steps per graph; CUDA only).
(b) many chains, the MLP 10-50-50-1 regression of ``models.py`` (N = 10,000, B = 128):
    ``pyro_sgmcmc.MCMC(..., chain_method="vectorized", keep_last=1)`` against the hand-written batched loop
    (``torch.bmm`` on per-chain minibatches, one noise draw, one permutation draw per epoch) at 1, 256,
    4,096 and 16,384 chains: ms per step and the ratio.
(c) the NUTS race on the GPU: ``SGHMC(model)`` on defaults (B = 1,000) against ``NUTS(model)`` on defaults (full
    data), both through ``pyro.infer.MCMC`` from Pyro's default init, timed end to end (set-up included), each
    on a ladder of doubling budgets until the race's criterion holds (every mean within 0.1 reference sd and
    every sd within 10 % of the Laplace reference, ``race_nuts.errors``); NUTS has a cap on its time.
(d) if the package offers a capture option (a parameter of ``SGHMC`` or ``pyro_sgmcmc.MCMC`` whose name holds
    "capture" or "graph", found with ``inspect.signature``), parts (a) and (b, 4,096 chains) with it on;
    otherwise skipped with a note.

Timing on a GPU: the package's runs are stamped by ``hook_fn``, with ``torch.cuda.synchronize()`` only at
the first and the last timed step (the mean over the steps between is the figure: device time, as the
package reads a value back every step anyway); the hand loops run in blocks of steps, synchronised at both
ends, blocks doubling until one lasts ``MIN_BLOCK_S``. Set-up (the run's time to its first step) is reported
apart. The JSON (``--out``) records torch and CUDA versions, the device's name, the date and the git commit.
"""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, List, Optional

import pyro
import torch
from pyro.infer import MCMC as PyroMCMC
from pyro.infer import NUTS

import pyro_sgmcmc
from pyro_sgmcmc import SGHMC

if __package__:  # imported as benchmarks.gpu
    from . import harness, models, race_nuts
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    import models
    import race_nuts

#: seconds per part at ``--budget 1`` (in all 400 s: under 8 minutes with start-up and the data)
BUDGETS = {"a": 70.0, "b": 130.0, "c": 160.0, "d": 40.0}
MIN_BLOCK_S = 0.5  # a hand loop's timed block lasts at least this long
STEPS_PER_GRAPH = 10
SKIP = 5  # steps of every run not timed (allocator, lazy initialisation)
LOGISTIC_STEP = 1e-3  # fixed step size of part (a), both sides
CHAINS = [1, 256, 4096, 16384]


class OutOfTime(Exception):
    """Raised from a run's hook when its part's budget is spent."""


class Budget:
    """A part's time budget: :meth:`left` seconds, :meth:`spent` once the deadline has passed."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def spent(self) -> bool:
        return self.left() <= 0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------ problems
def logistic_energy(x: torch.Tensor, y: torch.Tensor, batch: int) -> harness.Energy:
    """The race's potential for flat positions ``(K, 21)`` in the package's order (``b``, then ``w``)."""
    num_data, dim = x.shape[0], x.shape[1] + 1
    log_norm = dim * (math.log(race_nuts.PRIOR_SD) + models.LOG_SQRT_2PI)

    def energy(z: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        logits = torch.bmm(x[idx], z[:, 1:].unsqueeze(-1)).squeeze(-1) + z[:, :1]
        log_lik = -torch.nn.functional.binary_cross_entropy_with_logits(logits, y[idx], reduction="none").sum(-1)
        log_prior = -0.5 / race_nuts.PRIOR_SD**2 * (z * z).sum(-1) - log_norm
        return -(log_prior + (num_data / batch) * log_lik)

    return energy


def race_data(num_data: int, device: torch.device):
    x, y, _ = race_nuts.make_data(num_data)
    return x.to(device), y.to(device), x, y


# ------------------------------------------------------------------------------------------ timing
def hooked_run(mcmc_factory: Callable[[Callable], object], args: tuple, device, budget: Budget, steps: int) -> dict:
    """Run ``mcmc_factory(hook).run(*args)``, stopping after ``SKIP + steps`` steps or when ``budget`` is spent;
    the mean seconds per step between the first and the last timed step (synchronised there), and the set-up."""
    stamps: List[float] = []
    start = time.perf_counter()

    def hook(*_):
        if len(stamps) == SKIP:
            sync(device)
        stamps.append(time.perf_counter())
        if len(stamps) >= SKIP + steps or budget.spent():
            sync(device)
            stamps[-1] = time.perf_counter()
            raise OutOfTime

    out: dict = {"timed_out": False}
    try:
        mcmc_factory(hook).run(*args)
    except OutOfTime:
        out["timed_out"] = budget.spent() and len(stamps) < SKIP + steps
    timed = len(stamps) - 1 - SKIP
    out["setup_s"] = stamps[0] - start if stamps else None
    out["steps_timed"] = max(timed, 0)
    out["ms_per_step"] = 1e3 * (stamps[-1] - stamps[SKIP]) / timed if timed > 0 else None
    return out


def timed_steps(step: Callable[[], None], device, budget: Budget, steps: int = 0) -> dict:
    """Seconds per call of ``step`` (a hand loop's step, or a graph's replay): ``SKIP`` untimed calls, then
    blocks doubling until one lasts :data:`MIN_BLOCK_S` (or ``steps`` calls exactly when given)."""
    for _ in range(SKIP):
        step()
    n, seconds, timed_out = steps or 4, 0.0, False
    while True:
        sync(device)
        start = time.perf_counter()
        for _ in range(n):
            step()
        sync(device)
        seconds = time.perf_counter() - start
        if steps or seconds >= MIN_BLOCK_S:
            break
        if budget.left() < 3 * seconds:
            timed_out = True
            break
        n *= 2
    return {"ms_per_step": 1e3 * seconds / n, "steps_timed": n, "timed_out": timed_out}


# ------------------------------------------------------------------------------------------ parts
def part_one_chain(device, budget: Budget, tiny: bool, capture: Optional[dict] = None) -> dict:
    """(a): one chain of the logistic regression, ``pyro_sgmcmc.MCMC`` vs the hand loop (eager, CUDA graph)."""
    num_data = 20_000 if tiny else 1_000_000
    steps = 20 if tiny else 400
    x, y, _, _ = race_data(num_data, device)
    init = 0.01 * torch.randn(1, race_nuts.D + 1, generator=torch.Generator().manual_seed(1))
    init = init.to(device)
    out: dict = {"num_data": num_data, "batch": race_nuts.BATCH, "capture": capture}
    kernel_options = dict(step_size=LOGISTIC_STEP, **harness.SAME_MATHS, **(capture or {}).get("kernel", {}))

    def ours(hook):
        kernel = SGHMC(race_nuts.model, **kernel_options)
        return pyro_sgmcmc.MCMC(
            kernel, num_samples=SKIP + steps + 10, warmup_steps=0, hook_fn=hook, disable_progbar=True,
            initial_params={"b": init[0, 0], "w": init[0, 1:]}, **(capture or {}).get("mcmc", {}),
        )  # fmt: skip

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["pyro_sgmcmc.MCMC"] = hooked_run(ours, (x, y, race_nuts.BATCH), device, Budget(budget.left() / 2), steps)
    if capture is not None:  # part (d): the package's side only
        out["fallbacks"] = fallbacks(caught)
        return out
    hand = harness.hand_loops.DeviceHandSGHMC(
        logistic_energy(x, y, race_nuts.BATCH), num_data, race_nuts.BATCH, init, seed=0, step_size=LOGISTIC_STEP
    )
    out["hand eager"] = timed_steps(hand.step, device, Budget(budget.left() / 2))
    if device.type == "cuda" and not budget.spent():
        out["hand CUDA graph"] = graph_steps(hand, device, budget)
    else:
        out["hand CUDA graph"] = {"skipped": "needs a CUDA device" if device.type != "cuda" else "out of time"}
    for name in ("hand eager", "hand CUDA graph"):
        ms = out[name].get("ms_per_step")
        if ms and out["pyro_sgmcmc.MCMC"]["ms_per_step"]:
            out[f"ratio to {name}"] = out["pyro_sgmcmc.MCMC"]["ms_per_step"] / ms
    return out


def graph_steps(hand, device, budget: Budget) -> dict:
    """The hand loop's steps captured ``STEPS_PER_GRAPH`` at a time in one CUDA graph; before each replay the
    next minibatches' indices are copied into the graph's input buffer. Per step: a replay's time / 10."""
    window = torch.stack([hand.next_indices() for _ in range(STEPS_PER_GRAPH)])

    def steps() -> None:
        for k in range(STEPS_PER_GRAPH):
            hand.update(window[k])

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up outside the graph: autograd's and the allocator's lazy work
        for _ in range(3):
            steps()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        steps()

    def replay() -> None:
        window.copy_(torch.stack([hand.next_indices() for _ in range(STEPS_PER_GRAPH)]))
        graph.replay()

    out = timed_steps(replay, device, budget)
    out["ms_per_step"] /= STEPS_PER_GRAPH
    out["steps_timed"] *= STEPS_PER_GRAPH
    out["finite"] = bool(torch.isfinite(hand.position).all())
    return out


def part_many_chains(device, budget: Budget, tiny: bool, chains_list=None, capture: Optional[dict] = None) -> dict:
    """(b): the MLP at several chain counts, ``pyro_sgmcmc.MCMC`` (vectorised, keep_last=1) vs the hand loop."""
    hidden = models.SIZES["small"]
    x, y = (t.to(device) for t in models.make_data())
    chains_list = chains_list or ([1, 8] if tiny else CHAINS)
    steps = 10 if tiny else 100
    out: dict = {"hidden": hidden, "batch": models.BATCH, "num_data": models.NUM_DATA, "chains": {}}
    kernel_options = dict(step_size=models.STEP_SIZE, friction=models.FRICTION, **harness.SAME_MATHS)
    kernel_options.update((capture or {}).get("kernel", {}))
    for i, chains in enumerate(chains_list):
        share = Budget(budget.left() / (len(chains_list) - i))  # what is left, shared by the chain counts left
        entry = out["chains"][str(chains)] = {}
        if share.left() <= 1:
            entry["timed_out"] = True
            continue
        init = 0.1 * torch.randn(chains, models.dim(hidden), generator=torch.Generator().manual_seed(1))
        init = init.to(device)

        def ours(hook, chains=chains, init=init):
            kernel = SGHMC(models.make_model(hidden), **kernel_options)
            return pyro_sgmcmc.MCMC(
                kernel, num_samples=SKIP + steps + 10, warmup_steps=0, num_chains=chains, chain_method="vectorized",
                keep_last=1, seed=0, hook_fn=hook, disable_progbar=True, initial_params=models.unpack(init, hidden),
                **(capture or {}).get("mcmc", {}),
            )  # fmt: skip

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                entry["pyro_sgmcmc.MCMC"] = hooked_run(ours, (x, y), device, Budget(share.left() / 2), steps)
            entry["fallbacks"] = fallbacks(caught)
            if capture is None:
                hand = harness.hand_loops.DeviceHandSGHMC(
                    models.mlp_energy(x, y, hidden, chains), models.NUM_DATA, models.BATCH, init, seed=0,
                    step_size=models.STEP_SIZE, friction=models.FRICTION,
                )  # fmt: skip
                entry["hand"] = timed_steps(hand.step, device, share)
                if entry["pyro_sgmcmc.MCMC"]["ms_per_step"]:
                    entry["ratio"] = entry["pyro_sgmcmc.MCMC"]["ms_per_step"] / entry["hand"]["ms_per_step"]
        except torch.cuda.OutOfMemoryError as error:  # 16,384 chains may not fit: say so, go on
            entry["error"] = f"out of memory: {str(error)[:200]}"
            torch.cuda.empty_cache()
        except Exception as error:  # noqa: BLE001  (a part's failure is a result, the others still run)
            entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        entry["timed_out"] = share.spent() or any(v.get("timed_out") for v in entry.values() if isinstance(v, dict))
    return out


def part_race(
    device, budget: Budget, tiny: bool, sides: Optional[List[str]] = None, nuts_rungs: Optional[List[int]] = None
) -> dict:
    """(c): the NUTS race on the device, end to end; NUTS capped at half the part's budget. ``nuts_rungs``: NUTS's
    ladder (warmup = draws = each), to start it where an earlier run left it (the rungs below are then recorded as
    not run here)."""
    num_data = 20_000 if tiny else 1_000_000
    x, y, x_cpu, y_cpu = race_data(num_data, device)
    ref = race_nuts.newton_reference(x_cpu, y_cpu)
    out: dict = {"num_data": num_data, "reference_s": ref["seconds"], "sides": {}}
    ladders = {
        "SGHMC": [(250, 1000), (500, 2000)] if tiny else [(n // 4, n) for n in (2000, 4000, 8000, 16000, 32000)],
        "NUTS": [(50, 50), (100, 100)] if tiny else [(n, n) for n in (250, 500, 1000, 2000)],
    }
    if nuts_rungs:
        ladders["NUTS"] = [(n, n) for n in nuts_rungs]
    out["nuts_rungs"] = [list(rung) for rung in ladders["NUTS"]]
    if capture_option() is not None:  # the package's capture option on the same defaults, as a third side
        ladders = {"SGHMC": ladders["SGHMC"], "SGHMC, capture": ladders["SGHMC"], "NUTS": ladders["NUTS"]}
        if sides:
            ladders = {side: ladders[side] for side in sides}
            caps = {side: budget.left() / len(sides) for side in sides}
        if not sides:
            caps = {"SGHMC": budget.left() * 0.2, "SGHMC, capture": budget.left() * 0.15, "NUTS": budget.left() * 0.6}
    else:
        caps = {"SGHMC": budget.left() * 0.45, "NUTS": budget.left() * 0.45}
    for side, ladder in ladders.items():
        side_budget = Budget(caps[side])
        runs: List[dict] = []
        for warmup, samples in ladder:
            if runs and 2 * runs[-1]["seconds"] > side_budget.left():
                runs.append({"warmup_steps": warmup, "num_samples": samples, "skipped": "predicted past the cap"})
                break
            runs.append(race_run(side, x, y, warmup, samples, ref, side_budget))
            if runs[-1].get("meets") or runs[-1].get("timed_out"):
                break
        reached = next((r for r in runs if r.get("meets")), None)
        out["sides"][side] = {
            "cap_s": caps[side],
            "runs": runs,
            "time_to_criterion_s": None if reached is None else reached["seconds"],
            "timed_out": reached is None and (side_budget.spent() or any("skipped" in r for r in runs)),
        }
    sg, nuts = (out["sides"].get(s, {}).get("time_to_criterion_s") for s in ("SGHMC", "NUTS"))
    out["nuts_over_sghmc"] = nuts / sg if sg and nuts else None
    captured = out["sides"].get("SGHMC, capture", {}).get("time_to_criterion_s")
    out["nuts_over_sghmc_capture"] = nuts / captured if captured and nuts else None
    return out


def race_run(side: str, x, y, warmup: int, samples: int, ref: dict, budget: Budget) -> dict:
    """One fresh run of ``side`` through ``pyro.infer.MCMC``, stopped by its hook if ``budget`` runs out."""
    pyro.clear_param_store()
    pyro.set_rng_seed(race_nuts.SEED)
    if side == "NUTS":
        kernel = NUTS(race_nuts.model)
    else:
        kernel = SGHMC(race_nuts.model, **(capture_option()["kernel"] if side == "SGHMC, capture" else {}))

    def hook(*_):
        if budget.spent():
            raise OutOfTime

    mcmc = PyroMCMC(kernel, num_samples=samples, warmup_steps=warmup, disable_progbar=True, hook_fn=hook)
    entry: dict = {"warmup_steps": warmup, "num_samples": samples}
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(x, y, None if side == "NUTS" else race_nuts.BATCH)
        entry["fallbacks"] = fallbacks(caught)
    except OutOfTime:
        entry.update(seconds=time.perf_counter() - start, timed_out=True)
        return entry
    entry["seconds"] = time.perf_counter() - start
    draws = race_nuts.flat({k: v.cpu() for k, v in mcmc.get_samples().items()})
    entry.update(race_nuts.errors(draws, ref))
    return entry


def fallbacks(caught) -> List[str]:
    """The messages of the capture option's fallback warnings (``CaptureFallback``) among ``caught``."""
    return [str(w.message)[:300] for w in caught if w.category.__name__ == "CaptureFallback"]


def capture_option() -> Optional[dict]:
    """``{"kernel": {name: True}}`` or ``{"mcmc": {name: True}}`` for a capture parameter of ``SGHMC`` or
    ``pyro_sgmcmc.MCMC`` (a name holding "capture" or "graph"), or None."""
    for where, target in (("kernel", SGHMC), ("mcmc", pyro_sgmcmc.MCMC)):
        for name in inspect.signature(target).parameters:
            if "capture" in name or "graph" in name:
                return {where: {name: True}, "parameter": f"{target.__name__}({name}=True)"}
    return None


# ------------------------------------------------------------------------------------------ main
def git_commit() -> Optional[str]:
    try:
        command = ["git", "rev-parse", "HEAD"]
        done = subprocess.run(command, cwd=harness.ROOT, capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return harness.package_fingerprint()["git_commit"]


def meta(device: torch.device, args) -> dict:
    cuda = device.type == "cuda"
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "git_commit": args.commit or git_commit(),
        "sources_sha256": harness.package_fingerprint()["sources_sha256"],
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "pyro": pyro.__version__,
        "python": sys.version.split()[0],
        "tiny": args.tiny,
        "budgets_s": {k: v * args.budget for k, v in {**BUDGETS, **(args.part_budget or {})}.items()},
        "cpu_threads": torch.get_num_threads(),
        "load": harness.load_average(),
    }


PARTS = {
    "a": "one chain: pyro_sgmcmc.MCMC vs hand loop, eager and CUDA graph",
    "b": "many chains: vectorised MCMC vs hand batched loop",
    "c": "NUTS race on the device",
    "d": "capture option",
}


def run_part(key: str, device, args, results: dict, write: Callable[[], None]) -> None:
    budget = Budget((args.part_budget or {}).get(key, BUDGETS[key]) * args.budget)
    start = time.perf_counter()
    try:
        if key == "a":
            out = part_one_chain(device, budget, args.tiny)
        elif key == "b":
            out = part_many_chains(device, budget, args.tiny)
        elif key == "c":
            out = part_race(device, budget, args.tiny, args.sides, args.nuts_rungs)
        else:
            capture = capture_option()
            if capture is None:
                out = {"skipped": "no capture option in SGHMC's or pyro_sgmcmc.MCMC's signature"}
            else:
                one = part_one_chain(device, Budget(budget.left() / 2), args.tiny, capture)
                many = part_many_chains(device, budget, args.tiny, [8 if args.tiny else 4096], capture)
                out = {"parameter": capture["parameter"], "a": one, "b": many}
    except Exception as error:  # noqa: BLE001  (a part that fails is recorded; the others still run)
        out = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
    out["seconds"] = time.perf_counter() - start
    inner = [v.get("timed_out") for v in {**out.get("sides", {}), **out.get("chains", {})}.values()]
    out["timed_out"] = bool(out.get("timed_out")) or budget.spent() or any(inner)
    out["what"] = PARTS[key]
    results["parts"][key] = out
    write()
    print(f"part ({key}) {PARTS[key]}: {out['seconds']:.1f} s\n{json.dumps(out, indent=1, default=str)[:3000]}")


def main(argv=None) -> dict:
    parser = harness.parser(__doc__, Path("gpu_results.json"), "small sizes, few steps (CPU smoke test, < 60 s)")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--budget", type=float, default=1.0, help="scale of every part's time budget (default 1)")
    parser.add_argument("--sides", nargs="+", help='part (c): only these sides (e.g. "SGHMC, capture")')
    parser.add_argument("--nuts-rungs", type=int, nargs="+", help="part (c): NUTS's ladder (warmup = draws)")
    parser.add_argument("--part-budget", type=json.loads, help='seconds per part at --budget 1, e.g. \'{"c": 300}\'')
    parser.add_argument("--commit", help="the git commit measured, where the copy there has no .git (recorded)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (--device cpu for the smoke test)")
    if args.tiny:
        args.budget = min(args.budget, 0.06)
    results = {"meta": meta(device, args), "parts": {}}

    def write() -> None:
        harness.write_json(args.out, results, indent=1)

    write()
    for key in args.parts:
        run_part(key, device, args, results, write)
    results["meta"]["seconds"] = sum(p["seconds"] for p in results["parts"].values())
    write()
    print(f"written: {args.out}")
    return results


if __name__ == "__main__":
    main()
