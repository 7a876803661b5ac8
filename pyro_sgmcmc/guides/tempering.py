r"""Tempered variational objectives: :class:`TemperedELBO` and the guide-side settings it reads.

**One meaning of temperature in the package.** The SG-MCMC kernels sample the tempered posterior

.. math:: p_T(\theta \mid y) \propto p(\theta \mid y)^{1/T} \propto \big(p(y \mid \theta)\, p(\theta)\big)^{1/T},

prior included. ``TemperedELBO(temperature=T)`` fits the same target: its loss is the negative
ELBO of :math:`p_T`, multiplied by :math:`T` (the same optimum, and at every :math:`T` the scale
of an ordinary negative ELBO, so learning rates carry over),

.. math:: \mathcal L_T(q) = \mathbb E_q\big[-\log p(y \mid \theta) - \log p(\theta)\big] - T\, \mathbb H[q]
          = T \Big(\mathbb E_q\big[-\tfrac1T \log p(y, \theta)\big] - \mathbb H[q]\Big),

whose minimiser over all distributions is :math:`p_T`. For a Gaussian posterior
:math:`\mathcal N(m, \Lambda^{-1})` that is :math:`\mathcal N(m, T \Lambda^{-1})`: same mean,
variances times :math:`T`.

**The KL weight** (the cold-posterior literature's "temperature" of variational BNNs, and this
package's ``temperature`` before 0.2) weights only the KL term,

.. math:: \mathcal L^{\mathrm{KL}}_w(q) = \mathbb E_q[-\log p(y \mid \theta)] + w\, \mathrm{KL}(q \,\|\, p),

whose minimiser is the *likelihood*-tempered posterior :math:`p(y \mid \theta)^{1/w} p(\theta)`.
Both settings combine: with ``kl_weight=w`` and ``temperature=T`` the loss is
:math:`\mathbb E_q[-\log p(y \mid \theta)] + w\,(\mathbb E_q[-\log p(\theta)] - T\, \mathbb H[q])`, the
target :math:`(p(y \mid \theta)^{1/w} p(\theta))^{1/T}`. Both are 1 by default (``Trace_ELBO``).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch
from pyro.infer import Trace_ELBO
from pyro.poutine.messenger import Messenger

from ._checks import check_bool, check_positive_int, check_positive_real

__all__ = ["TemperedELBO", "TemperedGuide", "check_temperature"]


def check_temperature(value, name: str = "temperature") -> float:
    """A positive finite real number (``True`` and strings refused)."""
    return check_positive_real(
        value, name, f". Variational inference needs {name} > 0: at 0 the objective loses the entropy, sigma "
        "collapses to 0 and the mean goes to a point estimate. For a point estimate use "
        "pyro.infer.autoguide.AutoDelta, or the SG-MCMC kernels with temperature=0.",
    )


class TemperedGuide:
    """The tempering settings a guide carries for :class:`TemperedELBO`: ``temperature`` and ``kl_weight``.

    Both may be changed between steps (annealing); :class:`TemperedELBO` reads them at every step.
    """

    def _init_tempering(self, temperature: float, kl_weight: float) -> None:
        self._temperature = check_temperature(temperature)
        self._kl_weight = check_temperature(kl_weight, "kl_weight")
        self.under_tempered_elbo = False  # set by TemperedELBO while it runs the guide

    @property
    def temperature(self) -> float:
        """:math:`T > 0`: the guide targets :math:`p(\\theta \\mid y)^{1/T}` (:mod:`~pyro_sgmcmc.guides.tempering`)."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = check_temperature(value)

    @property
    def kl_weight(self) -> float:
        """:math:`w > 0`, the weight of the KL term (likelihood tempering); 1 by default."""
        return self._kl_weight

    @kl_weight.setter
    def kl_weight(self, value: float) -> None:
        self._kl_weight = check_temperature(value, "kl_weight")

    @property
    def is_tempered(self) -> bool:
        return self._temperature != 1.0 or self._kl_weight != 1.0


class _Scale(Messenger):
    """Multiply the log-density of sample sites by ``factor`` (only latent sites if ``latent_only``)."""

    def __init__(self, factor: float, latent_only: bool) -> None:
        super().__init__()
        self.factor = factor
        self.latent_only = latent_only

    def _process_message(self, msg) -> None:
        if msg["type"] == "sample" and not (self.latent_only and msg["is_observed"]):
            msg["scale"] = self.factor * msg["scale"]


class TemperedELBO(Trace_ELBO):
    """:class:`pyro.infer.Trace_ELBO` for the tempered posterior :math:`p(\\theta \\mid y)^{1/T}`.

    The loss (returned by :meth:`loss`, minimised by :class:`pyro.infer.SVI`) is, with
    ``temperature`` :math:`T` and ``kl_weight`` :math:`w` (see :mod:`~pyro_sgmcmc.guides.tempering`),

    .. math:: \\mathcal{L} = \\mathbb{E}_{q}\\Big[-\\log p(y \\mid \\theta)
              + w \\big(T \\log q(\\theta) - \\log p(\\theta)\\big)\\Big],

    i.e. :math:`\\mathbb E_q[-\\log p(y,\\theta)] - T\\,\\mathbb H[q]` by default (:math:`w = 1`), whose
    minimiser is :math:`p(\\theta \\mid y)^{1/T}`, as the kernels' ``temperature``; ``kl_weight``
    alone gives the KL-weighted objective :math:`\\mathbb E_q[-\\log p(y\\mid\\theta)] + w\\,\\mathrm{KL}(q\\|p)`.

    Implementation: the model runs under a handler that multiplies the log-density of its *latent*
    sites by :math:`w`, leaving observed sites (the likelihood, ``pyro.factor`` included) alone,
    and every guide site's log-density is multiplied by :math:`wT`; the subsampling scales
    (:math:`N / B`) are untouched and the rest is :class:`~pyro.infer.Trace_ELBO`. At
    :math:`T = w = 1` it is exactly ``Trace_ELBO``.

    Parameters
    ----------
    temperature : float, optional
        :math:`T > 0`. By default the guide's ``temperature`` if it is a :class:`TemperedGuide`
        (e.g. :class:`~pyro_sgmcmc.guides.AutoDiagVI`), else 1. If both are given they must agree.
    kl_weight : float, optional
        :math:`w > 0`, resolved as ``temperature``.
    **kwargs
        Passed to :class:`pyro.infer.Trace_ELBO` (``num_particles``, ``vectorize_particles``, ...).

    Examples
    --------
    >>> import pyro, torch
    >>> import pyro.distributions as dist
    >>> from pyro_sgmcmc.guides import TemperedELBO
    >>> def model():
    ...     x = pyro.sample("x", dist.Normal(0.0, 1.0))
    ...     pyro.sample("y", dist.Normal(x, 1.0), obs=torch.tensor(0.0))
    >>> def guide():  # a point mass at x = 1 (log q = 0), so that the one-draw estimate is exact
    ...     pyro.sample("x", dist.Delta(torch.tensor(1.0)))
    >>> # -log p(y | x) = log(2 pi) / 2 + 1/2 = 1.4189 and -log p(x) = 1.4189
    >>> [round(TemperedELBO(temperature=t).loss(model, guide), 4) for t in (1.0, 0.5)]
    [2.8379, 2.8379]
    >>> round(TemperedELBO(kl_weight=0.5).loss(model, guide), 4)
    2.1284
    """

    def __init__(self, temperature: Optional[float] = None, *, kl_weight: Optional[float] = None, **kwargs) -> None:
        if "num_particles" in kwargs:
            check_positive_int(kwargs["num_particles"], "num_particles")
        nesting = kwargs.get("max_plate_nesting", math.inf)
        if not (isinstance(nesting, float) and nesting == math.inf):
            check_positive_int(nesting, "max_plate_nesting", low=0)
        for flag in ("vectorize_particles", "strict_enumeration_warning", "retain_graph", "ignore_jit_warnings"):
            if flag in kwargs and kwargs[flag] is not None:
                check_bool(kwargs[flag], flag)
        super().__init__(**kwargs)
        self.temperature = None if temperature is None else check_temperature(temperature)
        self.kl_weight = None if kl_weight is None else check_temperature(kl_weight, "kl_weight")

    def _resolve(self, guide, name: str) -> float:
        mine = getattr(self, name)
        theirs = getattr(guide, name) if isinstance(guide, TemperedGuide) else None
        if mine is None:
            return 1.0 if theirs is None else theirs
        if theirs is not None and theirs != mine:
            raise ValueError(
                f"TemperedELBO({name}={mine}) disagrees with the guide's {name}={theirs}; set the {name} in one "
                f"place (AutoDiagVI(..., {name}=...) with TemperedELBO())"
            )
        return mine

    def resolve_temperature(self, guide) -> float:
        """The temperature used with ``guide``: this ELBO's, else the guide's, else 1."""
        return self._resolve(guide, "temperature")

    def resolve_kl_weight(self, guide) -> float:
        """The KL weight used with ``guide``: this ELBO's, else the guide's, else 1."""
        return self._resolve(guide, "kl_weight")

    def _tempered(self, model: Callable, guide: Callable) -> Tuple[Callable, Callable]:
        temperature, kl_weight = self.resolve_temperature(guide), self.resolve_kl_weight(guide)
        if temperature == 1.0 and kl_weight == 1.0:
            return model, guide
        return _Scale(kl_weight, latent_only=True)(model), _Scale(kl_weight * temperature, latent_only=False)(guide)

    def _run(self, method, model, guide, *args, **kwargs):
        tempered = isinstance(guide, TemperedGuide)
        if tempered:
            guide.under_tempered_elbo = True
        try:
            return method(*self._tempered(model, guide), *args, **kwargs)
        finally:
            if tempered:
                guide.under_tempered_elbo = False

    def loss(self, model, guide, *args, **kwargs) -> float:
        """A Monte Carlo estimate of the tempered loss (a float)."""
        return self._run(super().loss, model, guide, *args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The estimate of the tempered loss as a tensor that autograd can differentiate."""
        return self._run(super().differentiable_loss, model, guide, *args, **kwargs)

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """Estimate the tempered loss and accumulate its gradient in the parameters' ``.grad``."""
        return self._run(super().loss_and_grads, model, guide, *args, **kwargs)
