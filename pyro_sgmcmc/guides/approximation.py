"""The Laplace approximation itself: :class:`LaplaceApproximation`, a Gaussian guide with a precision object.

:class:`LaplaceApproximation` holds the curvature of the likelihood as a
:class:`~pyro_sgmcmc.guides.precision.Precision` (:attr:`~LaplaceApproximation.likelihood_precision`,
:math:`H`) and the current :math:`\\Lambda = sH + P` (:attr:`~LaplaceApproximation.posterior_precision`);
every method asks that object, never which representation (diagonal, dense, Kronecker) it is.
The evidence methods are in :mod:`~pyro_sgmcmc.guides.laplace_evidence`.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Union

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoContinuous
from pyro.infer.autoguide.initialization import init_to_median
from torch.distributions import biject_to

from .._compat import AutoGuideInternals
from ._checks import check_precision
from .curvature import Curvature
from .evidence import GaussianNoise
from .kron import KronPrecision
from .laplace_evidence import EvidenceMixin, PriorPrecision
from .precision import DensePrecision, DiagPrecision, Precision
from .predictive import GLMPrediction, linearized_predictive
from .sites import site_prior, site_slices, split_latent, unconstrained_shapes

__all__ = ["LaplaceApproximation"]


def make_precision(curvature: torch.Tensor, slices: Dict[str, slice], kron_factors=None) -> Precision:
    """The precision class for a likelihood curvature: K-FAC factors (:class:`~pyro_sgmcmc.guides.kron.KronPrecision`),
    a ``(d, d)`` matrix (:class:`~pyro_sgmcmc.guides.precision.DensePrecision`) or a ``(d,)`` diagonal
    (:class:`~pyro_sgmcmc.guides.precision.DiagPrecision`)."""
    if kron_factors is not None:
        return KronPrecision(kron_factors, slices)
    if curvature.dim() == 2:
        return DensePrecision(curvature, slices)
    return DiagPrecision(curvature, slices)


class LaplaceApproximation(EvidenceMixin, AutoContinuous):
    """The Gaussian guide :math:`\\mathcal N(\\theta_*, \\Lambda^{-1})` over the latent sites (unconstrained).

    Built by :meth:`~pyro_sgmcmc.guides.AutoLaplace.laplace_approximation`. It is a Pyro
    :class:`~pyro.infer.autoguide.AutoContinuous` guide: :meth:`get_posterior`, :meth:`median`,
    :meth:`quantiles`, sampling (calling it) and ``pyro.infer.Predictive(model, guide=laplace,
    num_samples=...)`` all work. On top of that:

    * :meth:`predict`: the linearised (GLM) predictive of a network output, with probit or Monte
      Carlo class probabilities;
    * :meth:`log_marginal_likelihood` and :meth:`optimize_prior_precision` (scalar or per site);
    * :meth:`as_prior`: the posterior as prior distributions for a next task's model.

    :attr:`posterior_precision` is the :class:`~pyro_sgmcmc.guides.precision.Precision` in use
    (:class:`~pyro_sgmcmc.guides.precision.DiagPrecision`, ``DensePrecision`` or
    :class:`~pyro_sgmcmc.guides.kron.KronPrecision`); the buffer ``precision`` is its ``(d,)``
    diagonal, its ``(d, d)`` matrix or, for ``"kron"``, the reciprocal marginal variances.
    The vector :math:`\\theta` follows Pyro's ``AutoContinuous`` layout (sites in the order the
    model samples them); :attr:`site_slices` gives each site's slice, :attr:`site_shapes` its
    unconstrained shape.

    Parameters
    ----------
    model : callable
        The Pyro model.
    prototype_trace : pyro.poutine.Trace
        The model's trace whose latent sites are the approximation's (the MAP guide's prototype).
    loc : Tensor ``(d,)``
        The MAP :math:`\\theta_*` in unconstrained space.
    likelihood_curvature, prior_curvature : Tensor ``(d,)`` or ``(d, d)``
        :math:`H` and the model prior's :math:`-\\nabla^2 \\log p(\\theta_*)`.
    prior_log_density, prior_grad : Tensor
        The model prior's :math:`\\log p(\\theta_*)` (with the log-det-Jacobian) and its gradient.
    prior_mean : Tensor ``(d,)``
        The centre :math:`m` of the Gaussian prior used when a prior precision is set.
    log_likelihood : Tensor
        :math:`\\sum_n \\log p(y_n \\mid \\theta_*)` on the full data.
    curvature : str
        The curvature name, for the record.
    kron_factors : dict, optional
        ``curvature="kron"`` only: ``{site: (G, A)}`` for a weight, ``{site: (G,)}`` for a bias.
    fixed : dict, optional
        ``{site: constrained value}`` of the sites outside the Gaussian (``subset_of_weights``):
        point masses at the MAP, included by calls, :meth:`median`, :meth:`quantiles` and :meth:`params`.
    noise : GaussianNoise, optional
        The model's fixed Gaussian noise scale and number of observations, when its likelihood is
        Gaussian of one fixed scale: the noise scale can then be tuned with the prior precision.
    prior_precision : None, float or dict
        The Gaussian prior to use (see :meth:`set_prior_precision`); ``None``: the model's.
    """

    def __init__(
        self,
        model,
        *,
        prototype_trace,
        loc: torch.Tensor,
        likelihood_curvature: torch.Tensor,
        prior_curvature: torch.Tensor,
        prior_log_density: torch.Tensor,
        prior_grad: torch.Tensor,
        prior_mean: torch.Tensor,
        log_likelihood: torch.Tensor,
        curvature: str = "diag_ggn",
        init_loc_fn=init_to_median,
        kron_factors: Optional[Dict[str, tuple]] = None,
        fixed: Optional[Dict[str, torch.Tensor]] = None,
        noise: Optional[GaussianNoise] = None,
        prior_precision: Optional[PriorPrecision] = None,
    ) -> None:
        super().__init__(model, init_loc_fn=init_loc_fn)
        self._fixed = {name: value.detach() for name, value in (fixed or {}).items()}
        self._noise = noise
        self._sigma_noise: Optional[torch.Tensor] = None
        self.curvature = Curvature.parse(curvature)
        self.register_buffer("loc", loc.detach().clone())
        self.register_buffer("likelihood_curvature", likelihood_curvature.detach().clone())
        self.register_buffer("prior_curvature", prior_curvature.detach().clone())
        self.register_buffer("prior_log_density", torch.as_tensor(prior_log_density).detach().clone())
        self.register_buffer("prior_grad", prior_grad.detach().clone())
        self.register_buffer("prior_mean", prior_mean.detach().clone())
        self.register_buffer("log_likelihood", torch.as_tensor(log_likelihood).detach().clone())
        self._prior_precision: Optional[Dict[str, torch.Tensor]] = None
        # the layout of the latent vector, from the prototype trace (as AutoContinuous sets it up)
        self.prototype_trace = prototype_trace
        self.site_shapes = unconstrained_shapes(prototype_trace)
        AutoGuideInternals.set_layout(self, prototype_trace, self.site_shapes)
        self.latent_dim = sum(math.prod(shape) for shape in self.site_shapes.values())
        self.site_slices = site_slices(prototype_trace, self.site_shapes)
        self.kron_factors = kron_factors
        #: :math:`H` as a :class:`~pyro_sgmcmc.guides.precision.Precision` (no prior, likelihood scale 1)
        self.likelihood_precision: Precision = make_precision(self.likelihood_curvature, self.site_slices, kron_factors)
        self.posterior_precision: Precision = self.likelihood_precision
        self.register_buffer("precision", None)  # set by set_prior_precision
        self.set_prior_precision(prior_precision)

    @property
    def is_diagonal(self) -> bool:
        return isinstance(self.posterior_precision, DiagPrecision)

    @property
    def is_kron(self) -> bool:
        """Is the precision Kronecker-factored (``curvature="kron"``)?"""
        return isinstance(self.posterior_precision, KronPrecision)

    # ------------------------------------------------------------------ prior precision
    @property
    def prior_precision(self) -> Optional[Dict[str, torch.Tensor]]:
        """``None`` (the model's own prior) or ``{site: precision}`` of the Gaussian prior in use."""
        return None if self._prior_precision is None else dict(self._prior_precision)

    def set_prior_precision(self, prior_precision: Optional[PriorPrecision]) -> None:
        """Use the Gaussian prior :math:`\\mathcal N(m, \\lambda^{-1} I)` (or the model's prior for ``None``).

        The precision becomes :math:`\\Lambda = s H + \\mathrm{diag}(\\lambda)`; the mean stays at
        :math:`\\theta_*`.

        Parameters
        ----------
        prior_precision : None, float or dict
            One positive number for every site, or ``{site: positive number}`` (sites left out get
            precision 1).

        Raises
        ------
        ValueError
            For an invalid value, or when the resulting precision is not positive definite or
            not representable in the model's dtype; the approximation is then left unchanged.
        """
        previous = self._prior_precision
        try:
            self.apply_prior_precision(prior_precision)
        except ValueError:
            self._prior_precision = previous
            raise

    def apply_prior_precision(self, prior_precision: Optional[PriorPrecision]) -> None:
        """Rebuild :math:`\\Lambda` with ``prior_precision`` and the noise scale in use (no rollback)."""
        if prior_precision is None:
            self._prior_precision = None
            prior, what = self.prior_curvature, "prior curvature"
        else:
            self._prior_precision = self.precision_dict(prior_precision, "prior_precision")
            prior, what = self.precision_vector(self._prior_precision), "prior precision"
        posterior = self.likelihood_precision.with_prior(prior, self.likelihood_scale(), what)
        posterior.check()
        self.posterior_precision = posterior
        self.precision = posterior.as_tensor().detach()

    def precision_dict(self, value: PriorPrecision, name: str) -> Dict[str, torch.Tensor]:
        """``{site: tensor}`` from a checked scalar or mapping (sites left out of a mapping get 1)."""
        check_precision(value, name)
        sizes = {site: where.stop - where.start for site, where in self.site_slices.items()}
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(self.site_slices))
            if unknown:
                raise ValueError(f"{name} names unknown sites {unknown}; latent sites: {list(self.site_slices)}")
            return {site: _as_precision(value.get(site, 1.0), f"{name}[{site!r}]", self.loc, sizes[site])
                    for site in self.site_slices}  # fmt: skip
        tensor = _as_precision(value, name, self.loc, 1)
        return {site: tensor for site in self.site_slices}

    def precision_vector(self, precision: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The ``(d,)`` vector of a ``{site: precision}`` dict."""
        vector = torch.empty_like(self.loc)
        for name, where in self.site_slices.items():
            vector[where] = precision[name]
        return vector

    # ------------------------------------------------------------------ the Gaussian
    def get_posterior(self, *args, **kwargs):
        """:math:`\\mathcal N(\\theta_*, \\Lambda^{-1})`: ``Normal(...).to_event(1)`` (diagonal),
        ``MultivariateNormal`` (dense) or :class:`~pyro_sgmcmc.guides.kron.KroneckerNormal` (``"kron"``)."""
        return self.posterior_precision.distribution(self.loc)

    def _loc_scale(self, *args, **kwargs):  # AutoContinuous's hook: its median and quantiles call it
        return self.loc, self.scale

    @property
    def scale(self) -> torch.Tensor:
        """Marginal standard deviations in unconstrained space, ``(d,)``."""
        return self.posterior_precision.variances().sqrt()

    @property
    def covariance(self) -> torch.Tensor:
        """The covariance :math:`\\Lambda^{-1}`: ``(d,)`` variances if diagonal, else ``(d, d)``."""
        return self.posterior_precision.covariance()

    def params(self, latent: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
        """Constrained site values ``{name: value}`` at ``latent`` (default: the MAP), fixed sites included."""
        latent = self.loc if latent is None else latent
        pieces = split_latent(self.prototype_trace, self.site_shapes, latent)
        values = {site["name"]: biject_to(site["fn"].support)(value) for site, value in pieces}
        return {**self._fixed, **values}

    @property
    def fixed(self) -> Dict[str, torch.Tensor]:
        """``{site: value}`` of the sites held at the MAP (empty unless ``subset_of_weights`` chose some)."""
        return dict(self._fixed)

    def forward(self, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """Draw the Gaussian's sites, and the fixed sites as ``Delta`` point masses at the MAP."""
        result = super().forward(*args, **kwargs)
        for name, value in self._fixed.items():
            result[name] = pyro.sample(name, dist.Delta(value, event_dim=value.dim()))
        return result

    def median(self, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """The posterior median of every site in constrained space (the fixed sites at the MAP)."""
        return {**self._fixed, **super().median(*args, **kwargs)}

    def quantiles(self, quantiles, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """Marginal quantiles in constrained space; a fixed site repeats its MAP value."""
        result = super().quantiles(quantiles, *args, **kwargs)
        count = len(quantiles)
        for name, value in self._fixed.items():
            result[name] = value.expand((count,) + value.shape).clone()
        return result

    # ------------------------------------------------------------------ continual learning
    def as_prior(self) -> Dict[str, dist.Distribution]:
        """The approximation as prior distributions ``{site: distribution}`` in constrained space.

        Each site gets its own marginal (correlations *between* sites are dropped): for a diagonal
        precision ``Normal(mean, sd).to_event(k)`` over the unconstrained value, ``k`` the site's
        own event dimension (its plate dimensions stay batch dimensions); for a dense precision the
        ``MultivariateNormal`` of the site's block, for ``"kron"`` the site's
        :class:`~pyro_sgmcmc.guides.kron.KroneckerNormal` block, reshaped to the site's shape (the
        whole site is one event); pushed through ``biject_to(support)`` for constrained sites. Use
        them in the next task's model, e.g. ``pyro.sample("w", priors["w"])``.
        """
        priors = {}
        loc = self.loc
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            shape = self.site_shapes[name]
            event_dim = site["fn"].event_dim + len(shape) - site["value"].dim()
            base = self.posterior_precision.site_distribution(loc, name, shape, event_dim)
            priors[name] = site_prior(base, site)
        return priors

    # ------------------------------------------------------------------ predictive
    def predict(self, fn, x: torch.Tensor, *, link: Optional[str] = None, num_samples: int = 1000,
                batch_size: int = 32, generator: Optional[torch.Generator] = None,
                ) -> Union[GLMPrediction, torch.Tensor]:  # fmt: skip
        """Linearised (GLM) predictive :math:`f(x) \\sim \\mathcal N(f(x, \\theta_*), J \\Sigma J^\\top)` of an output.

        ``fn(params, x)`` returns the output for constrained site values ``params``; ``link`` is
        ``None`` (mean and covariance), ``"probit"`` or ``"mc"`` (class probabilities). See
        :func:`~pyro_sgmcmc.guides.predictive.linearized_predictive` for the details.
        """
        return linearized_predictive(
            self, fn, x, link=link, num_samples=num_samples, batch_size=batch_size, generator=generator
        )


def _as_precision(value, name: str, like: torch.Tensor, numel: int) -> torch.Tensor:
    """``value`` as a tensor of ``like``'s dtype and device that broadcasts to ``(numel,)``."""
    tensor = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if tensor.dim() > 0 and tensor.reshape(-1).shape[0] not in (1, numel):
        raise ValueError(f"{name} has {tensor.numel()} entries; the site has {numel} coordinates (or give 1 number)")
    if not (torch.isfinite(tensor).all() and (tensor > 0).all()):
        raise ValueError(
            f"{name} = {value!r} is not a positive finite number in {like.dtype} (it overflows or underflows)"
        )
    return tensor.reshape(-1) if tensor.dim() > 0 else tensor
