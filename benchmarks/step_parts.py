"""Where a sampling step's time goes beyond the hand-written loop: the noise, the divergence rule, Pyro's logging.

The small MLP regression of ``peers.py`` (3,151 weights, B = 128), SGHMC, one torch thread, for ``C`` chains
(default 1 and 256), each part timed in blocks interleaved with its comparison (median of the blocks, and the
median of the per-round differences):

``noise``
    One step's injected noise, ``ChainGenerators.fill_normal`` on a ``(C, D)`` float32 buffer at consecutive
    steps (the keyed Philox streams, drawn ahead where the package draws ahead), against one ``normal_`` of the
    same tensor from one ``torch.Generator`` (what the hand-written batched loop draws).
``divergence rule``
    The kernel's step (``kernel.step()``, as ``peers.py``'s ``kernel`` contender) with its divergence rule
    (:func:`pyro_sgmcmc.kernels.step.settle`: the stability test and the ``torch.where`` that put diverging chains
    back) against the same step with the rule replaced by the identity (the proposal kept as it is): the
    difference is what the rule costs. (The replaced step is not a valid sampler; it is timed, never used.)
``pyro logging``
    What :class:`pyro.infer.MCMC` adds to every step of every kernel: its hook that JSON-encodes
    ``kernel.logging()`` and emits a log record to its progress-bar handler (progress bar disabled), timed on
    the kernel's cached ``logging()`` dict.

Run::

    python benchmarks/step_parts.py                    # about a minute on a quiet 2-core machine
    python benchmarks/step_parts.py --tiny             # seconds: smoke test

Writes ``benchmarks/results/step_parts.json`` with the run's context (date, machine, load, threads); the figures
are quoted in ``docs/benchmarks.rst``.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from typing import Callable, Dict, List

import torch

if __package__:  # imported as benchmarks.step_parts
    from . import harness, models, peers
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    import models
    import peers

import pyro_sgmcmc.kernels.sampling as sampling
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.kernels.step import StepInfo


def interleaved(parts: Dict[str, Callable[[], None]], calls: int, rounds: int) -> Dict[str, List[float]]:
    """Microseconds per call of each part, one block of ``calls`` calls per part per round, parts interleaved."""
    times: Dict[str, List[float]] = {name: [] for name in parts}
    for part in parts.values():  # warm-up: buffers, caches, the allocator
        for _ in range(max(2, calls // 10)):
            part()
    for _ in range(rounds):
        for name, part in parts.items():
            start = time.process_time()
            for _ in range(calls):
                part()
            times[name].append((time.process_time() - start) / calls * 1e6)
    return times


def summary(times: Dict[str, List[float]], first: str, second: str) -> dict:
    """Medians of both parts and the median of their per-round differences, in microseconds."""
    return {
        first: statistics.median(times[first]),
        second: statistics.median(times[second]),
        "difference": statistics.median(a - b for a, b in zip(times[first], times[second])),
    }


def noise_part(chains: int, dim: int, calls: int, rounds: int) -> dict:
    streams = ChainGenerators(0, list(range(chains)))
    out = torch.empty(chains, dim)
    generator = torch.Generator().manual_seed(0)
    step = iter(range(1 << 40))
    parts = {
        "keyed Philox": lambda: streams.fill_normal(out, step=next(step)),
        "one normal_": lambda: out.normal_(generator=generator),
    }
    return summary(interleaved(parts, calls, rounds), "keyed Philox", "one normal_")


def divergence_rule_part(chains: int, calls: int, rounds: int) -> dict:
    hidden = models.SIZES["small"]
    x, y = peers.make_data()
    init = 0.1 * torch.randn(chains, peers.dim(hidden), generator=torch.Generator().manual_seed(1))
    kernel = peers.OursKernel(x, y, hidden, init, 0)
    rule = sampling.settle

    def identity(dynamics, parameters, state, proposed):
        return proposed, StepInfo(torch.zeros(proposed.position.shape[0], dtype=torch.bool))

    def with_rule():
        sampling.settle = rule
        kernel.step()

    def without_rule():
        sampling.settle = identity
        kernel.step()

    try:
        return summary(interleaved({"step": with_rule, "step, rule = identity": without_rule}, calls, rounds),
                       "step", "step, rule = identity")  # fmt: skip
    finally:
        sampling.settle = rule


def pyro_logging_part(calls: int, rounds: int) -> dict:
    from pyro.infer.mcmc.api import _add_logging_hook
    from pyro.infer.mcmc.logger import ProgressBar, initialize_logger

    hidden = models.SIZES["small"]
    x, y = peers.make_data()
    init = 0.1 * torch.randn(1, peers.dim(hidden), generator=torch.Generator().manual_seed(1))
    kernel = peers.OursKernel(x, y, hidden, init, 0).kernel
    progress = ProgressBar(10, 10, disable=True)  # as pyro.infer.MCMC(disable_progbar=True) makes it
    logger = initialize_logger(logging.getLogger("pyro.infer.mcmc"), "", progress)
    hook = _add_logging_hook(logger, progress, None)
    times = interleaved({"pyro logging hook": lambda: hook(kernel, None, "Sample", 0)}, calls, rounds)
    progress.close()
    return {"pyro logging hook": statistics.median(times["pyro logging hook"])}


def _rounded(value):
    """``value`` with its floats rounded to 0.1 (for printing)."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 1) if isinstance(value, float) else value


def main(argv=None):
    parser = harness.parser(__doc__, harness.RESULTS / "step_parts.json")
    parser.add_argument("--chains", type=int, nargs="+", default=[1, 256])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chains = [1, 4] if args.tiny else args.chains
    context = harness.run_context()
    print(harness.context_line(context))
    results = {"context": context, "chains": {}}
    for c in chains:
        calls = 2 if args.tiny else max(3, 2000 // c)
        rounds = 2 if args.tiny else 9
        entry = results["chains"][str(c)] = {
            "noise_us": noise_part(c, peers.dim(models.SIZES["small"]), calls, rounds),
            # the rule is a few per cent of a step: more steps and rounds, for a difference above the noise
            "divergence_rule_us": divergence_rule_part(c, *((2, 2) if args.tiny else (max(8, calls // 2), 15))),
        }
        print(f"{c} chain(s): " + json.dumps(_rounded(entry)))
    results["pyro_logging_us"] = pyro_logging_part(10 if args.tiny else 5000, 2 if args.tiny else 9)
    print("pyro.infer.MCMC's logging hook:", json.dumps(_rounded(results["pyro_logging_us"])))
    results["load_average_end"] = harness.load_average()
    harness.write_json(args.out, results)
    print("written:", args.out)


if __name__ == "__main__":
    main()
