"""A small vectorised run used by the reliability tests, in-process and as a subprocess.

    python tests/reliability_script.py OUT.pt [--checkpoint PATH] [--every K] [--progress]

Writes the draws to OUT.pt; with --progress prints the finished step number after every step.
"""

import argparse
import sys

import pyro
import pyro.distributions as dist
import torch

from pyro_sgmcmc import MCMC, SGHMC, CheckpointSettings

SETTINGS = dict(num_samples=60, warmup_steps=40, num_chains=6, num_superchains=3, chain_method="vectorized", seed=5)


def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=20) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 3, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(300, generator=g)


def decaying_step(t):
    """A callable step size (a schedule the kernel cannot adapt: run with adapt_step_size=False)."""
    return 0.02 / (1.0 + t / 100.0)


def run(checkpoint=None, every=None, hook=None, step_size=0.02):
    pyro.set_rng_seed(0)  # the init strategy draws from the global generator
    kernel = SGHMC(model, step_size=step_size, **({} if isinstance(step_size, float) else {"adapt_step_size": False}))
    settings = (
        None if checkpoint is None else CheckpointSettings(checkpoint, **({} if every is None else {"every": every}))
    )
    mcmc = MCMC(kernel, checkpoint=settings, hook_fn=hook, disable_progbar=True, **SETTINGS)
    mcmc.run(*data())
    return mcmc


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--checkpoint")
    parser.add_argument("--every", type=int)
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--callable-step", action="store_true", help="step_size=decaying_step (a function)")
    parser.add_argument("--stop", type=int, help="exit with status 3 after this many steps (an interruption)")
    args = parser.parse_args()

    def hook(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn); state.step is the run's
        if args.slow:
            import time

            time.sleep(args.slow)
        if args.progress:
            print(kernel.state.step, flush=True)
        if args.stop is not None and kernel.state.step == args.stop:
            sys.exit(3)

    mcmc = run(args.checkpoint, args.every, hook, decaying_step if args.callable_step else 0.02)
    torch.save({"samples": mcmc.get_samples(group_by_chain=True), "stats": mcmc.sample_stats}, args.out)
    sys.exit(0)
