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
``sgmcmc.MCMC``
    One chain through ``pyro_sgmcmc.MCMC(SGHMC(model), num_samples=...)`` as the quickstart writes it (every
    draw kept): the baseline is ``hand+draws``.
``kernel``
    The bare kernel: ``kernel.setup_chains(...)`` once, then ``kernel.step()`` (validation off, so compiled
    like ``MCMC``); ``kernel eager`` (one chain) the same with ``jit_compile=False``.
``hand``
    Plain PyTorch, written for speed: one flat parameter vector (per chain), the log density written
    out, one ``torch.autograd.grad``, the SGHMC update as fused in-place ops, the noise and the minibatches
    (``torch.randperm`` per chain per epoch, as a user writes it) drawn from per-chain ``torch.Generator``
    streams seeded as the package seeds its chains. For 256 chains the network runs as ``torch.bmm`` on
    per-chain minibatches. It does *our* maths: with the package's minibatch stream (``hand pkg-stream``,
    ``minibatches="package"``) it reproduces our trajectories (checked below). ``hand+draws`` (one chain)
    also keeps a copy of every draw, as an MCMC run that returns its draws must: the baseline of ``MCMC``.
``hand batched``
    (K > 1) SGHMC for all chains as one writes it for speed (``hand_loops.DeviceHandSGHMC``): ``torch.bmm``
    on per-chain minibatches, all chains' noise in one ``normal_`` draw, one batched permutation draw per
    epoch (``torch.rand(K, N).argsort(-1)``), the update in place. The same maths with other random
    streams; the baseline of the issue's many-chain targets (``hand`` draws each chain's noise from its own
    generator, ``K`` calls a step).
``posteriors``
    ``posteriors.sgmcmc.sghmc`` 0.1.x (``update`` on a dict of parameters, its documented use), the log
    posterior written as ``posteriors`` recommends (``(N/B * log-lik + log-prior) / N`` with
    ``temperature = 1/N``); for 256 chains ``torch.vmap(update, randomness="different")`` over the
    stacked parameters (not run at 4,096 chains: ``--posteriors-up-to``).

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
over blocks and the median of the per-round ratios to the hand loop (paired). One torch thread
(``--threads 0``: torch's default; CPU time then counts every thread, so read the wall ratios). The
load average is recorded with each configuration, and so are the minor page faults per step (memory
the allocator had to map afresh: glibc hands large freed blocks back to the system, and a step that
then touches new pages pays for each one). Set-up is not in the per-step figures; it is reported apart
(``setup_s``: a contender's construction, and for an MCMC run the time to its first step less one step).

Targets (issue 25), printed at the end and kept in the JSON (``targets``), as paired CPU ratios (wall
ratios beside them): 256 chains ``MCMC`` <= 1.2x and 4,096 chains ``MCMC`` <= 1.5x the hand-written
batched loop (``hand batched``); one chain ``sgmcmc.MCMC`` <= 1.05x and ``pyro.infer.MCMC`` (``MCMC``) <= 1.15x the hand
loop that keeps its draws (``hand+draws``).

Run::

    python benchmarks/peers.py                    # about 10 minutes on a quiet 2-core machine
    python benchmarks/peers.py --tiny             # seconds: smoke test
    python benchmarks/peers.py --configs small-1 small-256 small-4096   # the issue's targets
    python benchmarks/peers.py --retain-memory --out benchmarks/results/peers_retained.json \
        --rst docs/benchmarks_peers_retained_table.inc   # glibc keeps freed memory (all contenders)

Writes ``benchmarks/results/peers.json``, and with ``--rst PATH`` the results as an rst table (the docs' table,
``docs/benchmarks_peers_table.inc`` in benchmarks.rst, was written with ``--rst`` that way and is kept as dated).
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from pathlib import Path
from typing import Callable, Dict, List

import pyro
import pyro.infer
import torch

import pyro_sgmcmc
from pyro_sgmcmc import MCMC, SGHMC
from pyro_sgmcmc.model.potential import JitMode

if __package__:  # imported as benchmarks.peers
    from . import harness, models
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    import models

# the MLP regression of models.py and its SGHMC settings
BATCH, FRICTION, NUM_DATA, SIZES = models.BATCH, models.FRICTION, models.NUM_DATA, models.SIZES
STEP_SIZE, dim, make_data, make_model = models.STEP_SIZE, models.dim, models.make_data, models.make_model
shapes, unpack = models.shapes, models.unpack

warnings.filterwarnings("ignore", category=FutureWarning)  # tensordict's notices on import of posteriors

SAME_MATHS, ROOT = harness.SAME_MATHS, harness.ROOT


def hand_sghmc(x, y, hidden, init, seed, keep_draws=False, minibatches="randperm") -> harness.HandChains:
    """Our SGHMC for K chains in plain PyTorch, written for speed (one chain: plain matrix products; K > 1:
    batched; the update as fused in-place operations). ``keep_draws``: also keep a copy of every draw, as an
    MCMC run that returns its draws must; ``minibatches``: ``torch.randperm`` or the package's stream."""
    energy = models.mlp_energy(x, y, hidden, init.shape[0])
    return harness.HandChains(
        energy, NUM_DATA, BATCH, init, seed, method="SGHMC", step_size=STEP_SIZE, friction=FRICTION,
        in_place=True, keep_draws=keep_draws, minibatches=minibatches,
    )  # fmt: skip


def hand_batched(x, y, hidden, init, seed) -> harness.hand_loops.DeviceHandSGHMC:
    """Our SGHMC for K chains with one noise draw and one permutation draw for all chains (the issue's
    "hand-written batched loop")."""
    energy = models.mlp_energy(x, y, hidden, init.shape[0])
    return harness.hand_loops.DeviceHandSGHMC(
        energy, NUM_DATA, BATCH, init, seed, step_size=STEP_SIZE, friction=FRICTION
    )


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
            return ((NUM_DATA / BATCH) * models.log_likelihood(params, xb, yb) + log_prior) / NUM_DATA, torch.tensor([])

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


#: Steps of each MCMC run not timed after its first: a fresh run's first steps touch memory no earlier step of
#: that run has used (at 4,096 chains its first step took 1.3x a later one), which a real run of thousands of
#: steps amortises; the per-step figures are of the steady state, as the other contenders' are.
UNTIMED_FIRST_STEPS = 2


class OursMCMC:
    """A whole MCMC run per block; the block's time runs from the stamp of its step ``1 + UNTIMED_FIRST_STEPS``
    to the last's (the steps before are neither timed nor set-up).

    The run takes one step more than is timed: the kept draw (``keep_last=1``: the final state, its copy
    and its statistics) is recorded once per run, at its end, which a long run amortises to nothing."""

    def __init__(self, x, y, hidden, init, seed, jit: JitMode = "auto", keep_last: bool = False,
                 keep_draws: bool = False):  # fmt: skip
        self.args, self.hidden, self.init, self.seed = (x, y), hidden, init, seed
        self.keep_last = keep_last  # one chain through pyro_sgmcmc.MCMC(keep_last=1) instead of pyro.infer.MCMC
        self.keep_draws = keep_draws  # one chain through pyro_sgmcmc.MCMC keeping every draw (the quickstart's)
        self.kernel = SGHMC(make_model(hidden), step_size=STEP_SIZE, friction=FRICTION, jit_compile=jit, **SAME_MATHS)
        self.setups: List[float] = []  # seconds from the run's start to its first step, less one step

    def run(self, num_steps: int) -> List[tuple]:
        stamps: List[tuple] = []

        def hook(*_):
            stamps.append(harness.now())

        total = num_steps + 2 + UNTIMED_FIRST_STEPS
        start = harness.now()
        if self.keep_draws:
            mcmc = MCMC(
                self.kernel, num_samples=total, warmup_steps=0, hook_fn=hook, disable_progbar=True,
                initial_params={k: v[0] for k, v in unpack(self.init, self.hidden).items()},
            )  # fmt: skip
        elif self.init.shape[0] == 1 and not self.keep_last:
            mcmc = pyro.infer.MCMC(
                self.kernel, num_samples=total, warmup_steps=0, hook_fn=hook, disable_progbar=True,
                initial_params={k: v[0] for k, v in unpack(self.init, self.hidden).items()},
            )  # fmt: skip
        else:
            mcmc = MCMC(
                self.kernel, num_samples=total, warmup_steps=0, num_chains=self.init.shape[0],
                chain_method="vectorized", keep_last=1, seed=self.seed, hook_fn=hook, disable_progbar=True,
                initial_params=unpack(self.init, self.hidden),
            )  # fmt: skip
        mcmc.run(*self.args)
        if len(stamps) > 2:
            self.setups.append(stamps[0][0] - start[0] - (stamps[2][0] - stamps[1][0]))
        return stamps[UNTIMED_FIRST_STEPS:-1]  # without the last step, which records the kept draw


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
        hand = hand_sghmc(x, y, hidden, init, seed, minibatches="package")
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
def time_config(hidden: int, chains: int, steps: int, rounds: int, seed: int = 0, posteriors: bool = True) -> dict:
    """Every contender in blocks of ``steps`` steps, ``rounds`` rotating rounds after one warm-up block each
    (allocator, vmap/dynamo import, jit compile); medians over blocks and paired ratios per round. The
    contenders' set-up (construction; an MCMC run's time to its first step) is timed apart."""
    x, y = make_data()
    init = 0.1 * torch.randn(chains, dim(hidden), generator=torch.Generator().manual_seed(1))
    load_before = harness.load_average()
    contenders: Dict[str, Callable[[], List[tuple]]] = {}
    setup: Dict[str, float] = {}

    def made(name: str, make: Callable):
        start = harness.now()
        made_object = make()
        setup[name] = harness.now()[0] - start[0]
        return made_object

    contenders["hand"] = harness.stepped(made("hand", lambda: hand_sghmc(x, y, hidden, init, seed)).step, steps)
    package_stream = made("hand pkg-stream", lambda: hand_sghmc(x, y, hidden, init, seed, minibatches="package"))
    contenders["hand pkg-stream"] = harness.stepped(package_stream.step, steps)
    if chains == 1:  # the hand loop as an MCMC run that returns its draws: a copy of each
        draws = made("hand+draws", lambda: hand_sghmc(x, y, hidden, init, seed, keep_draws=True))
        contenders["hand+draws"] = harness.stepped(draws.step, steps)
    if chains > 1:  # one noise draw and one permutation draw for all chains
        batched = made("hand batched", lambda: hand_batched(x, y, hidden, init, seed))
        contenders["hand batched"] = harness.stepped(batched.step, steps)
    contenders["kernel"] = harness.stepped(made("kernel", lambda: OursKernel(x, y, hidden, init, seed)).step, steps)
    runs = {"MCMC": OursMCMC(x, y, hidden, init, seed)}
    if chains == 1:
        runs["sgmcmc.MCMC"] = OursMCMC(x, y, hidden, init, seed, keep_draws=True)
        runs["MCMC eager"] = OursMCMC(x, y, hidden, init, seed, jit=False)
        eager = made("kernel eager", lambda: OursKernel(x, y, hidden, init, seed, jit=False))
        contenders["kernel eager"] = harness.stepped(eager.step, steps)
        runs["MCMC keep_last"] = OursMCMC(x, y, hidden, init, seed, keep_last=True)
    for name, run in runs.items():
        contenders[name] = lambda run=run: run.run(steps)
    if posteriors:
        post = made("posteriors", lambda: PosteriorsSGHMC(x, y, hidden, init, seed))
        contenders["posteriors"] = harness.stepped(post.step, steps)
    for block in contenders.values():  # warm-up
        block()
    per_round = harness.rotating_rounds(contenders, rounds)
    for name, run in runs.items():  # the median run's set-up, the warm-up run's (imports, compilation) apart
        setup[name] = statistics.median(run.setups[1:] or run.setups)
        setup[f"{name} first run"] = run.setups[0]
    result = {
        "hidden": hidden,
        "weights": dim(hidden),
        "chains": chains,
        "steps_per_block": steps,
        "rounds": rounds,
        "torch_threads": torch.get_num_threads(),
        "load_before": load_before,
        "load_after": harness.load_average(),
        "setup_s": setup,
        "blocks_ms": per_round,
        "contenders": {},
    }
    names = ("hand", "hand+draws", "hand batched", "posteriors")
    baselines = {k: [b[1] for b in per_round[k]] for k in names if k in per_round}
    wall_baselines = {k: [b[0] for b in per_round[k]] for k in names if k in per_round}
    for name, blocks in per_round.items():
        wall, cpu = [w for w, _, _ in blocks], [c for _, c, _ in blocks]
        entry = result["contenders"][name] = {
            "wall_ms": statistics.median(wall),
            "cpu_ms": statistics.median(cpu),
            "cpu_ratio_to_hand": harness.paired_median(cpu, baselines["hand"]),
            "wall_ratio_to_hand": harness.paired_median(wall, wall_baselines["hand"]),
            # minor page faults per step: fresh pages the allocator had to map (a block of MCMC also counts
            # its run's set-up); a large, varying count is the allocator returning memory to the system
            "page_faults_per_step": statistics.median(f for _, _, f in blocks),
        }
        if "posteriors" in baselines:
            entry["cpu_ratio_to_posteriors"] = harness.paired_median(cpu, baselines["posteriors"])
        for baseline in ("hand+draws", "hand batched"):
            if baseline in baselines:
                label = baseline.replace("+", "_").replace(" ", "_")
                entry[f"cpu_ratio_to_{label}"] = harness.paired_median(cpu, baselines[baseline])
                entry[f"wall_ratio_to_{label}"] = harness.paired_median(wall, wall_baselines[baseline])
    return result


#: issue 25's targets: (configuration, contender, baseline, largest ratio)
TARGETS = [
    ("small-256", "MCMC", "hand_batched", 1.2),
    ("small-4096", "MCMC", "hand_batched", 1.5),
    ("small-1", "sgmcmc.MCMC", "hand_draws", 1.05),
    ("small-1", "MCMC", "hand_draws", 1.15),
]


def targets(results: dict) -> List[dict]:
    """Each target of :data:`TARGETS` whose configuration was run: the paired CPU and wall ratios, whether
    the CPU ratio is within the bound, and ``streams_cpu_ratio``: what the package's keyed streams (issue 25
    point 1: Philox noise and keyed permutations, whose operations do not depend on the chains) cost a
    hand-written loop on their own, the loop drawing them (``hand pkg-stream``) against the same loop
    drawing from torch's generators: against ``hand batched`` for many chains, against ``hand`` for one
    (neither keeps draws). A bound below that ratio cannot be met by any sampler that draws those streams."""
    out = []
    for key, name, baseline, bound in TARGETS:
        contenders = results["configs"].get(key, {}).get("contenders", {})
        entry = contenders.get(name)
        if entry is None:
            continue
        cpu, wall = entry[f"cpu_ratio_to_{baseline}"], entry[f"wall_ratio_to_{baseline}"]
        label = {"hand_draws": "hand+draws", "hand_batched": "hand batched"}[baseline]
        streams = contenders.get("hand pkg-stream", {})
        streams_ratio = streams.get("cpu_ratio_to_hand" if baseline == "hand_draws" else f"cpu_ratio_to_{baseline}")
        out.append({"config": key, "contender": name, "baseline": label, "bound": bound,
                    "cpu_ratio": cpu, "wall_ratio": wall, "met": cpu <= bound,
                    "streams_cpu_ratio": streams_ratio})  # fmt: skip
    return out


CONFIGS = {
    "small-1": ("small", 1, 200, 9),
    "small-256": ("small", 256, 10, 7),
    "large-1": ("large", 1, 100, 5),  # 100 steps: each MCMC block is a new run (its first steps fault memory in)
    "large-256": ("large", 256, 2, 3),
    "small-4096": ("small", 4096, 2, 3),
}


def rst_table(results: dict, retained: bool = False) -> str:
    names = ["MCMC", "MCMC keep_last", "sgmcmc.MCMC", "MCMC eager", "kernel", "kernel eager", "hand"]
    names += ["hand pkg-stream", "hand+draws", "hand batched", "posteriors"]
    memory = ", freed CPU memory retained (retain_freed_cpu_memory)" if retained else ""
    caption = (
        "ms per step (all chains), CPU time, median over interleaved blocks;"
        f" in brackets the paired ratio to the hand loop (torch.randperm minibatches){memory}"
    )
    rows = []
    for key, r in results["configs"].items():
        c = r["contenders"]
        load = f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}"
        cells = [f"{c[n]['cpu_ms']:.3g} ({c[n]['cpu_ratio_to_hand']:.2f}x)" if n in c else "n/a" for n in names]
        to_posteriors = c["MCMC"].get("cpu_ratio_to_posteriors")
        mcmc_vs_posteriors = "n/a" if to_posteriors is None else f"{1 / to_posteriors:.2f}x"
        rows.append([f"{key.split('-')[0]} ({r['weights']:,})", str(r["chains"]), load, *cells, mcmc_vs_posteriors])
    header = ["MLP (weights)", "chains", "load avg", *names, "posteriors / ours (MCMC)"]
    return harness.rst_list_table(caption, header, rows)


def main(argv=None):
    parser = harness.parser(__doc__, harness.RESULTS / "peers.json", "a few steps of the small configs (smoke test)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--merge", action="store_true", help="keep the results of the configurations not re-run")
    parser.add_argument(
        "--retain-memory",
        action="store_true",
        help="call pyro_sgmcmc.retain_freed_cpu_memory() first (process-wide: every contender gets it)",
    )
    parser.add_argument("--rst", type=Path, default=None, help="also write the results as an rst table there (the "
                        "docs' table, docs/benchmarks_peers_table.inc, is a dated record: not rewritten by default)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default; default 1)")
    parser.add_argument("--posteriors-up-to", type=int, default=256, help="run posteriors up to this many chains")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    retained = pyro_sgmcmc.retain_freed_cpu_memory() if args.retain_memory else False
    if args.retain_memory and not retained:
        raise SystemExit("--retain-memory: not a glibc process, nothing to retain")
    import posteriors

    results = {
        "machine": harness.machine_info(
            posteriors=getattr(posteriors, "__version__", "0.1.x"), retain_freed_cpu_memory=retained
        ),
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
        chains = chains if not args.tiny else min(chains, 8)
        r = time_config(SIZES[size], chains, steps, rounds, posteriors=chains <= args.posteriors_up_to)
        results["configs"][key] = r
        results["configs"] = {k: results["configs"][k] for k in CONFIGS if k in results["configs"]}
        print(f"\n{key}: {r['weights']:,} weights, {r['chains']} chains, load {r['load_before']} -> {r['load_after']}")
        for name, c in r["contenders"].items():
            to_posteriors = c.get("cpu_ratio_to_posteriors")
            print(
                f"  {name:<15} {c['cpu_ms']:9.3f} ms CPU ({c['cpu_ratio_to_hand']:.2f}x hand, paired) "
                f"{c['wall_ms']:9.3f} ms wall ({c['wall_ratio_to_hand']:.2f}x)  "
                + ("" if to_posteriors is None else f"{to_posteriors:.2f}x posteriors  ")
                + f"{c['page_faults_per_step']:8.0f} faults/step  set-up {r['setup_s'].get(name, float('nan')):.3f} s"
            )
    results["targets"] = targets(results)
    if results["targets"]:
        print(f"\ntargets (paired CPU ratio; wall in brackets), {torch.get_num_threads()} torch thread(s):")
    for t in results["targets"]:
        print(
            f"  {t['config']:<11} {t['contender']:<12} / {t['baseline']:<10} {t['cpu_ratio']:.2f}x "
            f"({t['wall_ratio']:.2f}x)  target <= {t['bound']}x: {'met' if t['met'] else 'NOT met'}"
            + ("" if t["streams_cpu_ratio"] is None else
               f"; the keyed streams alone cost a hand loop {t['streams_cpu_ratio']:.2f}x")
        )  # fmt: skip
    if not args.tiny:
        harness.write_json(args.out, results, indent=1)
        if args.rst is not None:
            args.rst.write_text(rst_table(results, retained))
        print(f"\nwritten: {args.out}" + ("" if args.rst is None else f", {args.rst}"))
    return results


if __name__ == "__main__":
    main()
