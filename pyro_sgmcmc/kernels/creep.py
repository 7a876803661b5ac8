"""Is a chain still drifting at the end of warmup? A test on the mean gradient of the slow phase.

Under the (tempered) posterior the gradient of the potential has mean zero, :math:`E_\\pi[\\nabla U] = 0`, and so
has the minibatch estimate :math:`\\hat g`. Over the :math:`n` slow-phase steps of warmup, the mean gradient
:math:`\\bar g` of a chain that has reached the posterior is therefore zero up to

.. math:: \\mathrm{Var}(\\bar g_i) \\approx \\frac{\\Sigma^{\\mathrm{noise}}_{ii} + 2\\tau\\, T N \\bar H_{ii}}{n},

the minibatch noise (fresh minibatches: independent from step to step) plus the chain's own fluctuation
(:math:`\\mathrm{Var}_\\pi(\\partial_i U) = T N \\bar H_{ii}` by integration by parts,
:math:`\\bar H = \\nabla^2 U / N`, over an integrated autocorrelation time of about :math:`2\\tau` steps,
:math:`\\tau` the relaxation time). The curvature is the probed Hessian's, not the one the gradients see: a drift
inflates the gradients' spread over the slow phase and would hide itself. A chain that still creeps towards
the posterior has a systematic :math:`\\bar g`: in a locally Gaussian posterior
:math:`\\nabla U \\approx \\bar H N (\\theta - \\theta^*)`, so its offset in posterior standard deviations is

.. math:: \\delta_i = \\bar g_i \\sqrt{T / (N \\bar H_{ii})}.

A chain is reported as drifting when, in some coordinate, :math:`\\delta_i` exceeds one posterior sd *and*
:math:`|\\bar g_i| / \\sqrt{\\mathrm{Var}(\\bar g_i)}` exceeds the normal quantile of a false-alarm probability of
``CREEP_FALSE_ALARM`` shared (Bonferroni) over all chains and coordinates: a mixed chain is wrongly flagged at
most that often, and a drift smaller than an sd is not worth a warning.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Optional, Tuple

import torch

__all__ = ["CREEP_FALSE_ALARM", "CREEP_MIN_DRAWS", "drift_offsets"]

#: Probability that a run whose chains have all reached the posterior is reported as drifting.
CREEP_FALSE_ALARM = 1e-3
#: Fewer slow-phase draws than this and the mean gradient is not tested.
CREEP_MIN_DRAWS = 50


def _diagonal(values: torch.Tensor) -> torch.Tensor:
    return values.diagonal(dim1=-2, dim2=-1) if values.dim() == 3 else values


def drift_offsets(
    adaptation, num_data: int, temperature: float, relaxation: torch.Tensor
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Per chain and coordinate ``(C, D)``: the offsets :math:`\\delta` in posterior sds and whether each is a
    significant drift (module docstring), from the slow-phase sums of a
    :class:`~pyro_sgmcmc.kernels.adapt.windows.WindowedState` (the metric's draws and probed Hessians, the step
    size's drift-noise covariances); ``None`` without enough of them.

    ``relaxation`` is the chains' relaxation time in steps, ``(C,)``."""
    metric, step = adaptation.metric, adaptation.step
    n = metric.draw_count
    if n < CREEP_MIN_DRAWS or step.noise_sum is None or metric.hessian_sum is None:
        return None
    if temperature <= 0:
        return None
    mean = (metric.grad_sum / n).double()
    noise = _diagonal(step.noise_sum / step.noise_count).double() * num_data**2
    # the probed Hessian, not the curvature the gradients see: a drift inflates the gradients' spread over the slow
    # phase, which would hide the drift it comes from
    curvature = _diagonal(metric.hessian_sum / metric.count).double().abs() / num_data
    curvature = curvature.clamp_min(torch.finfo(torch.float64).tiny)
    tau = relaxation.double().reshape(-1, 1)
    variance = (noise.clamp_min(0.0) + 2.0 * tau * temperature * num_data * curvature) / n
    z = mean.abs() / variance.sqrt()
    offset = mean.abs() * (temperature / (num_data * curvature)).sqrt()
    tests = max(1, mean.numel())
    critical = NormalDist().inv_cdf(1.0 - CREEP_FALSE_ALARM / (2.0 * tests))
    significant = (z > critical) & (offset > 1.0) & torch.isfinite(offset)
    return offset, significant


def describe(offset: torch.Tensor, significant: torch.Tensor) -> str:
    """``chain(s) [..] are about K posterior sds from where their gradients balance``."""
    chains = significant.any(-1).nonzero().flatten().tolist()
    worst = float(torch.where(significant, offset, torch.zeros_like(offset)).max())
    return (
        f"chain(s) {chains[:8]} are still drifting at the end of warmup: about {worst:.3g} posterior sds from "
        "where their gradients balance"
    )
