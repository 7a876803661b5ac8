"""Online marginal-likelihood training of a Laplace approximation (Immer et al., 2021).

The MAP and the prior precision are learnt together, in one run: MAP steps on the log joint
under the current Gaussian prior :math:`\\mathcal N(m, \\mathrm{diag}(\\lambda)^{-1})` (in
unconstrained space),

.. math::
    \\theta \\leftarrow \\theta + \\text{optimiser step on }
    \\frac{N}{B}\\sum_{n \\in \\mathcal B} \\log p(y_n \\mid \\theta)
    - \\tfrac12 (\\theta - m)^\\top \\mathrm{diag}(\\lambda)(\\theta - m),

(through the compiled potential of :mod:`~pyro_sgmcmc.guides.gaussian_prior_steps` when every
latent site has real support, else ``SVI`` with :func:`gaussian_prior_loss`), alternate every
``hyper_every`` steps with ``hyper_steps`` Adam steps on :math:`\\log\\lambda` that
raise the standard Laplace evidence (:mod:`pyro_sgmcmc.guides.evidence`) of a Laplace
approximation built at the current :math:`\\theta` (one curvature sweep over the data each time).
As in laplace-torch (Immer et al.'s algorithm 1), the run keeps the point and precision whose
evidence was highest after an evidence step (``keep_best=True``) and returns the approximation
there: with a constant learning rate the MAP steps keep moving :math:`\\theta` about the optimum,
and the last point is a random one of them. At a fixed point :math:`\\theta` is the MAP of the
prior :math:`\\lambda` and :math:`\\lambda` maximises the evidence at that MAP; for a model whose
log-likelihood is quadratic (Bayesian linear regression) that is the maximiser of the exact
evidence (type-II maximum likelihood), because the evidence's derivative through :math:`\\theta` vanishes at the MAP.

Reference: A. Immer, M. Bauer, V. Fortuin, G. Rätsch, M. E. Khan, "Scalable marginal likelihood
estimation for model selection in deep learning", ICML 2021.
"""

from __future__ import annotations

from typing import Dict, Optional

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions.util import is_identically_zero
from pyro.poutine.util import site_is_subsample

from ._checks import check_bool, check_positive_int, check_precision
from .gaussian_prior_steps import GaussianPriorSteps

__all__ = ["marglik_training", "gaussian_prior_loss"]


def gaussian_prior_loss(prior_mean: torch.Tensor, precision_fn):
    """An SVI loss: the negative log joint with the model's prior replaced by a Gaussian.

    ``loss(model, guide, *args)`` is
    :math:`-\\sum_{\\text{observed}} \\log p(y \\mid \\theta) + \\frac12 \\sum_i \\lambda_i (\\theta_i - m_i)^2`,
    :math:`\\theta` the guide's unconstrained point, the observed sites' log-probabilities scaled
    as Pyro scales them (``N / B`` for a subsampled plate); ``precision_fn()`` returns the current
    ``(d,)`` precisions in the guide's order.
    """

    def loss(model, guide, *args, **kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        model_trace.compute_log_prob()
        log_likelihood = 0.0
        for site in model_trace.nodes.values():
            if site["type"] == "sample" and site["is_observed"] and not site_is_subsample(site):
                if not is_identically_zero(site["log_prob_sum"]):
                    log_likelihood = log_likelihood + site["log_prob_sum"]
        offset = guide.loc - prior_mean
        scatter = (precision_fn().to(offset.dtype) * offset**2).sum()
        return -log_likelihood + 0.5 * scatter

    return loss


def marglik_training(
    guide,
    *args,
    num_steps: int,
    optim: Optional[pyro.optim.PyroOptim] = None,
    mode: str = "site",
    prior_precision: float = 1.0,
    hyper_every: int = 100,
    hyper_steps: int = 10,
    hyper_lr: float = 0.1,
    burnin: int = 0,
    keep_best: bool = True,
    **kwargs,
):
    """Train the MAP of ``guide`` (an :class:`~pyro_sgmcmc.guides.AutoLaplace`) and its prior precision.

    See :meth:`pyro_sgmcmc.guides.AutoLaplace.marglik_training` for the parameters. Returns the
    :class:`~pyro_sgmcmc.guides.LaplaceApproximation` at the final (or best) point with the tuned
    precision, and leaves ``guide.prior_precision`` set to it and ``guide.evidence_history`` the
    log evidence (float64) after each evidence step, as laplace-torch's ``margliks``.
    """
    num_steps = check_positive_int(num_steps, "num_steps")
    hyper_every = check_positive_int(hyper_every, "hyper_every")
    hyper_steps = check_positive_int(hyper_steps, "hyper_steps")
    burnin = check_positive_int(burnin, "burnin", low=0)
    keep_best = check_bool(keep_best, "keep_best")
    check_precision(prior_precision, "prior_precision")
    if isinstance(hyper_lr, bool) or not isinstance(hyper_lr, (int, float)) or not hyper_lr > 0:
        raise ValueError(f"hyper_lr must be a positive number; got {hyper_lr!r}")
    if optim is None:
        optim = pyro.optim.Adam({"lr": 1e-2})
    if not isinstance(optim, pyro.optim.PyroOptim):
        raise TypeError(f"optim must be a pyro.optim optimiser (e.g. pyro.optim.Adam({{'lr': 1e-2}})); got {optim!r}")
    if guide.subset_of_weights != "all":
        raise ValueError(
            "marglik_training tunes the prior of every weight along with the MAP, so it needs "
            f"subset_of_weights='all' (got {guide.subset_of_weights!r}); train with it, then build a subset "
            "approximation from the trained MAP with AutoLaplace(..., subset_of_weights=...)"
        )
    if guide.prototype_trace is None:
        guide(*args, **kwargs)  # set up the MAP point
    laplace = guide.laplace_approximation(*args, **kwargs)
    groups, labels = laplace.precision_groups(mode)
    prior_mean = laplace.prior_mean.detach()
    dtype = torch.float64
    log_precision = torch.full((len(labels),), float(prior_precision), dtype=dtype).log().requires_grad_(True)
    hyper_optimizer = torch.optim.Adam([log_precision], lr=hyper_lr)
    if GaussianPriorSteps.applies(guide, optim):  # the compiled potential; its minibatches seeded from torch's RNG
        steps = GaussianPriorSteps(guide, args, kwargs, prior_mean, optim, seed=int(torch.randint(2**62, ())))
    else:
        loss = gaussian_prior_loss(prior_mean, lambda: log_precision.detach().exp()[groups])
        steps = pyro.infer.SVI(guide.model, guide, optim, loss=loss)
    precision = log_precision.detach().exp()[groups]
    best = None  # (evidence, point, log precision) after the best evidence step
    history = []  # the evidence after each evidence step
    reuse: dict = {}  # the potential and prior terms of the evidence steps' approximations, built once
    for step in range(1, num_steps + 1):
        if isinstance(steps, GaussianPriorSteps):
            steps.step(precision)
        else:
            steps.step(*args, **kwargs)
        if step > burnin and step % hyper_every == 0:
            if isinstance(steps, GaussianPriorSteps):
                steps.write_back(guide)
            laplace = guide.approximation_at_loc(args, kwargs, reuse)
            for _ in range(hyper_steps):
                hyper_optimizer.zero_grad()
                with torch.enable_grad():
                    (-laplace.log_evidence(log_precision.exp()[groups])).backward()
                hyper_optimizer.step()
            precision = log_precision.detach().exp()[groups]
            with torch.no_grad():
                evidence = float(laplace.log_evidence(precision))
            history.append(evidence)
            if keep_best and (best is None or evidence > best[0]):
                best = (evidence, guide.loc.detach().clone(), log_precision.detach().clone())
    if isinstance(steps, GaussianPriorSteps):
        steps.write_back(guide)
    if best is not None:
        with torch.no_grad():
            guide.loc.copy_(best[1])
            log_precision.copy_(best[2])
    tuned = _as_dict(log_precision.detach().exp().to(guide.loc.dtype), laplace, mode)
    guide.prior_precision = tuned
    guide.evidence_history = history
    return guide.laplace_approximation(*args, **kwargs)


def _as_dict(values: torch.Tensor, laplace, mode: str) -> Dict[str, torch.Tensor]:
    if mode == "scalar":
        return {name: values[0] for name in laplace.site_slices}
    if mode == "parameter":
        return {name: values[where] for name, where in laplace.site_slices.items()}
    return {name: values[number] for number, name in enumerate(laplace.site_slices)}
