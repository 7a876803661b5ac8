"""benchmarks/loglik_export.py runs at ``--tiny`` size and writes the figures the docs quote (time ratio, peak
memory over the output); their values on today's code are in docs/reliability.rst, measured at full size."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_runs_at_tiny_size_and_writes_its_figures(tmp_path):
    out = tmp_path / "loglik.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, str(ROOT / "benchmarks" / "loglik_export.py"), "--tiny", "--out", str(out)]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    case = json.loads(out.read_text())["cases"]["tiny"]
    assert case["log_likelihood_dtype"] == "float32" and case["torch_threads"] == 1
    assert case["log_likelihood_bytes"] == 2 * 10 * 2_000 * 4
    assert case["ratio_cpu"] > 0 and case["sampling"]["wall_s"] > 0 and case["export"]["wall_s"] > 0
    if os.path.exists("/proc/self/clear_refs"):
        assert case["peak_growth_bytes"] > 0
