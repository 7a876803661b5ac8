"""A checkpointed run whose fingerprint must be the same in every process (tests/run/test_fingerprint.py).

    python tests/run/fingerprint_script.py OUT.pt CHECKPOINT [--stop STEP]

Its step size is a ``Schedule`` subclass without a ``__repr__`` (the default one holds a memory address), its data
a dict holding a NumPy array, a list of tensors and a set of strings (iterated in an order that changes with
each process's hash seed). With ``--stop`` the process exits with status 3 after that step (an interruption);
it writes the draws to OUT.pt.
"""

import argparse
import sys

import numpy as np
import pyro
import pyro.distributions as dist
import torch

from pyro_sgmcmc import MCMC, SGLD, CheckpointSettings, Schedule

SETTINGS = dict(num_samples=12, warmup_steps=8, num_chains=2, chain_method="vectorized", seed=4, disable_progbar=True)
EVERY = 5


class Decay(Schedule):
    """:math:`\\epsilon_t = a / (1 + t / h)`, with no ``__repr__``."""

    def __init__(self, a, half_life):
        self.a, self.half_life = a, half_life

    def __call__(self, t):
        return self.a / (1.0 + t / self.half_life)


def model(data):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    shift = torch.as_tensor(data["shift"])
    with pyro.plate("rows", len(data["y"][0]), subsample_size=8) as idx:
        pyro.sample("obs", dist.Normal(mu + shift[idx], 1.0), obs=data["y"][0][idx])


def data():
    g = torch.Generator().manual_seed(0)
    return {
        "shift": np.linspace(-1.0, 1.0, 40, dtype=np.float32),
        "y": [2.0 + torch.randn(40, generator=g)],
        "tags": {"first", "second", "third"},
    }


def run(checkpoint=None, hook=None):
    pyro.set_rng_seed(0)
    kernel = SGLD(model, step_size=Decay(0.02, 20.0), adapt_step_size=False, adapt_mass_matrix=False)
    settings = None if checkpoint is None else CheckpointSettings(checkpoint, every=EVERY)
    mcmc = MCMC(kernel, checkpoint=settings, hook_fn=hook, **SETTINGS)
    mcmc.run(data())
    return mcmc


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("checkpoint")
    parser.add_argument("--stop", type=int)
    args = parser.parse_args()

    def hook(kernel, params, stage, i):
        if args.stop is not None and kernel.state.step == args.stop:
            sys.exit(3)

    mcmc = run(args.checkpoint, hook)
    torch.save(mcmc.get_samples(group_by_chain=True), args.out)
