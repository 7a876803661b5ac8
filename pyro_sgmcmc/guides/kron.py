"""Kronecker-factored (K-FAC) Laplace precisions, and the Gaussian they define.

For a layer :math:`z_n = W a_n + b` the per-example gradient of a row :math:`r_{nk}` (a whitened
output of the GGN, see :class:`~pyro_sgmcmc.guides.curvature.Curvature`) with respect to the
row-major ``vec(W)`` is :math:`\\delta_{nk} \\otimes a_n`, :math:`\\delta_{nk} = \\partial r_{nk} /
\\partial z_n`, so the weight's GGN block is :math:`\\sum_n G_n \\otimes a_n a_n^\\top` with
:math:`G_n = \\sum_k \\delta_{nk}\\delta_{nk}^\\top`. K-FAC replaces it by

.. math:: G \\otimes A, \\qquad G = \\sum_n G_n, \\qquad A = \\frac1N \\sum_n a_n a_n^\\top,

exact when :math:`G_n` is the same for every example (a single linear layer with a Gaussian
likelihood of fixed scale, where :math:`G_n = I / \\sigma^2`). The bias block
:math:`\\sum_n G_n = G` is exact. Blocks of different sites are treated as independent (the
precision is block diagonal over sites), and each site gets an isotropic prior precision
:math:`\\lambda_s`, so that with :math:`G = U_G S_G U_G^\\top` and :math:`A = U_A S_A U_A^\\top`

.. math:: \\Lambda_s = G \\otimes A + \\lambda_s I = (U_G \\otimes U_A)
          \\operatorname{diag}(s_G \\otimes s_A + \\lambda_s) (U_G \\otimes U_A)^\\top .

Every operation then costs two small matrix products per layer: :math:`(U_G \\otimes U_A)^\\top
\\operatorname{vec}(V) = \\operatorname{vec}(U_G^\\top V U_A)` for ``V`` of the weight's shape
``(out, in)``. Memory is :math:`O(\\mathrm{out}^2 + \\mathrm{in}^2)` per layer.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Dict, List, Sequence, Tuple

import torch
from pyro.distributions import TorchDistribution, constraints

from .curvature.kinds import MAX_FULL_DIM
from .precision import Precision
from .sites import reshaped

__all__ = ["KronPrecision", "KroneckerBlocks", "KroneckerPrecision", "KroneckerNormal"]


class KroneckerBlocks(Precision):
    """What every Kronecker-factored precision shares (:class:`KronPrecision` and
    :class:`~pyro_sgmcmc.guides.lowrank_kron.LowRankKronPrecision`): the distribution over the whole latent
    vector and over one site, the marginal precisions and the dense matrix, all through the subclass's
    :meth:`apply_power`, :meth:`variances` and :meth:`site`."""

    def distribution(self, loc):
        return KroneckerNormal(loc, self)

    def site_distribution(self, loc, name, shape, event_dim):
        """The site's own Kronecker block: the whole site is one event."""
        return reshaped(KroneckerNormal(loc[self.slices[name]].clone(), self.site(name)), shape)

    def as_tensor(self):
        return self.variances().reciprocal()

    def dense(self) -> torch.Tensor:
        """The dense ``(d, d)`` precision (tests and small models only)."""
        return self.apply_power(torch.eye(self.dim, dtype=self.dtype, device=self.device), 1.0)


class KronPrecision(KroneckerBlocks):
    """A block-diagonal precision with one Kronecker-factored block per site (potential or guide order).

    The :class:`~pyro_sgmcmc.guides.precision.Precision` interface, with every operation done in
    the eigenbases of the factors (see the module).

    Parameters
    ----------
    factors : dict
        ``{site: (G, A)}`` for a weight of shape ``(out, in)`` (block :math:`G \\otimes A`) or
        ``{site: (G,)}`` for a bias of shape ``(out,)`` (block :math:`G`).
    slices : dict
        ``{site: slice}`` of each site in the flat vector.
    prior_precision : Tensor ``(num_sites,)``, optional
        The isotropic :math:`\\lambda_s` added to each block, in the order of ``slices`` (default 0);
        may carry gradients (the eigenvalues are differentiable in it).
    """

    has_layer_factors = True

    def __init__(self, factors: Dict[str, Tuple[torch.Tensor, ...]], slices: Dict[str, slice], prior_precision=None):
        super().__init__(slices)
        self.names: List[str] = list(slices)
        self.factors = dict(factors)
        self.eigen: Dict[str, List[Tuple[torch.Tensor, torch.Tensor]]] = {}
        for name in self.names:
            pairs = []
            for factor in factors[name]:
                values, vectors = torch.linalg.eigh(0.5 * (factor + factor.T))
                pairs.append((values.clamp(min=0), vectors))  # PSD up to rounding
            self.eigen[name] = pairs
        if prior_precision is None:
            first = factors[self.names[0]][0]
            prior_precision = torch.zeros(len(self.names), dtype=first.dtype, device=first.device)
        self.set_prior_precision(prior_precision)

    def set_prior_precision(self, prior_precision: torch.Tensor, likelihood_scale=1.0) -> None:
        """Use :math:`s\\,G \\otimes A + \\lambda_s I` per site (``likelihood_scale`` :math:`s`, e.g.
        :math:`\\sigma_0^2/\\sigma^2` for another Gaussian noise scale)."""
        self.prior_precision = prior_precision
        self.likelihood_scale = likelihood_scale
        self.eigenvalues = {}
        for number, name in enumerate(self.names):
            pairs = self.eigen[name]
            if len(pairs) == 2:
                spectrum = torch.outer(pairs[0][0], pairs[1][0])
            else:
                spectrum = pairs[0][0]
            self.eigenvalues[name] = spectrum * likelihood_scale + prior_precision[number]

    def with_prior(self, prior, likelihood_scale=1.0, what: str = "prior precision") -> "KronPrecision":
        """The same factors with the prior :math:`\\mathrm{diag}(p)`, ``(d,)`` and constant within each
        site (a copy; the eigenbases are shared)."""
        other = copy.copy(self)
        if prior.shape[-1] == len(self.names) != self.dim:  # the former argument: one number per site
            warnings.warn(
                "KronPrecision.with_prior takes the (d,) prior diagonal now; one number per site is deprecated "
                "(use set_prior_precision for that)", FutureWarning, stacklevel=2,
            )  # fmt: skip
            other.set_prior_precision(prior, likelihood_scale)
            return other
        other.set_prior_precision(self.site_values(prior, what), likelihood_scale)
        return other

    def double(self) -> "KronPrecision":
        factors = {name: tuple(f.double() for f in parts) for name, parts in self.factors.items()}
        return KronPrecision(factors, self.slices)

    dtype = property(lambda self: self.eigenvalues[self.names[0]].dtype)
    device = property(lambda self: self.eigenvalues[self.names[0]].device)

    def site(self, name: str) -> "KronPrecision":
        """The block of one site, as a precision over that site's own flat vector."""
        other = copy.copy(self)
        where = self.slices[name]
        other.names = [name]
        other.slices = {name: slice(0, where.stop - where.start)}
        other.eigen = {name: self.eigen[name]}
        other.prior_precision = self.prior_precision[self.names.index(name)].reshape(1)
        other.eigenvalues = {name: self.eigenvalues[name]}
        return other

    # ---------------------------------------------------------------- the eigenbasis
    def _rotate(self, name: str, block: torch.Tensor, transpose: bool) -> torch.Tensor:
        """``Q^T v`` (``transpose``) or ``Q v`` for the site's eigenbasis ``Q``; ``block`` is ``(..., *shape)``."""
        pairs = self.eigen[name]
        u_g = pairs[0][1]
        if len(pairs) == 2:
            u_a = pairs[1][1]
            if transpose:
                return u_g.T @ block @ u_a
            return u_g @ block @ u_a.T
        return block @ (u_g if transpose else u_g.T)

    def _shape(self, name: str) -> Tuple[int, ...]:
        return tuple(self.eigenvalues[name].shape)

    def _blocks(self, vector: torch.Tensor) -> Dict[str, torch.Tensor]:
        lead = vector.shape[:-1]
        return {name: vector[..., self.slices[name]].reshape(lead + self._shape(name)) for name in self.names}

    def _assemble(self, blocks: Dict[str, torch.Tensor], lead: Sequence[int]) -> torch.Tensor:
        out = None
        for name in self.names:
            part = blocks[name].reshape(tuple(lead) + (-1,))
            if out is None:
                out = part.new_empty(tuple(lead) + (self.dim,))
            out[..., self.slices[name]] = part
        return out

    def apply_power(self, vector: torch.Tensor, power: float) -> torch.Tensor:
        """:math:`\\Lambda^{p} v` for ``vector`` of shape ``(..., d)`` (``p = -1/2`` draws, ``-1`` solves)."""
        lead = vector.shape[:-1]
        out = {}
        for name, block in self._blocks(vector).items():
            rotated = self._rotate(name, block, transpose=True) * self.eigenvalues[name] ** power
            out[name] = self._rotate(name, rotated, transpose=False)
        return self._assemble(out, lead)

    def whiten(self, vector: torch.Tensor) -> torch.Tensor:
        """:math:`S^{-1/2} Q^\\top v` (``(..., d)``): its squared norm is :math:`v^\\top \\Lambda^{-1} v`."""
        lead = vector.shape[:-1]
        out = {
            name: self._rotate(name, block, transpose=True) * self.eigenvalues[name].rsqrt()
            for name, block in self._blocks(vector).items()
        }
        return self._assemble(out, lead)

    def quadratic(self, vector: torch.Tensor) -> torch.Tensor:
        """:math:`v^\\top \\Lambda^{-1} v` (differentiable in the prior precision)."""
        total = vector.new_zeros(())
        for name, block in self._blocks(vector).items():
            rotated = self._rotate(name, block, transpose=True)
            total = total + (rotated**2 / self.eigenvalues[name]).sum()
        return total

    def logdet(self) -> torch.Tensor:
        """:math:`\\log\\det\\Lambda`."""
        return sum(values.log().sum() for values in self.eigenvalues.values())

    def variances(self) -> torch.Tensor:
        """Marginal variances :math:`\\operatorname{diag}(\\Lambda^{-1})`, ``(d,)``."""
        out = {}
        for name in self.names:
            pairs = self.eigen[name]
            inverse = self.eigenvalues[name].reciprocal()
            if len(pairs) == 2:
                out[name] = pairs[0][1].pow(2) @ inverse @ pairs[1][1].pow(2).T
            else:
                out[name] = pairs[0][1].pow(2) @ inverse
        return self._assemble(out, ())

    def is_positive(self) -> Dict[str, bool]:
        return {name: bool((values > 0).all()) for name, values in self.eigenvalues.items()}

    def solve(self, vector):
        return self.apply_power(vector, -1.0)

    def covariance(self):
        if self.dim > MAX_FULL_DIM:
            raise ValueError(
                f"the dense covariance of a 'kron' approximation is limited to latent dimension <= {MAX_FULL_DIM}"
            )
        return self.apply_power(torch.eye(self.dim, dtype=self.dtype, device=self.device), -1.0)

    def check(self):
        bad = [name for name, ok in self.is_positive().items() if not ok]
        if bad:
            raise ValueError(f"the Laplace precision is not positive for sites {bad}; pass prior_precision=...")
        variances = self.variances()
        if not (torch.isfinite(variances).all() and torch.isfinite(variances.reciprocal()).all()):
            raise ValueError(
                f"the marginal variances of the Laplace approximation underflow or overflow in {variances.dtype} "
                "(a huge or tiny prior_precision?); use a moderate prior_precision or float64"
            )

    def layer_factors(self, name, delta, inputs):
        r""":math:`\tilde\delta = U_G^\top\delta` and :math:`\sum_j \tilde a_j^2 / E_{ij}` (weight) or 1/E."""
        pairs = self.eigen[name]
        rotated = delta @ pairs[0][1]  # (K, b, out): U_G^T delta per row
        inverse = self.eigenvalues[name].reciprocal()
        if inputs is None:
            return rotated, inverse.expand(delta.shape[1], -1)
        return rotated, (inputs @ pairs[1][1]) ** 2 @ inverse.T  # (b, out)

    def describe_factors(self) -> str:
        """The factors' shapes per site, ``{w: (out, out) x (in, in), b: (out, out)}`` (for reprs)."""
        sites = (f"{name}: " + " x ".join(str(tuple(vectors.shape)) for _, vectors in self.eigen[name])
                 for name in self.names)  # fmt: skip
        return "{" + ", ".join(sites) + "}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(factors: {self.describe_factors()})"


#: The former name of :class:`KronPrecision` (same class).
KroneckerPrecision = KronPrecision


class KroneckerNormal(TorchDistribution):
    """:math:`\\mathcal N(\\mu, \\Lambda^{-1})` over a flat vector with a :class:`KroneckerPrecision` :math:`\\Lambda`.

    ``rsample`` draws :math:`\\mu + \\Lambda^{-1/2}\\varepsilon`; ``log_prob`` is exact.
    """

    arg_constraints = {}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: torch.Tensor, precision: KronPrecision, validate_args=None):
        self.loc = loc
        self.precision = precision
        super().__init__(loc.shape[:-1], loc.shape[-1:], validate_args=validate_args)

    def __repr__(self) -> str:
        # torch's repr lists the parameters in ``arg_constraints`` (none here): show the shapes instead
        return f"{type(self).__name__}(loc: {self.loc.size()}, factors: {self.precision.describe_factors()})"

    def expand(self, batch_shape, _instance=None):
        if tuple(batch_shape) != ():
            raise NotImplementedError("KroneckerNormal has no batch dimensions")
        return self

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        return self.precision.variances()

    def rsample(self, sample_shape=torch.Size()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.batch_shape + self.event_shape
        noise = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + self.precision.apply_power(noise, -0.5)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        whitened = self.precision.apply_power(value - self.loc, 0.5)
        d = self.loc.shape[-1]
        return -0.5 * (whitened**2).sum(-1) - 0.5 * d * math.log(2 * math.pi) + 0.5 * self.precision.logdet()
