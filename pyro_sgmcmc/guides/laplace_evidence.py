"""The evidence half of :class:`~pyro_sgmcmc.guides.LaplaceApproximation`: marginal likelihood,
prior-precision and noise tuning.

:class:`EvidenceMixin` holds the methods of the approximation that read and tune its Gaussian
prior and noise scale through the evidence; the formulas and the optimiser are the pure
functions of :mod:`pyro_sgmcmc.guides.evidence`. It is mixed into ``LaplaceApproximation`` and
relies on that class's buffers (``loc``, ``likelihood_curvature``, ``prior_curvature``,
``prior_mean``, ``prior_grad``, ``log_likelihood``, ``prior_log_density``) and helpers.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Tuple, Union

import torch

from ._checks import check_bool, check_positive_int, check_precision
from .evidence import (
    check_bounds,
    check_evidence,
    diagonal_evidence_optimum,
    gaussian_log_likelihood,
    maximise_log_evidence,
    standard_log_evidence,
)
from .precision import DiagPrecision

__all__ = ["EvidenceMixin", "PriorPrecision"]

PriorPrecision = Union[float, torch.Tensor, Mapping[str, Union[float, torch.Tensor]]]


class EvidenceMixin:
    """Evidence, prior-precision and noise-scale methods of a Laplace approximation."""

    # ------------------------------------------------------------------ Gaussian noise
    @property
    def sigma_noise(self) -> Optional[torch.Tensor]:
        """The Gaussian noise scale in use (``None``: the model's own, or a non-Gaussian likelihood)."""
        return self._sigma_noise

    @property
    def has_gaussian_noise(self) -> bool:
        """Is the likelihood Gaussian with one fixed scale (so that ``sigma_noise`` can be tuned)?"""
        return self._noise is not None

    def likelihood_scale(self, sigma: Optional[torch.Tensor] = None) -> Union[float, torch.Tensor]:
        """:math:`s = \\sigma_0^2 / \\sigma^2`: the likelihood curvature at noise scale :math:`\\sigma` is
        :math:`s H`."""
        sigma = self._sigma_noise if sigma is None else sigma
        if sigma is None:
            return 1.0
        return self._noise.scale**2 / sigma**2

    def _check_noise(self, name: str = "sigma_noise") -> None:
        if self._noise is None:
            raise ValueError(
                f"{name} needs a Gaussian likelihood of one fixed scale (every observed site a Normal whose scale is "
                "a single number that does not depend on the latent sites, without mask or poutine.scale); this "
                "model's likelihood is not"
            )

    def set_sigma_noise(self, sigma_noise: Optional[float]) -> None:
        """Use the Gaussian noise scale ``sigma_noise`` (``None``: the model's) in the precision and evidence.

        The likelihood curvature of a Gaussian likelihood is proportional to :math:`1/\\sigma^2`, so
        the precision becomes :math:`(\\sigma_0^2/\\sigma^2) H_{\\mathrm{lik}} + \\mathrm{diag}(\\lambda)`.
        """
        if sigma_noise is None:
            value = None
        else:
            self._check_noise()
            check_precision(sigma_noise, "sigma_noise")
            value = torch.as_tensor(sigma_noise, dtype=self.loc.dtype, device=self.loc.device).detach()
        previous = self._sigma_noise
        self._sigma_noise = value
        try:
            self.apply_prior_precision(self._prior_precision)
        except ValueError:
            self._sigma_noise = previous
            self.apply_prior_precision(self._prior_precision)
            raise

    # ------------------------------------------------------------------ evidence
    def log_marginal_likelihood(
        self,
        prior_precision: Optional[PriorPrecision] = None,
        *,
        evidence: str = "standard",
        sigma_noise: Optional[float] = None,
    ) -> torch.Tensor:
        """Laplace estimate of the log evidence :math:`\\log p(y)`.

        With the model's own prior (nothing set) it is the textbook formula

        .. math::
            \\log p(y) \\approx \\log p(y \\mid \\theta_*) + \\log p(\\theta_*)
            + \\frac d2 \\log 2\\pi - \\frac12 \\log\\det\\Lambda .

        With a Gaussian prior :math:`\\mathcal N(m, \\mathrm{diag}(\\lambda)^{-1})` in place of the
        model's, ``evidence="standard"`` (the default, as laplace-torch) keeps :math:`\\theta_*` and
        :math:`H_{\\mathrm{lik}}` fixed, :math:`\\Lambda_\\lambda = H_{\\mathrm{lik}} + \\mathrm{diag}(\\lambda)`:

        .. math::
            \\log p(y \\mid \\lambda) \\approx \\log p(y \\mid \\theta_*)
            - \\tfrac12 (\\theta_* - m)^\\top \\mathrm{diag}(\\lambda) (\\theta_* - m)
            + \\tfrac12 \\log\\det\\mathrm{diag}(\\lambda) - \\tfrac12 \\log\\det\\Lambda_\\lambda .

        It has a finite maximiser in :math:`\\lambda` for a network. ``evidence="refit"`` adds
        :math:`\\frac12 b^\\top \\Lambda_\\lambda^{-1} b`, :math:`b = \\nabla \\log p_\\lambda(\\theta_*) -
        \\nabla\\log p_{\\mathrm{model}}(\\theta_*)`: the MAP refitted on the quadratic model of the
        log-likelihood at :math:`\\theta_*`. It is the exact evidence of Bayesian linear regression
        (Gaussian likelihood, linear mean, ``"full"`` curvature) at every :math:`\\lambda`, but on a
        network it rises without bound in :math:`\\lambda`; see :mod:`pyro_sgmcmc.guides.evidence`.
        Both agree at the model's prior. Computed in float64 and returned in the model's dtype;
        differentiable in ``prior_precision`` (a tensor).

        Parameters
        ----------
        prior_precision : None, float, Tensor or dict
            Evaluate at this prior precision (scalar, or ``{site: value}``) without changing the
            approximation; by default the one in use.
        evidence : {"standard", "refit"}
            Which evidence (see above).
        sigma_noise : float or Tensor, optional
            For a Gaussian likelihood of one fixed scale :math:`\\sigma_0` (:attr:`has_gaussian_noise`):
            evaluate at the noise scale :math:`\\sigma` instead (default: the one in use), with
            :math:`\\log p(y\\mid\\theta_*, \\sigma) = -\\mathrm{RSS}/2\\sigma^2 - n\\log\\sigma - \\frac n2\\log 2\\pi`
            and the likelihood curvature scaled by :math:`\\sigma_0^2/\\sigma^2`.
        """
        check_evidence(evidence)
        sigma = None
        if sigma_noise is not None:
            self._check_noise()
            check_precision(sigma_noise, "sigma_noise")
            sigma = torch.as_tensor(sigma_noise, dtype=torch.float64, device=self.loc.device)
        if prior_precision is None and self._prior_precision is None:
            return self.log_evidence(None, sigma=sigma).to(self.loc.dtype)
        if prior_precision is None:
            vector = self.precision_vector(self._prior_precision)
        else:
            vector = self._vector_from(prior_precision, "prior_precision")
        return self.log_evidence(vector, evidence, sigma).to(self.loc.dtype)

    def _vector_from(self, precision: PriorPrecision, name: str) -> torch.Tensor:
        parts = self.precision_dict(precision, name)
        return torch.cat([parts[site].expand(where.stop - where.start) for site, where in self.site_slices.items()])

    def log_evidence(
        self, precision: Optional[torch.Tensor], evidence: str = "standard", sigma: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """The log evidence in float64 at the ``(d,)`` prior precision (``None``: the model's prior).

        ``sigma`` (default: the noise scale in use) rescales a Gaussian likelihood: its
        log-likelihood at :math:`\\theta_*` and its curvature, by :math:`s = \\sigma_0^2/\\sigma^2`.
        Differentiable in ``precision`` and ``sigma`` (the tuners' objective).
        """
        f64 = torch.float64
        sigma = self._sigma_noise if sigma is None else sigma
        log_likelihood = self.log_likelihood.to(f64)
        scale = 1.0
        if sigma is not None:
            sigma = sigma.to(f64)
            log_likelihood = gaussian_log_likelihood(self._noise, log_likelihood, sigma)
            scale = self.likelihood_scale(sigma)
        if getattr(self, "_likelihood64", None) is None:  # the terms of the evidence nearly cancel: float64
            self._likelihood64 = self.likelihood_precision.double()
        if precision is None:
            constant = 0.5 * self.loc.shape[0] * math.log(2 * math.pi)
            posterior = self._likelihood64.with_prior(self.prior_curvature.to(f64), scale, "prior curvature")
            return log_likelihood + self.prior_log_density.to(f64) + constant - 0.5 * posterior.logdet()
        precision = precision.to(f64)
        offset = (self.loc - self.prior_mean).to(f64)
        posterior = self._likelihood64.with_prior(precision, scale)
        value = standard_log_evidence(log_likelihood, offset, precision, posterior.logdet())
        if evidence == "refit":  # the log-likelihood's gradient at theta_* is -scale * grad log p_model
            b = -precision * offset - scale * self.prior_grad.to(f64)
            value = value + 0.5 * posterior.quadratic(b)
        return value

    def optimize_prior_precision(
        self,
        mode: str = "scalar",
        *,
        init: Optional[PriorPrecision] = None,
        max_iter: int = 200,
        evidence: str = "standard",
        bounds: Tuple[float, float] = (1e-8, 1e8),
        tune_sigma_noise: bool = False,
    ) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Maximise :meth:`log_marginal_likelihood` over the prior precision, then use it.

        Optimises :math:`\\log\\lambda` with L-BFGS (strong Wolfe line search) in float64; every
        evaluation is ``O(d)`` for a diagonal curvature, two small eigenvalue products per layer
        for ``"kron"`` and one Cholesky factorisation for a dense one. The standard evidence is
        concave in :math:`\\log\\lambda` (:mod:`pyro_sgmcmc.guides.evidence`), so the optimum is
        global. A precision that ends at a bound warns (``UserWarning``).

        Parameters
        ----------
        mode : {"scalar", "site", "parameter"}
            One precision for all sites, one per latent site (for a network written with
            ``PyroSample`` weights and biases, one per layer's weight and one per layer's bias), or
            one per coordinate (diagonal and dense curvatures only; laplace-torch's diagonal
            prior precision).
        init : float or dict, optional
            Starting point; by default the mean prior curvature of each group (1 if not positive).
        max_iter : int
            Maximum L-BFGS iterations; stopping there short of the optimum warns
            (:class:`~pyro_sgmcmc.guides.evidence.ConvergenceWarning`). For a diagonal curvature
            with ``mode="parameter"`` (and the standard evidence, noise fixed) the optimum has a
            closed form (:func:`~pyro_sgmcmc.guides.evidence.diagonal_evidence_optimum`): L-BFGS
            starts there and stops at once.
        evidence : {"standard", "refit"}
            See :meth:`log_marginal_likelihood`; ``"refit"`` only for (nearly) linear-Gaussian models.
        bounds : (float, float)
            The box :math:`[\\lambda_{\\min}, \\lambda_{\\max}]` of every precision (and of the
            noise precision :math:`1/\\sigma^2` when it is tuned).
        tune_sigma_noise : bool
            Also maximise over the noise scale :math:`\\sigma` of a Gaussian likelihood of one fixed
            scale (:attr:`has_gaussian_noise`; see :meth:`log_marginal_likelihood`); the optimum is
            then used (:attr:`sigma_noise`, :meth:`set_sigma_noise`).

        Returns
        -------
        Tensor or dict
            The optimum: a 0-dim tensor (``"scalar"``), ``{site: tensor}`` (``"site"``) or
            ``{site: tensor of the site's unconstrained shape}`` (``"parameter"``).
        """
        groups, labels = self.precision_groups(mode)
        max_iter = check_positive_int(max_iter, "max_iter")
        check_evidence(evidence)
        bounds = check_bounds(bounds)
        if check_bool(tune_sigma_noise, "tune_sigma_noise"):
            self._check_noise("tune_sigma_noise=True")
        prior_diag = self.prior_curvature if self.prior_curvature.dim() == 1 else self.prior_curvature.diagonal()
        num_groups = len(labels)
        source = prior_diag if init is None else self._vector_from(init, "init")
        start = torch.zeros(num_groups, dtype=torch.float64, device=self.loc.device)
        start.index_add_(0, groups, source.to(torch.float64))
        start = start / torch.bincount(groups, minlength=num_groups).to(torch.float64)
        if init is None:
            start = torch.where(torch.isfinite(start) & (start > 0), start, torch.ones_like(start))
        separable = mode == "parameter" and evidence == "standard" and not tune_sigma_noise
        if init is None and separable and isinstance(self.likelihood_precision, DiagPrecision):  # closed form
            f64 = torch.float64
            curvature = self.likelihood_curvature.to(f64) * self.likelihood_scale()
            optimum = diagonal_evidence_optimum(curvature, (self.loc - self.prior_mean).to(f64))
            start = torch.where(torch.isnan(optimum), start, optimum)
        if tune_sigma_noise:  # the last coordinate is the noise precision 1 / sigma^2
            sigma = self._sigma_noise if self._sigma_noise is not None else self._noise.scale
            start = torch.cat([start, torch.as_tensor([float(sigma) ** -2], dtype=torch.float64)])
            optimum = maximise_log_evidence(
                lambda values: self.log_evidence(values[:-1][groups], evidence, values[-1].rsqrt()),
                start, bounds, max_iter, labels + ["1 / sigma_noise^2"],
            )  # fmt: skip
            self._sigma_noise = optimum[-1].rsqrt().to(self.loc.dtype)
            optimum = optimum[:-1]
        else:
            optimum = maximise_log_evidence(
                lambda values: self.log_evidence(values[groups], evidence), start, bounds, max_iter, labels
            )
        optimum = optimum.to(self.loc.dtype)
        if mode == "scalar":
            self.set_prior_precision(optimum[0])
            return optimum[0]
        if mode == "site":
            result = {name: optimum[number] for number, name in enumerate(self.site_slices)}
        else:
            result = {
                name: optimum[where].reshape(self._unconstrained_shapes[name])
                for name, where in self.site_slices.items()
            }
        self.set_prior_precision(result)
        return result

    def precision_groups(self, mode: str) -> Tuple[torch.Tensor, list]:
        """``(groups, labels)``: the group index of each coordinate and a label per group, for ``mode``
        ``"scalar"`` (one precision), ``"site"`` (one per site) or ``"parameter"`` (one per coordinate)."""
        if not isinstance(mode, str) or mode not in ("scalar", "site", "parameter"):
            raise ValueError(f"mode must be 'scalar', 'site' or 'parameter'; got {mode!r}")
        if mode == "parameter" and self.is_kron:
            raise ValueError(
                "mode='parameter' needs a diagonal or dense curvature: a 'kron' block takes one isotropic "
                "precision per site (use mode='site')"
            )
        d = self.loc.shape[0]
        device = self.loc.device
        if mode == "scalar":
            return torch.zeros(d, dtype=torch.long, device=device), ["all sites"]
        if mode == "parameter":
            labels = [
                f"{name}[{i}]" for name, where in self.site_slices.items() for i in range(where.stop - where.start)
            ]
            return torch.arange(d, device=device), labels
        groups = torch.zeros(d, dtype=torch.long, device=device)
        for number, where in enumerate(self.site_slices.values()):
            groups[where] = number
        return groups, list(self.site_slices)

