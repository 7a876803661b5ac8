"""Benchmark (and check): the ATen operator calls and host reads of ONE sampling step, at 1, 256 and 4,096 chains.

A step that a GPU can replay, or that costs the same per chain whatever the number of chains, issues the same
operators at every chain count: only their shapes grow. This script counts them for SGLD, SGHMC and SGNHT
(``kernel.step()`` after set-up, a fixed step size, no adaptation: ``harness.SAME_MATHS``; the hot path of a
sampling step) on two problems:

``mlp``
    the Bayesian MLP regression 10-50-50-1 of ``models.py`` (N = 10,000 synthetic points, B = 128);
``logistic``
    the logistic regression of the NUTS race (``race_nuts.model``: d = 20 raw features and an intercept,
    B = 1,000), at N = 10^4 here (the counts do not depend on N; the race's 10^6 would only slow set-up).

How the operators are counted: a :class:`torch.utils._python_dispatch.TorchDispatchMode` sees every operator
call *below* autograd, after composite operators have been decomposed (``torch.matmul`` arrives as ``mm``,
``bmm`` or ``view`` + ``mm``), the backward pass's operators included: exactly the calls that reach a backend
(a kernel launch each on a GPU, views and metadata-only calls aside, which are counted apart as
``metadata``). ``torch.profiler`` would record nested scopes (a composite and its parts both), so its
counts depend on how an operator is implemented; the dispatch mode's do not, and it names the Python line that
issued each call (the innermost frame in ``pyro_sgmcmc``), which is how the differences are attributed.

Host reads ("syncs": on a GPU each one waits for the device), counted two ways: a
:class:`torch.overrides.TorchFunctionMode` counts the Python calls that read a tensor back
(``Tensor.item``, ``__bool__``, ``__float__``, ``__int__``, ``__index__``, ``tolist``, ``numpy``, ``cpu``)
with their line; the dispatch mode counts ``aten._local_scalar_dense`` (what every scalar read becomes),
``aten.equal`` and ``aten.is_nonzero`` (a boolean to the host) and the operators whose output shape depends on
the data (``nonzero``, ``masked_select``, ``unique``, ...: the host waits for the size).

Minibatch blocks. The package evaluates its keyed permutations ahead, in blocks (``chains/minibatch.py``,
``DRAW_AHEAD`` positions at a time); a step that draws a new block issues more operators than one that does
not. Each step is classified by whether a plate's block changed during it, and both kinds are reported
(``ordinary`` and ``block``), with the share of block steps among the counted ones.

Exit status: 1, with a message naming the kernel, problem and chain counts, if a kind of step issues a
different number of operators at different chain counts (so the script works as a check); 0 otherwise.

Run::

    python benchmarks/step_ops.py                        # both problems, 1, 256 and 4096 chains: a few minutes
    python benchmarks/step_ops.py --tiny                 # 1 and 8 chains, MLP only: seconds (smoke test)
    python benchmarks/step_ops.py --problems mlp --chains 1 256 --kernels SGHMC

Writes JSON to ``--out`` (default ``benchmarks/results/step_ops.json``).
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pyro
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import pyro_sgmcmc
from pyro_sgmcmc import SGHMC, SGLD, SGNHT

if __package__:  # imported as benchmarks.step_ops
    from . import harness, models, race_nuts
else:  # run as a script: benchmarks/ is on sys.path
    import harness
    import models
    import race_nuts

KERNELS = {"SGLD": SGLD, "SGHMC": SGHMC, "SGNHT": SGNHT}
PACKAGE_DIR = str(Path(pyro_sgmcmc.__file__).parent)  # the package measured (PYTHONPATH may name another copy)
#: Python calls that read a tensor back to the host
READ_BACK = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu"}
#: operators that hand a value to the host, or whose output shape depends on the data (the host waits for it)
SYNC_OPS = {"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "masked_select", "_unique2", "unique_dim",
            "unique_consecutive", "repeat_interleave", "argwhere", "nonzero_static"}  # fmt: skip
LOGISTIC_N = 10_000
#: steps counted when every one draws a block (many chains: the block covers one step)
ALL_BLOCKS = 4


def where(skip: int = 2) -> str:
    """``file:line`` of the innermost frame in the package (else the innermost outside torch), for attribution."""
    frame = sys._getframe(skip)
    fallback = None
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE_DIR):
            return f"{name[len(PACKAGE_DIR) - len('pyro_sgmcmc') :]}:{frame.f_lineno}"
        if fallback is None and "/torch/" not in name and "/pyro/" not in name and not name.startswith("<"):
            fallback = f"{Path(name).name}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "?"


class OperatorCounter(TorchDispatchMode):
    """Counts every ATen operator call (by overload), the Python line that issued it, and the host reads."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.lines: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()
        self.metadata = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket.__name__
        if func.is_view:
            self.metadata += 1
        self.ops[str(func.overloadpacket)] += 1
        line = where()
        self.lines[line] += 1
        if packet in SYNC_OPS:
            self.syncs[f"aten.{packet} @ {line}"] += 1
        return func(*args, **(kwargs or {}))


class ReadBackCounter(TorchFunctionMode):
    """Counts the Python calls that read a tensor back to the host, with their line."""

    def __init__(self):
        super().__init__()
        self.reads: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READ_BACK:
            self.reads[f"Tensor.{name} @ {where()}"] += 1
        return func(*args, **(kwargs or {}))


def problem(name: str, num_chains: int, dtype=torch.float32):
    """``(model, args, initial params)`` of problem ``name`` for ``num_chains`` chains (fixed seeds)."""
    generator = torch.Generator().manual_seed(1)
    if name == "mlp":
        hidden = models.SIZES["small"]
        x, y = models.make_data(dtype)
        init = 0.1 * torch.randn(num_chains, models.dim(hidden), generator=generator, dtype=dtype)
        return models.make_model(hidden), (x, y), models.unpack(init, hidden), models.STEP_SIZE
    if name == "logistic":
        x, y, _ = race_nuts.make_data(LOGISTIC_N)
        w = 0.01 * torch.randn(num_chains, race_nuts.D, generator=generator)
        b = 0.01 * torch.randn(num_chains, generator=generator)
        return race_nuts.model, (x, y, race_nuts.BATCH), {"w": w, "b": b}, 1e-3
    raise ValueError(f"problem must be 'mlp' or 'logistic'; got {name!r}")


def blocks_of(kernel) -> Tuple[int, ...]:
    """Identities of the minibatch blocks drawn ahead (a new identity: the step drew a block)."""
    return tuple(id(block) for block in kernel.minibatches.ahead.values())


def count_step(kernel) -> dict:
    """One ``kernel.step()`` under both counters: its operators, lines, host reads and whether it drew a block."""
    before = blocks_of(kernel)
    ops, reads = OperatorCounter(), ReadBackCounter()
    with ops, reads:
        kernel.step()
    return {
        "total": sum(ops.ops.values()),
        "views": ops.metadata,
        "ops": dict(ops.ops),
        "lines": dict(ops.lines),
        "host_reads": dict(reads.reads),
        "sync_ops": dict(ops.syncs),
        "block": blocks_of(kernel) != before,
    }


def count_config(problem_name: str, kernel_name: str, num_chains: int, max_steps: int, warm: int = 3) -> dict:
    """Set up ``num_chains`` chains, take ``warm`` uncounted steps, then count steps until an ordinary step and a
    block step have both been seen (or every step of :data:`ALL_BLOCKS` drew a block, or ``max_steps``); per
    kind, the first step of that kind and the totals seen."""
    model, args, init, step_size = problem(problem_name, num_chains)
    kernel = KERNELS[kernel_name](model, step_size=step_size, **harness.SAME_MATHS)
    with pyro.validation_enabled(False):
        start = harness.now()
        kernel.setup_chains(0, args, {}, num_chains=num_chains, initial_params=init, seed=0)
        setup_s = harness.now()[0] - start[0]
        for _ in range(warm):
            kernel.step()
        steps: List[dict] = []
        for _ in range(max_steps):
            steps.append(count_step(kernel))
            kinds = {s["block"] for s in steps}
            if kinds == {True, False} or (kinds == {True} and len(steps) >= ALL_BLOCKS):
                break  # both kinds seen, or every step draws a block
    out = {"chains": num_chains, "setup_s": setup_s, "steps_counted": len(steps),
           "block_share": sum(s["block"] for s in steps) / len(steps)}  # fmt: skip
    for kind, is_block in (("ordinary", False), ("block", True)):
        of_kind = [s for s in steps if s["block"] == is_block]
        if of_kind:
            first = of_kind[0]
            out[kind] = {**first, "totals_seen": sorted({s["total"] for s in of_kind})}
            del out[kind]["block"]
        else:
            out[kind] = None
    return out


def steady(entry: dict) -> Optional[dict]:
    """The step as it usually runs at this chain count: the ordinary step if any was seen, else the block step."""
    return entry["ordinary"] or entry["block"]


def differences(by_chains: Dict[int, dict]) -> List[str]:
    """Where the step's operator counts differ across chain counts: per kind of step, and for the usual step."""
    found = []
    chains = sorted(by_chains)
    for kind in ("ordinary", "block", "usual"):
        totals = {}
        for c in chains:
            step = steady(by_chains[c]) if kind == "usual" else by_chains[c][kind]
            if step is not None:
                totals[c] = step["total"]
        if len(set(totals.values())) > 1:
            found.append(f"{kind} step: " + ", ".join(f"{c} chains {t} ops" for c, t in totals.items()))
    return found


def diff_table(a: dict, b: dict, key: str, top: int = 12) -> List[Tuple[str, int, int]]:
    """``(name, count in a, count in b)`` for the ``key`` entries (ops or lines) whose counts differ."""
    names = set(a[key]) | set(b[key])
    rows = [(n, a[key].get(n, 0), b[key].get(n, 0)) for n in names if a[key].get(n, 0) != b[key].get(n, 0)]
    return sorted(rows, key=lambda r: -abs(r[2] - r[1]))[:top]


def main(argv=None) -> int:
    parser = harness.parser(__doc__, harness.RESULTS / "step_ops.json", "MLP only, 1 and 8 chains (smoke test)")
    parser.add_argument("--problems", nargs="+", default=["mlp", "logistic"], choices=["mlp", "logistic"])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--chains", nargs="+", type=int, default=[1, 256, 4096])
    parser.add_argument("--max-steps", type=int, default=100, help="steps counted at most per configuration")
    parser.add_argument("--no-check", action="store_true", help="exit 0 even if the counts differ")
    args = parser.parse_args(argv)
    if args.tiny:
        args.problems, args.chains, args.max_steps = ["mlp"], [1, 8], 3
    torch.set_num_threads(1)
    results = {
        "machine": harness.machine_info(load=harness.load_average()),
        "package": {**harness.package_fingerprint(), "measured": PACKAGE_DIR},
        "method": "TorchDispatchMode (operators below autograd) + TorchFunctionMode (host reads)",
        "configs": {},
    }
    problems_left: List[str] = []
    rows = []
    for problem_name in args.problems:
        for kernel_name in args.kernels:
            by_chains = {}
            for chains in args.chains:
                # a block is drawn at most once per epoch (N / B steps): count that far at one chain
                by_chains[chains] = count_config(problem_name, kernel_name, chains, args.max_steps)
                e = by_chains[chains]
                for kind in ("ordinary", "block"):
                    step = e[kind]
                    if step is None:
                        continue
                    reads, syncs = sum(step["host_reads"].values()), sum(step["sync_ops"].values())
                    shares = f"{e['block_share']:.2f}", f"{e['setup_s']:.2f}"
                    counts = step["total"], step["views"], reads, syncs
                    rows.append([problem_name, kernel_name, chains, kind, *counts, *shares])
            key = f"{problem_name}/{kernel_name}"
            results["configs"][key] = {str(c): e for c, e in by_chains.items()}
            problems_left += [f"{key}: {d}" for d in differences(by_chains)]
            chains = sorted(by_chains)
            if len(chains) > 1:  # what makes the counts differ: smallest against largest chain count
                a, b = steady(by_chains[chains[0]]), steady(by_chains[chains[-1]])
                ops, lines = diff_table(a, b, "ops"), diff_table(a, b, "lines")
                results["configs"][key]["diff"] = {"chains": [chains[0], chains[-1]], "ops": ops, "lines": lines}
    header = ["problem", "kernel", "chains", "step", "ATen ops", "views", "host reads (Python)", "sync ops",
              "block share", "set-up s"]  # fmt: skip
    print(harness.text_table(header, rows))
    for key, entry in results["configs"].items():
        diff = entry.get("diff")
        if diff and (diff["ops"] or diff["lines"]):
            lo, hi = diff["chains"]
            print(f"\n{key}: usual step, {lo} vs {hi} chains")
            for name, x, y in diff["ops"]:
                print(f"  op   {name:<45} {x:>6} {y:>6}")
            for name, x, y in diff["lines"]:
                print(f"  line {name:<45} {x:>6} {y:>6}")
    reads = collections.Counter()
    for entry in results["configs"].values():
        for c, e in entry.items():
            if c != "diff" and steady(e) is not None:
                reads.update({k: 0 for k in {**steady(e)["host_reads"], **steady(e)["sync_ops"]}})
    if reads:
        print("\nhost reads seen in a usual step (Python call or operator @ line):")
        for name in sorted(reads):
            print(f"  {name}")
    results["differences"] = problems_left
    results["load_after"] = harness.load_average()
    harness.write_json(args.out, results, indent=1)
    print(f"\nwritten: {args.out}")
    if problems_left and not args.no_check:
        print("\nFAIL: the operator count of a step depends on the number of chains:\n  " + "\n  ".join(problems_left))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
