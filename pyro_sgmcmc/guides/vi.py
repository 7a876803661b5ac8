"""Tempered diagonal-Gaussian variational inference for Pyro models with subsampled data.

:class:`AutoDiagVI` is a Pyro autoguide: a diagonal Gaussian over every latent site in
unconstrained space, with a log-scale parameterisation,

.. math:: q_\\phi(z) = \\mathcal{N}\\big(z \\mid \\mu, \\operatorname{diag}(\\sigma^2)\\big),
          \\qquad \\sigma = \\exp(\\rho), \\qquad \\theta = g(z),

where :math:`g` maps each site's unconstrained value to its support
(``torch.distributions.biject_to(site.support)``). It is trained by :class:`pyro.infer.SVI` with
:class:`TemperedELBO`, whose loss is the tempered negative ELBO

.. math:: \\mathcal{L}_T(\\phi) = \\mathbb{E}_{q_\\phi}\\big[-\\log p(y \\mid \\theta)\\big]
          + T \\, \\mathrm{KL}\\big(q_\\phi \\,\\|\\, p\\big),

estimated from one minibatch (the model's ``pyro.plate("data", N, subsample_size=B)`` scales the
likelihood by :math:`N / B`) and reparameterised draws :math:`z = \\mu + \\sigma \\odot \\varepsilon`.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Callable, Dict, Iterator, Optional, Tuple

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoContinuous
from pyro.infer.autoguide.initialization import init_to_median
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from torch import nn
from torch.distributions import biject_to
from torch.distributions.transforms import ComposeTransform, IndependentTransform

from ..model.potential import ModelPotential
from ._checks import check_bool, check_callable, check_positive_int

__all__ = ["AutoDiagVI", "TemperedELBO"]

DEFAULT_INIT_SCALE = math.exp(-3.0)  # initial sigma: log-sd -3, a common choice for network weights


# ---------------------------------------------------------------------- argument checks
def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(f"temperature must be a positive finite number; got {temperature!r}")
    temperature = float(temperature)
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature must be a positive finite number; got {temperature!r}. Variational inference needs "
            "T > 0: at T = 0 the tempered NELBO E_q[-log p(y | theta)] loses both the prior and the entropy, "
            "sigma collapses to 0 and the mean goes to the maximum-likelihood point, not the MAP. For a point "
            "estimate use pyro.infer.autoguide.AutoDelta, or the SG-MCMC kernels with temperature=0."
        )
    return temperature


def _check_init_scale(init_scale) -> float:
    if isinstance(init_scale, bool) or not isinstance(init_scale, numbers.Real):
        raise ValueError(f"init_scale must be a positive finite float; got {init_scale!r}")
    init_scale = float(init_scale)
    if not (math.isfinite(init_scale) and init_scale > 0):
        raise ValueError(
            f"init_scale must be a positive finite float (the initial standard deviation sigma of every "
            f"unconstrained coordinate; the default {DEFAULT_INIT_SCALE:.4f} is log-sd -3); got {init_scale!r}"
        )
    return init_scale


# ---------------------------------------------------------------------- tempering
class _Tempering(Messenger):
    """Multiply the log-density of sample sites by ``temperature``.

    With ``latent_only=True`` (the model) observed sites, i.e. the likelihood and any
    ``pyro.factor``, are left alone and only the prior terms are scaled; with ``latent_only=False``
    (the guide) every sample site, i.e. :math:`\\log q`, is scaled.
    """

    def __init__(self, temperature: float, latent_only: bool) -> None:
        super().__init__()
        self.temperature = temperature
        self.latent_only = latent_only

    def _process_message(self, msg) -> None:
        if msg["type"] == "sample" and not (self.latent_only and msg["is_observed"]):
            msg["scale"] = self.temperature * msg["scale"]


def _active_guide_tempering() -> Optional[_Tempering]:
    for messenger in _PYRO_STACK:
        if isinstance(messenger, _Tempering) and not messenger.latent_only:
            return messenger
    return None


class TemperedELBO(Trace_ELBO):
    """:class:`pyro.infer.Trace_ELBO` with the KL term weighted by a temperature :math:`T`.

    The loss (returned by :meth:`loss`, and minimised by :class:`pyro.infer.SVI`) is the tempered
    negative ELBO

    .. math:: \\mathcal{L}_T = \\mathbb{E}_{q}\\Big[-\\log p(y \\mid \\theta)
              + T \\big(\\log q(\\theta) - \\log p(\\theta)\\big)\\Big]
              = \\mathbb{E}_q[-\\log p(y \\mid \\theta)] + T \\, \\mathrm{KL}(q \\,\\|\\, p).

    Its minimiser over all distributions is the *likelihood-tempered* posterior
    :math:`q^\\star(\\theta) \\propto p(y \\mid \\theta)^{1/T} \\, p(\\theta)`: ``T = 1`` is the Bayesian
    posterior, ``T < 1`` a cold posterior (the likelihood counts more), ``T > 1`` a warm one.
    :math:`\\mathcal{L}_T / T` is the ordinary negative ELBO of the model with its likelihood
    scaled by :math:`1/T`, so both views have the same optimum.

    Implementation: the model runs under a handler that multiplies the log-density of its *latent*
    sites (the prior) by ``T`` and leaves *observed* sites (the likelihood, ``pyro.factor``
    included) alone, and the log-density of every guide site is multiplied by ``T`` (as
    :func:`pyro.poutine.scale` would). Each term is then weighted exactly as written above, the
    subsampling scales (:math:`N / B`) are untouched, and the rest is
    :class:`~pyro.infer.Trace_ELBO`. At ``T = 1`` it is exactly ``Trace_ELBO``.

    Parameters
    ----------
    temperature : float, optional
        :math:`T > 0`. By default the ``temperature`` of the guide if it is an :class:`AutoDiagVI`,
        else 1. If both this argument and the guide's ``temperature`` are given they must agree.
    **kwargs
        Passed to :class:`pyro.infer.Trace_ELBO` (``num_particles``, ``vectorize_particles``,
        ``max_plate_nesting``, ...).

    Examples
    --------
    >>> from pyro_sgmcmc.guides.vi import TemperedELBO
    >>> def model():
    ...     x = pyro.sample("x", dist.Normal(0.0, 1.0))
    ...     pyro.sample("y", dist.Normal(x, 1.0), obs=torch.tensor(0.0))
    >>> def guide():  # a point mass at x = 1, so that the one-draw estimate is exact
    ...     pyro.sample("x", dist.Delta(torch.tensor(1.0)))
    >>> # -log p(y | x) = log(2 pi) / 2 + 1/2 = 1.4189, -log p(x) = 1.4189 and log q(x) = 0
    >>> [round(TemperedELBO(temperature=t).loss(model, guide), 4) for t in (1.0, 0.5)]
    [2.8379, 2.1284]
    """

    def __init__(self, temperature: Optional[float] = None, **kwargs) -> None:
        if "num_particles" in kwargs:
            check_positive_int(kwargs["num_particles"], "num_particles")
        nesting = kwargs.get("max_plate_nesting", math.inf)
        if not (isinstance(nesting, float) and nesting == math.inf):
            check_positive_int(nesting, "max_plate_nesting", low=0)
        for flag in ("vectorize_particles", "strict_enumeration_warning", "retain_graph", "ignore_jit_warnings"):
            if flag in kwargs and kwargs[flag] is not None:
                check_bool(kwargs[flag], flag)
        super().__init__(**kwargs)
        self.temperature = None if temperature is None else _check_temperature(temperature)

    def resolve_temperature(self, guide) -> float:
        """The temperature used with ``guide``: this ELBO's, else the guide's, else 1."""
        guide_temperature = guide.temperature if isinstance(guide, AutoDiagVI) else None
        if self.temperature is None:
            return 1.0 if guide_temperature is None else guide_temperature
        if guide_temperature is not None and guide_temperature != self.temperature:
            raise ValueError(
                f"TemperedELBO(temperature={self.temperature}) disagrees with the guide's temperature="
                f"{guide_temperature}; set the temperature in one place (AutoDiagVI(..., temperature=T) "
                "with TemperedELBO())"
            )
        return self.temperature

    def _tempered(self, model: Callable, guide: Callable) -> Tuple[Callable, Callable]:
        temperature = self.resolve_temperature(guide)
        if temperature == 1.0 and not isinstance(guide, AutoDiagVI):
            return model, guide
        # The guide is always wrapped (at T = 1 the scale is 1): AutoDiagVI checks for the wrapper.
        return _Tempering(temperature, latent_only=True)(model), _Tempering(temperature, latent_only=False)(guide)

    def loss(self, model, guide, *args, **kwargs) -> float:
        """A Monte Carlo estimate of :math:`\\mathcal{L}_T` (a float)."""
        return super().loss(*self._tempered(model, guide), *args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The estimate of :math:`\\mathcal{L}_T` as a tensor that autograd can differentiate."""
        return super().differentiable_loss(*self._tempered(model, guide), *args, **kwargs)

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """Estimate :math:`\\mathcal{L}_T` and accumulate its gradient in the parameters' ``.grad``."""
        return super().loss_and_grads(*self._tempered(model, guide), *args, **kwargs)


# ---------------------------------------------------------------------- sticking the landing
class _StickingTheLandingNormal(dist.Normal):
    """A Normal whose draws carry gradients to ``loc`` and ``scale`` but whose ``log_prob`` does not.

    ``rsample`` is the usual :math:`z = \\mu + \\sigma \\varepsilon`; ``log_prob(z)`` is evaluated with
    detached :math:`(\\bar\\mu, \\bar\\sigma)`, so :math:`\\nabla_\\phi \\log q(z)` is only the path term
    :math:`\\partial_z \\log q(z) \\, \\partial_\\phi z`, and the score term
    :math:`\\partial_\\phi \\log q_\\phi(z)|_{z}`, zero in expectation, is dropped.
    """

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return dist.Normal(self.loc.detach(), self.scale.detach(), validate_args=False).log_prob(value)


# ---------------------------------------------------------------------- the guide
def _is_identity(transform) -> bool:
    while isinstance(transform, IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, ComposeTransform) and not transform.parts


class AutoDiagVI(AutoContinuous):
    """Diagonal-Gaussian variational inference, tempered, with an optional sticking-the-landing gradient.

    Usage::

        guide = AutoDiagVI(model, temperature=1.0, stl=True)
        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), TemperedELBO())
        for step in range(num_steps):
            svi.step(*args)

    The guide is :math:`q_\\phi(z) = \\mathcal{N}(z \\mid \\mu, \\operatorname{diag}(\\sigma^2))` over
    the flat vector :math:`z` of all latent sites in unconstrained space, with parameters
    ``loc`` (:math:`\\mu`) and ``log_scale`` (:math:`\\rho = \\log \\sigma`); the constrained value of
    each site is :math:`\\theta = g(z)` with :math:`g` = ``biject_to(site.support)``, and the log-det
    Jacobian enters :math:`\\log q(\\theta)` as in every Pyro autoguide. Trained with
    :class:`TemperedELBO`, it minimises

    .. math:: \\mathcal{L}_T(\\mu, \\rho) = \\mathbb{E}_{\\varepsilon \\sim \\mathcal{N}(0, I)}
              \\Big[-\\log p(y \\mid \\theta) + T \\big(\\log q_\\phi(\\theta) - \\log p(\\theta)\\big)\\Big],
              \\qquad z = \\mu + e^{\\rho} \\odot \\varepsilon,

    i.e. :math:`\\mathbb{E}_q[-\\log p(y \\mid \\theta)] + T \\, \\mathrm{KL}(q \\,\\|\\, p)`, whose
    unrestricted optimum is :math:`p(y \\mid \\theta)^{1/T} p(\\theta)` normalised. For a Gaussian
    target :math:`\\mathcal{N}(m, \\Lambda^{-1})` the diagonal optimum has mean :math:`m` and
    variances :math:`1 / \\Lambda_{ii}` (not the marginal variances :math:`(\\Lambda^{-1})_{ii}`,
    which are larger when the target is correlated).

    On a model with ``pyro.plate("data", N, subsample_size=B)`` every step sees a new minibatch
    and the plate scales its likelihood by :math:`N / B`: the loss and its gradient are unbiased.

    **Temperature.** Note the difference with the SG-MCMC kernels of this package, whose
    ``temperature`` tempers the whole posterior, :math:`\\pi^{1/T}` (prior included). Here, as in
    the cold-posterior literature for variational BNNs, :math:`T` weights the KL term, so it tempers
    the likelihood only; both agree at ``T = 1`` and agree closely whenever the likelihood
    dominates the prior. ``T`` must be positive (see ``temperature`` below). ``guide.temperature``
    may be changed between steps (KL annealing); :class:`TemperedELBO` reads it at every step.

    **Sticking the landing** (Roeder, Wu and Duvenaud, 2017). With ``stl=True`` the parameters are
    detached inside :math:`\\log q_\\phi(z)` of the sampled :math:`z`, so the gradient of the
    entropy part keeps only its path term: the estimator stays unbiased (the dropped score term
    has expectation zero) and, when :math:`q` equals the target, every single draw gives a zero
    gradient. The value of the loss is unchanged; only its gradient differs. It is meant for
    :class:`TemperedELBO` / :class:`~pyro.infer.Trace_ELBO` (not for importance-weighted bounds,
    for which it is biased).

    Parameters
    ----------
    model : callable
        A Pyro model. Its latent sites must be continuous and global (outside every subsampled
        plate), exactly as for the SG-MCMC kernels (:class:`~pyro_sgmcmc.ModelPotential` checks
        the model on the first call and raises :class:`~pyro_sgmcmc.ModelError` naming any bad site).
    init_loc_fn : callable
        A Pyro init strategy for :math:`\\mu` (default :func:`~pyro.infer.autoguide.init_to_median`).
    init_scale : float
        The initial :math:`\\sigma` of every unconstrained coordinate, positive; the default
        :math:`e^{-3} \\approx 0.0498` (log-sd :math:`-3`) suits network weights.
    temperature : float
        :math:`T > 0`, the weight of the KL term (default 1, the Bayesian posterior).
        ``T = 0`` is refused: the objective would have neither prior nor entropy, :math:`\\sigma`
        would collapse and :math:`\\mu` would go to the maximum-likelihood point, not the MAP; for a
        point estimate use :class:`~pyro.infer.autoguide.AutoDelta` or an SG-MCMC kernel at ``T = 0``.
    stl : bool
        Use the sticking-the-landing gradient estimator (default False).

    Attributes
    ----------
    loc, log_scale : torch.nn.Parameter
        :math:`\\mu` and :math:`\\rho`, created on the first call of the guide (as in every Pyro
        autoguide): run one SVI step, or call ``guide(*args)``, before ``guide.parameters()``.

    Examples
    --------
    A conjugate model, :math:`x \\sim \\mathcal{N}(0, 1)`, :math:`y_n \\mid x \\sim \\mathcal{N}(x, 1)`,
    fitted on minibatches of 2 of its 4 data; the posterior is
    :math:`\\mathcal{N}(\\sum_n y_n / (N + 1), 1 / (N + 1)) = \\mathcal{N}(1, 0.2)`:

    >>> from pyro_sgmcmc.guides.vi import AutoDiagVI, TemperedELBO
    >>> y = torch.tensor([0.5, 1.5, 1.0, 2.0])
    >>> def model(y):
    ...     x = pyro.sample("x", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(y), subsample_size=2) as idx:
    ...         pyro.sample("y", dist.Normal(x, 1.0), obs=y[idx])
    >>> pyro.clear_param_store(); _ = pyro.set_rng_seed(0)
    >>> guide = AutoDiagVI(model, stl=True)
    >>> svi = pyro.infer.SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.1, "lrd": 0.99}), TemperedELBO())
    >>> for step in range(400):
    ...     _ = svi.step(y)
    >>> print(f"mean {guide.median()['x'].item():.1f}, variance {guide.scale.item() ** 2:.1f}")
    mean 1.0, variance 0.2
    >>> prior = guide.as_prior()["x"]  # the posterior, as the prior of the next task
    >>> type(prior).__name__, prior.loc.shape
    ('Normal', torch.Size([]))
    """

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: Callable = init_to_median,
        init_scale: float = DEFAULT_INIT_SCALE,
        temperature: float = 1.0,
        stl: bool = False,
    ) -> None:
        check_callable(model, "model")
        check_callable(init_loc_fn, "init_loc_fn")
        stl = check_bool(stl, "stl")
        self._temperature = _check_temperature(temperature)
        self._init_scale = _check_init_scale(init_scale)
        self.stl = stl
        self._init_loc_strategy = init_loc_fn
        self._unwrapped_model = (model,)  # a tuple: never registered as a submodule (as AutoGuide does)
        self._warned_untempered = False
        super().__init__(model, init_loc_fn=init_loc_fn)

    # ------------------------------------------------------------------ configuration
    @property
    def temperature(self) -> float:
        """:math:`T > 0`, the weight of the KL term; may be changed between steps."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = _check_temperature(value)

    @property
    def init_scale(self) -> float:
        """The initial :math:`\\sigma` of every unconstrained coordinate."""
        return self._init_scale

    def __getstate__(self):
        self._unwrapped_model = None  # as AutoGuide drops its model: functions and weakrefs do not pickle
        return super().__getstate__()

    # ------------------------------------------------------------------ set-up and sampling
    def _setup_prototype(self, *args, **kwargs) -> None:
        model = self._unwrapped_model[0] if self._unwrapped_model else self.model
        # The package's model inspection: a clear ModelError naming discrete latent sites, latent
        # sites inside subsampled plates, or a model without latent sites.
        ModelPotential(model, args, kwargs, init_strategy=self._init_loc_strategy)
        super()._setup_prototype(*args, **kwargs)
        self.loc = nn.Parameter(self._init_loc())
        self.log_scale = nn.Parameter(torch.full_like(self.loc, math.log(self._init_scale)))

    @property
    def scale(self) -> torch.Tensor:
        """:math:`\\sigma = \\exp(\\rho)`, the standard deviations in unconstrained space (``(latent_dim,)``)."""
        return self.log_scale.exp()

    def get_base_dist(self) -> dist.Distribution:
        return dist.Normal(torch.zeros_like(self.loc), torch.ones_like(self.loc)).to_event(1)

    def get_transform(self, *args, **kwargs) -> torch.distributions.Transform:
        return dist.transforms.AffineTransform(self.loc, self.scale)

    def get_posterior(self, *args, **kwargs) -> dist.Distribution:
        """:math:`q = \\mathcal{N}(\\mu, \\operatorname{diag}(\\sigma^2))` over the flat unconstrained latent."""
        return dist.Normal(self.loc, self.scale).to_event(1)

    def _loc_scale(self, *args, **kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.loc, self.scale

    def sample_latent(self, *args, **kwargs) -> torch.Tensor:
        """Draw the flat unconstrained latent :math:`z` (with the STL ``log_prob`` if ``stl``)."""
        if self.stl:
            posterior = _StickingTheLandingNormal(self.loc, self.scale).to_event(1)
        else:
            posterior = self.get_posterior()
        return pyro.sample(f"_{self._pyro_name}_latent", posterior, infer={"is_auxiliary": True})

    def forward(self, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """Draw every latent site, as any Pyro autoguide: takes the model's arguments, returns
        ``{name: constrained value}``."""
        if self._temperature != 1.0 and not self._warned_untempered:
            self._warn_if_untempered()
        return super().forward(*args, **kwargs)

    def _warn_if_untempered(self) -> None:
        # Being traced with gradients on but not under TemperedELBO: most likely SVI with Trace_ELBO,
        # which would silently train at T = 1. Predictive runs the guide under torch.no_grad().
        traced = any(isinstance(m, TraceMessenger) for m in _PYRO_STACK)
        if traced and torch.is_grad_enabled() and _active_guide_tempering() is None:
            self._warned_untempered = True
            warnings.warn(
                f"AutoDiagVI(temperature={self._temperature}) is being traced by an ELBO that does not temper "
                "it, which trains at T = 1: use pyro_sgmcmc.guides.vi.TemperedELBO()",
                UserWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------------ prediction
    def _split(self, latent: torch.Tensor) -> Iterator[Tuple[dict, torch.Tensor]]:
        """``(site, unconstrained value (*batch, *unconstrained_shape))`` for a flat ``(*batch, dim)`` latent."""
        batch, offset = latent.shape[:-1], 0
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            shape = self._unconstrained_shapes[name]
            size = math.prod(shape)
            yield site, latent[..., offset : offset + size].reshape(batch + shape)
            offset += size

    def _check_ready(self) -> None:
        if self.prototype_trace is None:
            raise RuntimeError("the guide has no parameters yet: call it once (or run an SVI step) first")

    @torch.no_grad()
    def sample_posterior(self, num_samples: int = 1) -> Dict[str, torch.Tensor]:
        """Independent draws of every latent site from :math:`q`, in constrained space.

        Returns ``{name: Tensor (num_samples, *site_shape)}``, detached. (For draws of the
        observed sites too, use :class:`pyro.infer.Predictive` with ``guide=``.)
        """
        self._check_ready()
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer; got {num_samples!r}")
        if num_samples * self.latent_dim >= 2**62:
            raise ValueError(f"num_samples = {num_samples} draws of {self.latent_dim} numbers do not fit in memory")
        latent = self.get_posterior().sample((num_samples,))
        return {site["name"]: biject_to(site["fn"].support)(u) for site, u in self._split(latent)}

    @torch.no_grad()
    def as_prior(self) -> Dict[str, dist.Distribution]:
        """The fitted :math:`q`, site by site, as prior distributions in constrained space (continual learning).

        For each latent site with unconstrained mean and sd :math:`(\\mu_s, \\sigma_s)` and
        transform :math:`T_s`: ``dist.Normal(mu_s, sigma_s).to_event(k)`` when :math:`T_s` is the
        identity (real support), else ``dist.TransformedDistribution`` of that Normal by
        :math:`T_s` (e.g. a log-normal for a positive site). ``k`` is the site's event dimension
        (in unconstrained space), so the batch shape fits the site's plates. The tensors are
        detached copies: the prior does not move when the guide is trained further.

        Returns
        -------
        dict
            ``{name: Distribution}``. Use it as the prior of the next task, e.g. with a model that
            takes its priors as an argument: ``pyro.sample("w", priors["w"])``.
        """
        self._check_ready()
        loc, scale = self.loc.detach().clone(), self.scale.detach().clone()
        priors = {}
        for (site, site_loc), (_, site_scale) in zip(self._split(loc), self._split(scale)):
            event_dim = site["fn"].event_dim + site_loc.dim() - site["value"].dim()
            base = dist.Normal(site_loc, site_scale).to_event(event_dim)
            transform = biject_to(site["fn"].support)
            priors[site["name"]] = base if _is_identity(transform) else dist.TransformedDistribution(base, transform)
        return priors
