"""``benchmarks/cyclical_chains.py``: its basins, its balanced within-basin nested R-hat, and its ``--tiny`` run.

Oracles: the nearest mode by brute force (``torch.cdist``); the package's ``nested_rhat`` on a balanced array
built by hand; the run's own bookkeeping (shares sum to one, a chain's basins are those it has draws in).
"""

from __future__ import annotations

import json

import numpy as np
import torch

import benchmarks.cyclical_chains as bench
from pyro_sgmcmc.diagnostics import nested_rhat

from .test_benchmarks import ROOT, _run


def test_basin_is_the_nearest_mode():
    points = (torch.rand(20000, 2, generator=torch.Generator().manual_seed(0)) * 14 - 7).double()
    brute = torch.cdist(points, bench.mixture.MEANS).argmin(dim=1)
    assert torch.equal(bench.basin_of(points), brute)


def test_within_basin_rhat_is_nested_rhat_on_the_balanced_subset():
    """Superchains 0 and 1 (2 chains each) and 2 (1 chain) reach basin 7; chain 5 has too few draws there.
    The balanced subset is K = 2 superchains of M = 2 chains (K M = 4 beats K = 3 of M = 1), of N = the fewest
    draws any of them has in the basin, evenly spaced."""
    rng = np.random.default_rng(1)
    num_draws, basin = 400, 7
    ids = np.array([0, 0, 1, 1, 2, 2])
    draws = rng.normal(size=(6, num_draws, 2))
    basins = np.zeros((6, num_draws), dtype=int)
    counts = [300, 150, 400, 250, 350, bench.MIN_DRAWS - 1]
    for chain, count in enumerate(counts):
        basins[chain, :count] = basin
    out = bench.within_basin_rhat(draws, basins, ids, basin)
    assert (out["superchains"], out["chains_per_superchain"], out["draws_per_chain"]) == (2, 2, 150)
    subset = np.stack([draws[c, : counts[c]][np.linspace(0, counts[c] - 1, 150).round().astype(int)] for c in range(4)])
    assert out["rhat"] == float(np.max(nested_rhat(subset, [0, 0, 1, 1])))
    # a basin that one superchain only reaches has none
    alone = np.where(ids[:, None] == 0, basin, 0) * np.ones((1, num_draws), dtype=int)
    assert bench.within_basin_rhat(draws, alone, ids, basin)["rhat"] is None


def test_the_benchmark_runs_at_tiny_size_and_writes_its_results(tmp_path):
    out = tmp_path / "cyclical_chains.json"
    done = _run([str(ROOT / "benchmarks" / "cyclical_chains.py"), "--tiny", "--out", str(out)], tmp_path, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    meta = results["meta"]
    assert meta["tiny"] is True and (meta["chains"], meta["superchains"]) == (32, 4)
    assert {"date_utc", "load_end", "seconds"} <= set(meta) and meta["machine"]["torch_threads"] == 1
    assert meta["machine"]["load_average"] is not None
    rows = {row["sampler"]: row for row in results["results"]}
    assert set(rows) == {"cyclical, defaults", "cyclical, peak_factor 20", "cyclical, peak 0.09"}
    for name, row in rows.items():
        assert row["draws_per_chain"] == 450 and row["seconds"] > 0, name  # exploration 0.25 of 600 steps dropped
        basins = row["per_basin"]
        assert len(basins) == 25 and abs(sum(b["share_of_draws"] for b in basins) - 1) < 1e-9, name
        assert sum(b["chains_visiting"] > 0 for b in basins) == row["basins_visited"], name
        assert all(b["superchains_visiting"] <= 4 and b["chains_visiting"] <= 32 for b in basins), name
    # on defaults (a stable peak) every chain stays in the basin it descended to: its superchain's, so the
    # superchains disagree and no basin has two of them (the 4 seeded starts lie in 4 basins)
    defaults = rows["cyclical, defaults"]
    assert defaults["basins_per_chain_max"] == 1 and defaults["basins_visited"] == 4
    assert defaults["rhat_x"] > 2 and defaults["within_basin_rhat_max"] is None
    assert rows["cyclical, peak 0.09"]["basins_visited"] > 4
