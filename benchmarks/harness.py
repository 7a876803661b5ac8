"""One harness for the benchmarks: hand-written reference loops, timing, results and tables.

Every benchmark in this folder asks one question ("how much slower than the same maths written by hand?",
"how much memory do the kept draws take?", ...); this module holds what answering them shares, so that each
script reads as its question and its answer:

* :class:`HandChains`: SGLD, SGHMC and SGNHT for ``K`` chains written out in plain PyTorch on a potential
  given as a function, with the package's random streams, so it reproduces the kernels' trajectories;
* timing: :func:`now` (wall clock and CPU time of the process), :func:`stepped` blocks with a time stamp after
  every step, :func:`rotating_rounds` (contenders interleaved, order rotating, page faults counted),
  :func:`step_summary`, :func:`best_ms`, :func:`interleaved_best_ms`, :func:`paired_median`, :func:`timed`,
  :func:`median_seconds`;
* the machine: :func:`machine_info`, :func:`load_average`, :func:`package_fingerprint`, :func:`rss_bytes`;
* results: :func:`parser` (the common flags), :func:`write_json`, :class:`Log`, :func:`rst_list_table`,
  :func:`markdown_table`, :func:`text_table`.

``python benchmarks/harness.py --check`` runs the reference loops against the package's kernels on a small
model (same start, same seed, fixed step size, no adaptation) and prints the largest position difference.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pyro
import torch

import pyro_sgmcmc

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: the kernels' settings under which the hand loops do the same maths: a fixed step size, the identity
#: mass matrix, plain minibatch gradients (the kernels' defaults adapt all three)
SAME_MATHS = dict(adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)

Stamp = Tuple[float, float]  # (wall clock, CPU time of this process), seconds
Energy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------------------------ reference loops
class HandChains:
    """SGLD, SGHMC or SGNHT for ``K`` chains in plain PyTorch: the baseline the package is timed against.

    ``energy(z, idx)`` returns the minibatch potential of every chain, shape ``(K,)``,

    .. math:: U_k(z_k) = -\\log p(z_k) - \\frac{N}{B} \\sum_{n \\in I_k} \\log p(y_n \\mid z_k),

    for flat positions ``z`` of shape ``(K, D)`` (sites in the package's order) and minibatch indices ``idx``
    of shape ``(K, B)``. One ``torch.autograd.grad`` gives :math:`\\nabla U` for all chains. With step size
    :math:`\\epsilon`, friction :math:`\\alpha`, mass :math:`\\sigma^2`, temperature :math:`T`, data size
    :math:`N` and :math:`\\zeta \\sim N(0, I)`:

    .. math::
        \\text{SGLD:}\\quad & z' = z - \\tfrac{\\epsilon}{N} \\nabla U + \\sqrt{2 \\epsilon T / N}\\, \\zeta \\\\
        \\text{SGHMC:}\\quad & m' = (1 - \\tfrac{\\epsilon \\alpha}{\\sigma^2}) m - \\tfrac{\\epsilon}{N} \\nabla U
            + \\sqrt{2 \\epsilon \\alpha T / N}\\, \\zeta, \\quad z' = z + \\tfrac{\\epsilon}{\\sigma^2} m' \\\\
        \\text{SGNHT:}\\quad & \\text{the same with } \\alpha \\to \\xi \\text{ in the decay, then }
            \\xi' = \\xi + \\epsilon (m' \\cdot m' / (\\sigma^2 D) - T / N)

    (the package's temperature is per datum: its noise temperature is :math:`T / N`). The random streams
    are the package's: one ``torch.Generator`` per chain seeded with ``chain_seed(seed, c)``, noise drawn
    row by row, minibatches walking through a per-chain epoch permutation, reshuffled when fewer than ``B``
    indices remain. The step order is the kernels': noise, move with the cached gradient, new minibatch,
    new gradient. ``in_place=True`` writes the SGHMC update as fused in-place operations (the fastest hand
    form); ``keep_draws`` also keeps a copy of every position, as an MCMC run that returns its draws must.
    """

    def __init__(
        self,
        energy: Energy,
        num_data: int,
        batch_size: int,
        initial_position: torch.Tensor,
        seed: int,
        method: str = "SGHMC",
        step_size: float = 0.01,
        friction: float = 1.0,
        mass: float = 1.0,
        temperature: float = 1.0,
        in_place: bool = False,
        keep_draws: bool = False,
    ):
        from pyro_sgmcmc.chains.streams import chain_seed  # here: storage.py may time an older package

        if method not in ("SGLD", "SGHMC", "SGNHT"):
            raise ValueError(f"method must be SGLD, SGHMC or SGNHT; got {method!r}")
        self.energy, self.method, self.in_place = energy, method, in_place
        self.num_data, self.batch_size = num_data, batch_size
        self.step_size, self.friction, self.mass, self.temperature = step_size, friction, mass, temperature
        self.num_chains, self.dim = initial_position.shape
        self.generators = [torch.Generator().manual_seed(chain_seed(seed, c)) for c in range(self.num_chains)]
        self.permutation = torch.empty((self.num_chains, num_data), dtype=torch.long)
        self.cursor = num_data
        self.position = initial_position.clone()
        self.momentum = torch.zeros_like(self.position)
        self.thermostat = torch.full((self.num_chains,), friction, dtype=self.position.dtype)
        self.noise_buffer = torch.empty_like(self.position)
        self.draws: Optional[List[torch.Tensor]] = [] if keep_draws else None
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())

    def next_indices(self) -> torch.Tensor:
        """The next ``(K, B)`` minibatch indices, each chain walking through its own epoch permutation."""
        if self.cursor + self.batch_size > self.num_data:
            for row, generator in zip(self.permutation, self.generators):
                row.copy_(torch.randperm(self.num_data, generator=generator))
            self.cursor = 0
        idx = self.permutation[:, self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return idx

    def potential_and_grad(self, z: torch.Tensor, idx: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            energy = self.energy(z, idx)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        return energy.detach(), grad

    def noise(self) -> torch.Tensor:
        out = self.noise_buffer if self.in_place else torch.empty_like(self.position)
        for row, generator in zip(out, self.generators):
            row.normal_(generator=generator)
        return out

    def step(self) -> None:
        eps, n = self.step_size, self.num_data
        noise = self.noise()
        if self.method == "SGLD":
            scale = math.sqrt(2.0 * eps * self.temperature / n)
            self.position = self.position - (eps / n) * self.grad + scale * noise
        elif self.in_place:  # SGHMC as fused in-place operations
            self.momentum.mul_(1.0 - eps * self.friction / self.mass).add_(self.grad, alpha=-eps / n)
            self.momentum.add_(noise, alpha=math.sqrt(2.0 * eps * self.friction * self.temperature / n))
            self.position.add_(self.momentum, alpha=eps / self.mass)
        else:
            friction = self.friction if self.method == "SGHMC" else self.thermostat.unsqueeze(-1)
            scale = math.sqrt(2.0 * eps * self.temperature / n * self.friction)
            self.momentum = (1.0 - eps * friction / self.mass) * self.momentum - (eps / n) * self.grad + scale * noise
            self.position = self.position + (eps / self.mass) * self.momentum
            if self.method == "SGNHT":
                kinetic = (self.momentum * self.momentum).sum(-1) / (self.mass * self.dim)
                self.thermostat = self.thermostat + eps * (kinetic - self.temperature / n)
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())
        if self.draws is not None:
            self.draws.append(self.position.clone())


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------- timing
def now() -> Stamp:
    """(wall clock, CPU time of this process), in seconds."""
    return time.perf_counter(), time.process_time()


def stepped(step: Callable[[], Any], steps: int) -> Callable[[], List[Stamp]]:
    """A block of ``steps`` calls of ``step`` with a time stamp before the first and after every call."""

    def block() -> List[Stamp]:
        stamps = [now()]
        for _ in range(steps):
            step()
            stamps.append(now())
        return stamps

    return block


def minor_faults() -> int:
    """Minor page faults of this process so far: fresh pages the allocator had to map."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def rotating_rounds(blocks: Dict[str, Callable[[], List[Stamp]]], rounds: int) -> Dict[str, List[tuple]]:
    """Run every contender's block once per round, the order rotating by one each round, so that slow phases
    of a shared machine hit every contender alike. Per contender and round: ``(wall ms, CPU ms, minor page
    faults)`` per step, from the block's first to its last stamp."""
    names = list(blocks)
    out: Dict[str, List[tuple]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            faults = minor_faults()
            stamps = blocks[name]()
            n = len(stamps) - 1
            wall, cpu = (stamps[-1][0] - stamps[0][0]) / n, (stamps[-1][1] - stamps[0][1]) / n
            out[name].append((1e3 * wall, 1e3 * cpu, (minor_faults() - faults) / n))
    return out


def paired_median(values: Sequence[float], baseline: Sequence[float]) -> float:
    """Median over rounds of ``value / baseline`` (paired: cancels slow drifts of the background load)."""
    return statistics.median(v / b for v, b in zip(values, baseline))


def step_summary(stamps: List[Stamp], start: Stamp, skip: int = 5) -> dict:
    """Median wall and CPU ms per step from per-step stamps (the first ``skip`` steps dropped: allocator and
    dispatch warm-up), and the set-up time: from ``start`` to the first stamp, minus one median step."""
    wall = [b[0] - a[0] for a, b in zip(stamps[:-1], stamps[1:])]
    cpu = [b[1] - a[1] for a, b in zip(stamps[:-1], stamps[1:])]
    if len(wall) > skip + 2:
        wall, cpu = wall[skip:], cpu[skip:]
    median_wall = statistics.median(wall)
    return {
        "median_ms": 1e3 * median_wall,
        "mean_ms": 1e3 * statistics.fmean(wall),
        "cpu_median_ms": 1e3 * statistics.median(cpu),
        "setup_s": stamps[0][0] - start[0] - median_wall,
        "total_s": stamps[-1][0] - start[0],
    }


def best_ms(fn: Callable, number: int, repeat: int, clock: Callable[[], float] = time.process_time) -> float:
    """Best over ``repeat`` blocks of the mean time of ``number`` calls, in ms (CPU time by default: at one
    thread it equals the wall time on an idle machine and is barely touched by other jobs)."""
    best = math.inf
    for _ in range(repeat):
        start = clock()
        for _ in range(number):
            fn()
        best = min(best, (clock() - start) / number)
    return 1e3 * best


def timed(fn: Callable[[], Any]) -> Tuple[Any, float]:
    """``(fn(), wall seconds it took)``."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn``."""
    return statistics.median(timed(fn)[1] for _ in range(repeats))


def interleaved_best_ms(fns: Dict[str, Callable], number: int, repeat: int) -> Dict[str, float]:
    """:func:`best_ms` for several functions, block by block in turn, so background load hits them alike."""
    best = {name: math.inf for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            best[name] = min(best[name], best_ms(fn, number, 1))
    return best


# ------------------------------------------------------------------------------------------ machine
def machine_info(**extra: Any) -> dict:
    """CPU model and count, torch threads, platform and the versions that matter, plus ``extra``."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "pyro_sgmcmc": pyro_sgmcmc.__version__,
        **extra,
    }


def load_average() -> Optional[List[float]]:
    """The 1, 5 and 15-minute load averages (other jobs on a shared machine), or None where unknown."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def package_fingerprint() -> dict:
    """The git commit and a hash of the package's sources as measured (uncommitted edits included)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "pyro_sgmcmc").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    commit = None
    try:
        head = (ROOT / ".git" / "HEAD").read_text().strip()
        commit = (ROOT / ".git" / head[5:]).read_text().strip() if head.startswith("ref: ") else head
    except OSError:  # a worktree (.git is a file) or no checkout
        pass
    measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
    return {"git_commit": commit, "sources_sha256": digest.hexdigest(), "measured_at": measured_at}


def rss_bytes() -> int:
    """Resident set size of this process (``/proc/self/statm``), bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------------------ results
def companion(name: str, package: Optional[str]):
    """The module ``benchmarks/<name>.py``, whether the caller runs as a script (``package`` empty: the folder
    is on ``sys.path``; a script asking for itself gets ``__main__``) or was imported from ``package``."""
    main = sys.modules.get("__main__")
    if not package and main is not None and Path(getattr(main, "__file__", "") or "").stem == name:
        return main
    return importlib.import_module(f"{package}.{name}" if package else name)


def parser(doc: str, out: Optional[Path], tiny: Optional[str] = "smallest sizes: a smoke test only"):
    """An ``argparse`` parser described by the first line of ``doc``, with ``--out`` (default ``out``) and,
    unless ``tiny`` is None, ``--tiny`` (help ``tiny``)."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--out", type=Path, default=out, help=f"results as JSON (default {out})")
    if tiny is not None:
        p.add_argument("--tiny", action="store_true", help=tiny)
    return p


def write_json(path: Path, results: Any, indent: int = 2, default: Callable[[Any], Any] = str) -> Path:
    """Write ``results`` as JSON to ``path`` (parents made; anything not JSON written as ``default(value)``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=indent, default=default))
    return path


class Log:
    """Print a line at once and keep it (the results file holds the run's log)."""

    def __init__(self):
        self.lines: List[str] = []

    def __call__(self, message: str) -> None:
        print(message, flush=True)
        self.lines.append(message)


def rst_list_table(caption: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A reStructuredText ``list-table`` (the docs include these files as they are written)."""
    lines = [f".. list-table:: {caption}", "   :header-rows: 1", ""]
    for row in [header, *rows]:
        lines += [f"   * - {row[0]}"] + [f"     - {cell}" for cell in row[1:]]
    return "\n".join(lines) + "\n"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown (GitHub) table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table for the terminal: columns as wide as their widest cell, numbers right-aligned."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


# ------------------------------------------------------------------------------------------ self-check
def check_against_kernels(steps: int = 5, chains: int = 3) -> Dict[str, float]:
    """The reference loops against SGLD, SGHMC and SGNHT on a small logistic regression (float64, fixed step
    size, no adaptation): the largest position difference after ``steps`` steps, per method."""
    import pyro.distributions as dist

    from pyro_sgmcmc import SGHMC, SGLD, SGNHT

    n, d, batch, seed = 500, 5, 50, 0
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (x @ torch.randn(d, generator=g, dtype=torch.float64) > 0).double()

    def model(x, y):
        w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0).expand([d]).to_event(1))
        with pyro.plate("data", n, subsample_size=batch) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    def energy(z, idx):
        logits = torch.bmm(x[idx], z.unsqueeze(-1)).squeeze(-1)
        log_lik = -torch.nn.functional.binary_cross_entropy_with_logits(logits, y[idx], reduction="none").sum(-1)
        log_prior = -0.5 * (z * z).sum(-1) - 0.5 * d * math.log(2 * math.pi)
        return -(log_prior + (n / batch) * log_lik)

    init = 0.1 * torch.randn(chains, d, generator=g, dtype=torch.float64)
    out = {}
    for method, kernel_class in (("SGLD", SGLD), ("SGHMC", SGHMC), ("SGNHT", SGNHT)):
        kernel = kernel_class(model, step_size=0.01, **SAME_MATHS)
        with pyro.validation_enabled(False):
            kernel.setup_chains(0, (x, y), {}, num_chains=chains, initial_params={"w": init}, seed=seed)
            hand = HandChains(energy, n, batch, init, seed, method=method, step_size=0.01)
            for _ in range(steps):
                kernel.step()
                hand.step()
        out[method] = max_abs_diff(kernel.state.position, hand.position)
    return out


if __name__ == "__main__":
    args = parser(__doc__, None, tiny=None)
    args.add_argument("--check", action="store_true", help="the reference loops against the package's kernels")
    if args.parse_args().check:
        print(json.dumps(check_against_kernels()))
