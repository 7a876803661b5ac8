"""Deep ensemble, serial SGHMC and parallel SGHMC on a 2-D double well (the seed paper's Figure 2 idea).

The target is :math:`\\pi(x, y) \\propto \\exp(-U(x, y) / T)` with

.. math:: U(x, y) = a (x^2 - 1)^2 + c\\, x + b\\, y^2,

two modes near :math:`x = \\pm 1` separated by a barrier of height about :math:`a` at
:math:`x \\approx 0`; the tilt :math:`c > 0` makes the left mode the heavier one, so the mode weights
are not 0.5/0.5 and a method that merely visits both modes does not get them right by symmetry.
The exact weights (and the exact within-mode moments) come from numerical integration of the
:math:`x`-marginal; the :math:`y`-marginal is Gaussian with variance :math:`T / (2b)`.

As a Pyro model: a latent 2-vector ``z = (x, y)`` with a flat prior (``ImproperUniform``) and
``pyro.factor("well", -U(z))``. The model has no data plate, so ``num_data`` is set by hand
(``--num-data``, default 8): the kernels' step size multiplies :math:`N^{-1} \\nabla \\log \\pi`,
and :math:`N = 8` brings the normalised curvature at the modes (:math:`8a / N = 3` across,
:math:`2b / N = 1.25` along :math:`y`, with the defaults :math:`a = 3, b = 5, c = 0.5`) to order
one, where ``step_size=0.2, friction=1`` is a sensible SGD-like setting (``step_size**2`` times the
largest normalised curvature is 0.12). :math:`N` only rescales time (one step advances the
dynamics by :math:`\\epsilon / \\sqrt{N}`); the stationary distribution is :math:`\\exp(-U / T)`
whatever it is. The barrier (:math:`a = 3` in units of :math:`T`) is high enough that a single chain
crosses it only a handful of times in ``--steps`` = 2,000 steps, and low enough that the population
of parallel chains relaxes to the right mode weights in about 1,000.

Three runs, all with ``pyro_sgmcmc.MCMC(SGHMC(...), chain_method="vectorized")`` and the same
number of steps per chain (``--steps``), i.e. the same wall-clock budget, since a step of all the
vectorised chains costs about as much as a step of one chain here:

1. **deep ensemble**: ``--chains`` chains at ``temperature=0`` (SGD with momentum) from dispersed
   starts, ``keep_last=1``: one point per member, at the bottom of the basin it started in;
2. **serial SGHMC**: one chain at ``T = 1`` for the same number of steps (after
   ``--burn-in``), every draw kept;
3. **parallel SGHMC**: ``--chains`` chains at ``T = 1`` in ``--superchains`` superchains (the
   chains of a superchain start from one dispersed point), ``keep_last=1``.

For each the script reports the fraction of draws in each mode (left/right of the barrier top)
against the exact weights, the within-mode standard deviations against the exact ones, and
nested R-hat (Margossian et al., 2024) of ``x`` and ``y``:

* parallel SGHMC: ``K`` superchains of ``M`` chains with one draw each (``keep_last=1``);
* serial SGHMC: the single chain cut into ``--serial-segments`` consecutive segments, each its
  own superchain with one chain (``M = 1``: then nested R-hat is close to split-R-hat);
* deep ensemble: each member its own superchain (``M = 1``) with one draw: there is no within-chain
  or within-superchain variation at all (``W = 0``). ``pyro_sgmcmc.nested_rhat`` refuses that
  layout (it names the problem), so the script evaluates the formula directly and reports
  :math:`\\sqrt{1 + B / 0} = \\infty`. That is the correct verdict: an ensemble of optima is not a
  sample from the posterior, however well its members cover the modes.

``nested_rhat`` comes from ``pyro_sgmcmc.diagnostics`` when the package has it; otherwise the
FALLBACK below implements the same formula. Each row of the JSON says which was used.

What to expect (defaults, seeds 0, 1, 2; exact left-mode weight 0.714): the deep ensemble puts
0.54 / 0.51 / 0.52 of its members in the left mode (the share of starts in that basin) with zero
spread inside each mode; the serial chain gets 0.77 / 0.87 / 1.00 (it crosses the barrier a few
times, or never: with seed 2 it stays in the left mode, and its nested R-hat of 1.004 cannot tell,
since no segment ever saw the other mode); parallel SGHMC gets 0.720 / 0.711 / 0.695 (standard
error 0.014) with within-mode standard deviations within a few per cent of the exact ones and
nested R-hat of x of 1.014 / 1.005 / 1.005 (its floor with ``M = 64`` chains per superchain and one
draw is about 1.008). Re-checked on 2026-11-26 after the keyed-permutation minibatch stream: the
same to the printed digit (the model has no data plate).

One PNG with three panels (trajectories and end points over the contours of U) and a JSON of the
numbers are written to ``--out`` (default ``double_well_results/``).

Run it::

    python examples/double_well.py             # 8 s of CPU, 12 s wall on 2 shared cores (2026-11-26)
    python examples/double_well.py --tiny      # a few seconds, smoke test only
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Tuple

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from pyro_sgmcmc import MCMC, SGHMC

try:  # the package's diagnostic, once it exists
    from pyro_sgmcmc.diagnostics import nested_rhat

    NESTED_RHAT_SOURCE = "pyro_sgmcmc.diagnostics.nested_rhat"
except ImportError:  # pragma: no cover - depends on the state of the package
    nested_rhat = None
    NESTED_RHAT_SOURCE = "fallback in examples/double_well.py"
try:
    from pyro_sgmcmc.diagnostics import nested_rhat_threshold
except ImportError:  # pragma: no cover
    nested_rhat_threshold = None


# ------------------------------------------------------------------------------ the target
class DoubleWell:
    """``U(x, y) = a (x^2 - 1)^2 + c x + b y^2`` and its exact mode weights at temperature ``T``."""

    def __init__(self, a: float = 3.0, b: float = 5.0, c: float = 0.5, temperature: float = 1.0):
        self.a, self.b, self.c, self.temperature = a, b, c, temperature
        # dU/dx = 4 a x^3 - 4 a x + c: three real roots for a small tilt; the middle one is the barrier top.
        roots = np.sort(np.roots([4 * a, 0.0, -4 * a, c]).real)
        self.left_min, self.barrier, self.right_min = (float(r) for r in roots)

    def energy(self, z: torch.Tensor) -> torch.Tensor:
        x, y = z[..., 0], z[..., 1]
        return self.a * (x * x - 1.0) ** 2 + self.c * x + self.b * y * y

    def energy_np(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self.a * (x * x - 1.0) ** 2 + self.c * x + self.b * y * y

    def model(self):
        z = pyro.sample("z", dist.ImproperUniform(constraints.real, (), (2,)))
        pyro.factor("well", -self.energy(z))

    def exact(self) -> dict:
        """Mode weights and within-mode moments of x by quadrature; y is N(0, T / (2b))."""
        x = np.linspace(-4.0, 4.0, 400_001)
        dx = x[1] - x[0]
        u = self.a * (x * x - 1.0) ** 2 + self.c * x
        density = np.exp(-(u - u.min()) / self.temperature)
        density /= density.sum() * dx
        left = x < self.barrier
        out = {"barrier_x": self.barrier, "minima_x": [self.left_min, self.right_min]}
        for name, mask in (("left", left), ("right", ~left)):
            w = density[mask].sum() * dx
            mean = (x[mask] * density[mask]).sum() * dx / w
            var = ((x[mask] - mean) ** 2 * density[mask]).sum() * dx / w
            out[name] = {"weight": float(w), "x_mean": float(mean), "x_sd": float(math.sqrt(var))}
        out["y_sd"] = math.sqrt(self.temperature / (2.0 * self.b))
        return out


# --------------------------------------------------------------------------- nested R-hat
def nested_rhat_fallback(samples, superchain_ids) -> np.ndarray:
    """FALLBACK nested R-hat (used only when ``pyro_sgmcmc.diagnostics.nested_rhat`` is missing).

    ``samples``: ``(chains, draws, *params)``; ``superchain_ids``: ``(chains,)``, every superchain
    with the same number ``M`` of chains. With chain means ``f_mk``, superchain means ``f_k``:
    ``B = var_k(f_k)`` (ddof 1), ``Btilde_k = var_m(f_mk)`` (ddof 1; 0 if ``M = 1``),
    ``Wtilde_k = mean_m`` of the within-chain variances (ddof 1; 0 if one draw),
    ``W = mean_k(Btilde_k + Wtilde_k)`` and ``nRhat = sqrt(1 + B / W)``: ``inf`` when ``W = 0 < B``.
    """
    samples = np.asarray(samples, dtype=np.float64)
    ids = np.asarray(superchain_ids)
    labels = np.unique(ids)
    groups = [samples[ids == k] for k in labels]  # each (M, draws, *params)
    if len({g.shape[0] for g in groups}) != 1:
        raise ValueError("every superchain must have the same number of chains")
    if len(labels) < 2:
        raise ValueError("nested R-hat needs at least two superchains")
    num_chains_per, num_draws = groups[0].shape[0], groups[0].shape[1]
    chain_means = np.stack([g.mean(axis=1) for g in groups])  # (K, M, *params)
    superchain_means = chain_means.mean(axis=1)  # (K, *params)
    between = superchain_means.var(axis=0, ddof=1)
    btilde = chain_means.var(axis=1, ddof=1) if num_chains_per > 1 else np.zeros_like(superchain_means)
    if num_draws > 1:
        wtilde = np.stack([g.var(axis=1, ddof=1).mean(axis=0) for g in groups])
    else:
        wtilde = np.zeros_like(superchain_means)
    within = (btilde + wtilde).mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(1.0 + between / within)


def rhat_threshold(chains_per_superchain: int, num_draws: int) -> float:
    """Floor-aware threshold max(1.01, sqrt(1 + 1/(M N) + 1e-4)) (the package's, or the same formula)."""
    if nested_rhat_threshold is not None:
        return float(nested_rhat_threshold(chains_per_superchain, num_draws))
    return max(1.01, math.sqrt(1.0 + 1.0 / (chains_per_superchain * num_draws) + 1e-4))  # FALLBACK


def compute_nested_rhat(samples: torch.Tensor, superchain_ids: torch.Tensor) -> Tuple[list, str]:
    """Nested R-hat per parameter and where it came from.

    The package's function when present. It refuses layouts with no within-superchain variation at
    all (one chain per superchain and one draw per chain, i.e. ``W = 0``); for those the formula
    (the FALLBACK below) is evaluated directly and gives ``inf``, which the JSON records as such.
    """
    if nested_rhat is not None:
        try:
            value = nested_rhat(samples, superchain_ids)
        except ValueError as error:
            values = nested_rhat_fallback(samples.numpy(), superchain_ids.numpy()).reshape(-1)
            return [float(v) for v in values], f"formula (the package refuses this layout: {error})"
        return [float(v) for v in np.asarray(torch.as_tensor(value).detach().cpu()).reshape(-1)], NESTED_RHAT_SOURCE
    values = nested_rhat_fallback(samples.numpy(), superchain_ids.numpy()).reshape(-1)
    return [float(v) for v in values], NESTED_RHAT_SOURCE


# ------------------------------------------------------------------------------------- runs
class Recorder:
    """``hook_fn`` that keeps the positions of the first ``num`` chains every ``every`` steps."""

    def __init__(self, num: int, every: int = 1):
        self.num, self.every, self.path = num, every, []

    def __call__(self, kernel, params, stage, i):
        if (kernel.state.step - 1) % self.every == 0:  # the step of the whole run (i restarts at sampling)
            self.path.append(params["z"][: self.num].detach().clone())

    def trajectories(self) -> np.ndarray:
        return torch.stack(self.path, dim=1).numpy()  # (num, steps, 2)


def dispersed_starts(num: int, generator: torch.Generator) -> torch.Tensor:
    """Uniform on the box [-2.5, 2.5] x [-1.5, 1.5]: both basins, far from the modes."""
    u = torch.rand(num, 2, generator=generator)
    return torch.stack([5.0 * u[:, 0] - 2.5, 3.0 * u[:, 1] - 1.5], dim=-1)


def make_kernel(well: DoubleWell, args, temperature: float) -> SGHMC:
    return SGHMC(
        # the paper's protocol: every method (T = 0 ensembles, serial and parallel chains) at one fixed
        # step, so they differ only in how they use it; on the package's defaults each run would adapt its own
        well.model, step_size=args.step_size, friction=args.friction, temperature=temperature, num_data=args.num_data,
        adapt_step_size=False, adapt_mass_matrix=False, control_variate=None,
    )  # fmt: skip


def run_deep_ensemble(well, args, starts):
    recorder = Recorder(args.show)
    mcmc = MCMC(
        make_kernel(well, args, 0.0), num_samples=args.steps, warmup_steps=0, initial_params={"z": starts},
        num_chains=args.chains, chain_method="vectorized", keep_last=1, seed=args.seed, hook_fn=recorder,
        disable_progbar=True,
    )  # fmt: skip
    mcmc.run()
    return mcmc, recorder


def run_serial(well, args, start):
    mcmc = MCMC(
        make_kernel(well, args, 1.0), num_samples=args.steps - args.burn_in, warmup_steps=args.burn_in,
        initial_params={"z": start[None]}, num_chains=1, chain_method="vectorized", seed=args.seed + 1,
        disable_progbar=True,
    )  # fmt: skip
    mcmc.run()
    return mcmc


def run_parallel(well, args, starts):
    recorder = Recorder(args.show)
    mcmc = MCMC(
        make_kernel(well, args, 1.0), num_samples=args.steps, warmup_steps=0, initial_params={"z": starts},
        num_chains=args.chains, num_superchains=args.superchains, chain_method="vectorized", keep_last=1,
        seed=args.seed + 2, hook_fn=recorder, disable_progbar=True,
    )  # fmt: skip
    mcmc.run()
    return mcmc, recorder


# ---------------------------------------------------------------------------------- summaries
def summarise(name: str, draws: torch.Tensor, well: DoubleWell, exact: dict, rhat: list, extra: dict) -> dict:
    """Mode fractions and within-mode spreads of ``draws`` ``(n, 2)`` against the exact values."""
    x, y = draws[:, 0].double(), draws[:, 1].double()
    left = x < well.barrier
    out = {"method": name, "num_draws": int(x.numel())}
    for mode, mask in (("left", left), ("right", ~left)):
        n = int(mask.sum())
        out[mode] = {
            "fraction": n / x.numel(),
            "exact_weight": exact[mode]["weight"],
            "x_mean": float(x[mask].mean()) if n else float("nan"),
            "x_sd": float(x[mask].std()) if n > 1 else float("nan"),
            "exact_x_mean": exact[mode]["x_mean"],
            "exact_x_sd": exact[mode]["x_sd"],
        }
    out["y_sd"] = float(y.std()) if y.numel() > 1 else float("nan")
    out["exact_y_sd"] = exact["y_sd"]
    out["mode_weight_error"] = abs(out["left"]["fraction"] - exact["left"]["weight"])
    out["nested_rhat"] = {"x": rhat[0], "y": rhat[1] if len(rhat) > 1 else rhat[0]}
    out.update(extra)
    return out


def print_table(rows: list, exact: dict) -> None:
    print(
        f"\nexact mode weights: left {exact['left']['weight']:.3f}, right {exact['right']['weight']:.3f} "
        f"(barrier at x = {exact['barrier_x']:.3f}); exact within-mode sd of x: "
        f"{exact['left']['x_sd']:.3f} / {exact['right']['x_sd']:.3f}, sd of y: {exact['y_sd']:.3f}"
    )
    header = (
        f"{'method':<16} | {'draws':>7} | {'left':>6} | {'right':>6} | {'|err|':>6} | {'sd x L':>6} | "
        f"{'sd x R':>6} | {'sd y':>6} | {'nRhat x':>8} | {'nRhat y':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['method']:<16} | {r['num_draws']:7d} | {r['left']['fraction']:6.3f} | {r['right']['fraction']:6.3f} | "
            f"{r['mode_weight_error']:6.3f} | {r['left']['x_sd']:6.3f} | {r['right']['x_sd']:6.3f} | "
            f"{r['y_sd']:6.3f} | {_fmt(r['nested_rhat']['x']):>8} | {_fmt(r['nested_rhat']['y']):>8}"
        )
    print(
        f"{'exact':<16} | {'':>7} | {exact['left']['weight']:6.3f} | {exact['right']['weight']:6.3f} | {'':>6} | "
        f"{exact['left']['x_sd']:6.3f} | {exact['right']['x_sd']:6.3f} | {exact['y_sd']:6.3f} | {'1':>8} | {'1':>8}"
    )


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)[:8]


# ------------------------------------------------------------------------------------- plot
def plot(path: Path, well: DoubleWell, exact: dict, panels: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gx, gy = np.meshgrid(np.linspace(-2.6, 2.6, 300), np.linspace(-1.6, 1.6, 200))
    gu = well.energy_np(gx, gy)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), sharex=True, sharey=True)
    for ax, panel in zip(axes, panels):
        ax.contourf(gx, gy, gu, levels=np.linspace(gu.min(), gu.min() + 12, 25), cmap="Greys_r", extend="max")
        ax.contour(gx, gy, gu, levels=np.linspace(gu.min(), gu.min() + 12, 13), colors="k", linewidths=0.3)
        for trajectory in panel.get("trajectories", []):
            style = {"color": "tab:blue", "lw": panel.get("lw", 0.6), "alpha": panel.get("alpha", 0.5)}
            ax.plot(trajectory[:, 0], trajectory[:, 1], **style)
        starts = panel.get("starts")
        if starts is not None:
            ax.scatter(starts[:, 0], starts[:, 1], marker="x", s=30, color="tab:red", lw=1.2, zorder=4, label="start")
            ax.legend(loc="upper right", fontsize=8)
        points = panel["points"]
        ax.scatter(points[:, 0], points[:, 1], s=panel.get("size", 6), color="tab:orange", alpha=0.7, lw=0, zorder=3)
        ax.axvline(exact["barrier_x"], color="tab:red", lw=0.8, ls="--")
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("x")
        ax.set_xlim(-2.6, 2.6)
        ax.set_ylim(-1.6, 1.6)
    axes[0].set_ylabel("y")
    fig.suptitle(
        f"U(x, y) = {well.a:g}(x^2 - 1)^2 + {well.c:g}x + {well.b:g}y^2 at T = {well.temperature:g}: exact mode "
        f"weights {exact['left']['weight']:.2f} (left) / {exact['right']['weight']:.2f} (right)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def panel_title(label: str, row: dict) -> str:
    return (
        f"{label}\nleft/right {row['left']['fraction']:.2f}/{row['right']['fraction']:.2f}, "
        f"nested R-hat(x) = {_fmt(row['nested_rhat']['x'])}"
    )


# ------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="Deep ensemble vs serial vs parallel SGHMC on a 2-D double well.")
    parser.add_argument("--out", type=Path, default=Path("double_well_results"), help="output directory")
    parser.add_argument("--tiny", action="store_true", help="a few seconds: smoke test only")
    parser.add_argument("--chains", type=int, default=1024, help="ensemble members / parallel chains")
    parser.add_argument("--superchains", type=int, default=16, help="superchains of the parallel run")
    parser.add_argument("--steps", type=int, default=2000, help="steps per chain (all three methods)")
    parser.add_argument("--burn-in", type=int, default=200, help="serial chain: steps discarded (within --steps)")
    parser.add_argument("--serial-segments", type=int, default=4, help="serial chain: segments for nested R-hat")
    parser.add_argument("--step-size", type=float, default=0.2)
    parser.add_argument("--friction", type=float, default=1.0)
    parser.add_argument("--num-data", type=int, default=8, help="N: normalises drift and noise (time scale)")
    parser.add_argument("--barrier", type=float, default=3.0, help="a: barrier height in units of T")
    parser.add_argument("--tilt", type=float, default=0.5, help="c: tilt, the left mode is heavier for c > 0")
    parser.add_argument("--y-stiffness", type=float, default=5.0, help="b")
    parser.add_argument("--show", type=int, default=12, help="trajectories drawn in panels 1 and 3")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.tiny:
        args.chains, args.superchains, args.steps, args.burn_in, args.show = 32, 4, 60, 10, 4
    if args.chains % args.superchains:
        parser.error("--chains must be a multiple of --superchains")
    if not 0 <= args.burn_in < args.steps:
        parser.error("--burn-in must be in [0, --steps)")

    torch.set_num_threads(1)  # 2-D positions: one thread is fastest
    pyro.set_rng_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    well = DoubleWell(a=args.barrier, b=args.y_stiffness, c=args.tilt)
    exact = well.exact()
    generator = torch.Generator().manual_seed(args.seed)
    ensemble_starts = dispersed_starts(args.chains, generator)
    superchain_starts = dispersed_starts(args.superchains, generator)
    serial_start = dispersed_starts(1, generator)[0]
    started = time.perf_counter()
    rows, panels, timings = [], [], {}

    # 1. deep ensemble: T = 0 from dispersed starts, one point per member.
    t0 = time.perf_counter()
    ensemble, ensemble_path = run_deep_ensemble(well, args, ensemble_starts)
    timings["deep_ensemble_s"] = time.perf_counter() - t0
    samples = ensemble.get_samples(group_by_chain=True)["z"]  # (chains, 1, 2)
    rhat, source = compute_nested_rhat(samples, torch.arange(args.chains))
    row = summarise("deep ensemble", samples[:, -1], well, exact, rhat, {"temperature": 0.0})
    row["nested_rhat_source"] = source
    row["start_fraction_left_of_barrier"] = float((ensemble_starts[:, 0] < well.barrier).double().mean())
    row["nested_rhat_layout"] = f"{args.chains} superchains of M = 1 chain, 1 draw: W = 0"
    rows.append(row)
    panels.append({
        "title": panel_title(f"(1) deep ensemble: {args.chains} chains at T = 0, last point", row),
        "trajectories": ensemble_path.trajectories(), "points": samples[:, -1].numpy(), "size": 14,
    })  # fmt: skip

    # 2. serial SGHMC: one chain, every draw after burn-in.
    t0 = time.perf_counter()
    serial = run_serial(well, args, serial_start)
    timings["serial_s"] = time.perf_counter() - t0
    draws = serial.get_samples(group_by_chain=True)["z"][0]  # (draws, 2)
    segments = args.serial_segments
    length = draws.shape[0] // segments
    rhat, source = compute_nested_rhat(draws[: segments * length].reshape(segments, length, 2), torch.arange(segments))
    crossings = int(((draws[1:, 0] < well.barrier) != (draws[:-1, 0] < well.barrier)).sum())
    row = summarise("serial SGHMC", draws, well, exact, rhat, {"temperature": 1.0, "barrier_crossings": crossings})
    row["nested_rhat_source"] = source
    row["nested_rhat_layout"] = f"{segments} consecutive segments of {length} draws, M = 1"
    row["nested_rhat_threshold"] = rhat_threshold(1, length)
    rows.append(row)
    panels.append({
        "title": panel_title(f"(2) serial SGHMC: 1 chain, {draws.shape[0]} draws", row),
        "trajectories": [draws.numpy()], "points": draws[:: max(1, draws.shape[0] // 400)].numpy(),
        "alpha": 0.35, "lw": 0.4, "size": 5, "starts": serial_start[None].numpy(),
    })  # fmt: skip

    # 3. parallel SGHMC: many short chains in superchains, the last point of each.
    t0 = time.perf_counter()
    parallel, parallel_path = run_parallel(well, args, superchain_starts)
    timings["parallel_s"] = time.perf_counter() - t0
    samples = parallel.get_samples(group_by_chain=True)["z"]  # (chains, 1, 2)
    rhat, source = compute_nested_rhat(samples, parallel.superchain_ids)
    row = summarise("parallel SGHMC", samples[:, -1], well, exact, rhat, {"temperature": 1.0})
    row["nested_rhat_source"] = source
    per = args.chains // args.superchains
    row["nested_rhat_layout"] = f"K = {args.superchains} superchains x M = {per} chains, 1 draw"
    row["nested_rhat_threshold"] = rhat_threshold(per, 1)
    rows.append(row)
    panels.append({
        "title": panel_title(f"(3) parallel SGHMC: {args.chains} chains, last point", row),
        "trajectories": parallel_path.trajectories(), "points": samples[:, -1].numpy(), "alpha": 0.3, "lw": 0.3,
        "starts": superchain_starts.numpy(),
    })  # fmt: skip

    print_table(rows, exact)
    print(f"serial chain: {rows[1]['barrier_crossings']} barrier crossings in {args.steps - args.burn_in} draws")
    for row in rows:
        print(f"nested R-hat of {row['method']}: {row['nested_rhat_source']}")
    png = args.out / "double_well.png"
    plot(png, well, exact, panels)
    timings["total_s"] = time.perf_counter() - started
    result = {
        "potential": {"a": well.a, "b": well.b, "c": well.c, "temperature": well.temperature},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "exact": exact,
        "nested_rhat_source": NESTED_RHAT_SOURCE,
        "results": rows,
        "timings_s": timings,
        "png": str(png),
    }
    (args.out / "double_well.json").write_text(json.dumps(result, indent=2))
    times = ", ".join(f"{k} {v:.1f}" for k, v in timings.items())
    print(f"\nnested R-hat from {NESTED_RHAT_SOURCE}; times (s): {times}")
    print(f"wrote {png} and {args.out / 'double_well.json'}")
    return result


if __name__ == "__main__":
    main()
