"""The curvature kinds a Laplace approximation can use, and the records the sweeps return."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

__all__ = ["MAX_FULL_DIM", "Curvature", "LikelihoodCurvature", "PriorTerms", "UserFacingError"]

#: Largest number of latent dimensions for the dense curvatures (``"full"``, ``"full_ggn"``):
#: a dense precision holds ``d^2`` numbers (200 MB in float64 at ``d = 5000``) and its Cholesky
#: factorisation costs ``d^3 / 3`` flops.
MAX_FULL_DIM = 5000


class Curvature(str, enum.Enum):
    r"""The curvature of the negative log-likelihood used as the Laplace precision.

    With :math:`\ell_n(\theta) = \log p(y_n \mid \theta)` the log-likelihood of example
    :math:`n`, :math:`f_n(\theta)` the parameters of its distribution (the network output) and
    :math:`J_n = \partial f_n / \partial \theta` their Jacobian:

    .. math::
        H_{\mathrm{EF}} = \sum_n \nabla\ell_n \nabla\ell_n^\top, \qquad
        H_{\mathrm{GGN}} = \sum_n J_n^\top F(f_n) J_n, \qquad
        H = -\sum_n \nabla^2 \ell_n,

    where :math:`F(f) = \mathbb{E}_{y \sim p(y \mid f)}[\nabla_f \log p \, \nabla_f \log p^\top]` is the
    Fisher information of the output distribution.
    """

    #: Diagonal empirical Fisher, :math:`\sum_n (\nabla_\theta \ell_n)^2`, from exact per-example
    #: gradients (not squared minibatch gradients). One backward pass per example.
    DIAG_EF = "diag_ef"
    #: Diagonal generalised Gauss-Newton / conditional Fisher, :math:`\mathrm{diag}\sum_n J_n^\top F J_n`.
    #: Exact for ``Normal`` (``F = diag(1/sigma^2)`` for the loc, ``2/sigma^2`` for a scale that
    #: depends on theta), ``Bernoulli`` (``F = p(1-p)`` on the logit) and ``Categorical``
    #: (``F = diag(p) - p p^T`` on the logits) likelihoods, at one backward pass per output column.
    #: Any other likelihood uses Monte Carlo labels: :math:`\frac1S \sum_s (\nabla\log p(\hat y_s\mid\theta))^2`,
    #: :math:`\hat y_s \sim p(y \mid f_n)`, an unbiased estimate of the same diagonal.
    DIAG_GGN = "diag_ggn"
    #: Full exact Hessian of the negative log joint (Pyro's ``AutoLaplaceApproximation``), summed
    #: over the data; small models only (``d <= MAX_FULL_DIM``). Not PSD away from a maximum.
    FULL = "full"
    #: Full (dense) GGN / conditional Fisher, always PSD; small models only (``d <= MAX_FULL_DIM``).
    FULL_GGN = "full_ggn"
    #: Kronecker-factored GGN (K-FAC) for networks of ``F.linear`` layers (``nn.Linear`` in a
    #: ``PyroModule`` with ``PyroSample`` weight and bias): a layer's weight block is
    #: :math:`G \otimes A`, :math:`A = \frac1N\sum_n a_n a_n^\top` (layer inputs),
    #: :math:`G = \sum_n \sum_k \delta_{nk}\delta_{nk}^\top` (output gradients of the whitened
    #: outputs of ``diag_ggn``); its bias block is :math:`G` itself (exact). Blocks of different
    #: sites are independent. See :mod:`pyro_sgmcmc.guides.kron`.
    KRON = "kron"

    @property
    def is_diagonal(self) -> bool:
        return self in (Curvature.DIAG_EF, Curvature.DIAG_GGN)

    @property
    def is_dense(self) -> bool:
        return self in (Curvature.FULL, Curvature.FULL_GGN)

    @classmethod
    def parse(cls, value) -> "Curvature":
        """Return the member named by ``value``; a ``ValueError`` lists the accepted names."""
        try:
            return cls(value)
        except ValueError:
            accepted = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"unknown curvature {value!r}; accepted: {accepted}") from None


@dataclass
class LikelihoodCurvature:
    """The result of :func:`likelihood_curvature` (potential order)."""

    curvature: torch.Tensor  #: ``(d,)`` diagonal or ``(d, d)`` dense curvature of :math:`-\sum_n \ell_n`
    log_likelihood: torch.Tensor  #: :math:`\sum_n \ell_n(\theta_*)` on the full data (0-dim)
    num_terms: int  #: number of likelihood terms visited (examples, or elements on the Jacobian path)
    method: str  #: ``"per-example"``, ``"jacobian"`` or ``"hessian"``
    #: ``"kron"`` only: ``{site: factors}``, ``(G, A)`` for a weight (block :math:`G \otimes A`) and
    #: ``(G,)`` for a bias; ``curvature`` then holds the diagonal of these blocks
    kron_factors: Optional[Dict[str, Tuple[torch.Tensor, ...]]] = None


@dataclass
class PriorTerms:
    """The prior in unconstrained space at one position (potential order).

    ``log_density`` is :math:`\\log p(T(z)) + \\log|\\det J_T(z)|`, ``grad`` its gradient,
    ``curvature`` its negative Hessian (``(d,)`` diagonal or ``(d, d)``), and ``mean`` the mean
    of each real-valued site's prior (0 for constrained sites), the centre of the Gaussian prior
    that replaces it when a prior precision is set.
    """

    log_density: torch.Tensor
    grad: torch.Tensor
    curvature: torch.Tensor
    mean: torch.Tensor


class UserFacingError(ValueError):
    """An error about the model itself (not a reason to fall back to the Jacobian path)."""

