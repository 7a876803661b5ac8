"""Preconditioning (a constant mass matrix) and its warmup adaptation, for all three kernels.

The preconditioned dynamics are the plain dynamics run in linearly transformed coordinates.
Each chain ``c`` has a factor :math:`L_c` (diagonal, or lower triangular with ``full_mass=True``)
and the kernel's update rule runs on :math:`w = L_c^{-1} z`, whose normalised drift is
:math:`L_c^\\top N^{-1} \\nabla \\log \\pi(z)`. Mapped back to :math:`z` this is the general recipe
:math:`dz = (D + Q) N^{-1} \\nabla \\log \\pi\\, dt + \\sqrt{2 \\mathcal{T} D}\\, dw` with constant
:math:`D` (for SGLD, :math:`D = P = L L^\\top`):

.. math:: z' = z + \\epsilon P\\, N^{-1} \\nabla \\log \\pi(z) + \\sqrt{2 \\epsilon \\mathcal{T}}\\, L \\zeta,

and for SGHMC/SGNHT a mass matrix :math:`M = \\sigma^2 P^{-1}` with friction matrix
:math:`\\alpha P^{-1}` (uniform damping :math:`\\alpha / \\sigma^2` per unit time in every direction).
A *constant* linear change of variables leaves the target invariant, so while :math:`L` is frozen
the chain targets exactly the same tempered posterior :math:`\\pi^{1/T}` (no correction term is
missing, unlike position-dependent preconditioners such as pSGLD, Li et al. 2016, whose
:math:`\\Gamma(z)` term is usually dropped). The momentum (and thermostat) live in :math:`w`
units. The update rules are translation invariant in the position, so the kernel computes the
displacement from :math:`w = 0` and adds :math:`L\\, \\Delta w` to :math:`z`: no inverse of
:math:`L` is ever needed.

Units. :math:`P` is chosen so that the normalised curvature in :math:`w` is about 1 in every
direction: for a Gaussian posterior with covariance :math:`\\Sigma` (at temperature ``T``) that
is :math:`P = (N / T) \\Sigma`. A step size with preconditioning is therefore in *preconditioned
units*, independent of the scales of the parameters and of ``N``.

Adaptation (``adapt_mass_matrix=True``, the default), per chain, in the adaptation phase of the warmup
(after the approach of :mod:`~pyro_sgmcmc.kernels.warmup`), by the pure functions of
:mod:`~pyro_sgmcmc.kernels.adapt` (the metric: :mod:`~pyro_sgmcmc.kernels.adapt.mass_matrix`; the step size:
:mod:`~pyro_sgmcmc.kernels.adapt.step_size`; Stan's windows composing them:
:mod:`~pyro_sgmcmc.kernels.adapt.windows`). The metric is the inverse of the *curvature*
of the potential averaged over the chain's own draws, :math:`P = |\\bar H|^{-1}` with :math:`\\bar H` the
mean normalised Hessian :math:`\\nabla^2 U / N` (for a Gaussian posterior exactly :math:`(N / T) \\Sigma`;
``full_mass``: dense; otherwise the diagonal of :math:`|\\bar H|^{-1}`). Each Hessian comes from central
differences of minibatch gradients at the chain's point (the same minibatch on both sides, one probe per
coordinate, batched over chains in one vectorised call); for ``dim > 64`` only the diagonal of :math:`H`
is estimated (16 Rademacher probes) and :math:`P = 1 / |\\mathrm{diag}\\, \\bar H|` (Jacobi). The schedule
follows Stan's (:func:`adaptation_schedule`): an initial buffer (15 %) whose probes at steps 1, 2, 4, ...
*replace* the metric (and reset the momentum), a slow phase (75 %) whose 8 probes are averaged, and a
terminal buffer (10 %) with the final metric.

Regularisation (so that a flat or saturated direction cannot blow the metric up): the absolute
eigenvalues of the curvature are floored at the largest over ``MAX_CONDITION`` and, in the initial buffer, at the median
over ``TRANSIENT_CONDITION``; in the slow phase the curvature along each eigenvector is the larger of the
Hessian's and the gradients' (:math:`(\\overline{\\hat g \\hat g^\\top} - \\mathrm{Cov}\\, \\hat g) / (N T)`,
which equals the mean curvature under the posterior by integration by parts and does not vanish in a
linear tail), and the variance along it is at most ``SPREAD_CAP`` times that of the chain's slow-phase
draws.

After warmup :math:`P` is frozen: the sampling phase targets the exact tempered posterior (up to the
usual :math:`O(\\epsilon)` bias of the discretisation and the gradient noise). Each chain adapts from its
own draws only, so the chains stay independent (needed by R-hat).

Step size (``adapt_step_size=True``, the default), one per chain: each time :math:`P` changes, the largest
curvature :math:`\\lambda_{max}` of the preconditioned Hessian :math:`L^\\top H L` is estimated at the
chain's point by 12 power iterations (central-difference Hessian-vector products; in the slow phase the
running maximum over the points probed; at least 1 with an adapted metric) and the step size set to
:math:`c / \\sqrt{\\lambda_{max}}` for SGHMC (:math:`c = 0.4`: the symplectic-Euler variance bias along the
stiffest direction is about :math:`c^2 / 4 = 4 \\%`), for SGNHT with :math:`c = 0.1` (its thermostat
fluctuates, and the momentum update is unstable once :math:`\\epsilon \\xi > 2`), and :math:`c / \\lambda_{max}`
for SGLD (:math:`c = 0.1`: the Euler variance bias :math:`\\epsilon \\lambda / 2` is at most 5 %). With
subsampled data the step is further capped, from the slow phase on, so that the gradient noise inflates
the stationary variance by at most 10 %: the inflation is :math:`\\epsilon N V / (2 \\alpha T)`
(SGLD: :math:`\\alpha = 1`; SGHMC: the friction; SGNHT: the diffusion), with :math:`V` the largest
per-coordinate variance of the minibatch drift in :math:`w` units, averaged over the points probed
(32 minibatches each). A divergence in adaptation halves the chain's step until the next slow-phase probe.
With ``adapt_mass_matrix=False`` and ``adapt_step_size=True`` the metric is the identity and only the step
adapts.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch

from .state import SGMCMCState

__all__ = ["preconditioned_transition", "adaptation_schedule", "DENSE_MAX_DIM"]

#: ``full_mass=None`` chooses a dense mass matrix up to this dimension (O(dim^2) per step and chain).
DENSE_MAX_DIM = 64


def adaptation_schedule(warmup_steps: int, num_probes: int = 8) -> Tuple[List[int], List[int]]:
    """Warmup steps after which the curvature is probed: ``(initial, slow)``.

    Initial buffer (first 15 % of warmup): after steps 1, 2, 4, ... and at its end, each probe
    *replaces* the metric (and the momentum is reset to zero). Slow phase (the next 75 %):
    ``num_probes`` evenly spaced probes whose Hessians are *averaged*. Terminal buffer (last 10 %):
    no probes, the metric is final.

    Examples
    --------
    >>> adaptation_schedule(100)
    ([1, 2, 4, 8, 15], [24, 34, 43, 53, 62, 71, 81, 90])
    """
    if warmup_steps <= 0:
        return [], []
    init_end = max(1, int(0.15 * warmup_steps))
    term_start = warmup_steps - int(0.10 * warmup_steps)
    initial, step = [], 1
    while step < init_end:  # 1, 2, 4, ...: the curvature changes fastest early in the transient
        initial.append(step)
        step *= 2
    initial.append(init_end)
    slow_length = term_start - init_end
    count = min(num_probes, slow_length)
    slow = sorted({init_end + round((k + 1) * slow_length / count) for k in range(count)}) if count > 0 else []
    return initial, [s for s in slow if s not in initial]


def preconditioned_transition(
    update: Callable,
    factor: torch.Tensor,
    full_mass: bool,
    state: SGMCMCState,
    drift: torch.Tensor,
    step_size,
    noise: Optional[torch.Tensor],
    drift_scale: float = 1.0,
):
    """The kernel's ``update`` (:meth:`~pyro_sgmcmc.kernels.base.SGMCMCKernel.transition`) in :math:`w = L^{-1} z`
    coordinates, mapped back to :math:`z` (the drift is ``drift_scale * drift``, as in
    :mod:`~pyro_sgmcmc.kernels.diffusions`): the drift in :math:`w` is :math:`L^\\top a`, and the update,
    translation invariant in the position, moves :math:`w` from 0 by :math:`\\Delta w`, so :math:`z' = z + L\\,
    \\Delta w` (no inverse of :math:`L`). ``factor`` is :math:`L`, ``(C, D, D)`` if ``full_mass``, else its diagonal
    ``(C, D)``. Returns the new ``(position, momentum, thermostat)``."""
    if full_mass:
        drift_w = torch.einsum("cji,cj->ci", factor, drift)
    else:
        drift_w = drift * factor
    w_state = state.replace(position=torch.zeros_like(state.position))
    displacement, momentum, thermostat = update(w_state, drift_w, step_size, noise, drift_scale)
    if full_mass:
        displacement = torch.einsum("cij,cj->ci", factor, displacement)
    else:
        displacement = displacement * factor
    return state.position + displacement, momentum, thermostat
