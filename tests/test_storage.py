"""Kept draws are stored in preallocated tensors: resident memory close to their bytes (#20 point 1).

The oracle is the draws' own size: positions (chains x draws x dim float32) plus the statistics. The
resident set size is read inside the run (``hook_fn``) in a fresh process, so that nothing else of the
test session is counted; its growth between the first and the last reading of the sampling phase,
divided by the bytes of the draws kept in between, must stay under 1.2 (the issue's bar; before the
preallocated store it was 3.1 for 256 chains and 6.6 for one chain: one tensor and one dict per draw).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyro_sgmcmc.draws import DrawStore

ROOT = Path(__file__).resolve().parents[1]


def _measure(chains: int, draws: int) -> dict:
    code = (
        "import json, sys; sys.path.insert(0, 'benchmarks'); import storage; "
        f"print(json.dumps(storage.measure_memory({chains}, {draws})))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
@pytest.mark.parametrize("chains, draws", [(1, 20_000), (64, 1500)], ids=["1-chain", "64-chains"])
def test_resident_memory_of_the_kept_draws_is_at_most_1_2_times_their_bytes(chains, draws):
    result = _measure(chains, draws)
    # 11.5 MB (1 chain) and 55 MB (64 chains) of draws: the allocator's granularity (a few MB at most)
    # is well inside the 20 % margin
    assert result["ratio"] <= 1.2, result["ratio"]


def test_the_store_is_written_in_place_and_read_as_views():
    store = DrawStore(3, 5, 2, torch.float32, "cpu")
    buffer = store.positions.data_ptr()
    for i in range(4):
        store.append(torch.full((3, 2), float(i)), {"lp": torch.full((3,), -float(i), dtype=torch.float64)})
    positions, stats = store.filled()
    assert positions.data_ptr() == buffer and store.positions.data_ptr() == buffer  # no reallocation
    assert positions.shape == (3, 4, 2) and stats["lp"].shape == (3, 4)
    assert torch.equal(positions[0, :, 0], torch.arange(4.0)) and torch.equal(stats["lp"][1], -torch.arange(4.0))
    assert store.nbytes == 4 * 3 * (2 * 4 + 8)
    later, _ = store.filled(2)
    assert later.shape == (3, 2, 2) and torch.equal(later[:, 0], positions[:, 2])


def test_the_store_refuses_more_draws_than_it_holds():
    store = DrawStore(1, 1, 1, torch.float32, "cpu")
    store.append(torch.zeros(1, 1), {})
    with pytest.raises(RuntimeError, match="full"):
        store.append(torch.zeros(1, 1), {})
