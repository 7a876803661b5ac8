"""PROTOTYPES of a faster vectorised step (``vectorized_chains.py --prototypes``, on by default).

*Not* package code: they show what a change to ``pyro_sgmcmc/`` would buy, by timing the package's step with
pieces swapped (:class:`PrototypeStep`): ``cheap-finite`` (``isfinite(U + grad.sum(-1))`` instead of
``isfinite(U) & isfinite(grad).all(-1)``), ``fused-update`` (the SGHMC update with in-place ops on a new
momentum tensor), ``split-unpack`` (``position.split`` in ``log_density`` instead of one slice per site) and
all three; each must reproduce the package's trajectory (same seed, same start). The variants and the hand
loop are timed in interleaved blocks, the best block per variant and clock.
"""

from __future__ import annotations

import math
from typing import Callable, Dict

import pyro
import torch

from pyro_sgmcmc.kernels.diffusions import underdamped_step

if __package__:
    from . import harness
    from . import vectorized_chains as vc
else:
    import harness

    vc = harness.companion("vectorized_chains", None)


class PrototypeStep:
    """PROTOTYPE, not package code: ``SGMCMCKernel.step`` for SGHMC with pieces swapped.

    fused_update
        The SGHMC update in place (``mul_``/``add_`` on the momentum, one ``add`` for the position)
        instead of ``drift = grad * (-1/N)`` and ``underdamped_step``'s five new tensors.
    cheap_finite
        ``isfinite(U + grad.sum(-1))`` instead of ``isfinite(U) & isfinite(grad).all(-1)``: NaN and
        inf propagate through the sum, and ``isfinite`` runs on 256 numbers instead of 770,560.
    split_unpack
        ``ModelPotential.log_density`` splitting the flat position with ``position.split(sizes)``
        (backward: one ``cat``) instead of one slice per site (backward: a zero-filled full-size
        gradient per site, then added up).
    """

    def __init__(self, kernel, fused_update: bool = False, cheap_finite: bool = False, split_unpack: bool = False):
        self.kernel, self.fused_update, self.cheap_finite = kernel, fused_update, cheap_finite
        self.inverse_num_data = 1.0 / kernel.potential.num_data
        if split_unpack:
            potential = kernel.potential
            potential.log_density = _split_log_density.__get__(potential)  # this instance only

    def __call__(self):
        k = self.kernel
        state = k.state
        eps = k.step_size(state.step)
        noise = k.generators.normal(state.position.shape[1:], state.position.dtype, step=state.step)
        if self.fused_update:
            momentum = state.momentum.mul(1.0 - eps * k.friction / k.mass)
            momentum.add_(state.grad, alpha=-eps * self.inverse_num_data)
            momentum.add_(noise, alpha=math.sqrt(2.0 * eps * k.noise_temperature * k.friction))
            position = state.position.add(momentum, alpha=eps / k.mass)
        else:
            drift = state.grad * (-self.inverse_num_data)
            position, momentum = underdamped_step(
                state.position, state.momentum, drift, eps, k.noise_temperature, k.friction, k.mass, noise
            )
        energy, grad = k.potential.batched_potential_and_grad(position, k.minibatches.next())
        if self.cheap_finite:
            finite = torch.isfinite(energy + grad.sum(-1))
        else:
            finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1)
        if not bool(finite.all()):
            raise RuntimeError("divergence in the prototype benchmark")
        k.state = state.replace(position=position, momentum=momentum, potential=energy, grad=grad, step=state.step + 1)
        return k.state


def _split_log_density(self, position, indices=None):
    """PROTOTYPE of ``ModelPotential.log_density``: ``position.split`` instead of per-site slices."""
    values = self._values
    values.clear()
    if indices:
        values.update(indices)
    log_det = position.new_zeros(())
    for site, part in zip(self.sites, position.split([site.numel for site in self.sites], -1)):
        u = part.view(site.unconstrained_shape)
        value = site.transform(u)
        values[site.name] = value
        if site.has_jacobian:
            log_det = log_det + site.transform.log_abs_det_jacobian(u, value).sum()
    trace = pyro.poutine.trace(self._conditioned_model).get_trace(*self.model_args, **self.model_kwargs)
    return trace.log_prob_sum() + log_det


PROTOTYPES = {
    "PROTOTYPE cheap-finite": {"cheap_finite": True},
    "PROTOTYPE fused-update": {"fused_update": True},
    "PROTOTYPE split-unpack": {"split_unpack": True},
    "PROTOTYPE all three": {"cheap_finite": True, "fused_update": True, "split_unpack": True},
}


def run_prototypes(x, y, init: torch.Tensor, seed: int, number: int, repeat: int) -> dict:
    """CPU ms per step of the package's step, each prototype and the hand loop, interleaved."""
    fns: Dict[str, Callable] = {}
    kernels = {}
    for name in ["package step", *PROTOTYPES]:
        kernel = kernels[name] = vc.vectorized_kernel(x, y, init, seed)
        fns[name] = kernel.step if name == "package step" else PrototypeStep(kernel, **PROTOTYPES[name])
    fns["hand"] = vc.hand_chains(x, y, init, seed).step
    with pyro.validation_enabled(False):
        for fn in fns.values():
            for _ in range(vc.SKIP):
                fn()
        # same seed, same start: every prototype must reproduce the package's trajectory
        reference = kernels["package step"].state.position
        agreement = {name: float((k.state.position - reference).abs().max()) for name, k in kernels.items()}
        wall = {name: math.inf for name in fns}
        cpu = {name: math.inf for name in fns}
        for _ in range(repeat):  # interleaved blocks, best block per variant and clock
            for name, fn in fns.items():
                start = harness.now()
                for _ in range(number):
                    fn()
                end = harness.now()
                wall[name] = min(wall[name], 1e3 * (end[0] - start[0]) / number)
                cpu[name] = min(cpu[name], 1e3 * (end[1] - start[1]) / number)
    out = {}
    for name in fns:
        out[name] = {
            "wall_ms_per_step": wall[name],
            "cpu_ms_per_step": cpu[name],
            "wall_ratio_to_hand": wall[name] / wall["hand"],
            "cpu_ratio_to_hand": cpu[name] / cpu["hand"],
        }
        if name in agreement:
            out[name][f"max_abs_position_diff_to_package_after_{vc.SKIP}_steps"] = agreement[name]
    return out


def print_prototypes(prototypes: dict) -> None:
    """The prototypes' table, per thread count: ms per step and the ratio to the hand loop."""
    for threads, rows in prototypes.items():
        print(f"\nPROTOTYPE variants of the step (NOT package code), threads={threads}: ms, ratio to hand")
        for name, row in rows.items():
            diff = {k: v for k, v in row.items() if k.startswith("max_abs")}
            agree = f"  (max |dz| vs package {next(iter(diff.values())):.1e})" if diff else ""
            print(
                f"  wall {row['wall_ms_per_step']:7.2f} (x{row['wall_ratio_to_hand']:.2f})  cpu "
                f"{row['cpu_ms_per_step']:7.2f} (x{row['cpu_ratio_to_hand']:.2f})  {name}{agree}"
            )
