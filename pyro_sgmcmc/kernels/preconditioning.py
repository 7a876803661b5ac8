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
(after the approach of :mod:`~pyro_sgmcmc.kernels.warmup`). The metric is the inverse of the *curvature*
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
(8 minibatches each). A divergence in adaptation halves the chain's step until the next slow-phase probe.
With ``adapt_mass_matrix=False`` and ``adapt_step_size=True`` the metric is the identity and only the step
adapts.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

from .warmup import NOISE_MINIBATCHES, minibatch_gradients

__all__ = ["MassMatrixAdaptation", "adaptation_schedule", "DENSE_MAX_DIM"]

#: ``full_mass=None`` chooses a dense mass matrix up to this dimension (O(dim^2) per step and chain).
DENSE_MAX_DIM = 64
_EXACT_DIAGONAL_MAX_DIM = 64
#: Largest condition number of the metric: the absolute eigenvalues of the curvature (or the diagonal's entries)
#: are floored at the largest over this, so a flat or saturated direction cannot blow the metric up.
MAX_CONDITION = 1e12
#: In the initial buffer (the chain may still be far from the typical set, where the Hessian can be nearly
#: flat in some direction: a linear tail such as ``-log tau`` as ``tau -> 0``), the curvature is floored at
#: the median absolute eigenvalue over this: no direction gets more than this many times the typical variance.
TRANSIENT_CONDITION = 1e2
#: From the slow phase on, the metric's variance along each curvature eigendirection is capped at this
#: multiple of the variance of the chain's own slow-phase draws along it (a curvature-flat direction in
#: which the chain does not in fact spread cannot take a huge metric).
SPREAD_CAP = 10.0
_NUM_PROBES = 16
_POWER_ITERATIONS = 12
#: ``c`` of the step-size heuristic: ``c / lambda_max`` (first order) or ``c / sqrt(lambda_max)``.
STEP_CONSTANTS = {"first_order": 0.1, "second_order": 0.4, "thermostat": 0.1}
#: Largest accepted relative inflation of the stationary variance by gradient noise.
NOISE_INFLATION = 0.1


def adaptation_schedule(warmup_steps: int, num_probes: int = 8) -> Tuple[List[int], List[int]]:
    """Warmup steps after which the curvature is probed: ``(initial, slow)``.

    Initial buffer (first 15 % of warmup): after steps 1, 2, 4, ... and at its end, each probe
    *replaces* the metric (and the momentum is reset to zero). Slow phase (the next 75 %):
    ``num_probes`` evenly spaced probes whose Hessians are *averaged*. Terminal buffer (last 10 %):
    no probes, the metric is final.
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


class MassMatrixAdaptation:
    """The per-chain preconditioner of a kernel and its warmup adaptation (see the module docstring).

    Parameters
    ----------
    warmup_steps : int
        Warmup length; adaptation happens only there.
    full_mass : bool
        Dense factor ``(C, D, D)`` instead of a diagonal ``(C, D)``.
    adapt_step_size : bool
        Re-derive the step size from the preconditioned curvature whenever ``P`` changes.
    second_order : bool
        Whether the kernel has momentum (SGHMC, SGNHT): sets the step-size rule.
    temperature : float
        ``T > 0``.
    thermostat : bool
        Whether the kernel is SGNHT (a smaller step-size constant, see the module docstring).
    """

    def __init__(
        self,
        warmup_steps: int,
        full_mass: bool,
        adapt_step_size: bool,
        second_order: bool,
        temperature: float,
        thermostat: bool = False,
        adapt_mass_matrix: bool = True,
        offset: int = 0,
    ) -> None:
        self.warmup_steps = int(warmup_steps)
        self.offset = int(offset)  # steps of warmup before this adaptation starts (the approach phase)
        self.preconditioned = bool(adapt_mass_matrix)  # False: the metric is the identity, only the step adapts
        self.halvings: Optional[torch.Tensor] = None  # (C,) halvings in force (reset at each slow-phase probe)
        self.total_halvings: Optional[torch.Tensor] = None  # (C,) all halvings of the warmup
        self.noise_sum: Optional[torch.Tensor] = None  # summed z-space drift-noise covariances, (C, D, D) or (C, D)
        self.noise_count = 0
        self.largest_curvature: Optional[torch.Tensor] = None  # (C,) running max over the slow phase's probes
        self.draw_count = 0  # slow-phase draws summed for the spread cap
        self.draw_sum: Optional[torch.Tensor] = None  # (C, D)
        self.draw_outer: Optional[torch.Tensor] = None  # (C, D, D), or (C, D) squares without a dense metric
        self.grad_outer: Optional[torch.Tensor] = None  # the same of the minibatch gradients
        self.grad_sum: Optional[torch.Tensor] = None  # (C, D)
        self.thermostat = bool(thermostat)
        self.full_mass = bool(full_mass)
        self.adapt_step_size = bool(adapt_step_size)
        self.second_order = bool(second_order)
        self.temperature = float(temperature)
        self.initial_probes, self.slow_probes = adaptation_schedule(self.warmup_steps)
        #: first step (counted from the adaptation's start) after the initial buffer
        self.slow_start = self.initial_probes[-1] if self.initial_probes else 0
        self.factor: Optional[torch.Tensor] = None  # (C, D) or (C, D, D)
        self.step_size: Optional[torch.Tensor] = None  # (C, 1): one step size per chain
        self.count = 0  # Hessians summed in the slow phase
        self.hessian_sum: Optional[torch.Tensor] = None
        self.num_extra_evaluations = 0  # gradient evaluations (per chain) spent on probes

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        def cpu(t):
            return None if t is None else t.cpu().clone()

        return {
            "factor": cpu(self.factor),
            "step_size": cpu(self.step_size),
            "count": self.count,
            "hessian_sum": cpu(self.hessian_sum),
            "num_extra_evaluations": self.num_extra_evaluations,
            "halvings": cpu(self.halvings),
            "total_halvings": cpu(self.total_halvings),
            "noise_sum": cpu(self.noise_sum),
            "noise_count": self.noise_count,
            "largest_curvature": cpu(self.largest_curvature),
            "draw_count": self.draw_count,
            "draw_sum": cpu(self.draw_sum),
            "draw_outer": cpu(self.draw_outer),
            "grad_outer": cpu(self.grad_outer),
            "grad_sum": cpu(self.grad_sum),
        }

    def load_state_dict(self, saved: dict, device: torch.device) -> None:
        def dev(t):
            return None if t is None else t.to(device)

        self.factor = dev(saved["factor"])
        self.step_size = dev(saved["step_size"])
        self.count = saved["count"]
        self.hessian_sum = dev(saved["hessian_sum"])
        self.num_extra_evaluations = saved["num_extra_evaluations"]
        self.halvings = dev(saved["halvings"])
        self.total_halvings = dev(saved["total_halvings"])
        self.noise_sum = dev(saved["noise_sum"])
        self.noise_count = saved["noise_count"]
        self.largest_curvature = dev(saved["largest_curvature"])
        self.draw_count = saved["draw_count"]
        self.draw_sum = dev(saved["draw_sum"])
        self.draw_outer = dev(saved["draw_outer"])
        self.grad_outer = dev(saved["grad_outer"])
        self.grad_sum = dev(saved["grad_sum"])

    # ------------------------------------------------------------------ hot path
    def transition(self, kernel, state, drift: torch.Tensor, step_size: float, noise, drift_scale: float = 1.0):
        """The kernel's update in :math:`w` coordinates, mapped back to :math:`z` (the drift is
        ``drift_scale * drift``, as in :mod:`~pyro_sgmcmc.kernels.diffusions`)."""
        factor = self.factor
        if self.full_mass:
            drift_w = torch.einsum("cji,cj->ci", factor, drift)
        else:
            drift_w = drift * factor
        w_state = state._replace(position=torch.zeros_like(state.position))
        displacement, momentum, thermostat = kernel._transition(w_state, drift_w, step_size, noise, drift_scale)
        if self.full_mass:
            displacement = torch.einsum("cij,cj->ci", factor, displacement)
        else:
            displacement = displacement * factor
        return state.position + displacement, momentum, thermostat

    # ------------------------------------------------------------------ adaptation
    def setup(self, kernel, position: torch.Tensor) -> None:
        """First metric (the local Gaussian at the chains' points) and the step size from it."""
        if not self.preconditioned:
            self.factor = torch.ones_like(position)
            self._set_step_size(kernel, position, noise_cap=not self.slow_probes)
            return
        hessian = _hessian(kernel, position)
        self._set_metric(kernel, position, hessian, noise_cap=not self.slow_probes, transient=True)

    def update(self, kernel, step: int, position: torch.Tensor) -> None:
        """After warmup step ``step`` (1-based count of steps taken, approach included) at ``position``."""
        step -= self.offset
        if self.preconditioned and self.initial_probes and step > self.initial_probes[-1]:
            self._record_draw(position, kernel.state.grad)
        if step in self.initial_probes:
            if self.preconditioned:
                self._set_metric(kernel, position, _hessian(kernel, position), noise_cap=False, transient=True)
            else:
                self._set_step_size(kernel, position, noise_cap=False)
            if kernel.state.momentum is not None:  # momentum from the old metric would overshoot in the new one
                kernel.state = kernel.state._replace(momentum=torch.zeros_like(kernel.state.momentum))
        elif step in self.slow_probes:
            if self.halvings is not None:  # the new step size is derived afresh (divergences halve it again)
                self.halvings = torch.zeros_like(self.halvings)
            if not self.preconditioned:
                self._set_step_size(kernel, position)
                return
            hessian = _hessian(kernel, position)
            self.hessian_sum = hessian if self.hessian_sum is None else self.hessian_sum + hessian
            self.count += 1
            curvature = self.hessian_sum / self.count
            self._set_metric(
                kernel,
                position,
                curvature,
                spread=self._draw_covariance(kernel),
                fisher=self._gradient_curvature(kernel),
            )

    def _record_draw(self, position: torch.Tensor, grad: torch.Tensor) -> None:
        dense = position.shape[-1] <= _EXACT_DIAGONAL_MAX_DIM
        outer = torch.einsum("ci,cj->cij", position, position) if dense else position * position
        grad_outer = torch.einsum("ci,cj->cij", grad, grad) if dense else grad * grad
        if self.draw_sum is None:
            self.draw_sum, self.draw_outer, self.grad_outer = position.clone(), outer, grad_outer
            self.grad_sum = grad.clone()
        else:
            self.draw_sum, self.draw_outer = self.draw_sum + position, self.draw_outer + outer
            self.grad_outer, self.grad_sum = self.grad_outer + grad_outer, self.grad_sum + grad
        self.draw_count += 1

    def _gradient_curvature(self, kernel) -> Optional[torch.Tensor]:
        """The curvature seen by the gradients, :math:`(\\mathrm{Cov}_t[\\hat g] - \\mathrm{Cov}(\\hat g)) / (N T)`,
        over the slow-phase draws: under the (tempered) posterior :math:`E_\\pi[\\nabla U \\nabla U^\\top] =
        T\\, E_\\pi[\\nabla^2 U]` (integration by parts), and the minibatch noise covariance is subtracted. Unlike
        the Hessian it is not zero in a linear tail (``-log tau`` as ``tau -> 0``: gradient 1, curvature 0)."""
        if self.draw_count < 2 or self.noise_sum is None:
            return None
        num_data = kernel.potential.num_data
        noise = self.noise_sum / self.noise_count * num_data**2  # Cov of grad U from Cov of grad U / N
        if noise.dim() != self.grad_outer.dim():
            noise = noise.diagonal(dim1=-2, dim2=-1) if noise.dim() == 3 else torch.diag_embed(noise)
        mean = self.grad_sum / self.draw_count
        mean_outer = torch.einsum("ci,cj->cij", mean, mean) if self.grad_outer.dim() == 3 else mean * mean
        return (self.grad_outer / self.draw_count - mean_outer - noise) / (num_data * self.temperature)

    def _draw_covariance(self, kernel) -> Optional[torch.Tensor]:
        """Covariance of the slow-phase draws in normalised units (``N / T`` times), ``(C, D, D)`` or ``(C, D)``."""
        if self.draw_count < 2:
            return None
        mean = self.draw_sum / self.draw_count
        if self.draw_outer.dim() == 3:
            covariance = self.draw_outer / self.draw_count - torch.einsum("ci,cj->cij", mean, mean)
        else:
            covariance = self.draw_outer / self.draw_count - mean * mean
        return covariance * (kernel.potential.num_data / self.temperature)

    def shrink_step_size(self, diverging: torch.Tensor) -> None:
        """Halve the step size of the chains that diverged in warmup (``(C,)`` bool) until the next derivation."""
        self.halvings = self.halvings + diverging.long()
        self.total_halvings = self.total_halvings + diverging.long()
        if self.step_size is not None:
            self.step_size = torch.where(diverging.unsqueeze(-1), 0.5 * self.step_size, self.step_size)

    def _set_metric(
        self,
        kernel,
        position: torch.Tensor,
        hessian: torch.Tensor,
        noise_cap: bool = True,
        transient: bool = False,
        spread: Optional[torch.Tensor] = None,
        fisher: Optional[torch.Tensor] = None,
    ) -> None:
        """``P = |H / N|^{-1}`` (dense or its diagonal), or Jacobi ``1 / |diag H / N|`` for large ``dim``, with
        the curvature floored (bounded condition number; ``transient``: relative to the median) and, given the
        ``spread`` of the chain's draws, each direction's variance capped at ``SPREAD_CAP`` times it."""
        hessian = hessian / kernel.potential.num_data
        tiny = torch.finfo(position.dtype).tiny
        previous = self.factor
        # a chain with a non-finite Hessian entry keeps its previous metric (see _keep_finite)
        bad = ~torch.isfinite(hessian).flatten(1).all(-1)
        if bool(bad.any()):
            fill = torch.full_like(hessian, float("nan"))
            hessian = torch.where(bad.view((-1,) + (1,) * (hessian.dim() - 1)), fill, hessian)
        if hessian.dim() == 3:  # (C, D, D): eigenvalues in absolute value (SoftAbs-like)
            hessian = 0.5 * (hessian + hessian.transpose(-1, -2))
            finite = torch.isfinite(hessian).flatten(1).all(-1).view(-1, 1, 1)
            eye = torch.eye(hessian.shape[-1], dtype=hessian.dtype, device=hessian.device)
            eigenvalues, vectors = torch.linalg.eigh(torch.where(finite, hessian, eye))
            eigenvalues = torch.where(finite.squeeze(-1), eigenvalues, torch.full_like(eigenvalues, float("nan")))
            curvature = eigenvalues.abs()
            if fisher is not None:  # the larger of the two curvature estimates along each eigenvector (safe side)
                if fisher.dim() == 2:
                    fisher = torch.diag_embed(fisher)
                seen = torch.einsum("cdi,cde,cei->ci", vectors, fisher, vectors)
                curvature = torch.where(torch.isfinite(seen), curvature.maximum(seen), curvature)
            floor = _curvature_floor(curvature, transient) + tiny
            if spread is not None:  # variance along eigenvector v_i at most SPREAD_CAP v_i' S v_i
                if spread.dim() == 2:
                    spread = torch.diag_embed(spread)
                along = torch.einsum("cdi,cde,cei->ci", vectors, spread, vectors)
                floor = torch.where(along > 0, floor.maximum(1.0 / (SPREAD_CAP * along)), floor)
            factor = vectors * curvature.maximum(floor).rsqrt().unsqueeze(-2)  # V |Lambda|^-1/2
            if self.full_mass:
                self.factor = factor
            else:  # the diagonal of |H|^-1: the marginal variances of the local Gaussian (times N / T)
                self.factor = (factor * factor).sum(-1).sqrt()
        else:  # (C, D) diagonal only (large D): Jacobi, P = 1 / |diag H|
            curvature = hessian.abs()  # a non-finite entry makes the chain keep its metric (_keep_finite)
            if fisher is not None:
                seen = fisher.diagonal(dim1=-2, dim2=-1) if fisher.dim() == 3 else fisher
                curvature = torch.where(torch.isfinite(seen), curvature.maximum(seen), curvature)
            floor = _curvature_floor(curvature, transient) + tiny
            if spread is not None:
                variance = spread.diagonal(dim1=-2, dim2=-1) if spread.dim() == 3 else spread
                floor = torch.where(variance > 0, floor.maximum(1.0 / (SPREAD_CAP * variance)), floor)
            scale = curvature.maximum(floor).rsqrt()
            self.factor = torch.diag_embed(scale) if self.full_mass else scale
        self._keep_finite(previous)
        self._set_step_size(kernel, position, noise_cap)

    def _keep_finite(self, previous: Optional[torch.Tensor]) -> None:
        """A chain whose new factor is not finite (a probe left the model's domain) keeps its old one."""
        dims = tuple(range(1, self.factor.dim()))
        ok = torch.isfinite(self.factor).all(dim=dims) if dims else torch.isfinite(self.factor)
        if bool(ok.all()):
            return
        if previous is None:  # no metric yet: the identity
            ones = torch.ones(self.factor.shape[:2], dtype=self.factor.dtype, device=self.factor.device)
            previous = torch.diag_embed(ones) if self.full_mass else ones
        shape = ok.shape + (1,) * (self.factor.dim() - 1)
        self.factor = torch.where(ok.view(shape), self.factor, previous)

    def _set_step_size(self, kernel, position: torch.Tensor, noise_cap: bool = True) -> None:
        """One step size per chain, ``(C, 1)``, from that chain's own curvature and gradient noise."""
        if not self.adapt_step_size:
            return
        if self.halvings is None:
            self.halvings = torch.zeros(position.shape[0], dtype=torch.long, device=position.device)
            self.total_halvings = self.halvings.clone()
        lam = _largest_curvature(kernel, position, self)
        usable = torch.isfinite(lam) & (lam > 0)
        if noise_cap:  # slow phase: the step must be stable at every point probed so far, not only this one
            lam = torch.where(usable, lam, torch.zeros_like(lam))
            self.largest_curvature = lam if self.largest_curvature is None else self.largest_curvature.maximum(lam)
            lam = self.largest_curvature
            usable = lam > 0
        if self.preconditioned:  # P = |H|^-1 makes the largest preconditioned curvature at least 1: a smaller
            lam = lam.clamp_min(1.0)  # estimate (a flat probe, noise) must not give a huge step
        if self.thermostat:  # SGNHT: eps * xi must stay well below 2 while the thermostat fluctuates
            step_size = STEP_CONSTANTS["thermostat"] / lam.sqrt()
        elif self.second_order:
            step_size = STEP_CONSTANTS["second_order"] / lam.sqrt()
        else:
            step_size = STEP_CONSTANTS["first_order"] / lam
        damping = _noise_damping(kernel)
        if noise_cap and damping > 0:  # not in the initial buffer: far from the typical set the noise says nothing
            largest = self._drift_noise(kernel, position).amax(-1)  # (C,): per-step drift variance, w units
            # gradient noise inflates the kinetic (SGLD: the position) temperature by eps N V / (2 alpha T)
            limit = 2.0 * damping * self.temperature * NOISE_INFLATION / (kernel.potential.num_data * largest)
            capped = (largest > 0) & torch.isfinite(largest)
            step_size = torch.where(capped, step_size.minimum(limit), step_size)
        step_size = step_size * 0.5 ** self.halvings.to(step_size.dtype)
        if self.step_size is None:  # a chain without a usable curvature keeps the user's step size
            fallback = torch.full_like(step_size, min(kernel.step_size(0), torch.finfo(step_size.dtype).max))
        else:
            fallback = self.step_size.squeeze(-1)
        self.step_size = torch.where(usable, step_size, fallback).unsqueeze(-1).to(position.dtype)

    def _drift_noise(self, kernel, position: torch.Tensor) -> torch.Tensor:
        """Per-coordinate variance ``(C, D)`` of the minibatch drift in w units, averaged over every point of
        the chain measured so far (kept in z units, so that it survives changes of the metric)."""
        measured = _drift_noise_covariance(kernel, position)
        self.num_extra_evaluations += NOISE_MINIBATCHES
        self.noise_sum = measured if self.noise_sum is None else self.noise_sum + measured
        self.noise_count += 1
        mean = self.noise_sum / self.noise_count
        factor = self.factor
        if mean.dim() == 3:  # diag(L' V L)
            if self.full_mass:
                return torch.einsum("cji,cjk,cki->ci", factor, mean, factor)
            return factor * factor * mean.diagonal(dim1=-2, dim2=-1)
        if self.full_mass:
            return torch.einsum("cji,cj->ci", factor * factor, mean)
        return factor * factor * mean


def _curvature_floor(curvature: torch.Tensor, transient: bool) -> torch.Tensor:
    """Per chain ``(C, 1)``: the largest absolute eigenvalue over ``MAX_CONDITION``, and in the initial buffer at least
    the median over ``TRANSIENT_CONDITION``."""
    floor = curvature.amax(-1, keepdim=True) / MAX_CONDITION
    if transient:
        floor = floor.maximum(curvature.median(-1, keepdim=True).values / TRANSIENT_CONDITION)
    return floor


def _noise_damping(kernel) -> float:
    """:math:`\\alpha` in the gradient-noise inflation :math:`\\epsilon N V / (2 \\alpha T)` (1 for SGLD)."""
    if kernel.state.momentum is None:
        return 1.0
    value = getattr(kernel, "friction", None)
    if value is None:  # SGNHT: the thermostat settles near the injected-noise coefficient (or above)
        value = getattr(kernel, "diffusion", 1.0)
    return float(value)


def _drift_noise_covariance(kernel, position: torch.Tensor) -> torch.Tensor:
    """Covariance of the minibatch drift ``grad U / N`` in z units from ``NOISE_MINIBATCHES`` minibatches at
    the chains' points: ``(C, D, D)`` for ``dim <= 64``, else its diagonal ``(C, D)`` (0 for a full batch)."""
    C, D = position.shape
    dense = D <= _EXACT_DIAGONAL_MAX_DIM
    if not kernel.minibatches.plates:
        return position.new_zeros((C, D, D) if dense else (C, D))
    drifts = minibatch_gradients(kernel._evaluate, position, kernel.minibatches) / kernel.potential.num_data
    centred = drifts - drifts.mean(0)  # (K, C, D)
    if dense:
        covariance = torch.einsum("kci,kcj->cij", centred, centred) / (NOISE_MINIBATCHES - 1)
    else:
        covariance = (centred * centred).sum(0) / (NOISE_MINIBATCHES - 1)
    return torch.where(torch.isfinite(covariance), covariance, torch.zeros_like(covariance))


# ---------------------------------------------------------------------------- curvature probes
def _probe(kernel, points: torch.Tensor, directions: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Central differences ``(g(z + h u) - g(z - h u)) / (2 h)`` of the (unnormalised) gradient of U.

    ``points`` ``(C, D)``, ``directions`` ``(C, K, D)``, ``steps`` ``(C, K)``; returns ``(C, K, D)``.
    Both sides of a probe use the same minibatch; all probes run in one vectorised call.
    """
    C, K, D = directions.shape
    shift = directions * steps.unsqueeze(-1)
    plus = (points.unsqueeze(1) + shift).reshape(C * K, D)
    minus = (points.unsqueeze(1) - shift).reshape(C * K, D)
    indices = kernel.minibatches.next()  # (C, B) per plate: chain c's minibatch for all its probes
    rows = {k: v.repeat_interleave(K, 0) for k, v in indices.items()}
    both = {k: torch.cat([v, v]) for k, v in rows.items()}
    _, grads = kernel._evaluate(torch.cat([plus, minus]), both)
    difference = (grads[: C * K] - grads[C * K :]).reshape(C, K, D)
    adaptation = kernel._adaptation
    if adaptation is not None:
        adaptation.num_extra_evaluations += 2 * K
    return difference / (2 * steps.unsqueeze(-1))


def _difference_step(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps ** (1.0 / 3.0)


def _hessian(kernel, position: torch.Tensor) -> torch.Tensor:
    """The Hessian of U at each chain's point, ``(C, D, D)`` (``dim <= 64``: one probe per
    coordinate), or only its diagonal ``(C, D)`` from Rademacher probes for larger ``dim``."""
    C, D = position.shape
    h = _difference_step(position.dtype)
    if D <= _EXACT_DIAGONAL_MAX_DIM:
        eye = torch.eye(D, dtype=position.dtype, device=position.device)
        directions = eye.expand(C, D, D)
        steps = h * position.abs().clamp_min(1.0)  # (C, D): one probe per coordinate
        return _probe(kernel, position, directions, steps)  # row i: H e_i
    # Rademacher probes (deterministic signs: no draw from the chains' streams)
    generator = torch.Generator(device="cpu").manual_seed(0)
    signs = (torch.randint(0, 2, (_NUM_PROBES, D), generator=generator) * 2 - 1).to(position)
    directions = signs.expand(C, _NUM_PROBES, D)
    steps = torch.full((C, _NUM_PROBES), h, dtype=position.dtype, device=position.device)
    steps = steps * position.abs().amax(-1, keepdim=True).clamp_min(1.0) / math.sqrt(D)
    hv = _probe(kernel, position, directions, steps)
    return (hv * directions).mean(1)


def _largest_curvature(kernel, position: torch.Tensor, adaptation: MassMatrixAdaptation) -> torch.Tensor:
    """Power iteration for the largest absolute eigenvalue of :math:`L^\\top H L / N` per chain, ``(C,)``."""
    C, D = position.shape
    factor = adaptation.factor
    full = adaptation.full_mass
    h = _difference_step(position.dtype)
    v = torch.ones(C, D, dtype=position.dtype, device=position.device)
    v = v + 0.1 * torch.linspace(-1, 1, D, dtype=position.dtype, device=position.device)  # not an eigenvector
    v = v / v.norm(dim=-1, keepdim=True)
    lam = torch.zeros(C, dtype=position.dtype, device=position.device)
    num_data = kernel.potential.num_data
    for _ in range(_POWER_ITERATIONS):
        u = torch.einsum("cij,cj->ci", factor, v) if full else factor * v  # z-space direction
        size = u.norm(dim=-1).clamp_min(torch.finfo(u.dtype).tiny)
        steps = (h * position.abs().amax(-1).clamp_min(1.0) / size).unsqueeze(-1)
        hu = _probe(kernel, position, u.unsqueeze(1), steps).squeeze(1) / num_data
        hv = torch.einsum("cji,cj->ci", factor, hu) if full else factor * hu
        lam = (hv * v).sum(-1).abs()
        norm = hv.norm(dim=-1, keepdim=True)
        ok = torch.isfinite(norm) & (norm > 0)
        v = torch.where(ok, hv / norm.clamp_min(torch.finfo(norm.dtype).tiny), v)
    return torch.where(torch.isfinite(lam), lam, torch.zeros_like(lam))
