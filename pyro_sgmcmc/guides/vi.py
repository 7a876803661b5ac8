r"""Tempered diagonal-Gaussian variational inference for Pyro models with subsampled data.

:class:`AutoDiagVI` is Pyro's :class:`~pyro.infer.autoguide.AutoDiagonalNormal`, a diagonal
Gaussian over every latent site in unconstrained space, with a log-scale parameterisation,

.. math:: q_\phi(z) = \mathcal{N}\big(z \mid \mu, \operatorname{diag}(\sigma^2)\big),
          \qquad \sigma = \exp(\rho), \qquad \theta = g(z),

(:math:`g` = ``biject_to(site.support)``), plus what a tempered fit needs: a temperature and a KL
weight read by :class:`~pyro_sgmcmc.guides.tempering.TemperedELBO` (one meaning of temperature
with the SG-MCMC kernels, see :mod:`~pyro_sgmcmc.guides.tempering`), the sticking-the-landing
gradient, the package's model check, and the posterior as the next task's prior.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Dict

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoDiagonalNormal
from pyro.infer.autoguide.initialization import init_to_median

from .._compat import AutoGuideInternals
from ..model.potential import ModelPotential
from ._checks import NOT_GIVEN, check_bool, check_callable, check_positive_real, renamed_argument
from .sites import site_prior, split_latent, unconstrained_shapes
from .tempering import TemperedELBO, TemperedGuide  # TemperedELBO: re-exported (its former home)

__all__ = ["AutoDiagVI", "TemperedELBO", "DEFAULT_INIT_SCALE"]

DEFAULT_INIT_SCALE = math.exp(-3.0)  # initial sigma: log-sd -3, a common choice for network weights


def _check_init_scale(init_scale) -> float:
    return check_positive_real(
        init_scale, "init_scale", f" (the initial standard deviation sigma of every unconstrained coordinate; the "
        f"default {DEFAULT_INIT_SCALE:.4f} is log-sd -3)",
    )


class _StickingTheLandingNormal(dist.Normal):
    r"""A Normal whose draws carry gradients to ``loc`` and ``scale`` but whose ``log_prob`` does not.

    ``rsample`` is the usual :math:`z = \mu + \sigma \varepsilon`; ``log_prob(z)`` uses detached
    :math:`(\bar\mu, \bar\sigma)`, so :math:`\nabla_\phi \log q(z)` keeps only the path term and the
    score term, zero in expectation, is dropped.
    """

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return dist.Normal(self.loc.detach(), self.scale.detach(), validate_args=False).log_prob(value)


class AutoDiagVI(TemperedGuide, AutoDiagonalNormal):
    """Diagonal-Gaussian VI (Pyro's ``AutoDiagonalNormal``), tempered, with an optional sticking-the-landing gradient.

    Usage::

        guide = AutoDiagVI(model, temperature=1.0, sticking_the_landing=True)
        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), TemperedELBO())
        for step in range(num_steps):
            svi.step(*args)

    The parameters are ``loc`` (:math:`\\mu`) and ``scale`` (:math:`\\sigma`, stored as its
    logarithm :math:`\\rho`, :attr:`log_scale`: the ``scale_constraint`` is ``positive``, an exp
    transform). Trained with :class:`TemperedELBO` it minimises

    .. math:: \\mathcal{L}(\\mu, \\rho) = \\mathbb{E}_{\\varepsilon}\\Big[-\\log p(y \\mid \\theta)
              + w\\big(T \\log q_\\phi(\\theta) - \\log p(\\theta)\\big)\\Big],
              \\qquad z = \\mu + e^{\\rho} \\odot \\varepsilon,

    whose unrestricted optimum is :math:`(p(y \\mid \\theta)^{1/w} p(\\theta))^{1/T}` normalised:
    with the default ``kl_weight`` :math:`w = 1`, the tempered posterior
    :math:`p(\\theta \\mid y)^{1/T}` that the SG-MCMC kernels sample at ``temperature=T``. For a
    Gaussian target :math:`\\mathcal{N}(m, \\Lambda^{-1})` the diagonal optimum has mean :math:`m`
    and variances :math:`1 / \\Lambda_{ii}`. A ``pyro.plate("data", N, subsample_size=B)`` scales
    the likelihood by :math:`N / B`: the loss and its gradient are unbiased.

    **Sticking the landing** (Roeder, Wu and Duvenaud, 2017). With ``sticking_the_landing=True``
    the parameters are detached inside :math:`\\log q_\\phi(z)` of the sampled :math:`z`: the
    estimator stays unbiased and, when :math:`q` equals the target, every draw gives a zero
    gradient. The loss value is unchanged. Meant for :class:`TemperedELBO` / ``Trace_ELBO``.

    Parameters
    ----------
    model : callable
        A Pyro model with continuous global latent sites (checked by :class:`~pyro_sgmcmc.ModelPotential`).
    init_loc_fn : callable
        A Pyro init strategy for :math:`\\mu` (default :func:`~pyro.infer.autoguide.init_to_median`).
    init_scale : float
        The initial :math:`\\sigma`, positive; the default :math:`e^{-3} \\approx 0.0498` suits networks.
    temperature : float
        :math:`T > 0` of the tempered posterior (default 1, the Bayesian posterior).
    kl_weight : float
        :math:`w > 0`, the weight of the KL term (default 1): ``kl_weight=T`` with ``temperature=1``
        is the former meaning of ``temperature`` (likelihood tempering).
    sticking_the_landing : bool
        Use the sticking-the-landing gradient estimator (default False). ``stl`` is its former
        spelling (``FutureWarning``, removed in the next release).

    Examples
    --------
    A conjugate model, :math:`x \\sim \\mathcal{N}(0, 1)`, :math:`y_n \\mid x \\sim \\mathcal{N}(x, 1)`,
    fitted on minibatches of 2 of its 4 data; the posterior is :math:`\\mathcal{N}(1, 0.2)`:

    >>> from pyro_sgmcmc.guides import AutoDiagVI, TemperedELBO
    >>> y = torch.tensor([0.5, 1.5, 1.0, 2.0])
    >>> def model(y):
    ...     x = pyro.sample("x", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y), subsample_size=2) as idx:
    ...         pyro.sample("y", dist.Normal(x, 1.0), obs=y[idx])
    >>> pyro.clear_param_store(); _ = pyro.set_rng_seed(0)
    >>> guide = AutoDiagVI(model, sticking_the_landing=True)
    >>> svi = pyro.infer.SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.1, "lrd": 0.99}), TemperedELBO())
    >>> for step in range(400):
    ...     _ = svi.step(y)
    >>> print(f"mean {guide.median()['x'].item():.1f}, variance {guide.scale.item() ** 2:.1f}")
    mean 1.0, variance 0.2
    >>> prior = guide.as_prior()["x"]  # the posterior, as the prior of the next task
    >>> type(prior).__name__, prior.loc.shape
    ('Normal', torch.Size([]))
    """

    scale_constraint = constraints.positive

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: Callable = init_to_median,
        init_scale: float = DEFAULT_INIT_SCALE,
        temperature: float = 1.0,
        kl_weight: float = 1.0,
        sticking_the_landing: bool = False,
        stl=NOT_GIVEN,
    ) -> None:
        check_callable(model, "model")
        check_callable(init_loc_fn, "init_loc_fn")
        sticking_the_landing, name = renamed_argument("stl", stl, "sticking_the_landing", sticking_the_landing)
        self.sticking_the_landing = check_bool(sticking_the_landing, name)
        self._init_tempering(temperature, kl_weight)
        self._init_loc_strategy = init_loc_fn
        self._unwrapped_model = (model,)  # a tuple: never registered as a submodule (as AutoGuide does)
        self._warned_untempered = False
        self._initial_sigma = _check_init_scale(init_scale)
        super().__init__(model, init_loc_fn=init_loc_fn, init_scale=self._initial_sigma)

    @property
    def stl(self) -> bool:
        """Deprecated spelling of :attr:`sticking_the_landing` (``FutureWarning``)."""
        warnings.warn("AutoDiagVI.stl is deprecated; use AutoDiagVI.sticking_the_landing", FutureWarning, stacklevel=2)
        return self.sticking_the_landing

    @property
    def init_scale(self) -> float:
        """The initial :math:`\\sigma` of every unconstrained coordinate."""
        return self._initial_sigma

    @property
    def log_scale(self) -> torch.nn.Parameter:
        """:math:`\\rho = \\log\\sigma`, the unconstrained parameter behind ``scale`` (``(latent_dim,)``)."""
        return self.scale_unconstrained

    def __getstate__(self):
        self._unwrapped_model = None  # as AutoGuide drops its model: functions and weakrefs do not pickle
        return super().__getstate__()

    def _check_model(self, args: tuple, kwargs: dict) -> None:
        """The package's model inspection, before Pyro sets the guide up: a clear ModelError naming discrete
        latent sites, latent sites inside subsampled plates, or a model without latent sites."""
        model = self._unwrapped_model[0] if self._unwrapped_model else self.model
        ModelPotential(model, args, kwargs, init_strategy=self._init_loc_strategy)

    def sample_latent(self, *args, **kwargs) -> torch.Tensor:
        """Draw the flat unconstrained latent :math:`z` (with the STL ``log_prob`` if ``sticking_the_landing``)."""
        if not self.sticking_the_landing:
            return super().sample_latent(*args, **kwargs)
        posterior = _StickingTheLandingNormal(self.loc, self.scale).to_event(1)
        return pyro.sample(AutoGuideInternals.latent_site_name(self), posterior, infer={"is_auxiliary": True})

    def forward(self, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """Draw every latent site (takes the model's arguments, returns ``{name: constrained value}``)."""
        if self.is_tempered and not self._warned_untempered:
            self._warn_if_untempered()
        if self.prototype_trace is None:  # the first call: Pyro's forward sets the guide up from the model
            self._check_model(args, kwargs)
        return super().forward(*args, **kwargs)

    def _warn_if_untempered(self) -> None:
        # Run inside a handler with gradients on but not by TemperedELBO: most likely SVI with
        # Trace_ELBO, which would silently train at T = 1. Predictive runs the guide under no_grad.
        if pyro.poutine.runtime.am_i_wrapped() and torch.is_grad_enabled() and not self.under_tempered_elbo:
            self._warned_untempered = True
            warnings.warn(
                f"AutoDiagVI(temperature={self.temperature}, kl_weight={self.kl_weight}) is being traced by an ELBO "
                "that does not temper it, which trains at T = 1: use pyro_sgmcmc.guides.TemperedELBO()",
                UserWarning,
                stacklevel=3,
            )

    def _check_ready(self) -> None:
        if self.prototype_trace is None:
            raise RuntimeError("the guide has no parameters yet: call it once (or run an SVI step) first")

    @torch.no_grad()
    def sample_posterior(self, num_samples: int = 1) -> Dict[str, torch.Tensor]:
        """Independent draws ``{name: (num_samples, *site_shape)}`` of every latent site from :math:`q`, constrained."""
        self._check_ready()
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer; got {num_samples!r}")
        if num_samples * self.latent_dim >= 2**62:
            raise ValueError(f"num_samples = {num_samples} draws of {self.latent_dim} numbers do not fit in memory")
        latent = self.get_posterior().sample((num_samples,))
        shapes = unconstrained_shapes(self.prototype_trace)
        return {
            site["name"]: torch.distributions.biject_to(site["fn"].support)(u)
            for site, u in split_latent(self.prototype_trace, shapes, latent)
        }

    @torch.no_grad()
    def as_prior(self) -> Dict[str, dist.Distribution]:
        """The fitted :math:`q`, site by site, as prior distributions in constrained space (continual learning).

        Each site: ``Normal(mu_s, sigma_s).to_event(k)`` over its unconstrained value (``k`` the
        site's event dimension, so its plate dimensions stay batch dimensions), pushed through
        ``biject_to(support)`` for a constrained site. Detached copies: the prior does not move
        when the guide is trained further. Use it as ``pyro.sample("w", priors["w"])``.
        """
        self._check_ready()
        loc, scale = self.loc.detach().clone(), self.scale.detach().clone()
        shapes = unconstrained_shapes(self.prototype_trace)
        priors = {}
        for (site, site_loc), (_, site_scale) in zip(
            split_latent(self.prototype_trace, shapes, loc), split_latent(self.prototype_trace, shapes, scale)
        ):
            event_dim = site["fn"].event_dim + site_loc.dim() - site["value"].dim()
            priors[site["name"]] = site_prior(dist.Normal(site_loc, site_scale).to_event(event_dim), site)
        return priors
