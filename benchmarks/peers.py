"""Benchmark: ``pyro_sgmcmc`` SGHMC side by side with ``posteriors`` and a hand-written PyTorch loop.

The same Bayesian MLP regression, the same data, minibatches of B = 128 out of N = 10,000, four ways:

``MCMC``
    ``pyro.infer.MCMC(SGHMC(model))`` for one chain; ``pyro_sgmcmc.MCMC(SGHMC(model), num_chains=256,
    chain_method="vectorized", keep_last=1)`` for 256 chains (Pyro's validation off, its default). With
    the default ``jit_compile="auto"`` the one-chain potential is compiled (vectorised chains use vmap).
``MCMC eager``
    The same with ``SGHMC(..., jit_compile=False)`` (one chain only): the model's Python runs every step.
``MCMC keep_last``
    One chain through ``pyro_sgmcmc.MCMC(..., chain_method="vectorized", keep_last=1)``: the run keeps only
    its final state, so it does what the hand loop does (nothing stored per step).
``kernel``
    The bare kernel: ``kernel.setup_chains(...)`` once, then ``kernel.step()`` (validation off, so compiled
    like ``MCMC``); ``kernel eager`` (one chain) the same with ``jit_compile=False``.
``hand``
    Plain PyTorch, written for speed: one flat parameter vector (per chain), the log density written
    out, one ``torch.autograd.grad``, the SGHMC update as fused in-place ops, the minibatches and the
    noise drawn from per-chain ``torch.Generator`` streams seeded as the package seeds its chains. For
    256 chains the network runs as ``torch.bmm`` on per-chain minibatches. It does *our* maths, so it
    reproduces our trajectories (checked below). ``hand+draws`` (one chain) also keeps a copy of every
    draw, as an MCMC run that returns its draws must: the like-for-like baseline of ``MCMC``.
``posteriors``
    ``posteriors.sgmcmc.sghmc`` 0.1.x (``update`` on a dict of parameters, its documented use), the log
    posterior written as ``posteriors`` recommends (``(N/B * log-lik + log-prior) / N`` with
    ``temperature = 1/N``); for 256 chains ``torch.vmap(update, randomness="different")`` over the
    stacked parameters.

Same maths. ``posteriors``' SGHMC with ``lr = eps``, ``alpha = friction``, ``sigma = 1``, ``beta = 0``,
``temperature = 1/N`` has the same drift ``eps N^-1 grad log pi``, friction and noise variance
``2 eps alpha / N`` as ours; it moves the position with the *old* momentum (Euler) where we use the new
one (symplectic Euler, PyTorch's SGD order), which costs the same. The script checks, in float64:

1. ours against the hand loop: the same trajectories (same streams) over 5 steps, 1 and 4 chains;
2. the gradient of ``posteriors``' log posterior equals ours (``-grad U / N``) at the same point and
   minibatch, and one ``posteriors`` step at ``temperature=0`` equals its update equation with that
   gradient (its noise scale ``sqrt(2 eps alpha T)`` is ours at ``T = 1/N``).

Timing: every contender advances in blocks of steps, the blocks of the contenders interleaved (the order
rotates), repeated; a block's cost is its CPU time (and wall time) per step; the table gives the median
over blocks and the median of the per-round ratios to the hand loop (paired). One torch thread. The
load average is recorded with each configuration, and so are the minor page faults per step (memory
the allocator had to map afresh: glibc hands large freed blocks back to the system, and a step that
then touches new pages pays for each one).

Run::

    python benchmarks/peers.py                    # about 10 minutes on a quiet 2-core machine
    python benchmarks/peers.py --tiny             # seconds: smoke test
    python benchmarks/peers.py --configs small-1 small-256
    python benchmarks/peers.py --retain-memory --out benchmarks/results/peers_retained.json \
        --rst docs/benchmarks_peers_retained_table.inc   # glibc keeps freed memory (all contenders)

Writes ``benchmarks/results/peers.json`` and the reStructuredText table ``docs/benchmarks_peers_table.inc``
(included by ``docs/benchmarks.rst``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pyro
import pyro.distributions as dist
import pyro.infer
import torch

import pyro_sgmcmc
from pyro_sgmcmc import MCMC, SGHMC
from pyro_sgmcmc.chains.streams import chain_seed
from pyro_sgmcmc.model.potential import JitMode

warnings.filterwarnings("ignore", category=FutureWarning)  # tensordict's notices on import of posteriors

NUM_DATA, BATCH, INPUTS, NOISE_SD = 10_000, 128, 10, 0.5
STEP_SIZE, FRICTION = 0.01, 1.0
#: the hand loop's maths: a fixed step, no mass matrix, plain minibatches (the kernels' defaults adapt)
SAME_MATHS = dict(adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)
SIZES = {"small": 50, "large": 490}  # hidden width: 3,151 and 246,471 weights
ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------- model
def make_data(dtype=torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_DATA, INPUTS, generator=generator, dtype=dtype)
    y = (
        torch.sin(x[:, 0])
        + 0.5 * x[:, 1] * x[:, 2]
        + NOISE_SD * torch.randn(NUM_DATA, generator=generator, dtype=dtype)
    )
    return x, y


def shapes(hidden: int) -> Dict[str, tuple]:
    """Site shapes in the package's flat order (sorted site names)."""
    s = {
        "W1": (INPUTS, hidden),
        "W2": (hidden, hidden),
        "W3": (hidden, 1),
        "b1": (hidden,),
        "b2": (hidden,),
        "b3": (1,),
    }
    return dict(sorted(s.items()))


def make_model(hidden: int):
    def mlp_model(x, y):
        W1 = pyro.sample("W1", dist.Normal(0.0, 1.0).expand([INPUTS, hidden]).to_event(2))
        b1 = pyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        W2 = pyro.sample("W2", dist.Normal(0.0, 1.0).expand([hidden, hidden]).to_event(2))
        b2 = pyro.sample("b2", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        W3 = pyro.sample("W3", dist.Normal(0.0, 1.0).expand([hidden, 1]).to_event(2))
        b3 = pyro.sample("b3", dist.Normal(0.0, 1.0).expand([1]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=BATCH) as idx:
            mean = (torch.tanh(torch.tanh(x[idx] @ W1 + b1) @ W2 + b2) @ W3 + b3).squeeze(-1)
            pyro.sample("y", dist.Normal(mean, NOISE_SD), obs=y[idx])

    return mlp_model


def unpack(z: torch.Tensor, hidden: int) -> Dict[str, torch.Tensor]:
    lead, out, offset = z.shape[:-1], {}, 0
    for name, shape in shapes(hidden).items():
        n = math.prod(shape)
        out[name] = z[..., offset : offset + n].reshape(lead + shape)
        offset += n
    return out


def dim(hidden: int) -> int:
    return sum(math.prod(s) for s in shapes(hidden).values())


def log_likelihood(p, xb, yb):
    """Gaussian log-likelihood of a minibatch, summed over its last axis."""
    h = torch.tanh(torch.tanh(xb @ p["W1"] + p["b1"].unsqueeze(-2)) @ p["W2"] + p["b2"].unsqueeze(-2))
    mean = (h @ p["W3"] + p["b3"].unsqueeze(-2)).squeeze(-1)
    r = (yb - mean) / NOISE_SD
    return (-0.5 * r * r - (math.log(NOISE_SD) + 0.5 * math.log(2 * math.pi))).sum(-1)


# ------------------------------------------------------------------------------------- hand loop
class HandSGHMC:
    """Our SGHMC for K chains in plain PyTorch (K = 1: plain matrix products; K > 1: batched).

    ``keep_draws``: also keep a copy of every draw, as an MCMC run that returns its draws must."""

    def __init__(self, x, y, hidden, init: torch.Tensor, seed: int, keep_draws: bool = False):
        self.x, self.y, self.hidden = x, y, hidden
        self.draws: Optional[List[torch.Tensor]] = [] if keep_draws else None
        self.num_chains, self.dim = init.shape
        self.generators = [torch.Generator().manual_seed(chain_seed(seed, c)) for c in range(self.num_chains)]
        self.permutation = torch.empty((self.num_chains, NUM_DATA), dtype=torch.long)
        self.cursor = NUM_DATA
        self.position = init.clone()
        self.momentum = torch.zeros_like(init)
        self.noise = torch.empty_like(init)
        self.log_norm = self.dim * 0.5 * math.log(2 * math.pi)
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())

    def next_indices(self) -> torch.Tensor:
        if self.cursor + BATCH > NUM_DATA:
            for row, generator in zip(self.permutation, self.generators):
                row.copy_(torch.randperm(NUM_DATA, generator=generator))
            self.cursor = 0
        idx = self.permutation[:, self.cursor : self.cursor + BATCH]
        self.cursor += BATCH
        return idx

    def potential_and_grad(self, z, idx):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            p = unpack(z if self.num_chains > 1 else z[0], self.hidden)
            i = idx if self.num_chains > 1 else idx[0]
            log_lik = log_likelihood(p, self.x[i], self.y[i])
            log_prior = -0.5 * (z * z).sum(-1) - self.log_norm
            energy = -(log_prior + (NUM_DATA / BATCH) * log_lik)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        return energy.detach(), grad

    def step(self) -> None:
        for row, generator in zip(self.noise, self.generators):
            row.normal_(generator=generator)
        eps = STEP_SIZE
        # m <- (1 - eps alpha) m - eps/N grad U + sqrt(2 eps alpha / N) zeta ;  z <- z + eps m
        self.momentum.mul_(1.0 - eps * FRICTION).add_(self.grad, alpha=-eps / NUM_DATA)
        self.momentum.add_(self.noise, alpha=math.sqrt(2.0 * eps * FRICTION / NUM_DATA))
        self.position.add_(self.momentum, alpha=eps)
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())
        if self.draws is not None:
            self.draws.append(self.position.clone())


# ------------------------------------------------------------------------------------ posteriors
class PosteriorsSGHMC:
    """``posteriors.sgmcmc.sghmc`` on the same network (K = 1: ``update``; K > 1: ``vmap(update)``)."""

    def __init__(self, x, y, hidden, init: torch.Tensor, seed: int, temperature: float = 1.0 / NUM_DATA):
        import posteriors

        self.sghmc = posteriors.sgmcmc.sghmc
        self.x, self.y = x, y
        self.num_chains = init.shape[0]
        self.generator = torch.Generator().manual_seed(seed)
        self.cursor, self.permutation = NUM_DATA, None

        def log_posterior(params, batch):
            xb, yb = batch
            log_prior = sum((-0.5 * v * v - 0.5 * math.log(2 * math.pi)).sum() for v in params.values())
            return ((NUM_DATA / BATCH) * log_likelihood(params, xb, yb) + log_prior) / NUM_DATA, torch.tensor([])

        self.log_posterior = log_posterior
        self.transform = self.sghmc.build(
            log_posterior, lr=STEP_SIZE, alpha=FRICTION, sigma=1.0, temperature=temperature, momenta=0.0
        )
        params = unpack(init.clone(), hidden)
        if self.num_chains == 1:
            self.state = self.transform.init({k: v[0].contiguous() for k, v in params.items()})
        else:
            self.params = {k: v.contiguous() for k, v in params.items()}
            self.momenta = {k: torch.zeros_like(v) for k, v in self.params.items()}
            transform = self.transform

            def one_chain(p, m, batch):
                new = transform.update(self.sghmc.SGHMCState(p, m), batch)[0]
                return new.params, new.momenta

            self.batched_update = torch.vmap(one_chain, in_dims=(0, 0, 0), randomness="different")

    def next_batch(self):
        if self.cursor + BATCH > NUM_DATA:
            self.permutation = torch.stack(
                [torch.randperm(NUM_DATA, generator=self.generator) for _ in range(self.num_chains)]
            )
            self.cursor = 0
        idx = self.permutation[:, self.cursor : self.cursor + BATCH]
        self.cursor += BATCH
        return idx

    def step(self) -> None:
        idx = self.next_batch()
        if self.num_chains == 1:
            self.state = self.transform.update(self.state, (self.x[idx[0]], self.y[idx[0]]))[0]
        else:
            self.params, self.momenta = self.batched_update(self.params, self.momenta, (self.x[idx], self.y[idx]))


# ---------------------------------------------------------------------------------- our runners
class OursKernel:
    def __init__(self, x, y, hidden, init, seed, jit: JitMode = "auto"):
        self.kernel = SGHMC(make_model(hidden), step_size=STEP_SIZE, friction=FRICTION, jit_compile=jit, **SAME_MATHS)
        with pyro.validation_enabled(False):
            self.kernel.setup_chains(
                0, (x, y), {}, num_chains=init.shape[0], initial_params=unpack(init, hidden), seed=seed
            )

    def step(self) -> None:
        with pyro.validation_enabled(False):
            self.kernel.step()


class OursMCMC:
    """A whole MCMC run per block; the block's time runs from the first step's stamp to the last's.

    The run takes one step more than is timed: the kept draw (``keep_last=1``: the final state, its copy
    and its statistics) is recorded once per run, at its end, which a long run amortises to nothing."""

    def __init__(self, x, y, hidden, init, seed, jit: JitMode = "auto", keep_last: bool = False):
        self.args, self.hidden, self.init, self.seed = (x, y), hidden, init, seed
        self.keep_last = keep_last  # one chain through pyro_sgmcmc.MCMC(keep_last=1) instead of pyro.infer.MCMC
        self.kernel = SGHMC(make_model(hidden), step_size=STEP_SIZE, friction=FRICTION, jit_compile=jit, **SAME_MATHS)

    def run(self, num_steps: int) -> List[tuple]:
        stamps: List[tuple] = []

        def hook(*_):
            stamps.append((time.perf_counter(), time.process_time()))

        if self.init.shape[0] == 1 and not self.keep_last:
            mcmc = pyro.infer.MCMC(
                self.kernel, num_samples=num_steps + 2, warmup_steps=0, hook_fn=hook, disable_progbar=True,
                initial_params={k: v[0] for k, v in unpack(self.init, self.hidden).items()},
            )  # fmt: skip
        else:
            mcmc = MCMC(
                self.kernel, num_samples=num_steps + 2, warmup_steps=0, num_chains=self.init.shape[0],
                chain_method="vectorized", keep_last=1, seed=self.seed, hook_fn=hook, disable_progbar=True,
                initial_params=unpack(self.init, self.hidden),
            )  # fmt: skip
        mcmc.run(*self.args)
        return stamps[:-1]  # without the last step, which records the kept draw


# ------------------------------------------------------------------------------------ equivalence
def check_same_maths(hidden: int, seed: int = 0) -> dict:
    """float64: ours == hand (trajectories), posteriors' gradient == ours, posteriors' step == its equation."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the model's priors are built from Python floats
    try:
        return _check_same_maths(hidden, seed)
    finally:
        torch.set_default_dtype(default)


def _check_same_maths(hidden: int, seed: int) -> dict:
    x, y = make_data(torch.float64)
    out = {}
    for chains in (1, 4):
        init = 0.1 * torch.randn(chains, dim(hidden), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        ours = OursKernel(x, y, hidden, init, seed)
        hand = HandSGHMC(x, y, hidden, init, seed)
        for _ in range(5):
            ours.step()
            hand.step()
        moved = float((hand.position - init).abs().max())
        out[f"ours_vs_hand_{chains}_chains_max_abs_position_diff_after_5_steps"] = float(
            (ours.kernel.state.position - hand.position).abs().max()
        )
        out[f"hand_{chains}_chains_max_move"] = moved
        if chains == 1:  # the default path: one chain compiled ("auto", validation off)
            out["ours_1_chain_compiled"] = ours.kernel.potential.compiled
    # gradient of posteriors' log posterior against ours, same point and minibatch
    z = 0.1 * torch.randn(dim(hidden), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    idx = torch.randperm(NUM_DATA, generator=torch.Generator().manual_seed(3))[:BATCH]
    potential = ours.kernel.potential
    _, grad_u = potential.potential_and_grad(z, {"data": idx})
    post = PosteriorsSGHMC(x, y, hidden, z.unsqueeze(0), seed, temperature=0.0)
    params = unpack(z, hidden)
    grads, _ = torch.func.grad(post.log_posterior, has_aux=True)(params, (x[idx], y[idx]))
    flat = torch.cat([grads[k].reshape(-1) for k in shapes(hidden)])
    out["posteriors_grad_vs_ours_max_rel_diff"] = float((flat + grad_u / NUM_DATA).abs().max() / flat.abs().max())
    # one posteriors step at T = 0 from a state with non-zero momenta == its equation
    momenta = {k: 0.01 * torch.ones_like(v) for k, v in params.items()}
    state = post.sghmc.SGHMCState({k: v.clone() for k, v in params.items()}, {k: v.clone() for k, v in momenta.items()})
    new = post.transform.update(state, (x[idx], y[idx]))[0]
    err = 0.0
    for k in params:
        expected_p = params[k] + STEP_SIZE * momenta[k]
        expected_m = momenta[k] + STEP_SIZE * grads[k] - STEP_SIZE * FRICTION * momenta[k]
        err = max(
            err, float((new.params[k] - expected_p).abs().max()), float((new.momenta[k] - expected_m).abs().max())
        )
    out["posteriors_step_vs_equation_max_abs_diff"] = err
    out["ok"] = (
        max(v for k, v in out.items() if k.startswith("ours_vs_hand")) < 1e-10
        and out["posteriors_grad_vs_ours_max_rel_diff"] < 1e-10
        and err < 1e-12
    )
    return out


# ----------------------------------------------------------------------------------------- timing
def time_config(hidden: int, chains: int, steps: int, rounds: int, seed: int = 0) -> dict:
    x, y = make_data()
    init = 0.1 * torch.randn(chains, dim(hidden), generator=torch.Generator().manual_seed(1))
    load_before = os.getloadavg()
    contenders: Dict[str, Callable[[], List[tuple]]] = {}

    def stepped(obj):
        def block():
            stamps = [(time.perf_counter(), time.process_time())]
            for _ in range(steps):
                obj.step()
                stamps.append((time.perf_counter(), time.process_time()))
            return stamps

        return block

    contenders["hand"] = stepped(HandSGHMC(x, y, hidden, init, seed))
    if chains == 1:  # the hand loop as an MCMC run that returns its draws: a copy of each
        contenders["hand+draws"] = stepped(HandSGHMC(x, y, hidden, init, seed, keep_draws=True))
    contenders["kernel"] = stepped(OursKernel(x, y, hidden, init, seed))
    mcmc = OursMCMC(x, y, hidden, init, seed)
    contenders["MCMC"] = lambda: mcmc.run(steps)
    if chains == 1:
        mcmc_eager = OursMCMC(x, y, hidden, init, seed, jit=False)
        contenders["MCMC eager"] = lambda: mcmc_eager.run(steps)
        contenders["kernel eager"] = stepped(OursKernel(x, y, hidden, init, seed, jit=False))
        mcmc_last = OursMCMC(x, y, hidden, init, seed, keep_last=True)
        contenders["MCMC keep_last"] = lambda: mcmc_last.run(steps)
    contenders["posteriors"] = stepped(PosteriorsSGHMC(x, y, hidden, init, seed))
    for block in contenders.values():  # warm-up (allocator, vmap/dynamo import, jit compile)
        block()
    names = list(contenders)
    per_round: Dict[str, List[tuple]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            stamps = contenders[name]()
            n = len(stamps) - 1
            wall = (stamps[-1][0] - stamps[0][0]) / n
            cpu = (stamps[-1][1] - stamps[0][1]) / n
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before) / n
            per_round[name].append((1e3 * wall, 1e3 * cpu, faults))
    result = {
        "hidden": hidden,
        "weights": dim(hidden),
        "chains": chains,
        "steps_per_block": steps,
        "rounds": rounds,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "blocks_ms": per_round,
        "contenders": {},
    }
    for name in names:
        wall = [w for w, _, _ in per_round[name]]
        cpu = [c for _, c, _ in per_round[name]]
        result["contenders"][name] = {
            "wall_ms": statistics.median(wall),
            "cpu_ms": statistics.median(cpu),
            "cpu_ratio_to_hand": statistics.median(c / h[1] for c, h in zip(cpu, per_round["hand"])),
            "wall_ratio_to_hand": statistics.median(w / h[0] for w, h in zip(wall, per_round["hand"])),
            "cpu_ratio_to_posteriors": statistics.median(c / p[1] for c, p in zip(cpu, per_round["posteriors"])),
            # minor page faults per step: fresh pages the allocator had to map (a block of MCMC also counts
            # its run's set-up); a large, varying count is the allocator returning memory to the system
            "page_faults_per_step": statistics.median(f for _, _, f in per_round[name]),
        }
        if "hand+draws" in per_round:
            result["contenders"][name]["cpu_ratio_to_hand_draws"] = statistics.median(
                c / h[1] for c, h in zip(cpu, per_round["hand+draws"])
            )
    return result


CONFIGS = {
    "small-1": ("small", 1, 200, 9),
    "small-256": ("small", 256, 10, 7),
    "large-1": ("large", 1, 100, 5),  # 100 steps: each MCMC block is a new run (its first steps fault memory in)
    "large-256": ("large", 256, 2, 3),
}


def rst_table(results: dict, retained: bool = False) -> str:
    names = ["MCMC", "MCMC keep_last", "MCMC eager", "kernel", "kernel eager", "hand", "hand+draws", "posteriors"]
    memory = ", freed CPU memory retained (retain_freed_cpu_memory)" if retained else ""
    lines = (
        [
            ".. list-table:: ms per step (all chains), CPU time, median over interleaved blocks;"
            f" in brackets the paired ratio to the hand loop{memory}",
            "   :header-rows: 1",
            "",
            "   * - MLP (weights)",
            "     - chains",
            "     - load avg",
        ]
        + [f"     - {n}" for n in names]
        + ["     - posteriors / ours (MCMC)"]
    )
    for key, r in results["configs"].items():
        c = r["contenders"]
        load = f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}"
        lines += [f"   * - {key.split('-')[0]} ({r['weights']:,})", f"     - {r['chains']}", f"     - {load}"]
        for n in names:
            lines.append(f"     - {c[n]['cpu_ms']:.3g} ({c[n]['cpu_ratio_to_hand']:.2f}x)" if n in c else "     - n/a")
        lines.append(f"     - {1 / c['MCMC']['cpu_ratio_to_posteriors']:.2f}x")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--tiny", action="store_true", help="a few steps of the small configs (smoke test)")
    parser.add_argument("--merge", action="store_true", help="keep the results of the configurations not re-run")
    parser.add_argument(
        "--retain-memory",
        action="store_true",
        help="call pyro_sgmcmc.retain_freed_cpu_memory() first (process-wide: every contender gets it)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peers.json")
    parser.add_argument("--rst", type=Path, default=ROOT / "docs" / "benchmarks_peers_table.inc")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    retained = pyro_sgmcmc.retain_freed_cpu_memory() if args.retain_memory else False
    if args.retain_memory and not retained:
        raise SystemExit("--retain-memory: not a glibc process, nothing to retain")
    import posteriors

    results = {
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "pyro": pyro.__version__,
            "posteriors": getattr(posteriors, "__version__", "0.1.x"),
            "pyro_sgmcmc": pyro_sgmcmc.__version__,
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "retain_freed_cpu_memory": retained,
        },
        "same_maths": {},
        "configs": {},
    }
    for size in ("small",) if args.tiny else ("small", "large"):
        check = check_same_maths(SIZES[size])
        results["same_maths"][size] = check
        print(f"same maths ({size}): {json.dumps(check)}")
        if not check["ok"]:
            raise SystemExit("the contenders do not compute the same updates: timing them would be meaningless")
    if args.merge and args.out.exists():  # re-run some configurations, keep the others' results
        previous = json.loads(args.out.read_text())
        results["configs"] = {k: v for k, v in previous["configs"].items() if k not in args.configs}
    configs = ["small-1", "small-256"] if args.tiny else args.configs
    for key in configs:
        size, chains, steps, rounds = CONFIGS[key]
        if args.tiny:
            steps, rounds = 3, 2
        r = time_config(SIZES[size], chains if not args.tiny else min(chains, 8), steps, rounds)
        results["configs"][key] = r
        results["configs"] = {k: results["configs"][k] for k in CONFIGS if k in results["configs"]}
        print(f"\n{key}: {r['weights']:,} weights, {r['chains']} chains, load {r['load_before']} -> {r['load_after']}")
        for name, c in r["contenders"].items():
            print(
                f"  {name:<11} {c['cpu_ms']:9.3f} ms CPU ({c['cpu_ratio_to_hand']:.2f}x hand, paired) "
                f"{c['wall_ms']:9.3f} ms wall ({c['wall_ratio_to_hand']:.2f}x)  "
                f"{c['cpu_ratio_to_posteriors']:.2f}x posteriors  {c['page_faults_per_step']:8.0f} faults/step"
            )
    if not args.tiny:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        args.rst.write_text(rst_table(results, retained))
        print(f"\nwritten: {args.out}, {args.rst}")
    return results


if __name__ == "__main__":
    main()
