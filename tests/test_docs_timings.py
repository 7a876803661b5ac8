"""Every timing in the README and the docs is a figure measured by a script in ``benchmarks/`` that records the
machine, the load and the thread count beside it (issue 29, point 1: a new user on a loaded machine met timings
three to five times the README's, with nothing saying under which conditions they had been measured).

What is checked, without running Sphinx:

* every ``benchmarks/<file>`` a page names exists;
* every section of the README and of ``docs/`` that states a timing (seconds, milliseconds, minutes, a speed
  ratio such as ``1.5x`` or "8.6 times sooner") names the ``benchmarks/*.py`` script that measured it, a date
  and the load; the sections that do not yet are listed in ``SECTIONS_TO_REMEASURE`` with what is missing, and
  the test fails when that list is wrong either way (a new gap, or a listed one closed and still listed);
* every benchmark script that writes a results JSON records the machine, the load and the threads in it
  (through ``harness.run_context``, or the older ``machine_info`` and ``load_average``), and every committed
  results JSON holds them, except the files measured before that was recorded (``JSONS_TO_REMEASURE``);
* ``benchmarks/example_costs.py`` (the quickstart's headline and the gallery's costs) runs at ``--tiny``
  size and writes each figure beside its date, machine, load and threads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.rst"))]

# A timing: a number with a unit of time, or a ratio of times. Inline literals and maths are removed first
# (``1000 + 10 s`` is a threshold with s a symbol, not a duration).
TIMING = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:ms|s|seconds?|minutes?|min|hours?)\b(?!\s*[-+*/=])"
    r"|(?<![\w.])\d+(?:\.\d+)?x\b"
    r"|\btimes (?:faster|slower|sooner)\b"
)
LITERAL = re.compile(r"``[^`]*``|:math:`[^`]*`|`[^`]*`")
# a benchmark, or an example that times itself and records its context in its results (examples/lora_sentiment.py)
SCRIPT = re.compile(r"(?:benchmarks|examples)/(\w+)\.py")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
UNDERLINE = re.compile(r"^([=\-~^*#+])\1+$")
# the load stated: a figure near the word, or a machine said to be quiet, or said plainly not to be known
LOAD = re.compile(r"\bload(?:\s+average)?\b[^.]{0,80}?(?:\d|not\s+recorded)|\bquiet\b|\bidle\b", re.IGNORECASE)

# Sections whose timings do not yet name their script, date and load, with what is missing: each is to be
# re-measured with its script (and the list shortened), not accepted. Keys: (page, section title).
SECTIONS_TO_REMEASURE: dict = {}

# Results measured before the scripts recorded their context: the scripts record it now (checked below); these
# files keep the figures the docs quote until they are measured again.
JSONS_TO_REMEASURE: dict = {
    "distributed_scaling_results.json": ["threads"],  # 2026-11-24; one thread per process, stated in the docs
    "laplace_digits_results.json": ["machine", "load", "threads"],  # 2026-11-26
    "laplace_marglik_peer_results.json": ["load"],  # 2026-11-27, before the script recorded its run_context
    "laplace_scale_results.json": ["machine", "load"],  # 2026-11-24
    "laplace_speed_results.json": ["machine", "load"],  # 2026-11-26
    "preconditioning_results.json": ["machine", "load", "threads"],  # 2026-11-26
    "storage_results.json": ["machine", "threads"],  # 2026-11-26
    "storage_results_before_20.json": ["machine", "threads"],  # 2026-11-26, the figures before issue 20
}


def sections(path: Path) -> list[tuple[str, str, str]]:
    """``(title, text, context)`` for each section of a reST page (``#`` sections of a Markdown page): its own
    text up to its first subsection or the next section, and ``context``, the opening text of the sections
    that enclose it (a page that says once which script, date and load its figures come from covers its
    subsections). reST levels are the underline characters in the order they first appear."""
    lines = path.read_text(encoding="utf-8").splitlines()
    heads = []  # (line index, level, title)
    levels: list[str] = []
    fenced = False  # inside a Markdown code fence, where "#" starts a comment
    for i, line in enumerate(lines):
        if path.suffix == ".md":
            fenced ^= line.startswith("```")
            if line.startswith("#") and not fenced:
                heads.append((i, len(line) - len(line.lstrip("#")), line.lstrip("# ")))
            continue
        title = lines[i - 1] if i > 0 else ""
        if UNDERLINE.match(line) and title.strip() and not title[0].isspace() and not UNDERLINE.match(title):
            if len(line) >= len(title.rstrip()):
                if line[0] not in levels:
                    levels.append(line[0])
                heads.append((i - 1, levels.index(line[0]) + 1, title.strip()))
    bounds = [(0, 0, "(top)")] + heads + [(len(lines), 0, "")]
    out, stack = [], []  # stack: (level, opening text) of the enclosing sections
    for (start, level, title), (end, _, _) in zip(bounds, bounds[1:]):
        text = "\n".join(lines[start:end])
        stack = [(lv, t) for lv, t in stack if lv < level]
        out.append((title, text, "\n".join(t for _, t in stack)))
        stack.append((level, text))
    return out


def timed_sections() -> dict:
    """``{(page, title): what is missing}`` for every section that states a timing, with the missing items."""
    found = {}
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for title, text, context in sections(page):
            prose = LITERAL.sub(" ", text)
            if not TIMING.search(prose):
                continue
            both = context + "\n" + text
            missing = [
                what
                for what, present in (
                    ("script", SCRIPT.search(both)),
                    ("date", DATE.search(both)),
                    ("load", LOAD.search(both)),
                )
                if not present
            ]
            found[(name, title)] = missing
    return found


def test_the_timing_pattern_reads_the_figures_the_pages_use():
    for text in ["76 s wall", "0.40 ms a step", "8.6 times sooner", "1.5x the hand loop", "3.8-5.4 minutes"]:
        assert TIMING.search(text), text
    for text in ["N = 10^5", "3 x 200 steps", "0.2 sd", "15 %", "within 1.06"]:
        assert not TIMING.search(text), text
    assert not TIMING.search(LITERAL.sub(" ", "jumps by more than ``1000 + 10 s``"))


def test_every_benchmark_file_a_page_names_exists():
    """A script, or a results file the repository keeps; ``benchmarks/results/`` is the scripts' default
    output folder, which git ignores: a name there needs the script of the same name."""
    missing = []
    for page in PAGES:
        for name in re.findall(r"benchmarks/([\w./-]+\.(?:py|json|sh))", page.read_text(encoding="utf-8")):
            if name.startswith("results/"):
                name = Path(name).stem + ".py"
            if not (BENCHMARKS / name).exists():
                missing.append((page.relative_to(ROOT).as_posix(), f"benchmarks/{name}"))
    for page in PAGES:  # an example named as the script that measured a figure
        for name in re.findall(r"examples/(\w+\.py)", page.read_text(encoding="utf-8")):
            if not (ROOT / "examples" / name).exists():
                missing.append((page.relative_to(ROOT).as_posix(), f"examples/{name}"))
    assert not missing, f"pages name benchmark files that do not exist: {missing}"


def test_every_timing_names_its_script_date_and_load():
    """A section that states a timing names the script in ``benchmarks/`` that measured it, a date and the
    load. The known gaps are exactly ``SECTIONS_TO_REMEASURE``: a new gap fails, and so does a closed one left
    in the list (the list only shrinks)."""
    found = timed_sections()
    assert any(key[0] == "README.md" for key in found)  # the pattern reads the README's timings
    assert ("docs/quickstart.rst", "Quickstart") in found
    gaps = {key: missing for key, missing in found.items() if missing}
    new = {key: missing for key, missing in gaps.items() if SECTIONS_TO_REMEASURE.get(key) != missing}
    closed = sorted(set(SECTIONS_TO_REMEASURE) - set(gaps))
    assert not new, f"sections with a timing but without its script, date or load: {new}"
    assert not closed, f"these sections now name script, date and load: remove them from the list: {closed}"


def _keys(value, prefix: str = "") -> set[str]:
    """Every key of a nested JSON value, lower case."""
    keys = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            keys.add(str(key).lower())
            keys |= _keys(inner)
    elif isinstance(value, list):
        for inner in value:
            keys |= _keys(inner)
    return keys


def records_context(results) -> dict:
    """Whether a results JSON holds the machine (CPU or GPU model, or core count), the load and the threads."""
    keys = _keys(results)
    return {
        "machine": bool(keys & {"cpu", "cpus", "gpu", "machine"}),
        "load": any("load" in key for key in keys),
        "threads": any("thread" in key for key in keys),
    }


def test_every_results_json_records_machine_load_and_threads():
    lacking = {}
    for path in sorted(BENCHMARKS.glob("*.json")):
        recorded = records_context(json.loads(path.read_text(encoding="utf-8")))
        missing = [what for what, present in recorded.items() if not present]
        if missing:
            lacking[path.name] = missing
    assert lacking == JSONS_TO_REMEASURE


def test_every_benchmark_that_writes_results_records_its_context():
    """The scripts themselves, so that the next measurement of any figure carries its context."""
    lacking = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        if path.name in ("harness.py", "hand_loops.py", "models.py"):
            continue  # the harness and its companions: no results of their own
        source = path.read_text(encoding="utf-8")
        if "write_json(" not in source and "json.dump" not in source:
            continue
        if path.name == "gpu_syncs.py":
            assert "time" not in source.split('"""')[1]  # counts synchronisations: no timing to qualify
            continue
        context = "run_context(" in source
        machine = context or "machine_info(" in source or "get_device_name(" in source
        load = context or "load_average(" in source
        threads = context or "machine_info(" in source or "get_num_threads(" in source
        if not (machine and load and threads):
            lacking.append(path.name)
    assert not lacking, f"benchmarks writing results without the machine, load or threads: {lacking}"


def test_run_context_and_its_line_carry_date_machine_load_and_threads():
    sys.path.insert(0, str(ROOT))
    from benchmarks import harness

    context = harness.run_context(extra_note="x")
    assert DATE.search(context["date_utc"]) and context["machine"]["extra_note"] == "x"
    assert context["machine"]["cpus"] == os.cpu_count() and context["machine"]["cpu"]
    assert context["machine"]["torch_threads"] >= 1 and len(context["load_average"]) == 3
    line = harness.context_line(context, load_end=[1.0, 2.0, 3.0], threads=1)
    assert "load average" in line and "-> 1.00 2.00 3.00" in line and line.endswith("1 torch thread")
    assert context["machine"]["cpu"] in line and context["date_utc"] in line


def test_example_costs_times_an_example_beside_its_context(tmp_path):
    out = tmp_path / "costs.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, str(BENCHMARKS / "example_costs.py"), "--tiny", "quickstart", "--out", str(out)]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    entry = json.loads(out.read_text())["examples"]["quickstart"]
    assert entry["tiny"] is True and entry["wall_s"] > 0 and entry["cpu_s"] > 0
    assert entry["torch_threads"] == 1  # the quickstart sets one thread itself; the launcher reads it back
    assert all(records_context(entry).values()) and DATE.search(entry["context"]["date_utc"])
    assert {"sghmc", "nuts"} == set(entry["runs"]) and entry["runs"]["sghmc"]["wall_s"] > 0
    # the example's own phase timings, from the JSON it wrote, kept beside the totals
    own = entry["own_timings"]["quickstart_results.json: sghmc/seconds"]
    assert own == pytest.approx(entry["runs"]["sghmc"]["wall_s"], abs=1e-3)
    # the printed line carries the figure and, beside it, the machine, the load and the threads
    assert re.search(r"quickstart: [\d.]+ s wall, [\d.]+ s CPU", done.stdout)
    assert re.search(r"cores; load average \(1, 5, 15 min\) [\d. ]+ -> [\d. ]+; 1 torch thread\]", done.stdout)
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]  # the example wrote into a temporary folder


@pytest.mark.parametrize("stem", ["quickstart", "bnn_digits", "ood_detection"])
def test_long_examples_show_progress_by_default(stem):
    """Long runs show progress unless asked not to, as Pyro's ``MCMC`` does (issue 29: the quickstart was
    silent for two minutes)."""
    source = (ROOT / "examples" / f"{stem}.py").read_text(encoding="utf-8")
    assert re.search(r'"--progress",\s*action=argparse.BooleanOptionalAction,\s*default=True', source), stem
    assert "disable_progbar=not args.progress" in source or "not progress" in source, stem
