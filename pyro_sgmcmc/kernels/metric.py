"""The metric (inverse mass matrix) from a curvature estimate: a pure, regularised function.

Given a chain's normalised curvature :math:`\\bar H = \\nabla^2 U / N` (dense ``(C, D, D)``, or its diagonal ``(C, D)``
for large ``dim``), the metric is :math:`P = L L^\\top = |\\bar H|^{-1}` (SoftAbs-like: the eigenvalues in absolute
value), returned as its factor :math:`L = V |\\Lambda|^{-1/2}` (``full_mass``) or the square roots of the diagonal of
:math:`|\\bar H|^{-1}` (the marginal variances of the local Gaussian, times ``N / T``); for a diagonal-only curvature,
Jacobi: :math:`P = 1 / |\\mathrm{diag}\\, \\bar H|`. Regularisation, so that a flat or saturated direction cannot
blow the metric up: the absolute eigenvalues are floored at the largest over ``MAX_CONDITION`` and, in the initial
buffer (``transient``), at the median over ``TRANSIENT_CONDITION``; given the curvature the gradients see
(``fisher``), each eigendirection takes the larger of the two; given the spread of the chain's draws (``spread``),
the variance along each direction is at most ``SPREAD_CAP`` times the draws'. A chain whose result is not finite
keeps its ``previous`` factor (the identity if it has none).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["MAX_CONDITION", "TRANSIENT_CONDITION", "SPREAD_CAP", "regularised_factor", "curvature_floor"]

#: Largest condition number of the metric: the absolute eigenvalues of the curvature (or the diagonal's entries)
#: are floored at the largest over this, so a flat or saturated direction cannot blow the metric up.
MAX_CONDITION = 1e12
#: In the initial buffer (the chain may still be far from the typical set, where the Hessian can be nearly
#: flat in some direction: a linear tail such as ``-log tau`` as ``tau -> 0``), the curvature is floored at
#: the median absolute eigenvalue over this: no direction gets more than this many times the typical variance.
TRANSIENT_CONDITION = 1e2
#: From the slow phase on, the metric's variance along each curvature eigendirection is capped at this
#: multiple of the variance of the chain's own slow-phase draws along it (a curvature-flat direction in
#: which the chain does not in fact spread cannot take a huge metric).
SPREAD_CAP = 10.0


def curvature_floor(curvature: torch.Tensor, transient: bool) -> torch.Tensor:
    """Per chain ``(C, 1)``: the largest absolute eigenvalue over ``MAX_CONDITION``, and in the initial buffer at
    least the median over ``TRANSIENT_CONDITION``."""
    floor = curvature.amax(-1, keepdim=True) / MAX_CONDITION
    if transient:
        floor = floor.maximum(curvature.median(-1, keepdim=True).values / TRANSIENT_CONDITION)
    return floor


def regularised_factor(
    hessian: torch.Tensor,
    previous: Optional[torch.Tensor],
    full_mass: bool,
    transient: bool = False,
    spread: Optional[torch.Tensor] = None,
    fisher: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The factor :math:`L` of :math:`P = |H|^{-1}`, regularised (module docstring).

    Parameters
    ----------
    hessian : Tensor ``(C, D, D)`` or ``(C, D)``
        The normalised curvature :math:`\\nabla^2 U / N` per chain (or its diagonal).
    previous : Tensor or None
        The chains' current factors, kept by a chain whose new one is not finite.
    full_mass : bool
        Return the dense factor ``(C, D, D)``; otherwise its diagonal form ``(C, D)``.
    transient : bool
        In the initial buffer: floor the curvature at the median over ``TRANSIENT_CONDITION`` too.
    spread, fisher : Tensor, optional
        The covariance of the chain's draws and the gradients' curvature, both in normalised units.
    """
    tiny = torch.finfo(hessian.dtype).tiny
    # a chain with a non-finite Hessian entry keeps its previous metric (below)
    bad = ~torch.isfinite(hessian).flatten(1).all(-1)
    if bool(bad.any()):
        fill = torch.full_like(hessian, float("nan"))
        hessian = torch.where(bad.view((-1,) + (1,) * (hessian.dim() - 1)), fill, hessian)
    if hessian.dim() == 3:  # (C, D, D): eigenvalues in absolute value (SoftAbs-like)
        hessian = 0.5 * (hessian + hessian.transpose(-1, -2))
        finite = torch.isfinite(hessian).flatten(1).all(-1).view(-1, 1, 1)
        eye = torch.eye(hessian.shape[-1], dtype=hessian.dtype, device=hessian.device)
        eigenvalues, vectors = torch.linalg.eigh(torch.where(finite, hessian, eye))
        eigenvalues = torch.where(finite.squeeze(-1), eigenvalues, torch.full_like(eigenvalues, float("nan")))
        curvature = eigenvalues.abs()
        if fisher is not None:  # the larger of the two curvature estimates along each eigenvector (safe side)
            if fisher.dim() == 2:
                fisher = torch.diag_embed(fisher)
            seen = torch.einsum("cdi,cde,cei->ci", vectors, fisher, vectors)
            curvature = torch.where(torch.isfinite(seen), curvature.maximum(seen), curvature)
        floor = curvature_floor(curvature, transient) + tiny
        if spread is not None:  # variance along eigenvector v_i at most SPREAD_CAP v_i' S v_i
            if spread.dim() == 2:
                spread = torch.diag_embed(spread)
            along = torch.einsum("cdi,cde,cei->ci", vectors, spread, vectors)
            floor = torch.where(along > 0, floor.maximum(1.0 / (SPREAD_CAP * along)), floor)
        factor = vectors * curvature.maximum(floor).rsqrt().unsqueeze(-2)  # V |Lambda|^-1/2
        # full_mass: V |Lambda|^-1/2; else the diagonal of |H|^-1, the marginal variances of the local Gaussian
        factor = factor if full_mass else (factor * factor).sum(-1).sqrt()
    else:  # (C, D) diagonal only (large D): Jacobi, P = 1 / |diag H|
        curvature = hessian.abs()  # a non-finite entry makes the chain keep its metric (below)
        if fisher is not None:
            seen = fisher.diagonal(dim1=-2, dim2=-1) if fisher.dim() == 3 else fisher
            curvature = torch.where(torch.isfinite(seen), curvature.maximum(seen), curvature)
        floor = curvature_floor(curvature, transient) + tiny
        if spread is not None:
            variance = spread.diagonal(dim1=-2, dim2=-1) if spread.dim() == 3 else spread
            floor = torch.where(variance > 0, floor.maximum(1.0 / (SPREAD_CAP * variance)), floor)
        scale = curvature.maximum(floor).rsqrt()
        factor = torch.diag_embed(scale) if full_mass else scale
    ok = torch.isfinite(factor).flatten(1).all(-1)
    if bool(ok.all()):
        return factor
    if previous is None:  # no metric yet: the identity
        ones = torch.ones(factor.shape[:2], dtype=factor.dtype, device=factor.device)
        previous = torch.diag_embed(ones) if full_mass else ones
    return torch.where(ok.view(ok.shape + (1,) * (factor.dim() - 1)), factor, previous)
