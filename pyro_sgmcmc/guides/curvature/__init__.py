"""Curvature of the log joint of a Pyro model, accumulated over the full data set.

A Laplace approximation needs the precision :math:`\\Lambda = H_{\\mathrm{lik}} + H_{\\mathrm{prior}}`
at the MAP :math:`\\theta_*` (unconstrained space). This module computes both pieces for a model
wrapped in a :class:`~pyro_sgmcmc.ModelPotential` (flat position, latent sites in sorted-name
order):

* :func:`likelihood_curvature` walks the whole data set, minibatch by minibatch, and sums the
  curvature of the negative log-likelihood; the :class:`Curvature` options say which;
* :func:`prior_terms` returns the log prior, its gradient and its exact Hessian (diagonal or full)
  in unconstrained space, the log-det-Jacobian of the constraining transforms included.

**How the data set is walked.** The likelihood is split into *terms*
:math:`\\ell_n(\\theta) = w_n \\log p(y_n \\mid \\theta)`, :math:`w_n` the site's own scale
(``poutine.scale``, e.g. a likelihood temperature; the ``N / B`` factor of a subsampled plate is
removed, so every term counts once). With exactly one subsampled plate (the usual
``pyro.plate("data", N, subsample_size=B)``) an *example* is one index of that plate, and the
fastest route that applies is taken:

* **linear layers** (diagonal curvatures): when every latent site is the weight or bias of one
  ``F.linear`` call on a ``(batch, in)`` input (a ``PyroModule`` network with ``PyroSample``
  weights), the layer calls are recorded with a :class:`torch.overrides.TorchFunctionMode` and
  :math:`\\sum_n (\\delta_n a_n^\\top)^2 = (\\delta \\circ \\delta)^\\top (a \\circ a)` gives the
  diagonal from one backward pass per output column, with no per-example gradient stored. The
  first four examples are checked against plain per-example gradients;
* **per-example gradients** (:mod:`.per_example`): the model runs on chunks of the plate's own
  ``subsample_size`` (Pyro's plate always receives a subsample of the length it declares) and
  batched backward passes with one-hot cotangents give each example's gradient of each row. A
  model that fails there (an op without a batching rule, a shape it cannot take) falls back,
  with a warning, to:
* **Jacobians of minibatches** (also for no or several subsampled plates): the plates are walked
  in consecutive chunks of their own ``subsample_size`` (the last chunk overlaps the one before it
  and the overlap is masked out) and the Jacobian of the vector of terms is taken by batched
  backward passes; a term is one element of an observed site's batch shape. This costs ``B``
  backward passes per chunk: for small models (:mod:`.minibatch`).

The estimators (empirical Fisher, GGN / exact Fisher, Monte Carlo Fisher) differ only in the
*rows* they differentiate (:mod:`.rows`); K-FAC factors come from the layer calls (:mod:`.kfac`).
Each route and estimator lives in its own module; this one chooses the route.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

from .._checks import NOT_GIVEN, renamed_argument
from .kinds import MAX_FULL_DIM, Curvature, LikelihoodCurvature, PriorTerms, UserFacingError
from .linear import full_data_plate, linear_sweep
from .minibatch import hessian_sweep, jacobian_sweep
from .per_example import per_example_sweep
from .prior import prior_terms

__all__ = [
    "Curvature",
    "MAX_FULL_DIM",
    "LikelihoodCurvature",
    "PriorTerms",
    "likelihood_curvature",
    "prior_terms",
]


def likelihood_curvature(
    potential,
    position: torch.Tensor,
    curvature,
    *,
    num_mc_samples: int = 1,
    monte_carlo_fisher: bool = False,
    disable_progbar: bool = False,
    path: Optional[str] = None,
    mc_fisher=NOT_GIVEN,
) -> LikelihoodCurvature:
    """Curvature of the negative log-likelihood on the full data set, at ``position``.

    Parameters
    ----------
    potential : ModelPotential
        The model, its arguments, latent layout and subsampled plates.
    position : Tensor ``(d,)``
        The flat unconstrained point :math:`\\theta_*` (potential order).
    curvature : str or Curvature
        One of :class:`Curvature`.
    num_mc_samples : int
        Labels drawn per example for likelihoods without an exact Fisher (``diag_ggn``, ``full_ggn``).
    monte_carlo_fisher : bool
        Use Monte Carlo labels for *every* likelihood, the exact ones included: ``num_mc_samples``
        backward passes per example instead of one per output (``K`` for ``K`` classes), at the
        price of an unbiased estimate instead of the exact diagonal.
    disable_progbar : bool
        Hide the tqdm progress bar over minibatches.
    path : {None, "linear-layers", "per-example", "jacobian"}
        Force a path (tests); by default the fastest that applies, in that order.
    mc_fisher : bool, optional
        Deprecated spelling of ``monte_carlo_fisher`` (``FutureWarning``; removed in the next release).

    Returns
    -------
    LikelihoodCurvature
    """
    monte_carlo_fisher, _ = renamed_argument("mc_fisher", mc_fisher, "monte_carlo_fisher", monte_carlo_fisher)
    kind = Curvature.parse(curvature)
    position = position.detach()
    if kind is Curvature.FULL:
        return hessian_sweep(potential, position, disable_progbar)
    plates = potential.subsample_plates
    if kind is Curvature.KRON:
        result = None
        plate = plates[0] if len(plates) == 1 else (full_data_plate(potential, position) if not plates else None)
        if plate is not None:
            result = linear_sweep(potential, position, kind, num_mc_samples, monte_carlo_fisher, disable_progbar,
                                  plate=plate)  # fmt: skip
        if result is None:
            raise ValueError(
                "curvature='kron' needs a network of F.linear layers (nn.Linear in a PyroModule, PyroSample "
                "weights and biases, every latent site the weight or bias of exactly one layer on (batch, in) "
                "inputs) and one data plate (subsampled or not) holding every observation; use "
                "curvature='diag_ggn' for this model"
            )
        return result
    auto = path is None
    if path is None:
        path = "per-example" if len(plates) == 1 else "jacobian"
    if path == "linear-layers":
        if len(plates) != 1 or not kind.is_diagonal:
            raise ValueError("the linear-layers path needs exactly one subsampled plate and a diagonal curvature")
        result = linear_sweep(potential, position, kind, num_mc_samples, monte_carlo_fisher, disable_progbar,
                              check=False)  # fmt: skip
        if result is None:
            raise ValueError("the model's latent sites are not all weights and biases of F.linear layers")
        return result
    if path == "per-example":
        if len(plates) != 1:
            raise ValueError("the per-example path needs exactly one subsampled plate")
        try:
            if kind.is_diagonal and auto:
                result = linear_sweep(potential, position, kind, num_mc_samples, monte_carlo_fisher, disable_progbar)
                if result is not None:
                    return result
            return per_example_sweep(potential, position, kind, num_mc_samples, monte_carlo_fisher, disable_progbar)
        except (RuntimeError, ValueError, IndexError, TypeError) as error:
            if isinstance(error, UserFacingError):
                raise
            warnings.warn(
                f"the model could not be evaluated example by example ({type(error).__name__}: {error}); "
                "computing the curvature from Jacobians of whole minibatches instead, which is slower",
                RuntimeWarning,
                stacklevel=2,
            )
    return jacobian_sweep(potential, position, kind, num_mc_samples, monte_carlo_fisher, disable_progbar)

