r"""The Laplace precision :math:`\Lambda = s H + P`, one class per representation with one interface.

:math:`H` is a curvature of the negative log-likelihood (:mod:`~pyro_sgmcmc.guides.curvature`),
:math:`s` a likelihood scale (:math:`\sigma_0^2 / \sigma^2` for another Gaussian noise scale, else 1)
and :math:`P` the prior's precision (a diagonal :math:`\mathrm{diag}(\lambda)`, or the model prior's
negative Hessian). Three representations of :math:`H`:

* :class:`DiagPrecision`: a ``(d,)`` diagonal; every operation is :math:`O(d)`;
* :class:`DensePrecision`: a ``(d, d)`` matrix, through its Cholesky factor :math:`\Lambda = L L^\top`;
* :class:`~pyro_sgmcmc.guides.kron.KronPrecision`: one Kronecker-factored block per site (K-FAC).

Every class answers the same questions, so the Laplace guide, its evidence and its predictive never
ask which one they hold: :meth:`Precision.with_prior` (a new :math:`P` or :math:`s`),
:meth:`~Precision.logdet` (:math:`\log\det\Lambda`), :meth:`~Precision.quadratic`
(:math:`b^\top\Lambda^{-1}b`), :meth:`~Precision.variances` (:math:`\mathrm{diag}\,\Lambda^{-1}`),
:meth:`~Precision.covariance`, :meth:`~Precision.whiten` (:math:`W` with :math:`J\Lambda^{-1}J^\top =
WW^\top`), :meth:`~Precision.distribution` (:math:`\mathcal N(\mu, \Lambda^{-1})`),
:meth:`~Precision.site_distribution` (one site's marginal, for ``as_prior``) and
:meth:`~Precision.check` (positive definite and representable, or a ``ValueError`` naming the sites).
"""

from __future__ import annotations

import abc
import copy
from typing import Dict, Optional

import pyro.distributions as dist
import torch

from .sites import reshaped

__all__ = ["Precision", "DiagPrecision", "DensePrecision"]


class Precision(abc.ABC):
    """:math:`\\Lambda = s H + P` over a flat vector whose sites occupy ``slices``."""

    def __init__(self, slices: Dict[str, slice]) -> None:
        self.slices = dict(slices)
        self.likelihood_scale = 1.0

    @abc.abstractmethod
    def with_prior(self, prior: torch.Tensor, likelihood_scale=1.0, what: str = "prior precision") -> "Precision":
        """A copy with :math:`\\Lambda = s H + P`: ``prior`` is :math:`\\mathrm{diag}(P)`, ``(d,)`` (or ``(d, d)``
        for a dense precision); ``what`` names it in errors. Differentiable in ``prior`` and ``s``."""

    @abc.abstractmethod
    def double(self) -> "Precision":
        """The same precision with :math:`H` in float64 (the evidence's terms nearly cancel)."""

    @abc.abstractmethod
    def logdet(self) -> torch.Tensor:
        """:math:`\\log\\det\\Lambda`."""

    @abc.abstractmethod
    def quadratic(self, vector: torch.Tensor) -> torch.Tensor:
        """:math:`b^\\top \\Lambda^{-1} b` for ``vector`` :math:`b` of shape ``(d,)``."""

    @abc.abstractmethod
    def variances(self) -> torch.Tensor:
        """Marginal variances :math:`\\mathrm{diag}(\\Lambda^{-1})`, ``(d,)``."""

    def covariance(self) -> torch.Tensor:
        """:math:`\\Lambda^{-1}`, ``(d, d)`` (:class:`DiagPrecision`: its ``(d,)`` diagonal)."""
        identity = torch.eye(self.dim, dtype=self.dtype, device=self.device)
        return torch.stack([self.solve(row) for row in identity])

    @abc.abstractmethod
    def solve(self, vector: torch.Tensor) -> torch.Tensor:
        """:math:`\\Lambda^{-1} v` for ``vector`` of shape ``(..., d)``."""

    @abc.abstractmethod
    def whiten(self, jacobian: torch.Tensor) -> torch.Tensor:
        """``W`` (``(..., K, r)``) with :math:`W W^\\top = J \\Lambda^{-1} J^\\top` for ``jacobian`` ``(..., K, d)``."""

    @abc.abstractmethod
    def distribution(self, loc: torch.Tensor) -> dist.Distribution:
        """:math:`\\mathcal N(\\mu, \\Lambda^{-1})` over the flat vector (event shape ``(d,)``)."""

    @abc.abstractmethod
    def site_distribution(self, loc: torch.Tensor, name: str, shape, event_dim: int) -> dist.Distribution:
        """The marginal of site ``name`` over its unconstrained value of ``shape`` (correlations with
        other sites dropped); a diagonal one keeps ``event_dim`` event dimensions (plates stay batch)."""

    @abc.abstractmethod
    def as_tensor(self) -> torch.Tensor:
        """The ``precision`` buffer of the guide: the ``(d,)`` diagonal, the ``(d, d)`` matrix, or for
        ``"kron"`` the reciprocal marginal variances."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise a ``ValueError`` naming the sites if :math:`\\Lambda` is not positive definite or its
        inverse is not representable in its dtype."""

    #: Does :meth:`layer_factors` give the predictive of ``F.linear`` layers without Jacobians?
    has_layer_factors = False

    def layer_factors(self, name: str, delta: torch.Tensor, inputs: Optional[torch.Tensor]):
        """For the predictive of ``F.linear`` layers: ``(delta', w)`` with
        :math:`[J\\Lambda^{-1}J^\\top]_{kl} = \\sum_i \\delta'_{ki}\\delta'_{li} w_i` for the site's block
        (weight: ``inputs`` the layer inputs; bias: ``None``), or ``None`` if not available."""
        return None

    # the vector's geometry ---------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return sum(where.stop - where.start for where in self.slices.values())

    def site_values(self, vector: torch.Tensor, what: str) -> torch.Tensor:
        """One number per site from a ``(d,)`` vector constant within each site, else a ``ValueError``."""
        values = []
        for name, where in self.slices.items():
            block = vector[where]
            if not torch.allclose(block, block[0].expand_as(block), rtol=1e-6, atol=0.0):
                raise ValueError(
                    f"curvature='kron' needs one {what} per site (an isotropic Gaussian prior on each weight and "
                    f"bias); site {name!r} has several. Pass prior_precision=... (a number or {{site: number}})"
                )
            values.append(block[0])
        return torch.stack(values)


class DiagPrecision(Precision):
    """A diagonal :math:`\\Lambda = s\\,\\mathrm{diag}(h) + \\mathrm{diag}(p)`: every operation is elementwise."""

    has_layer_factors = True

    def __init__(self, curvature: torch.Tensor, slices: Dict[str, slice]) -> None:
        super().__init__(slices)
        self.curvature = curvature
        self.values = curvature

    dtype = property(lambda self: self.values.dtype)
    device = property(lambda self: self.values.device)

    def with_prior(self, prior, likelihood_scale=1.0, what="prior precision") -> "DiagPrecision":
        other = copy.copy(self)
        other.likelihood_scale = likelihood_scale
        other.values = self.curvature * likelihood_scale + prior
        return other

    def double(self) -> "DiagPrecision":
        return DiagPrecision(self.curvature.double(), self.slices)

    def logdet(self):
        return self.values.log().sum()

    def quadratic(self, vector):
        return (vector**2 / self.values).sum()

    def solve(self, vector):
        return vector / self.values

    def variances(self):
        return self.values.reciprocal()

    def covariance(self):
        return self.variances()

    def whiten(self, jacobian):
        return jacobian * self.variances().sqrt()

    def distribution(self, loc):
        return dist.Normal(loc, self.values.rsqrt()).to_event(1)

    def site_distribution(self, loc, name, shape, event_dim):
        where = self.slices[name]
        scale = self.values[where].rsqrt().reshape(shape).clone()
        return dist.Normal(loc[where].reshape(shape).clone(), scale).to_event(event_dim)

    def as_tensor(self):
        return self.values

    def check(self):
        bad = [name for name, where in self.slices.items() if not (self.values[where] > 0).all()]
        if bad:
            raise ValueError(
                f"the Laplace precision is not positive for sites {bad} (the prior's curvature there is "
                "not positive and the likelihood does not make up for it); pass prior_precision=... "
                "or check that the MAP fit converged"
            )

    def layer_factors(self, name, delta, inputs):
        variances = self.variances()[self.slices[name]]
        if inputs is None:  # a bias: (b, out)
            return delta, variances.expand(delta.shape[1], -1)
        return delta, (inputs**2) @ variances.reshape(delta.shape[-1], inputs.shape[-1]).T


class DensePrecision(Precision):
    """A dense :math:`\\Lambda = s H + P` through its Cholesky factor :math:`\\Lambda = L L^\\top`."""

    def __init__(self, curvature: torch.Tensor, slices: Dict[str, slice], matrix: Optional[torch.Tensor] = None,
                 likelihood_scale=1.0) -> None:  # fmt: skip
        super().__init__(slices)
        self.curvature = curvature
        self.likelihood_scale = likelihood_scale
        self.matrix = curvature if matrix is None else matrix
        self.cholesky, self.info = torch.linalg.cholesky_ex(self.matrix)
        self._scale_tril: Optional[torch.Tensor] = None

    dtype = property(lambda self: self.matrix.dtype)
    device = property(lambda self: self.matrix.device)

    def with_prior(self, prior, likelihood_scale=1.0, what="prior precision") -> "DensePrecision":
        matrix = self.curvature * likelihood_scale + (torch.diag(prior) if prior.dim() == 1 else prior)
        return DensePrecision(self.curvature, self.slices, matrix, likelihood_scale)

    def double(self) -> "DensePrecision":
        return DensePrecision(self.curvature.double(), self.slices)

    def _factor(self) -> torch.Tensor:
        if int(self.info) != 0:
            torch.linalg.cholesky(self.matrix)  # raises the LinAlgError that names the failing minor
        return self.cholesky

    def logdet(self):
        return 2 * self._factor().diagonal().log().sum()

    def quadratic(self, vector):
        return torch.cholesky_solve(vector.unsqueeze(-1), self._factor()).squeeze(-1) @ vector

    def solve(self, vector):
        return torch.cholesky_solve(vector.unsqueeze(-1), self._factor()).squeeze(-1)

    @property
    def scale_tril(self) -> torch.Tensor:
        """:math:`S` lower triangular with :math:`S S^\\top = \\Lambda^{-1}`."""
        if self._scale_tril is None:
            covariance = torch.cholesky_inverse(self._factor())
            self._scale_tril, self.scale_info = torch.linalg.cholesky_ex(0.5 * (covariance + covariance.T))
        return self._scale_tril

    def variances(self):
        return self.scale_tril.pow(2).sum(-1)

    def covariance(self):
        return self.scale_tril @ self.scale_tril.T

    def whiten(self, jacobian):
        return jacobian @ self.scale_tril

    def distribution(self, loc):
        return dist.MultivariateNormal(loc, scale_tril=self.scale_tril)

    def site_distribution(self, loc, name, shape, event_dim):
        where = self.slices[name]
        block = self.covariance()[where, where].clone()
        return reshaped(dist.MultivariateNormal(loc[where].clone(), covariance_matrix=0.5 * (block + block.T)), shape)

    def as_tensor(self):
        return self.matrix

    def check(self):
        if int(self.info) != 0:
            raise ValueError(
                "the Laplace precision (Hessian of the negative log joint) is not positive definite: the "
                "point is not a local maximum (fit the MAP longer) or use curvature='full_ggn'"
            )
        scale_tril = self.scale_tril
        if int(self.scale_info) != 0 or not torch.isfinite(scale_tril).all():
            raise ValueError(
                f"the Laplace covariance (the inverse precision) underflows in {self.matrix.dtype}: the precision "
                "is too large or too ill-conditioned for this dtype (a huge prior_precision?); use a smaller "
                "prior_precision or float64"
            )
