"""Smoke-run the benchmark scripts that other checks rely on, at their ``--tiny`` sizes, on the CPU.

``benchmarks/gpu.py`` is run on a GPU machine by hand (it cannot be tested here); ``--device cpu --tiny``
runs every part's code path but the CUDA graph's and must finish within a minute, writing the JSON whose
keys the GPU runs are read by. ``benchmarks/step_ops.py --tiny`` must count a step's operators and write
its JSON (its verdict on today's code is not asserted here: ``--no-check``). ``benchmarks/threads.py --tiny``
must time both examples at one and two torch threads and write the machine, load and thread counts beside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(args, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_gpu_benchmark_runs_on_the_cpu_at_tiny_size_and_writes_its_results(tmp_path):
    out = tmp_path / "gpu.json"
    done = _run([str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--tiny", "--out", str(out)], tmp_path, 180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    meta = results["meta"]
    assert {"date_utc", "git_commit", "torch", "cuda", "gpu", "device", "budgets_s", "seconds"} <= set(meta)
    assert meta["device"] == "cpu" and meta["tiny"] is True
    assert set(results["parts"]) == {"a", "b", "c", "d"}
    for part in results["parts"].values():
        assert "error" not in part, part["error"]
        assert {"seconds", "timed_out", "what"} <= set(part)
    one = results["parts"]["a"]
    assert one["pyro_sgmcmc.MCMC"]["ms_per_step"] > 0 and one["hand eager"]["ms_per_step"] > 0
    assert one["hand CUDA graph"] == {"skipped": "needs a CUDA device"}
    for entry in results["parts"]["b"]["chains"].values():
        assert "error" not in entry, entry["error"]
        assert entry["timed_out"] or entry["ratio"] > 0
    assert set(results["parts"]["c"]["sides"]) == {"SGHMC", "SGHMC, capture", "NUTS"}  # cuda_graph: a third side
    capture = results["parts"]["d"]
    assert capture["parameter"] == "SGHMC(cuda_graph=True)"
    fallbacks = capture["a"]["fallbacks"]
    assert fallbacks and all("needs the chains on a CUDA device" in m for m in fallbacks)  # on the CPU: says so
    assert meta["seconds"] < 60  # the parts' budgets at --tiny: a smoke run stays short


def test_step_ops_counts_operators_and_host_reads(tmp_path):
    out = tmp_path / "step_ops.json"
    args = [str(ROOT / "benchmarks" / "step_ops.py"), "--tiny", "--no-check", "--out", str(out)]
    done = _run(args, tmp_path, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results["configs"]) == {"mlp/SGLD", "mlp/SGHMC", "mlp/SGNHT"}
    step = results["configs"]["mlp/SGHMC"]["1"]["ordinary"]
    # one SGHMC step of the MLP: a forward and backward pass of three layers, at least an mm each way
    assert step["total"] > 20 and step["ops"].get("aten.mm", 0) + step["ops"].get("aten.bmm", 0) >= 3


def test_threads_benchmark_compares_one_thread_with_another_at_tiny_size(tmp_path):
    out = tmp_path / "threads.json"
    args = [str(ROOT / "benchmarks" / "threads.py"), "--tiny", "--threads", "1", "2", "--out", str(out)]
    done = _run(args, tmp_path, 120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    meta = results["meta"]
    assert {"date_utc", "cpu", "cpus", "load_start", "load_end", "default_threads", "thread_counts"} <= set(meta)
    assert meta["thread_counts"] == [1, 2] and meta["default_threads"] == 1  # _run sets OMP_NUM_THREADS=1
    assert set(results["results"]) == {"quickstart", "bnn"}
    for case, figures in (("quickstart", 4), ("bnn", 2)):
        for threads in ("1", "2"):
            median = results["results"][case][threads]["median"]
            assert sum(key.endswith("_ms") and median[key] > 0 for key in median) == figures, median
        assert results["ratios_to_one_thread"][case]["2"]["step_wall_ms"] > 0
    # every printed figure line carries the thread count and the load beside it
    assert any("2 threads / 1 thread" in line and "load" in line for line in results["log"])
    assert meta["seconds"] < 10  # the script's promise for --tiny (1.4 s measured at load 2.7)


def test_cyclical_mixture_benchmark_runs_at_tiny_size_and_writes_its_results(tmp_path):
    out = tmp_path / "cyclical.json"
    args = [str(ROOT / "benchmarks" / "cyclical_mixture.py"), "--tiny", "--out", str(out)]
    done = _run(args, tmp_path, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["meta"]["tiny"] is True and results["meta"]["mmd2_noise"] > 0
    rows = {row["sampler"]: row for row in results["results"]}
    assert {"constant 0.05", "cyclical 0.09, beta 0.25", "cyclical, adapted peak"} <= set(rows)
    for row in rows.values():
        assert 1 <= row["modes_all_chains"] <= 25 and row["gradient_evaluations_per_chain"] >= 660
    # a cyclical run returns its sampling stages' draws only: 3/4 of 600 steps, 1/2 with beta = 0.5
    assert rows["cyclical 0.09, beta 0.25"]["draws_per_chain"] == 450
    assert rows["cyclical 0.09, beta 0.5"]["draws_per_chain"] == 300
    assert rows["constant 0.05"]["draws_per_chain"] == 600


def test_cyclical_digits_benchmark_runs_at_tiny_size_at_an_equal_budget(tmp_path):
    out = tmp_path / "cyclical_digits.json"
    done = _run([str(ROOT / "benchmarks" / "cyclical_digits.py"), "--tiny", "--out", str(out)], tmp_path, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    meta, rows = results["meta"], results["per_seed"][0]
    assert meta["tiny"] is True and meta["machine"]["torch_threads"] == 1
    cyclical = {f"cyclical, peak {f}" for f in ("1 (defaults)", "5 (x adapted)", "20 (x adapted)")}
    assert set(rows) == {"SGHMC, constant (defaults)", *cyclical, "deep ensemble", "MAP", "diag Laplace", "diag VI"}
    budget = meta["budgets"][0]
    # the budget is what SGHMC on defaults spent (2 chains x 300 steps, plus its warmup's curvature probes)
    assert budget == rows["SGHMC, constant (defaults)"]["gradient_evaluations"] > 2 * 300
    for name in ("cyclical, peak 1 (defaults)", "cyclical, peak 5 (x adapted)", "deep ensemble"):
        assert rows[name]["gradient_evaluations"] == budget, name
    assert budget - 16 < rows["diag VI"]["gradient_evaluations"] <= budget  # whole steps of 16 particles
    assert rows["diag Laplace"]["gradient_evaluations"] <= budget
    # draws: 20 per chain kept by thinning; a cyclical run keeps those of sampling stages (the last 20% of each
    # of 4 cycles of 50 steps; thinning by 10 leaves one per cycle); the ensemble keeps each member's last point
    assert rows["SGHMC, constant (defaults)"]["num_draws"] == 2 * 20
    assert rows["cyclical, peak 5 (x adapted)"]["num_draws"] == 2 * 4
    assert rows["deep ensemble"]["num_draws"] == 2 and rows["diag Laplace"]["num_draws"] == 1
    for name, row in rows.items():
        assert 0 <= row["ece"] <= 1 and row["nll"] > 0 and 0 <= row["accuracy"] <= 1, name
        assert 0 <= row["auroc_total"] <= 1, name
        assert (row["auroc_epistemic"] is None) == (row["num_draws"] == 1), name
    assert meta["cpu_seconds"] < 60  # the script's promise for --tiny, in CPU time (wall time depends on the load)


def test_step_parts_times_the_noise_the_divergence_rule_and_pyros_logging(tmp_path):
    out = tmp_path / "step_parts.json"
    done = _run([str(ROOT / "benchmarks" / "step_parts.py"), "--tiny", "--out", str(out)], tmp_path, 180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert {"date_utc", "machine", "load_average"} <= set(results["context"])
    for entry in results["chains"].values():
        assert set(entry["noise_us"]) == {"keyed Philox", "one normal_", "difference"}
        assert set(entry["divergence_rule_us"]) == {"step", "step, rule = identity", "difference"}
        assert entry["noise_us"]["keyed Philox"] > 0 and entry["divergence_rule_us"]["step"] > 0
    assert results["pyro_logging_us"]["pyro logging hook"] > 0
