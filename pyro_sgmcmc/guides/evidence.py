"""The Laplace evidence as a function of the prior precision, and its maximisation.

With a Gaussian prior :math:`\\mathcal N(m, \\mathrm{diag}(\\lambda)^{-1})` on the unconstrained
parameters, a curvature :math:`H` of the negative log-likelihood at :math:`\\theta_*` and
:math:`\\Lambda_\\lambda = H + \\mathrm{diag}(\\lambda)`, the **standard** post-hoc Laplace evidence
(MacKay, 1992; Immer et al., 2021, the one laplace-torch computes) keeps :math:`\\theta_*` fixed:

.. math::
    \\log p(y \\mid \\lambda) \\approx \\log p(y \\mid \\theta_*)
    - \\tfrac12 (\\theta_* - m)^\\top \\mathrm{diag}(\\lambda) (\\theta_* - m)
    + \\tfrac12 \\log\\det \\mathrm{diag}(\\lambda) - \\tfrac12 \\log\\det \\Lambda_\\lambda ,

which is :math:`\\log p(y \\mid \\theta_*) + \\log p_\\lambda(\\theta_*) + \\frac d2 \\log 2\\pi -
\\frac12\\log\\det\\Lambda_\\lambda`. In :math:`x = \\log\\lambda` every term is concave (for one
eigenvalue :math:`h \\ge 0` of :math:`H`, :math:`\\frac12 x - \\frac12\\log(h + e^x)` has second
derivative :math:`-\\frac12 h e^x / (h + e^x)^2`), so the maximiser found by L-BFGS is the global one.
It grows like :math:`-\\frac12 \\lambda \\|\\theta_* - m\\|^2` for large :math:`\\lambda` and like
:math:`\\frac12 \\log \\lambda` times the number of flat directions of :math:`H` for small
:math:`\\lambda`: a finite interior optimum whenever the MAP is away from the prior mean.

The **refit** evidence adds :math:`\\frac12 b^\\top \\Lambda_\\lambda^{-1} b`,
:math:`b = \\nabla\\log p_\\lambda(\\theta_*) - \\nabla\\log p_{\\mathrm{model}}(\\theta_*)`: it
integrates the second-order Taylor model of the log-likelihood at :math:`\\theta_*` against the new
prior, i.e. it lets the MAP move with :math:`\\lambda` along that quadratic model. That is exact for
Bayesian linear regression (a quadratic log-likelihood) and equal to the standard evidence at the
model's own prior (:math:`b = 0`), but for a network the quadratic model extrapolated to
:math:`\\theta = m` is far above the true log-likelihood, and the refit evidence then keeps rising
with :math:`\\lambda` (the posterior collapses to the MAP).

Everything here is computed in float64, whatever the model's dtype: the terms of the evidence are
large (``O(N)``) and nearly cancel.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Optional, Tuple

import torch

__all__ = ["EVIDENCES", "check_evidence", "check_bounds", "standard_log_evidence", "maximise_log_evidence"]

#: The accepted values of ``evidence=``.
EVIDENCES = ("standard", "refit")


def check_evidence(value) -> str:
    """``value`` must be one of :data:`EVIDENCES`."""
    if not isinstance(value, str) or value not in EVIDENCES:
        raise ValueError(f"evidence must be one of {', '.join(repr(v) for v in EVIDENCES)}; got {value!r}")
    return value


def check_bounds(bounds, name: str = "bounds") -> Tuple[float, float]:
    """``(low, high)`` with ``0 < low < high < inf``."""
    try:
        low, high = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair (low, high) of positive numbers; got {bounds!r}") from None
    if not (0 < low < high < math.inf):
        raise ValueError(f"{name} must satisfy 0 < low < high < inf; got {bounds!r}")
    return low, high


def standard_log_evidence(
    log_likelihood: torch.Tensor, offset: torch.Tensor, precision: torch.Tensor, logdet_posterior: torch.Tensor
) -> torch.Tensor:
    """:math:`\\log p(y\\mid\\theta_*) - \\frac12 \\sum_i \\lambda_i o_i^2 + \\frac12\\sum_i \\log\\lambda_i
    - \\frac12 \\log\\det\\Lambda_\\lambda` (all float64).

    Parameters
    ----------
    log_likelihood : Tensor
        :math:`\\log p(y \\mid \\theta_*)`.
    offset : Tensor ``(d,)``
        :math:`o = \\theta_* - m`.
    precision : Tensor ``(d,)``
        The prior precisions :math:`\\lambda_i` (broadcast per coordinate).
    logdet_posterior : Tensor
        :math:`\\log\\det(H + \\mathrm{diag}(\\lambda))`.
    """
    scatter = (precision * offset**2).sum()
    return log_likelihood - 0.5 * scatter + 0.5 * precision.log().sum() - 0.5 * logdet_posterior


def maximise_log_evidence(
    objective: Callable[[torch.Tensor], torch.Tensor],
    start: torch.Tensor,
    bounds: Tuple[float, float],
    max_iter: int,
    names: Optional[list] = None,
) -> torch.Tensor:
    """Maximise ``objective(precision)`` over ``log(precision)`` in ``[log low, log high]`` with L-BFGS.

    The objective is evaluated at the clamped point, so outside the box its gradient is zero and
    L-BFGS stops there; the result is clamped. A coordinate that ends within 1e-3 (relative) of
    a bound gets a ``UserWarning``: the evidence still rises beyond the box, so the bound, not the
    data, chose that precision.

    Parameters
    ----------
    objective : callable
        float64 ``(k,)`` precisions -> 0-dim log evidence (differentiable).
    start : Tensor ``(k,)``
        Positive starting precisions.
    bounds : (float, float)
        The box for each precision.
    max_iter : int
        Maximum L-BFGS iterations.
    names : list of str, optional
        A name per coordinate, for the warning.

    Returns
    -------
    Tensor ``(k,)``
        The maximiser (float64).
    """
    low, high = math.log(bounds[0]), math.log(bounds[1])
    x = start.detach().to(torch.float64).log().clamp(low, high).clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [x], max_iter=max_iter, line_search_fn="strong_wolfe", tolerance_grad=1e-9, tolerance_change=1e-12
    )

    def closure():
        optimizer.zero_grad()
        loss = -objective(x.clamp(low, high).exp())
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    result = x.detach().clamp(low, high)
    at_bound = ((result - low).abs() < 1e-3) | ((result - high).abs() < 1e-3)
    if at_bound.any():
        which = at_bound.nonzero().reshape(-1).tolist()
        label = [names[i] for i in which[:5]] if names is not None else which[:5]
        more = f" (and {len(which) - 5} more)" if len(which) > 5 else ""
        warnings.warn(
            f"the evidence is maximised at a bound of the prior precision {bounds} for {len(which)} of "
            f"{result.numel()} precisions, e.g. {label}{more}: the evidence keeps rising beyond it, so the bound, "
            "not the data, set that value (a site the likelihood does not constrain, or a MAP at the prior mean?). "
            "Widen bounds=..., or use a coarser mode",
            UserWarning,
            stacklevel=3,
        )
    return result.exp()
