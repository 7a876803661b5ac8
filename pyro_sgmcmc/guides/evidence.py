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
from typing import Callable, NamedTuple, Optional, Tuple

import torch

__all__ = [
    "EVIDENCES",
    "ConvergenceWarning",
    "GaussianNoise",
    "check_evidence",
    "check_bounds",
    "diagonal_evidence_optimum",
    "gaussian_log_likelihood",
    "gaussian_noise",
    "maximise_log_evidence",
    "standard_log_evidence",
]

#: The accepted values of ``evidence=``.
EVIDENCES = ("standard", "refit")

#: The largest :math:`|\\partial \\log p(y\\mid\\lambda) / \\partial \\log\\lambda_i|` (nats) at which an
#: evidence maximisation that used all its ``max_iter`` iterations still counts as converged.
CONVERGED_GRADIENT = 1e-4


class ConvergenceWarning(RuntimeWarning):
    """Warned when an evidence maximisation stops at ``max_iter`` before its gradient vanished."""


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


def diagonal_evidence_optimum(curvature: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The maximiser of the standard evidence with a diagonal curvature and one precision per coordinate.

    The evidence then separates into :math:`\\sum_i f_i(\\lambda_i)`,
    :math:`f_i = -\\frac12 \\lambda_i o_i^2 + \\frac12\\log\\lambda_i - \\frac12\\log(h_i + \\lambda_i)`, whose
    derivative vanishes where :math:`o_i^2\\lambda_i^2 + o_i^2 h_i \\lambda_i - h_i = 0`:

    .. math:: \\lambda_i = \\frac{2 h_i}{o_i^2 h_i + \\sqrt{o_i^4 h_i^2 + 4 o_i^2 h_i}}

    (MacKay's fixed point, in the form without cancellation): :math:`+\\infty` where :math:`o_i = 0 < h_i`,
    0 where :math:`h_i = 0 < |o_i|`, NaN where both vanish (the evidence is flat in :math:`\\lambda_i`).

    Parameters
    ----------
    curvature : Tensor ``(d,)``
        :math:`h \\ge 0`, the likelihood curvature (times the noise factor in use).
    offset : Tensor ``(d,)``
        :math:`o = \\theta_* - m`.
    """
    h, squared = curvature.clamp(min=0), offset**2
    optimum = 2 * h / (squared * h + (squared**2 * h**2 + 4 * squared * h).sqrt())
    return torch.where((h == 0) & (squared > 0), torch.zeros_like(optimum), optimum)


def maximise_log_evidence(
    objective: Callable[[torch.Tensor], torch.Tensor],
    start: torch.Tensor,
    bounds: Tuple[float, float],
    max_iter: int,
    names: Optional[list] = None,
) -> torch.Tensor:
    """Maximise ``objective(precision)`` over ``log(precision)`` in ``[log low, log high]`` with L-BFGS.

    The objective is evaluated at the clamped point, so outside the box its gradient is zero and
    L-BFGS stops there; the result is clamped. When L-BFGS used all ``max_iter`` iterations and
    the gradient in :math:`\\log\\lambda` at the result still exceeds :data:`CONVERGED_GRADIENT` in
    some coordinate, a :class:`ConvergenceWarning` says so (the evidence is concave there, so more
    iterations reach a higher value). A coordinate that ends within 1e-3 (relative) of
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
        state = optimizer.state[x]
        if state["n_iter"] >= max_iter or state["func_evals"] >= optimizer.defaults["max_eval"]:
            closure()  # out of iterations: is the gradient at the result still large?
            gradient = x.grad.detach().abs().max().item()
            if gradient > CONVERGED_GRADIENT:
                warnings.warn(
                    f"the evidence maximisation stopped at max_iter={max_iter} L-BFGS iterations before converging "
                    f"(largest |d log evidence / d log precision| = {gradient:.2g} > {CONVERGED_GRADIENT:g}): the "
                    "precisions are short of the optimum. Raise max_iter",
                    ConvergenceWarning,
                    stacklevel=3,
                )
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


class GaussianNoise(NamedTuple):
    """A Gaussian likelihood of one fixed scale: :math:`y_i \\sim \\mathcal N(f_i(\\theta), \\sigma_0^2)`."""

    scale: float  #: :math:`\sigma_0`, the model's noise scale
    num_observations: int  #: :math:`n`, the number of observed numbers on the full data


def gaussian_noise(potential, position: torch.Tensor) -> Optional[GaussianNoise]:
    """The model's noise scale and number of observations if its likelihood is Gaussian of one fixed scale.

    Every observed site must be a (wrapped) ``Normal`` whose scale is one number that does not
    depend on :math:`\\theta`, without a mask or a ``poutine.scale`` of its own; otherwise ``None``.
    """
    from pyro.distributions.torch_distribution import ExpandedDistribution, MaskedDistribution
    from torch.distributions import Independent, Normal

    from .curvature.rows import observed_sites as _observed_sites
    from .curvature.rows import site_weight as _site_weight
    from .curvature.rows import trace_at as _trace

    with torch.enable_grad():
        z = position.detach().clone().requires_grad_(True)
        trace = _trace(potential, z, {})
    scales, count = set(), 0
    for site in _observed_sites(trace, set(potential.site_names)):
        fn = site["fn"]
        while isinstance(fn, (Independent, ExpandedDistribution)):
            fn = fn.base_dist
        if not isinstance(fn, Normal) or isinstance(fn, MaskedDistribution) or fn.scale.requires_grad:
            return None
        if site["mask"] is not None or abs(float(_site_weight(site)) - 1.0) > 1e-12:
            return None
        scale = fn.scale.detach().reshape(-1)
        if not bool((scale == scale[0]).all()):
            return None
        scales.add(float(scale[0]))
        plate_factor = 1.0
        for frame in site["cond_indep_stack"]:
            if frame.full_size is not None and frame.size not in (None, 0):
                plate_factor *= frame.full_size / frame.size
        count += round(site["value"].numel() * plate_factor)
    if len(scales) != 1:
        return None
    return GaussianNoise(scales.pop(), count)


def gaussian_log_likelihood(noise: GaussianNoise, log_likelihood: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """The Gaussian log-likelihood at another noise scale :math:`\\sigma`.

    .. math::
        \\log p(y \\mid \\theta_*, \\sigma) = -\\frac{\\mathrm{RSS}}{2\\sigma^2} - n\\log\\sigma
        - \\frac n2 \\log 2\\pi,

    the residual sum of squares recovered from the value at the model's :math:`\\sigma_0`.
    """
    n, s0 = noise.num_observations, noise.scale
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    rss = -2 * s0**2 * (log_likelihood + n * math.log(s0) + n * half_log_2pi)
    return -0.5 * rss / sigma**2 - n * sigma.log() - n * half_log_2pi
