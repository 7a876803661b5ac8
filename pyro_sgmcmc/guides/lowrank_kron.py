r"""A Kronecker-factored precision whose large factors keep only their top eigenpairs (Laplace-LoRA).

A weight of shape ``(out, in)`` has the K-FAC curvature block :math:`G \otimes A` (see
:mod:`pyro_sgmcmc.guides.kron`). For a LoRA adapter one factor is small (the rank :math:`r` of
the adapter) and the other large (the width of the layer, 384 to 4096): ``lora_A`` of shape
``(r, in)`` has :math:`A` of size ``in x in``, ``lora_B`` of shape ``(out, r)`` has :math:`G` of
size ``out x out``. Following Yang et al. (2024), every factor of dimension above ``rank``
:math:`k` is replaced by its best rank-:math:`k` approximation :math:`A_k = U_k S_k U_k^\top`
(its top :math:`k` eigenpairs, Eckart-Young), so that with orthonormal columns
:math:`Q = U_G \otimes U_A` (some of them truncated) and :math:`E = s_G \otimes s_A`,

.. math::
    \Lambda = s\,(G_k \otimes A_k) + \lambda I
            = Q \operatorname{diag}(sE + \lambda) Q^\top + \lambda (I - Q Q^\top),

a block that is exactly invertible without the discarded eigenvectors:

.. math::
    \Lambda^{p} v = \lambda^{p} v + Q \big[((sE + \lambda)^{p} - \lambda^{p}) \circ Q^\top v\big], \qquad
    \log\det\Lambda = \textstyle\sum \log(sE + \lambda) + (d_s - |E|) \log\lambda .

The approximation error of a block is :math:`\|G\otimes A - G\otimes A_k\|_F = \|G\|_F
(\sum_{i>k} s_{A,i}^2)^{1/2}`. Memory is :math:`O(\mathrm{out}\cdot k_G + \mathrm{in}\cdot k_A)`
per weight instead of :math:`O(\mathrm{out}^2 + \mathrm{in}^2)` (the eigendecomposition of a
factor still needs the factor itself once). With ``rank=None`` nothing is truncated and the block
equals :class:`~pyro_sgmcmc.guides.kron.KronPrecision`'s.
"""

from __future__ import annotations

import copy
from typing import Dict, List, Optional, Tuple

import torch

from .curvature.kinds import MAX_FULL_DIM
from .kron import KroneckerBlocks

__all__ = ["LowRankKronPrecision", "top_eigenpairs"]


def top_eigenpairs(factor: torch.Tensor, rank: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(values, vectors)`` of the symmetric PSD ``factor``, the ``rank`` largest kept (all if ``None``).

    Eigenvalues below zero (rounding of a PSD matrix) are clamped to zero.
    """
    values, vectors = torch.linalg.eigh(0.5 * (factor + factor.T))
    values = values.clamp(min=0)
    if rank is not None and rank < values.shape[0]:
        values, vectors = values[-rank:], vectors[:, -rank:]
    return values, vectors


class LowRankKronPrecision(KroneckerBlocks):
    r"""Block-diagonal :math:`\Lambda` with one (possibly truncated) Kronecker block per site.

    Parameters
    ----------
    factors : dict
        ``{site: (G, A)}`` for a weight of shape ``(out, in)`` or ``{site: (G,)}`` for a bias.
    slices : dict
        ``{site: slice}`` of each site in the flat vector (row-major ``vec`` of a weight).
    rank : int, optional
        Keep the top ``rank`` eigenpairs of every factor of larger dimension (``None``: all).
    prior_precision : Tensor ``(num_sites,)``, optional
        The isotropic :math:`\lambda_s` per site in the order of ``slices`` (default 1).
    """

    has_layer_factors = False

    def __init__(self, factors: Dict[str, Tuple[torch.Tensor, ...]], slices: Dict[str, slice],
                 rank: Optional[int] = None, prior_precision: Optional[torch.Tensor] = None) -> None:  # fmt: skip
        super().__init__(slices)
        self.names: List[str] = list(slices)
        self.rank = rank
        self.factors = {name: tuple(parts) for name, parts in factors.items()}
        self.eigen = {name: [top_eigenpairs(f, rank) for f in factors[name]] for name in self.names}
        self.shapes = {name: tuple(f.shape[0] for f in factors[name]) for name in self.names}
        if prior_precision is None:
            first = factors[self.names[0]][0]
            prior_precision = torch.ones(len(self.names), dtype=first.dtype, device=first.device)
        self.set_prior_precision(prior_precision)

    dtype = property(lambda self: self.eigen[self.names[0]][0][0].dtype)
    device = property(lambda self: self.eigen[self.names[0]][0][0].device)

    def set_prior_precision(self, prior_precision: torch.Tensor, likelihood_scale=1.0) -> None:
        """Use :math:`s\\,G_k \\otimes A_k + \\lambda_s I` per site (``prior_precision`` one per site)."""
        self.prior_precision = prior_precision
        self.likelihood_scale = likelihood_scale
        self.spectrum = {}
        for name in self.names:
            pairs = self.eigen[name]
            values = torch.outer(pairs[0][0], pairs[1][0]) if len(pairs) == 2 else pairs[0][0]
            self.spectrum[name] = values * likelihood_scale

    def site_prior(self, name: str) -> torch.Tensor:
        return self.prior_precision[self.names.index(name)]

    def with_prior(self, prior, likelihood_scale=1.0, what: str = "prior precision") -> "LowRankKronPrecision":
        """A copy with the prior :math:`\\mathrm{diag}(p)`, ``prior`` of shape ``(d,)`` constant within each site."""
        other = copy.copy(self)
        other.set_prior_precision(self.site_values(prior, what), likelihood_scale)
        return other

    def double(self) -> "LowRankKronPrecision":
        other = copy.copy(self)
        other.eigen = {n: [(v.double(), u.double()) for v, u in pairs] for n, pairs in self.eigen.items()}
        other.factors = {n: tuple(f.double() for f in parts) for n, parts in self.factors.items()}
        other.set_prior_precision(self.prior_precision.double(), self.likelihood_scale)
        return other

    def site(self, name: str) -> "LowRankKronPrecision":
        """The block of one site, as a precision over that site's own flat vector."""
        other = copy.copy(self)
        where = self.slices[name]
        other.names, other.slices = [name], {name: slice(0, where.stop - where.start)}
        other.set_prior_precision(self.site_prior(name).reshape(1), self.likelihood_scale)
        return other

    # ---------------------------------------------------------------- Q^T v and Q v
    def _project(self, name: str, block: torch.Tensor) -> torch.Tensor:
        """:math:`Q^\\top v` for ``block`` of shape ``(..., *site shape)``: ``(..., k_G[, k_A])``."""
        pairs = self.eigen[name]
        if len(pairs) == 2:
            return pairs[0][1].T @ block @ pairs[1][1]
        return block @ pairs[0][1]

    def _lift(self, name: str, block: torch.Tensor) -> torch.Tensor:
        """:math:`Q c` for coefficients ``block`` of shape ``(..., k_G[, k_A])``."""
        pairs = self.eigen[name]
        if len(pairs) == 2:
            return pairs[0][1] @ block @ pairs[1][1].T
        return block @ pairs[0][1].T

    def apply_power(self, vector: torch.Tensor, power: float) -> torch.Tensor:
        """:math:`\\Lambda^{p} v` for ``vector`` of shape ``(..., d)``."""
        lead = vector.shape[:-1]
        out = torch.empty_like(vector)
        for name in self.names:
            where, lam = self.slices[name], self.site_prior(name)
            block = vector[..., where].reshape(lead + self.shapes[name])
            change = (self.spectrum[name] + lam) ** power - lam**power
            result = block * lam**power + self._lift(name, self._project(name, block) * change)
            out[..., where] = result.reshape(lead + (-1,))
        return out

    def solve(self, vector):
        return self.apply_power(vector, -1.0)

    def whiten(self, jacobian):
        """:math:`W = J\\Lambda^{-1/2}` (``(..., K, d)``): :math:`WW^\\top = J\\Lambda^{-1}J^\\top`."""
        return self.apply_power(jacobian, -0.5)

    def quadratic(self, vector):
        return (vector * self.solve(vector)).sum()

    def logdet(self) -> torch.Tensor:
        total = 0.0
        for name in self.names:
            lam, spectrum = self.site_prior(name), self.spectrum[name]
            flat = self.slices[name].stop - self.slices[name].start - spectrum.numel()
            total = total + (spectrum + lam).log().sum() + flat * lam.log()
        return total

    def variances(self) -> torch.Tensor:
        """:math:`\\operatorname{diag}\\Lambda^{-1} = 1/\\lambda + (U_G^{\\circ 2}) C (U_A^{\\circ 2})^\\top`,
        :math:`C = (sE+\\lambda)^{-1} - \\lambda^{-1}`."""
        out = torch.empty(self.dim, dtype=self.dtype, device=self.device)
        for name in self.names:
            pairs, lam = self.eigen[name], self.site_prior(name)
            change = (self.spectrum[name] + lam).reciprocal() - lam.reciprocal()
            if len(pairs) == 2:
                block = pairs[0][1].pow(2) @ change @ pairs[1][1].pow(2).T
            else:
                block = pairs[0][1].pow(2) @ change
            out[self.slices[name]] = (block + lam.reciprocal()).reshape(-1)
        return out

    def covariance(self):
        if self.dim > MAX_FULL_DIM:
            raise ValueError(f"the dense covariance of a 'kron' approximation is limited to d <= {MAX_FULL_DIM}")
        return self.solve(torch.eye(self.dim, dtype=self.dtype, device=self.device))

    def check(self) -> None:
        bad = [
            name for name in self.names
            if not (self.site_prior(name) > 0 and bool((self.spectrum[name] + self.site_prior(name) > 0).all()))
        ]  # fmt: skip
        if bad:
            raise ValueError(
                f"the Laplace precision is not positive for sites {bad}: a truncated or flat Kronecker block needs "
                "a positive prior precision; pass prior_precision=... > 0"
            )

    def describe_factors(self) -> str:
        """The kept eigenvectors' shapes per site, ``{w: (out, k) x (in, k), b: (out, k)}``."""
        sites = (f"{name}: " + " x ".join(str(tuple(u.shape)) for _, u in self.eigen[name]) for name in self.names)
        return "{" + ", ".join(sites) + "}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, factors: {self.describe_factors()})"
