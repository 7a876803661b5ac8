"""Smoke-run the Laplace peer benchmarks at ``--tiny`` size (laplace-torch's rows only where it is installed)."""

from __future__ import annotations

import json


def test_marglik_peer_benchmark_tiny(tmp_path):
    import benchmarks.laplace_marglik_peer as bench

    out = tmp_path / "marglik.json"
    results = bench.main(["--tiny", "--out", str(out)])
    assert json.loads(out.read_text())["config"]["epochs"] == 3
    ours = [row for row in results["rows"] if row["library"] == "pyro_sgmcmc"]
    assert len(ours) == len(bench.VARIANTS)
    for row in ours:
        assert row["log_evidence"] < 0 and row["seconds"] > 0 and 0 <= row["accuracy"] <= 1
    for row in results["rows"]:
        if row["library"] == "laplace-torch":  # their end point, evaluated by both libraries' evidence
            assert abs(row["log_evidence"] - row["log_evidence_theirs"]) < 1e-3 * abs(row["log_evidence"])


def test_fit_backends_benchmark_tiny(tmp_path):
    import benchmarks.laplace_fit_backends as bench

    results = bench.main(["--tiny", "--out", str(tmp_path / "fit.json")])
    assert {"ours diag_ggn", "ours kron"} <= set(results["median_seconds"])
    assert all(difference < 1e-4 for difference in results["diagonal_max_relative_difference"].values())
