"""Benchmark: the bare ``kernel.step()`` of SGLD, SGHMC and SGNHT, per step and in page faults.

``peers.py`` compares SGHMC with other libraries; this script times the three kernels of the package
alone, on ``peers.py``'s Bayesian MLP regression (``models.py``: same data, N = 10,000, minibatches of
B = 128, priors ``N(0, 1)``), so that a change to one kernel's update (for example SGNHT's, fused and written into
reused buffers like SGHMC's) has a figure anyone can re-measure. Each kernel is set up once
(``setup_chains``, Pyro's validation off as ``MCMC`` has it), warmed up for 3 steps, then timed over
``--steps`` steps, in ``--rounds`` rounds with the kernels' order rotating; the table gives the median
over rounds of the CPU time per step and of the minor page faults per step (``getrusage``: fresh pages
the allocator had to map, see ``docs/benchmarks.rst``). One torch thread.

Run::

    python benchmarks/kernel_steps.py                          # large MLP, 64 chains: about 2 minutes
    python benchmarks/kernel_steps.py --size small --chains 256
    python benchmarks/kernel_steps.py --tiny                   # seconds: smoke test

Writes JSON to ``--out`` (default ``benchmarks/results/kernel_steps.json``).
"""

from __future__ import annotations

import statistics

import pyro
import torch

from pyro_sgmcmc import SGHMC, SGLD, SGNHT

if __package__:  # imported as benchmarks.kernel_steps
    from . import harness
    from .models import SIZES, STEP_SIZE, dim, make_data, make_model, unpack
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    from models import SIZES, STEP_SIZE, dim, make_data, make_model, unpack

KERNELS = {"SGLD": SGLD, "SGHMC": SGHMC, "SGNHT": SGNHT}


def time_kernels(size: str, chains: int, steps: int, rounds: int, seed: int = 0) -> dict:
    """CPU ms and minor page faults per step of each kernel's ``step()``: median over rotating rounds."""
    x, y = make_data()
    hidden = SIZES[size]
    init = 0.1 * torch.randn(chains, dim(hidden), generator=torch.Generator().manual_seed(1))
    blocks = {}
    with pyro.validation_enabled(False):
        for name, kernel_class in KERNELS.items():
            kernel = kernel_class(make_model(hidden), step_size=STEP_SIZE)
            kernel.setup_chains(0, (x, y), {}, num_chains=chains, initial_params=unpack(init, hidden), seed=seed)
            for _ in range(3):  # warm-up: the first steps fault in the state's memory
                kernel.step()
            blocks[name] = harness.stepped(kernel.step, steps)
        per_round = harness.rotating_rounds(blocks, rounds)
    return {
        name: {
            "cpu_ms_per_step": statistics.median(cpu for _, cpu, _ in runs),
            "page_faults_per_step": statistics.median(faults for _, _, faults in runs),
            "blocks": runs,  # (wall ms, CPU ms, page faults) per step, per round
        }
        for name, runs in per_round.items()
    }


def main(argv=None) -> dict:
    parser = harness.parser(__doc__, harness.RESULTS / "kernel_steps.json", "small MLP, 4 chains, 2 steps, 1 round")
    parser.add_argument("--size", choices=sorted(SIZES), default="large")
    parser.add_argument("--chains", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.tiny:
        args.size, args.chains, args.steps, args.rounds = "small", 4, 2, 1
    torch.set_num_threads(1)
    context = harness.run_context()
    results = time_kernels(args.size, args.chains, args.steps, args.rounds)
    load_after = harness.load_average()
    print(f"{args.size} MLP ({dim(SIZES[args.size]):,} weights), {args.chains} chains")
    print(f"  [{harness.context_line(context, load_after)}]")
    for name, r in results.items():
        ms, faults = r["cpu_ms_per_step"], r["page_faults_per_step"]
        print(f"  {name:6} {ms:10.2f} ms CPU per step  {faults:10.0f} faults per step")
    out = {"size": args.size, "chains": args.chains, "steps": args.steps, "rounds": args.rounds,
           "context": context, "load_after": load_after, "kernels": results}  # fmt: skip
    harness.write_json(args.out, out)
    return out


if __name__ == "__main__":
    main()
