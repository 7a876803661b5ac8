"""``retain_freed_cpu_memory`` is a deprecated no-op; the environment variables the docs name instead work.

The allocator is process-wide, so the measurement runs in child processes. Two 64 MiB tensors are made
and freed per round: 64 MiB is above the largest mmap threshold glibc picks by itself (32 MiB on 64-bit),
so by default each is a fresh mapping and writing it faults in all of its 4 KiB pages,
2 x 16,384 = 32,768 per round. With ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` set before
Python starts (what the docs now recommend), once the heap has grown to what a round needs the pages are
reused and a round faults in none. The heap gets there within the first four rounds: children measured
after one or two warm-up rounds grew by another 64 MiB in a measured round in 18 of 20, after three in 4
of 12 (always in round 4), after five or six in none of 35. Hence six warm-up rounds, then ten measured.
The bounds (at least 90 % of the pages by default, at most 1 % retained) leave room for the interpreter's
own small allocations. Calling the deprecated function must leave the default behaviour as it is.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

import pyro_sgmcmc

ROOT = Path(__file__).resolve().parent.parent
PAGES_PER_ROUND = 2 * (64 * 2**20) // 4096
RETAIN = {"MALLOC_MMAP_THRESHOLD_": str(2**31 - 1), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}

CHILD = """
import json, resource, sys, warnings
import torch
import pyro_sgmcmc
if sys.argv[1] == "call":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        pyro_sgmcmc.retain_freed_cpu_memory()
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
print(json.dumps({"faults_per_round": (faults() - before) / 10}))
"""


def _glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c")


def _run_child(mode: str, extra_env: Optional[dict] = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"):
        env.pop(name, None)  # the child starts with glibc's defaults
    env.update(extra_env or {})
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_retain_freed_cpu_memory_is_deprecated_and_returns_false():
    with pytest.warns(FutureWarning, match="deprecated and has no effect.*process-wide.*nothing to call"):
        assert pyro_sgmcmc.retain_freed_cpu_memory() is False
    with pytest.warns(FutureWarning, match="MALLOC_MMAP_THRESHOLD_"):  # the old argument is accepted, ignored
        assert pyro_sgmcmc.retain_freed_cpu_memory(2**20) is False


@pytest.mark.skipif(not _glibc(), reason="glibc only (the environment variables are glibc's tunables)")
def test_the_call_changes_nothing_and_the_environment_variables_keep_freed_blocks():
    default = _run_child("default")
    called = _run_child("call")
    retained = _run_child("default", RETAIN)
    assert default["faults_per_round"] >= 0.9 * PAGES_PER_ROUND, default
    assert called["faults_per_round"] >= 0.9 * PAGES_PER_ROUND, called  # the process's allocator is left alone
    assert retained["faults_per_round"] <= 0.01 * PAGES_PER_ROUND, retained
