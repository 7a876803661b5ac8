"""One harness for the benchmarks: hand-written reference loops, timing, results and tables.

Every benchmark in this folder asks one question ("how much slower than the same maths written by hand?",
"how much memory do the kept draws take?", ...); this module holds what answering them shares, so that each
script reads as its question and its answer:

* :class:`HandChains` (from ``hand_loops.py``, re-exported here): SGLD, SGHMC and SGNHT for ``K`` chains
  written out in plain PyTorch on a potential given as a function, with the package's random streams, so it
  reproduces the kernels' trajectories (``python benchmarks/hand_loops.py --check`` shows it);
* timing: :func:`now` (wall clock and CPU time of the process), :func:`stepped` blocks with a time stamp after
  every step, :func:`rotating_rounds` (contenders interleaved, order rotating, page faults counted),
  :func:`step_summary`, :func:`best_ms`, :func:`interleaved_best_ms`, :func:`paired_median`, :func:`timed`,
  :func:`median_seconds`;
* the machine: :func:`machine_info`, :func:`load_average`, :func:`run_context` and :func:`context_line` (what
  every timing is printed and stored beside: the date, the CPU, the load and the torch threads),
  :func:`package_fingerprint`, :func:`rss_bytes`;
* results: :func:`parser` (the common flags), :func:`write_json`, :class:`Log`, :func:`rst_list_table`,
  :func:`markdown_table`, :func:`text_table`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pyro
import torch

import pyro_sgmcmc

if __package__:  # imported as benchmarks.harness
    from . import hand_loops
else:  # run as a script: benchmarks/ is on sys.path
    import hand_loops

# the reference loops, re-exported: every benchmark reaches the whole harness through this module
HandChains, Energy, SAME_MATHS = hand_loops.HandChains, hand_loops.Energy, hand_loops.SAME_MATHS
max_abs_diff, max_rel_diff = hand_loops.max_abs_diff, hand_loops.max_rel_diff

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
Stamp = Tuple[float, float]  # (wall clock, CPU time of this process), seconds


# ------------------------------------------------------------------------------------------- timing
def now() -> Stamp:
    """(wall clock, CPU time of this process), in seconds."""
    return time.perf_counter(), time.process_time()


def stepped(step: Callable[[], Any], steps: int) -> Callable[[], List[Stamp]]:
    """A block of ``steps`` calls of ``step`` with a time stamp before the first and after every call."""

    def block() -> List[Stamp]:
        stamps = [now()]
        for _ in range(steps):
            step()
            stamps.append(now())
        return stamps

    return block


def minor_faults() -> int:
    """Minor page faults of this process so far: fresh pages the allocator had to map."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def rotating_rounds(blocks: Dict[str, Callable[[], List[Stamp]]], rounds: int) -> Dict[str, List[tuple]]:
    """Run every contender's block once per round, the order rotating by one each round, so that slow phases
    of a shared machine hit every contender alike. Per contender and round: ``(wall ms, CPU ms, minor page
    faults)`` per step, from the block's first to its last stamp."""
    names = list(blocks)
    out: Dict[str, List[tuple]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            faults = minor_faults()
            stamps = blocks[name]()
            n = len(stamps) - 1
            wall, cpu = (stamps[-1][0] - stamps[0][0]) / n, (stamps[-1][1] - stamps[0][1]) / n
            out[name].append((1e3 * wall, 1e3 * cpu, (minor_faults() - faults) / n))
    return out


def paired_median(values: Sequence[float], baseline: Sequence[float]) -> float:
    """Median over rounds of ``value / baseline`` (paired: cancels slow drifts of the background load)."""
    return statistics.median(v / b for v, b in zip(values, baseline))


def step_summary(stamps: List[Stamp], start: Stamp, skip: int = 5) -> dict:
    """Median wall and CPU ms per step from per-step stamps (the first ``skip`` steps dropped: allocator and
    dispatch warm-up), and the set-up time: from ``start`` to the first stamp, minus one median step."""
    wall = [b[0] - a[0] for a, b in zip(stamps[:-1], stamps[1:])]
    cpu = [b[1] - a[1] for a, b in zip(stamps[:-1], stamps[1:])]
    if len(wall) > skip + 2:
        wall, cpu = wall[skip:], cpu[skip:]
    median_wall = statistics.median(wall)
    return {
        "median_ms": 1e3 * median_wall,
        "mean_ms": 1e3 * statistics.fmean(wall),
        "cpu_median_ms": 1e3 * statistics.median(cpu),
        "setup_s": stamps[0][0] - start[0] - median_wall,
        "total_s": stamps[-1][0] - start[0],
    }


def best_ms(fn: Callable, number: int, repeat: int, clock: Callable[[], float] = time.process_time) -> float:
    """Best over ``repeat`` blocks of the mean time of ``number`` calls, in ms (CPU time by default: at one
    thread it equals the wall time on an idle machine and is barely touched by other jobs)."""
    best = math.inf
    for _ in range(repeat):
        start = clock()
        for _ in range(number):
            fn()
        best = min(best, (clock() - start) / number)
    return 1e3 * best


def timed(fn: Callable[[], Any]) -> Tuple[Any, float]:
    """``(fn(), wall seconds it took)``."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn``."""
    return statistics.median(timed(fn)[1] for _ in range(repeats))


def interleaved_best_ms(fns: Dict[str, Callable], number: int, repeat: int) -> Dict[str, float]:
    """:func:`best_ms` for several functions, block by block in turn, so background load hits them alike."""
    best = {name: math.inf for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            best[name] = min(best[name], best_ms(fn, number, 1))
    return best


# ------------------------------------------------------------------------------------------ machine
def machine_info(**extra: Any) -> dict:
    """CPU model and count, torch threads, platform and the versions that matter, plus ``extra``."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "pyro_sgmcmc": pyro_sgmcmc.__version__,
        **extra,
    }


def load_average() -> Optional[List[float]]:
    """The 1, 5 and 15-minute load averages (other jobs on a shared machine), or None where unknown."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def run_context(**extra: Any) -> dict:
    """What a timing depends on, to store beside it: the UTC date, :func:`machine_info` (CPU model and count,
    torch threads, versions; plus ``extra``) and the load average now (other jobs on a shared machine).

    Every benchmark that writes a results JSON records one of these (``tests/test_docs_timings.py`` checks)."""
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info(**extra),
        "load_average": load_average(),
    }


def context_line(context: dict, load_end: Optional[List[float]] = None, threads: Optional[int] = None) -> str:
    """One line to print beside a run's figures: date, CPU, cores, load (at start, and at the end if given)
    and torch threads (``threads`` where the timed code ran with another count than this process)."""
    machine = context["machine"]
    load = " ".join(f"{v:.2f}" for v in context["load_average"] or []) or "unknown"
    if load_end is not None:
        load += " -> " + " ".join(f"{v:.2f}" for v in load_end)
    threads = machine["torch_threads"] if threads is None else threads
    return (
        f"{context['date_utc']}; {machine['cpu']}, {machine['cpus']} cores; load average (1, 5, 15 min) {load}; "
        f"{threads} torch thread{'s' if threads != 1 else ''}"
    )


def package_fingerprint() -> dict:
    """The git commit and a hash of the package's sources as measured (uncommitted edits included)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "pyro_sgmcmc").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    commit = None
    try:
        head = (ROOT / ".git" / "HEAD").read_text().strip()
        commit = (ROOT / ".git" / head[5:]).read_text().strip() if head.startswith("ref: ") else head
    except OSError:  # a worktree (.git is a file) or no checkout
        pass
    measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
    return {"git_commit": commit, "sources_sha256": digest.hexdigest(), "measured_at": measured_at}


def rss_bytes() -> int:
    """Resident set size of this process (``/proc/self/statm``), bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------------------ results
def companion(name: str, package: Optional[str]):
    """The module ``benchmarks/<name>.py``, whether the caller runs as a script (``package`` empty: the folder
    is on ``sys.path``; a script asking for itself gets ``__main__``) or was imported from ``package``."""
    main = sys.modules.get("__main__")
    if not package and main is not None and Path(getattr(main, "__file__", "") or "").stem == name:
        return main
    return importlib.import_module(f"{package}.{name}" if package else name)


def parser(doc: str, out: Optional[Path], tiny: Optional[str] = "smallest sizes: a smoke test only"):
    """An ``argparse`` parser described by the first line of ``doc``, with ``--out`` (default ``out``) and,
    unless ``tiny`` is None, ``--tiny`` (help ``tiny``)."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--out", type=Path, default=out, help=f"results as JSON (default {out})")
    if tiny is not None:
        p.add_argument("--tiny", action="store_true", help=tiny)
    return p


def write_json(path: Path, results: Any, indent: int = 2, default: Callable[[Any], Any] = str) -> Path:
    """Write ``results`` as JSON to ``path`` (parents made; anything not JSON written as ``default(value)``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=indent, default=default))
    return path


class Log:
    """Print a line at once and keep it (the results file holds the run's log)."""

    def __init__(self):
        self.lines: List[str] = []

    def __call__(self, message: str) -> None:
        print(message, flush=True)
        self.lines.append(message)


def rst_list_table(caption: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A reStructuredText ``list-table`` (the docs include these files as they are written)."""
    lines = [f".. list-table:: {caption}", "   :header-rows: 1", ""]
    for row in [header, *rows]:
        lines += [f"   * - {row[0]}"] + [f"     - {cell}" for cell in row[1:]]
    return "\n".join(lines) + "\n"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown (GitHub) table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table for the terminal: columns as wide as their widest cell, numbers right-aligned."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])
