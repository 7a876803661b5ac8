"""Curvature probes: Hessians, largest curvatures and gradient noise from minibatch gradients.

The warmup's adaptation (:mod:`~pyro_sgmcmc.kernels.preconditioning`) measures the potential's curvature at the
chains' points without second derivatives: a Hessian-vector product is the central difference of two gradients,

.. math:: H u \\approx \\frac{\\nabla \\hat U_S(z + h u) - \\nabla \\hat U_S(z - h u)}{2 h},
          \\qquad h = \\epsilon_{\\mathrm{mach}}^{1/3} \\max(|z|_\\infty, 1) / |u|,

with the *same* minibatch :math:`S` on both sides (the difference then has no minibatch noise of its own), all
probes of all chains in one vectorised call. :class:`CurvatureProbes` is a value holding what the probes need
from a kernel, as callables: the gradient estimate (``evaluate``) and the next minibatch (``next_indices``). Each
probe returns its result and the number of gradient evaluations (per chain) it spent.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, NamedTuple, Sequence, Tuple

import torch

from .warmup import DRIFT_NOISE_MINIBATCHES

__all__ = ["CurvatureProbes", "EXACT_DIAGONAL_MAX_DIM", "NUM_PROBES", "POWER_ITERATIONS"]

#: Up to this dimension the Hessian is probed along every coordinate (dense); above, its diagonal by Rademacher probes.
EXACT_DIAGONAL_MAX_DIM = 64
NUM_PROBES = 16
POWER_ITERATIONS = 12


class CurvatureProbes(NamedTuple):
    """Finite-difference curvature probes at the chains' points.

    Parameters
    ----------
    evaluate : callable
        ``evaluate(positions, indices) -> (U, dU/dz)``: the kernel's gradient estimate, ``(C,)`` and ``(C, D)``
        at ``(C, D)`` positions (:meth:`~pyro_sgmcmc.kernels.base.SGMCMCKernel.evaluate`).
    next_indices : callable
        ``next_indices() -> {plate: (C, B) indices}``: each chain's next minibatch.
    plates : sequence
        The subsampled plates the minibatches are drawn for (none: the gradient is exact, no noise).
    num_data : int
        :math:`N`, the normaliser of the drift.
    """

    evaluate: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], Tuple[torch.Tensor, torch.Tensor]]
    next_indices: Callable[[], Mapping[str, torch.Tensor]]
    plates: Sequence
    num_data: int

    def gradient_differences(self, points: torch.Tensor, directions: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """Central differences ``(g(z + h u) - g(z - h u)) / (2 h)`` of the (unnormalised) gradient of U.

        ``points`` ``(C, D)``, ``directions`` ``(C, K, D)``, ``steps`` ``(C, K)``; returns ``(C, K, D)``.
        Both sides of a probe use the same minibatch; all probes run in one vectorised call.
        """
        C, K, D = directions.shape
        shift = directions * steps.unsqueeze(-1)
        plus = (points.unsqueeze(1) + shift).reshape(C * K, D)
        minus = (points.unsqueeze(1) - shift).reshape(C * K, D)
        indices = self.next_indices()  # (C, B) per plate: chain c's minibatch for all its probes
        rows = {k: v.repeat_interleave(K, 0) for k, v in indices.items()}
        both = {k: torch.cat([v, v]) for k, v in rows.items()}
        _, grads = self.evaluate(torch.cat([plus, minus]), both)
        difference = (grads[: C * K] - grads[C * K :]).reshape(C, K, D)
        return difference / (2 * steps.unsqueeze(-1))

    def hessian(self, position: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """The Hessian of U at each chain's point, ``(C, D, D)`` (``dim <= 64``: one probe per
        coordinate), or only its diagonal ``(C, D)`` from Rademacher probes for larger ``dim``; and the
        evaluations spent (two per probe)."""
        C, D = position.shape
        h = _difference_step(position.dtype)
        if D <= EXACT_DIAGONAL_MAX_DIM:
            eye = torch.eye(D, dtype=position.dtype, device=position.device)
            directions = eye.expand(C, D, D)
            steps = h * position.abs().clamp_min(1.0)  # (C, D): one probe per coordinate
            return self.gradient_differences(position, directions, steps), 2 * D  # row i: H e_i
        # Rademacher probes (deterministic signs: no draw from the chains' streams)
        generator = torch.Generator(device="cpu").manual_seed(0)
        signs = (torch.randint(0, 2, (NUM_PROBES, D), generator=generator) * 2 - 1).to(position)
        directions = signs.expand(C, NUM_PROBES, D)
        steps = torch.full((C, NUM_PROBES), h, dtype=position.dtype, device=position.device)
        steps = steps * position.abs().amax(-1, keepdim=True).clamp_min(1.0) / math.sqrt(D)
        hv = self.gradient_differences(position, directions, steps)
        return (hv * directions).mean(1), 2 * NUM_PROBES

    def largest_curvature(self, position: torch.Tensor, factor: torch.Tensor, full: bool) -> Tuple[torch.Tensor, int]:
        """Power iteration for the largest absolute eigenvalue of :math:`L^\\top H L / N` per chain, ``(C,)``,
        with ``factor`` :math:`L` (``(C, D, D)`` if ``full``, else its diagonal ``(C, D)``); and the evaluations
        spent (two per iteration)."""
        C, D = position.shape
        h = _difference_step(position.dtype)
        v = torch.ones(C, D, dtype=position.dtype, device=position.device)
        v = v + 0.1 * torch.linspace(-1, 1, D, dtype=position.dtype, device=position.device)  # not an eigenvector
        v = v / v.norm(dim=-1, keepdim=True)
        lam = torch.zeros(C, dtype=position.dtype, device=position.device)
        for _ in range(POWER_ITERATIONS):
            u = torch.einsum("cij,cj->ci", factor, v) if full else factor * v  # z-space direction
            size = u.norm(dim=-1).clamp_min(torch.finfo(u.dtype).tiny)
            steps = (h * position.abs().amax(-1).clamp_min(1.0) / size).unsqueeze(-1)
            hu = self.gradient_differences(position, u.unsqueeze(1), steps).squeeze(1) / self.num_data
            hv = torch.einsum("cji,cj->ci", factor, hu) if full else factor * hu
            lam = (hv * v).sum(-1).abs()
            norm = hv.norm(dim=-1, keepdim=True)
            ok = torch.isfinite(norm) & (norm > 0)
            v = torch.where(ok, hv / norm.clamp_min(torch.finfo(norm.dtype).tiny), v)
        return torch.where(torch.isfinite(lam), lam, torch.zeros_like(lam)), 2 * POWER_ITERATIONS

    def drift_noise_covariance(self, position: torch.Tensor) -> Tuple[torch.Tensor, int]:
        """Covariance of the minibatch drift ``grad U / N`` in z units from ``DRIFT_NOISE_MINIBATCHES`` (:math:`K`)
        minibatches at the chains' points: ``(C, D, D)`` for ``dim <= 64``, else its diagonal ``(C, D)`` (0 for a
        full batch); and the evaluations spent.

        Accumulated one minibatch at a time (memory of one gradient, not :math:`K`), about the first drift
        :math:`d_1` so that no large mean cancels: with :math:`c_k = d_k - d_1`,

        .. math:: \\hat V = \\frac{1}{K - 1} \\Big(\\sum_k c_k c_k^\\top - \\frac{1}{K}
                  \\big(\\textstyle\\sum_k c_k\\big)\\big(\\textstyle\\sum_k c_k\\big)^\\top\\Big).
        """
        C, D = position.shape
        dense = D <= EXACT_DIAGONAL_MAX_DIM
        if not self.plates:
            return position.new_zeros((C, D, D) if dense else (C, D)), 0
        count = DRIFT_NOISE_MINIBATCHES
        first = None
        for _ in range(count):
            drift = self.evaluate(position, self.next_indices())[1] / self.num_data
            if first is None:
                first = drift
                total = torch.zeros_like(drift)
                squares = position.new_zeros((C, D, D) if dense else (C, D))
                continue
            centred = drift - first
            total = total + centred
            squares = squares + (centred.unsqueeze(-1) * centred.unsqueeze(-2) if dense else centred * centred)
        outer = total.unsqueeze(-1) * total.unsqueeze(-2) if dense else total * total
        covariance = (squares - outer / count) / (count - 1)
        return torch.where(torch.isfinite(covariance), covariance, torch.zeros_like(covariance)), count


def _difference_step(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps ** (1.0 / 3.0)
