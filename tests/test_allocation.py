"""``retain_freed_cpu_memory``: freed blocks are reused instead of faulted in afresh.

The allocator is process-wide, so the measurement runs in a child process. Two 64 MiB tensors are made
and freed per round: 64 MiB is above the largest mmap threshold glibc picks by itself (32 MiB on 64-bit),
so by default each is a fresh mapping and writing it faults in all of its 4 KiB pages,
2 x 16,384 = 32,768 per round. With the memory retained, once the heap has grown to what a round needs
the pages are reused and a round faults in none. The heap gets there within the first four rounds:
children measured after one or two warm-up rounds grew by another 64 MiB in a measured round in 18 of
20, after three in 4 of 12 (always in round 4), after five or six in none of 35. Hence six warm-up
rounds, then ten measured. The bounds (at least 90 % of the pages by default, at most 1 % retained)
leave room for the interpreter's own small allocations; either failure means the setting did not take
effect or the default behaviour changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyro_sgmcmc
from pyro_sgmcmc import allocation

ROOT = Path(__file__).resolve().parent.parent
PAGES_PER_ROUND = 2 * (64 * 2**20) // 4096

CHILD = """
import json, resource, sys
import torch
import pyro_sgmcmc
applied = pyro_sgmcmc.retain_freed_cpu_memory() if sys.argv[1] == "retain" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def one_round():
    a = torch.ones(16 * 2**20)  # 64 MiB of float32, every page written
    b = torch.ones(16 * 2**20)
    del a, b
for _ in range(6):  # the heap reaches its size within four rounds (see the module docstring)
    one_round()
before = faults()
for _ in range(10):
    one_round()
print(json.dumps({"applied": applied, "faults_per_round": (faults() - before) / 10}))
"""


def _run_child(mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"):
        env.pop(name, None)  # the child starts with glibc's defaults
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(allocation._glibc() is None, reason="glibc only (the setting is a no-op elsewhere)")
def test_freed_blocks_are_reused_instead_of_faulted_in():
    default = _run_child("default")
    retained = _run_child("retain")
    assert retained["applied"] is True
    assert default["faults_per_round"] >= 0.9 * PAGES_PER_ROUND, default
    assert retained["faults_per_round"] <= 0.01 * PAGES_PER_ROUND, retained


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(allocation, "_glibc", lambda: None)
    assert pyro_sgmcmc.retain_freed_cpu_memory() is False


@pytest.mark.parametrize("bad", [0, -5, 2**31, 1.5, "1e9", True, None])
def test_bad_max_block_bytes_is_named(bad):
    with pytest.raises((TypeError, ValueError), match="max_block_bytes"):
        pyro_sgmcmc.retain_freed_cpu_memory(bad)
