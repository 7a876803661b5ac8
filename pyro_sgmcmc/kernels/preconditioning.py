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

from typing import Callable, List, Optional, Tuple

import torch

from .curvature_probes import EXACT_DIAGONAL_MAX_DIM, CurvatureProbes
from .metric import regularised_factor
from .state import SGMCMCState

__all__ = ["MassMatrixAdaptation", "adaptation_schedule", "DENSE_MAX_DIM"]

#: ``full_mass=None`` chooses a dense mass matrix up to this dimension (O(dim^2) per step and chain).
DENSE_MAX_DIM = 64
#: ``c`` of the step-size heuristic: ``c / lambda_max`` (first order) or ``c / sqrt(lambda_max)``.
STEP_CONSTANTS = {"first_order": 0.1, "second_order": 0.4, "thermostat": 0.1}
#: Largest accepted relative inflation of the stationary variance by gradient noise.
NOISE_INFLATION = 0.1


_SAVED_TENSORS = (
    "factor", "step_size", "hessian_sum", "halvings", "total_halvings", "noise_sum", "largest_curvature",
    "draw_sum", "draw_outer", "grad_outer", "grad_sum",
)  # fmt: skip
_SAVED_COUNTS = ("count", "num_extra_evaluations", "noise_count", "draw_count")


def _on(tensor: Optional[torch.Tensor], device) -> Optional[torch.Tensor]:
    """``tensor`` on ``device`` (a copy on the CPU, so that a saved state does not alias the live one)."""
    if tensor is None:
        return None
    return tensor.cpu().clone() if str(device) == "cpu" else tensor.to(device)


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
    adapt_mass_matrix : bool
        False: the metric stays the identity and only the step size adapts.
    offset : int
        Warmup steps before this adaptation starts (the approach phase).
    probes : CurvatureProbes
        The kernel's gradient estimate and minibatches, as the curvature probes use them.
    damping : float
        :math:`\\alpha` in the gradient-noise inflation :math:`\\epsilon N V / (2 \\alpha T)`: the friction (SGHMC),
        the injected-noise coefficient (SGNHT, where the thermostat settles), 1 for SGLD.
    initial_step_size : float
        The user's step size at step 0: kept by a chain whose curvature cannot be measured.
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
        *,
        probes: CurvatureProbes,
        damping: float = 1.0,
        initial_step_size: float = 1e-3,
    ) -> None:
        self.probes = probes
        self.damping = float(damping)
        self.initial_step_size = float(initial_step_size)
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

    @property
    def num_extra_evaluations(self) -> int:
        """Gradient evaluations (per chain) spent on probes."""
        return self.probes.evaluations

    @num_extra_evaluations.setter
    def num_extra_evaluations(self, count: int) -> None:
        self.probes.evaluations = count

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The adapted metric, step sizes and the warmup's running sums (tensors on the CPU)."""
        out = {name: _on(getattr(self, name), "cpu") for name in _SAVED_TENSORS}
        out.update({name: getattr(self, name) for name in _SAVED_COUNTS})
        return out

    def load_state_dict(self, saved: dict, device: torch.device) -> None:
        """Restore :meth:`state_dict` onto ``device``."""
        for name in _SAVED_TENSORS:
            setattr(self, name, _on(saved[name], device))
        for name in _SAVED_COUNTS:
            setattr(self, name, saved[name])

    # ------------------------------------------------------------------ hot path
    def transition(
        self,
        update: Callable,
        state: SGMCMCState,
        drift: torch.Tensor,
        step_size,
        noise: Optional[torch.Tensor],
        drift_scale: float = 1.0,
    ):
        """The kernel's ``update`` (:meth:`~pyro_sgmcmc.kernels.base.SGMCMCKernel.transition`) in :math:`w`
        coordinates, mapped back to :math:`z` (the drift is ``drift_scale * drift``, as in
        :mod:`~pyro_sgmcmc.kernels.diffusions`). Returns the new ``(position, momentum, thermostat)``."""
        factor = self.factor
        if self.full_mass:
            drift_w = torch.einsum("cji,cj->ci", factor, drift)
        else:
            drift_w = drift * factor
        w_state = state.replace(position=torch.zeros_like(state.position))
        displacement, momentum, thermostat = update(w_state, drift_w, step_size, noise, drift_scale)
        if self.full_mass:
            displacement = torch.einsum("cij,cj->ci", factor, displacement)
        else:
            displacement = displacement * factor
        return state.position + displacement, momentum, thermostat

    # ------------------------------------------------------------------ adaptation
    def setup(self, position: torch.Tensor) -> None:
        """First metric (the local Gaussian at the chains' points) and the step size from it."""
        if not self.preconditioned:
            self.factor = torch.ones_like(position)
            self._set_step_size(position, noise_cap=not self.slow_probes)
            return
        self._set_metric(position, self.probes.hessian(position), noise_cap=not self.slow_probes, transient=True)

    def update(self, step: int, position: torch.Tensor, grad: torch.Tensor) -> bool:
        """After warmup step ``step`` (1-based count of steps taken, approach included) at ``position`` with
        gradient ``grad``. Returns whether the metric was replaced, so that the momentum, in units of the old
        metric, must be reset to zero (it would overshoot in the new one)."""
        step -= self.offset
        if self.preconditioned and self.initial_probes and step > self.initial_probes[-1]:
            self._record_draw(position, grad)
        if step in self.initial_probes:
            if self.preconditioned:
                self._set_metric(position, self.probes.hessian(position), noise_cap=False, transient=True)
            else:
                self._set_step_size(position, noise_cap=False)
            return True
        if step in self.slow_probes:
            if self.halvings is not None:  # the new step size is derived afresh (divergences halve it again)
                self.halvings = torch.zeros_like(self.halvings)
            if not self.preconditioned:
                self._set_step_size(position)
                return False
            hessian = self.probes.hessian(position)
            self.hessian_sum = hessian if self.hessian_sum is None else self.hessian_sum + hessian
            self.count += 1
            curvature = self.hessian_sum / self.count
            self._set_metric(position, curvature, spread=self._draw_covariance(), fisher=self.gradient_curvature())
        return False

    def _record_draw(self, position: torch.Tensor, grad: torch.Tensor) -> None:
        dense = position.shape[-1] <= EXACT_DIAGONAL_MAX_DIM
        outer = torch.einsum("ci,cj->cij", position, position) if dense else position * position
        grad_outer = torch.einsum("ci,cj->cij", grad, grad) if dense else grad * grad
        if self.draw_sum is None:
            self.draw_sum, self.draw_outer, self.grad_outer = position.clone(), outer, grad_outer
            self.grad_sum = grad.clone()
        else:
            self.draw_sum, self.draw_outer = self.draw_sum + position, self.draw_outer + outer
            self.grad_outer, self.grad_sum = self.grad_outer + grad_outer, self.grad_sum + grad
        self.draw_count += 1

    def gradient_curvature(self) -> Optional[torch.Tensor]:
        """The curvature seen by the gradients, :math:`(\\mathrm{Cov}_t[\\hat g] - \\mathrm{Cov}(\\hat g)) / (N T)`,
        over the slow-phase draws: under the (tempered) posterior :math:`E_\\pi[\\nabla U \\nabla U^\\top] =
        T\\, E_\\pi[\\nabla^2 U]` (integration by parts), and the minibatch noise covariance is subtracted. Unlike
        the Hessian it is not zero in a linear tail (``-log tau`` as ``tau -> 0``: gradient 1, curvature 0)."""
        if self.draw_count < 2 or self.noise_sum is None:
            return None
        num_data = self.probes.num_data
        noise = self.noise_sum / self.noise_count * num_data**2  # Cov of grad U from Cov of grad U / N
        if noise.dim() != self.grad_outer.dim():
            noise = noise.diagonal(dim1=-2, dim2=-1) if noise.dim() == 3 else torch.diag_embed(noise)
        mean = self.grad_sum / self.draw_count
        mean_outer = torch.einsum("ci,cj->cij", mean, mean) if self.grad_outer.dim() == 3 else mean * mean
        return (self.grad_outer / self.draw_count - mean_outer - noise) / (num_data * self.temperature)

    def _draw_covariance(self) -> Optional[torch.Tensor]:
        """Covariance of the slow-phase draws in normalised units (``N / T`` times), ``(C, D, D)`` or ``(C, D)``."""
        if self.draw_count < 2:
            return None
        mean = self.draw_sum / self.draw_count
        if self.draw_outer.dim() == 3:
            covariance = self.draw_outer / self.draw_count - torch.einsum("ci,cj->cij", mean, mean)
        else:
            covariance = self.draw_outer / self.draw_count - mean * mean
        return covariance * (self.probes.num_data / self.temperature)

    def shrink_step_size(self, diverging: torch.Tensor) -> None:
        """Halve the step size of the chains that diverged in warmup (``(C,)`` bool) until the next derivation."""
        self.halvings = self.halvings + diverging.long()
        self.total_halvings = self.total_halvings + diverging.long()
        if self.step_size is not None:
            self.step_size = torch.where(diverging.unsqueeze(-1), 0.5 * self.step_size, self.step_size)

    def _set_metric(
        self,
        position: torch.Tensor,
        hessian: torch.Tensor,
        noise_cap: bool = True,
        transient: bool = False,
        spread: Optional[torch.Tensor] = None,
        fisher: Optional[torch.Tensor] = None,
    ) -> None:
        """The regularised metric from ``hessian`` (:func:`~pyro_sgmcmc.kernels.metric.regularised_factor`), then
        the step size under it."""
        self.factor = regularised_factor(
            hessian / self.probes.num_data, self.factor, self.full_mass, transient, spread, fisher
        )
        self._set_step_size(position, noise_cap)

    def _set_step_size(self, position: torch.Tensor, noise_cap: bool = True) -> None:
        """One step size per chain, ``(C, 1)``, from that chain's own curvature and gradient noise."""
        if not self.adapt_step_size:
            return
        if self.halvings is None:
            self.halvings = torch.zeros(position.shape[0], dtype=torch.long, device=position.device)
            self.total_halvings = self.halvings.clone()
        lam = self.probes.largest_curvature(position, self.factor, self.full_mass)
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
        damping = self.damping
        if noise_cap and damping > 0:  # not in the initial buffer: far from the typical set the noise says nothing
            largest = self._drift_noise(position).amax(-1)  # (C,): per-step drift variance, w units
            # gradient noise inflates the kinetic (SGLD: the position) temperature by eps N V / (2 alpha T)
            limit = 2.0 * damping * self.temperature * NOISE_INFLATION / (self.probes.num_data * largest)
            capped = (largest > 0) & torch.isfinite(largest)
            step_size = torch.where(capped, step_size.minimum(limit), step_size)
        step_size = step_size * 0.5 ** self.halvings.to(step_size.dtype)
        if self.step_size is None:  # a chain without a usable curvature keeps the user's step size
            fallback = torch.full_like(step_size, min(self.initial_step_size, torch.finfo(step_size.dtype).max))
        else:
            fallback = self.step_size.squeeze(-1)
        self.step_size = torch.where(usable, step_size, fallback).unsqueeze(-1).to(position.dtype)

    def _drift_noise(self, position: torch.Tensor) -> torch.Tensor:
        """Per-coordinate variance ``(C, D)`` of the minibatch drift in w units, averaged over every point of
        the chain measured so far (kept in z units, so that it survives changes of the metric)."""
        measured = self.probes.drift_noise_covariance(position)
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
