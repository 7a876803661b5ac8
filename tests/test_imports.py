"""A run imports nothing heavy that it does not use: no sympy on the path of a run.

``torch.broadcast_shapes`` (and other entry points into ``torch._refs``) import
``torch.fx.experimental.symbolic_shapes`` and with it sympy, which took about 4.7 s on a loaded 2-core
machine the first time a process ran a chain (0.4 s on an idle one). A small run, one chain through
``pyro_sgmcmc.MCMC`` and ``pyro.infer.MCMC`` and four vectorised chains, each in a fresh interpreter,
must leave ``sys.modules`` without sympy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import sys
import pyro, pyro.distributions as dist, torch
import pyro_sgmcmc
from pyro_sgmcmc import SGHMC

def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfCauchy(2.5))
    with pyro.plate("data", x.shape[0], subsample_size=16) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])

x = torch.randn(200, 3, generator=torch.Generator().manual_seed(0))
y = x.sum(-1)
assert "sympy" not in sys.modules, "importing the package imported sympy"
how = sys.argv[1]
if how == "pyro":
    mcmc = pyro.infer.MCMC(SGHMC(model), num_samples=5, warmup_steps=5, disable_progbar=True)
else:
    chains = {"one": 1, "vectorized": 4}[how]
    mcmc = pyro_sgmcmc.MCMC(SGHMC(model), num_samples=5, warmup_steps=5, num_chains=chains,
                            chain_method="vectorized", disable_progbar=True, seed=0)
mcmc.run(x, y)
assert mcmc.get_samples()["w"].shape[-1] == 3
print("sympy" in sys.modules)
"""


@pytest.mark.parametrize("how", ["one", "pyro", "vectorized"])
def test_a_small_run_does_not_import_sympy(how):
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", RUN, how], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False", "the run imported sympy"
