"""The cost of one step's noise: ``ChainGenerators.fill_normal`` on a ``(C, D)`` buffer against hand-written draws.

For ``C`` chains of ``D`` values (default ``D = 3151``, the small MLP of ``peers.py``; float32) it times, in
one process and one torch thread, blocks interleaved so that background load hits them alike:

* ``package``: ``ChainGenerators(0, range(C)).fill_normal(out, step=t)`` at consecutive steps ``t`` (or
  ``fill_normal(out)`` on a version of the package before the keyed streams, so that the same script measures
  both); ``package, tensor step``: the same with ``t`` a 0-d tensor advanced in place (as a CUDA graph would
  replay it: each draw evaluated alone, no drawing ahead);
* ``hand randn``: what a hand-written loop does, one ``torch.Generator`` per chain and ``row.normal_`` per
  chain (at one chain the whole tensor at once);
* ``one randn``: one ``torch.randn`` of the whole ``(C, D)`` (no per-chain streams: a lower bound).

It also counts the ATen operators one call of ``fill_normal`` dispatches (a ``TorchDispatchMode`` that counts
every call). ``python benchmarks/noise_draws.py [--chains 1 256 4096] [--dim 3151]``; the figures are in
``docs/benchmarks.rst``.
"""

from __future__ import annotations

import inspect
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if __package__:
    from . import harness
else:
    import harness

from pyro_sgmcmc.chains.streams import ChainGenerators


class OperatorCount(TorchDispatchMode):
    """Counts the ATen operators dispatched inside the ``with`` block."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def package_draw(generators: ChainGenerators, out: torch.Tensor):
    """``fill_normal`` of this version of the package: keyed (``step=``) or the per-chain generators."""
    if "step" in inspect.signature(generators.fill_normal).parameters:
        counter = iter(range(1 << 40))
        return lambda: generators.fill_normal(out, step=next(counter))
    return lambda: generators.fill_normal(out)


def package_draw_on_device(generators: ChainGenerators, out: torch.Tensor):
    """``fill_normal`` with the step a 0-d tensor, advanced in place (keyed versions only)."""
    step = torch.zeros((), dtype=torch.long)
    return lambda: generators.fill_normal(out, step=step.add_(1))


def hand_draw(num_chains: int, out: torch.Tensor):
    """A hand-written loop's noise: one generator per chain, drawn row by row (the whole tensor at one chain)."""
    generators = [torch.Generator().manual_seed(1000 + c) for c in range(num_chains)]
    if num_chains == 1:
        return lambda: out.normal_(generator=generators[0])

    def draw():
        for row, generator in zip(out, generators):
            row.normal_(generator=generator)

    return draw


def measure(num_chains: int, dim: int, number: int, repeat: int) -> dict:
    out = torch.empty(num_chains, dim)
    generators = ChainGenerators(0, range(num_chains))
    package = package_draw(generators, out)
    package()  # set-up work (scratch buffers) happens at the first call
    with OperatorCount() as ops:
        package()
    single = torch.empty(num_chains, dim)
    contenders = {"package": package, "hand randn": hand_draw(num_chains, out),
                  "one randn": lambda: torch.randn(num_chains, dim, out=single)}  # fmt: skip
    if "step" in inspect.signature(generators.fill_normal).parameters:
        contenders["package, tensor step"] = package_draw_on_device(generators, out)
        contenders["package, tensor step"]()  # its buffers (one step at a time) are set up apart
    times = harness.interleaved_best_ms(contenders, number, repeat)
    return {"chains": num_chains, "dim": dim, "operators": ops.count, **{f"{k} ms": v for k, v in times.items()}}


def main() -> None:
    p = harness.parser(__doc__, None)
    p.add_argument("--chains", type=int, nargs="+", default=[1, 256, 4096])
    p.add_argument("--dim", type=int, default=3151)
    args = p.parse_args()
    torch.set_num_threads(1)
    chains = [1, 4] if args.tiny else args.chains
    context = harness.run_context(omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
    rows = []
    for num_chains in chains:
        number = max(1, 2000 // num_chains) if not args.tiny else 1
        result = measure(num_chains, args.dim if not args.tiny else 7, number, 1 if args.tiny else 7)
        rows.append(result)
        print(result, flush=True)
    load_end = harness.load_average()
    print(f"{harness.context_line(context, load_end)}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    if args.out is not None:
        harness.write_json(args.out, {"context": context, "load_average_end": load_end, "results": rows})


if __name__ == "__main__":
    main()
