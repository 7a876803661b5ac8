"""A run imports nothing heavy that it does not use: no sympy (nor ``torch._dynamo``) on the path of a run.

``torch.broadcast_shapes`` (and other entry points into ``torch._refs``) import
``torch.fx.experimental.symbolic_shapes`` and with it sympy, which took about 4.7 s on a loaded 2-core
machine the first time a process ran a chain (0.4 s on an idle one). Small runs, one chain through
``pyro_sgmcmc.MCMC`` and through ``pyro.infer.MCMC`` and four vectorised chains, must leave ``sys.modules``
without sympy (the runs in turn, in one fresh interpreter, each checked before the next). The default
warmup's control variate finds its centre with L-BFGS, whose construction imported ``torch._dynamo`` (and sympy,
2.9-3.5 s of a 6.6 s first run): the first run's warmup is long enough to reach it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
print("import", "sympy" in sys.modules)
runs = {
    # long enough a warmup for the default control variate's MAP search (L-BFGS), which imported torch._dynamo
    "pyro_sgmcmc.MCMC": lambda: pyro_sgmcmc.MCMC(SGHMC(model), num_samples=5, warmup_steps=300, disable_progbar=True),
    "pyro.infer.MCMC": lambda: pyro.infer.MCMC(SGHMC(model), num_samples=5, warmup_steps=5, disable_progbar=True),
    "vectorized": lambda: pyro_sgmcmc.MCMC(SGHMC(model), num_samples=5, warmup_steps=5, num_chains=4,
                                           chain_method="vectorized", disable_progbar=True, seed=0),
}
for name, make in runs.items():  # in turn, in one process: each is checked before the next runs
    mcmc = make()
    mcmc.run(x, y)
    assert mcmc.get_samples()["w"].shape[-1] == 3
    print(name, "sympy" in sys.modules or "torch._dynamo" in sys.modules)
"""


def test_a_small_run_does_not_import_sympy():
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", RUN], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    seen = dict(line.rsplit(" ", 1) for line in out.stdout.strip().splitlines())
    assert seen == {"import": "False", "pyro_sgmcmc.MCMC": "False", "pyro.infer.MCMC": "False", "vectorized": "False"}
