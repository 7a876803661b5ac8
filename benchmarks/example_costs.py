"""What the examples cost to run, as a user runs them: wall and CPU seconds beside the machine, load and threads.

The README's quickstart headline and the gallery pages' "Cost" lines are these figures. Each example runs in a
fresh Python process, exactly as ``python examples/<name>.py`` runs it (imports included; its own thread
setting, progress bars on), through a small launcher that records, when the example exits, how many threads
torch used (every example sets one itself). Measured per example:

* wall seconds, from starting the process to its end;
* CPU seconds of the process (user + system, ``getrusage(RUSAGE_CHILDREN)``): on a machine shared with other
  jobs the wall time stretches with the load, the CPU time much less;
* the load average (1, 5 and 15 minutes) before and after, and the torch thread count;
* the timings the example itself reports in its JSON (every number under a key that names seconds: a phase's
  wall or CPU seconds), so that a page can quote a phase from the same run;
* for the quickstart, the wall and CPU seconds of each ``mcmc.run`` and each side's accuracy, from its JSON.

Run::

    python benchmarks/example_costs.py quickstart              # the README's headline (about 90 s quiet)
    python benchmarks/example_costs.py                         # every example (several minutes)
    python benchmarks/example_costs.py --tiny                  # smoke test: every example at its --tiny size

Results go to ``--out`` (default ``benchmarks/example_costs_results.json``); a run of a subset keeps the other
examples' earlier entries in that file, each with its own date, machine and load, and an example measured again
keeps its earlier measurements under ``"earlier"``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__:
    from . import harness
else:
    import harness

EXAMPLES = ["quickstart", "cold_posterior", "continual_learning", "double_well", "ood_detection", "bnn_digits"]
OUT_IS_A_FILE = {"bnn_digits"}  # its --out names the JSON; the others' name a directory
DEFAULT_OUT = harness.ROOT / "benchmarks" / "example_costs_results.json"

# Runs the example as ``python examples/<name>.py args`` would, then writes torch's thread count to a file.
LAUNCHER = """
import atexit, json, runpy, sys
report, script = sys.argv[1], sys.argv[2]
def threads():
    torch = sys.modules.get("torch")
    with open(report, "w") as f:
        json.dump({"torch_threads": torch.get_num_threads() if torch else None}, f)
atexit.register(threads)
sys.argv = sys.argv[2:]
sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
runpy.run_path(script, run_name="__main__")
"""


def children_cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_timings(value, path: str = "") -> dict:
    """``{"a/b/seconds": 1.23}`` for every number in an example's JSON under a key that names seconds
    (``seconds``, ``cpu_seconds``, ``serial_s``)."""
    found = {}
    if isinstance(value, dict):
        for key, inner in value.items():
            where = f"{path}/{key}" if path else str(key)
            timing = "seconds" in str(key) or str(key).endswith("_s")
            if timing and isinstance(inner, (int, float)) and not isinstance(inner, bool):
                found[where] = round(float(inner), 3)
            elif timing and isinstance(inner, dict):
                found.update({f"{where}/{k}": round(float(v), 3) for k, v in inner.items()
                              if isinstance(v, (int, float)) and not isinstance(v, bool)})  # fmt: skip
            else:
                found.update(own_timings(inner, where))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found.update(own_timings(inner, f"{path}/{index}"))
    return found


def quickstart_figures(results: dict) -> dict:
    """The quickstart's own timings and accuracies, from the JSON it writes."""
    out = {}
    for side in ("sghmc", "nuts"):
        run = results[side]
        out[side] = {"wall_s": run["seconds"], "cpu_s": run["cpu_seconds"],
                     "max_mean_err_sd": run["accuracy"]["max_abs_mean_error_sd"],
                     "max_sd_rel_err": run["accuracy"]["max_abs_sd_error"]}  # fmt: skip
    return out


def measure(name: str, tiny: bool, work: Path) -> dict:
    """Run ``examples/<name>.py`` once in a fresh process; its wall and CPU seconds, load and threads."""
    script = harness.ROOT / "examples" / f"{name}.py"
    out = work / (f"{name}.json" if name in OUT_IS_A_FILE else f"{name}_out")
    report = work / f"{name}_threads.json"
    args = [str(script), "--out", str(out), *(["--tiny"] if tiny else [])]
    context = harness.run_context()
    cpu_before, start = children_cpu_seconds(), time.perf_counter()
    done = subprocess.run([sys.executable, "-c", LAUNCHER, str(report), *args], cwd=work,
                          capture_output=True, text=True)  # fmt: skip
    wall, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu_before
    if done.returncode != 0:
        raise RuntimeError(f"examples/{name}.py failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    threads = json.loads(report.read_text())["torch_threads"]
    entry = {"command": "python examples/" + " ".join([f"{name}.py", *(["--tiny"] if tiny else [])]),
             "tiny": tiny, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "torch_threads": threads,
             "context": context, "load_average_end": harness.load_average()}  # fmt: skip
    written = [out] if out.suffix == ".json" else sorted(out.glob("*.json"))
    entry["own_timings"] = {}
    for path in written:
        timings = own_timings(json.loads(path.read_text()))
        entry["own_timings"].update({f"{path.name}: {key}": value for key, value in timings.items()})
    if name == "quickstart":
        path = out if out.suffix == ".json" else out / "quickstart_results.json"
        entry["runs"] = quickstart_figures(json.loads(path.read_text()))
    return entry


def describe(name: str, entry: dict) -> str:
    """The printed line: the figures, then the machine, load and threads they were measured at."""
    line = f"{name}: {entry['wall_s']:.1f} s wall, {entry['cpu_s']:.1f} s CPU"
    for side, run in entry.get("runs", {}).items():
        line += (f"; {side.upper()} run {run['wall_s']:.1f} s wall ({run['cpu_s']:.1f} s CPU), means within "
                 f"{run['max_mean_err_sd']:.3f} sd, sds within {100 * run['max_sd_rel_err']:.1f} %")  # fmt: skip
    context = harness.context_line(entry["context"], entry["load_average_end"], entry["torch_threads"])
    return f"{line}\n    [{context}]"


def main(argv=None) -> dict:
    p = harness.parser(__doc__, DEFAULT_OUT, tiny="every example at its --tiny size: a smoke test only")
    p.add_argument("examples", nargs="*", metavar="EXAMPLE", help=f"examples to run (default: {', '.join(EXAMPLES)})")
    args = p.parse_args(argv)
    unknown = sorted(set(args.examples) - set(EXAMPLES))
    if unknown:
        p.error(f"examples: unknown {unknown}; choose from {EXAMPLES}")
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.setdefault("examples", {})
    results.setdefault("earlier", {})
    log = harness.Log()
    with tempfile.TemporaryDirectory() as work:
        for name in args.examples or EXAMPLES:
            entry = measure(name, args.tiny, Path(work))
            if name in results["examples"]:
                results["earlier"].setdefault(name, []).append(results["examples"][name])
            results["examples"][name] = entry
            log(describe(name, entry))
    results["package"] = harness.package_fingerprint()
    results["log"] = results.get("log", []) + log.lines  # every run's lines, oldest first
    harness.write_json(args.out, results)
    print(f"results written to {args.out}")
    return results


if __name__ == "__main__":
    main()
