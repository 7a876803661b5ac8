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

Adaptation (``adapt_mass_matrix=True``), per chain, during warmup only. The metric is the inverse
of the *curvature* of the potential averaged over the chain's own warmup draws,
:math:`P = |\\bar H|^{-1}` with :math:`\\bar H` the mean normalised Hessian :math:`\\nabla^2 U / N`
(for a Gaussian posterior exactly :math:`(N / T) \\Sigma`; ``full_mass``: dense; otherwise the diagonal
of :math:`|\\bar H|^{-1}`, the marginal variances of the local Gaussian, times :math:`N / T`). Each
Hessian comes from central differences of minibatch gradients at the chain's point (the same
minibatch on both sides, one probe per coordinate, batched over chains in one vectorised call,
``2 dim`` gradient evaluations per chain); its eigenvalues are taken in absolute value, so an
indefinite Hessian far from the mode still gives a metric. For ``dim > 64`` only the diagonal of
:math:`H` is estimated (16 Rademacher probes) and :math:`P = 1 / |\\mathrm{diag}\\, \\bar H|`
(Jacobi). The schedule follows Stan's (:func:`adaptation_schedule`):

1. *Initial buffer* (first 15 % of warmup): the metric is the Hessian at the current point,
   recomputed at set-up, after steps 1, 2, 4, 8, ... and at the end of the buffer, as the chain
   moves to the typical set (the curvature changes fastest early: a regression started at a
   too-large ``sigma`` stiffens as ``sigma`` shrinks); the momentum is reset to zero each time, as
   momentum built up under the old metric overshoots under the new one.
2. *Slow phase* (the next 75 %): 8 evenly spaced probes; the metric is the inverse of the mean of
   the Hessians probed so far.
3. *Terminal buffer* (last 10 %): the metric is final and the chain settles with it.

Why not Stan's windowed variance of the draws: SG-MCMC draws are strongly autocorrelated, and a
window of 25-100 steps from a chain that starts at (or near) the mode has not spread out yet, so
the variance is underestimated, the metric shrinks, the chain slows down further, and the next
window is worse. Measured on ``sblrc-blr`` (B = 50, 600 warmup steps, SGHMC): windowed variances
ended 3 to 135 times below the true posterior variances and the bulk ESS of 16,000 draws was
16; with the curvature metric (dense, same run) the adapted variances are within 10 % and the
ESS is 230. Curvature
is a local property: it needs no exploration. Squared gradients (pSGLD's RMSprop estimate, Li et
al. 2016) measure the same curvature at stationarity (:math:`E[g g^\\top] = (T / N) H`) but are
inflated by the gradient noise (by up to :math:`N / B`) and wrong far from the mode.

Known limitation: the adaptation assumes the chains start in or near the typical set. From far
starts (``init_to_uniform`` on ``sblrc-blr``, coefficients 1000 posterior sds off) the Hessian of
an indefinite region can give a metric under which ``log sigma`` jumps by 10-14 units in one step,
and the run does not recover within 600 warmup steps (measured: 171 divergences, sds off by orders
of magnitude). Start at a cheap fit instead (least squares, a MAP, a Laplace mean:
``init_strategy=init_to_value(values=...)``); all the measurements here do. (Using only the
diagonal of the Hessian in the initial buffer did not help either: the same run still blew up.)

After warmup :math:`P` is frozen: the sampling phase targets the exact tempered posterior (up to
the usual :math:`O(\\epsilon)` bias of the discretisation and the gradient noise). Each chain
adapts from its own draws only, so the chains stay independent (needed by R-hat); the chains of
one superchain therefore get different (but similar) mass matrices.

Step size (when ``step_size`` is left at ``None``): each time :math:`P` changes, the largest
curvature :math:`\\lambda_{max}` of the preconditioned Hessian :math:`L^\\top H L` is estimated at
every chain's point by 12 power iterations (central-difference Hessian-vector products) and the
step size set to :math:`c / \\sqrt{\\lambda_{max}}` for SGHMC (:math:`c = 0.4`: the symplectic-Euler
variance bias along the stiffest direction is about :math:`c^2 / 4 = 4 \\%`), for SGNHT with
:math:`c = 0.1` (its thermostat :math:`\\xi` fluctuates, and the momentum update is unstable once
:math:`\\epsilon \\xi > 2`; with :math:`c = 0.4` a 3-dimensional Gaussian blew up), and
:math:`c / \\lambda_{max}` for SGLD (:math:`c = 0.1`: the Euler variance bias
:math:`\\epsilon \\lambda / 2` is at most 5 %), with the largest :math:`\\lambda_{max}` over the
chains (one step size for all). With subsampled data the step is further capped so that the
gradient noise inflates the stationary variance by at most 10 %: the inflation is
:math:`\\epsilon N V / (2 \\alpha T)` (SGLD: :math:`\\alpha = 1`; SGHMC: the friction; SGNHT: the
diffusion), with :math:`V` the largest variance of the minibatch drift in :math:`w` units, from 8
minibatches at the chains' points; this cap is applied from the slow phase on (in the initial
buffer the chain may still be far from the typical set, where the noise, large with control
variates far from their centre, says nothing about the stationary bias, and a tiny step would
keep the chain there). It is frozen with :math:`P` at the end of warmup.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

__all__ = ["MassMatrixAdaptation", "adaptation_schedule", "DENSE_MAX_DIM"]

#: ``full_mass=None`` chooses a dense mass matrix up to this dimension (O(dim^2) per step and chain).
DENSE_MAX_DIM = 64
_EXACT_DIAGONAL_MAX_DIM = 64
#: Floor of the |eigenvalues| of the Hessian in the initial buffer, relative to the largest. Raising it
#: (1e-8) did not stop the blow-up from far starts described in the module docstring.
TRANSIENT_FLOOR = 1e-12
_NUM_PROBES = 16
_POWER_ITERATIONS = 12
#: ``c`` of the step-size heuristic: ``c / lambda_max`` (first order) or ``c / sqrt(lambda_max)``.
STEP_CONSTANTS = {"first_order": 0.1, "second_order": 0.4, "thermostat": 0.1}
#: Largest accepted relative inflation of the stationary variance by gradient noise.
NOISE_INFLATION = 0.1
_NOISE_MINIBATCHES = 8


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
    ) -> None:
        self.warmup_steps = int(warmup_steps)
        self.thermostat = bool(thermostat)
        self.full_mass = bool(full_mass)
        self.adapt_step_size = bool(adapt_step_size)
        self.second_order = bool(second_order)
        self.temperature = float(temperature)
        self.initial_probes, self.slow_probes = adaptation_schedule(self.warmup_steps)
        self.factor: Optional[torch.Tensor] = None  # (C, D) or (C, D, D)
        self.step_size: Optional[float] = None
        self.count = 0  # Hessians summed in the slow phase
        self.hessian_sum: Optional[torch.Tensor] = None
        self.num_extra_evaluations = 0  # gradient evaluations (per chain) spent on probes

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        def cpu(t):
            return None if t is None else t.cpu().clone()

        return {
            "factor": cpu(self.factor),
            "step_size": self.step_size,
            "count": self.count,
            "hessian_sum": cpu(self.hessian_sum),
            "num_extra_evaluations": self.num_extra_evaluations,
        }

    def load_state_dict(self, saved: dict, device: torch.device) -> None:
        def dev(t):
            return None if t is None else t.to(device)

        self.factor = dev(saved["factor"])
        self.step_size = saved["step_size"]
        self.count = saved["count"]
        self.hessian_sum = dev(saved["hessian_sum"])
        self.num_extra_evaluations = saved["num_extra_evaluations"]

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
        """First metric (the local Gaussian at the initial points) and the step size from it."""
        hessian = _hessian(kernel, position)
        self._set_metric(kernel, position, hessian, noise_cap=not self.slow_probes, floor=TRANSIENT_FLOOR)

    def update(self, kernel, step: int, position: torch.Tensor) -> None:
        """After warmup step ``step`` (1-based count of steps taken) at ``position``."""
        if step in self.initial_probes:
            self._set_metric(kernel, position, _hessian(kernel, position), noise_cap=False, floor=TRANSIENT_FLOOR)
            if kernel.state.momentum is not None:  # momentum from the old metric would overshoot in the new one
                kernel.state = kernel.state._replace(momentum=torch.zeros_like(kernel.state.momentum))
        elif step in self.slow_probes:
            hessian = _hessian(kernel, position)
            self.hessian_sum = hessian if self.hessian_sum is None else self.hessian_sum + hessian
            self.count += 1
            self._set_metric(kernel, position, self.hessian_sum / self.count)

    def _set_metric(
        self, kernel, position: torch.Tensor, hessian: torch.Tensor, noise_cap: bool = True, floor: float = 1e-12
    ) -> None:
        """``P = |H / N|^{-1}`` (dense or its diagonal), or Jacobi ``1 / |diag H / N|`` for large ``dim``."""
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
            floor = curvature.amax(-1, keepdim=True) * floor + tiny
            factor = vectors * curvature.maximum(floor).rsqrt().unsqueeze(-2)  # V |Lambda|^-1/2
            if self.full_mass:
                self.factor = factor
            else:  # the diagonal of |H|^-1: the marginal variances of the local Gaussian (times N / T)
                self.factor = (factor * factor).sum(-1).sqrt()
        else:  # (C, D) diagonal only (large D): Jacobi, P = 1 / |diag H|
            curvature = hessian.abs()  # a non-finite entry makes the chain keep its metric (_keep_finite)
            floor = curvature.amax(-1, keepdim=True) * floor + tiny
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
        if not self.adapt_step_size:
            return
        lam = float(_largest_curvature(kernel, position, self).max())
        if not math.isfinite(lam) or lam <= 0:
            return
        if self.thermostat:  # SGNHT: eps * xi must stay well below 2 while the thermostat fluctuates
            step_size = STEP_CONSTANTS["thermostat"] / math.sqrt(lam)
        elif self.second_order:
            step_size = STEP_CONSTANTS["second_order"] / math.sqrt(lam)
        else:
            step_size = STEP_CONSTANTS["first_order"] / lam
        if not noise_cap:  # initial buffer: far from the typical set the noise says nothing about the bias
            self.step_size = step_size
            return
        noise = float(_drift_noise(kernel, position, self).max())  # largest per-step drift variance, w units
        damping = _noise_damping(kernel)
        if noise > 0 and math.isfinite(noise) and damping > 0:
            # gradient noise inflates the kinetic (SGLD: the position) temperature by eps N V / (2 alpha T)
            limit = 2.0 * damping * self.temperature * NOISE_INFLATION / (kernel.potential.num_data * noise)
            step_size = min(step_size, limit)
        self.step_size = step_size


def _noise_damping(kernel) -> float:
    """:math:`\\alpha` in the gradient-noise inflation :math:`\\epsilon N V / (2 \\alpha T)` (1 for SGLD)."""
    if kernel.state.momentum is None:
        return 1.0
    value = getattr(kernel, "friction", None)
    if value is None:  # SGNHT: the thermostat settles near the injected-noise coefficient (or above)
        value = getattr(kernel, "diffusion", 1.0)
    return float(value)


def _drift_noise(kernel, position: torch.Tensor, adaptation: "MassMatrixAdaptation") -> torch.Tensor:
    """Per-chain largest variance over coordinates of the minibatch drift in w units, ``(C,)``,
    from ``_NOISE_MINIBATCHES`` minibatches at the current points (0 for a full-batch model)."""
    if not kernel.minibatches.plates:
        return position.new_zeros(position.shape[0])
    drifts = []
    for _ in range(_NOISE_MINIBATCHES):
        _, grad = kernel._evaluate(position, kernel.minibatches.next())
        drift = grad / kernel.potential.num_data
        factor = adaptation.factor
        drifts.append(torch.einsum("cji,cj->ci", factor, drift) if adaptation.full_mass else drift * factor)
    adaptation.num_extra_evaluations += _NOISE_MINIBATCHES
    variance = torch.stack(drifts).var(0)
    variance = torch.where(torch.isfinite(variance), variance, torch.zeros_like(variance))
    return variance.amax(-1)


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
    """Power iteration for the largest |eigenvalue| of :math:`L^\\top H L / N` per chain, ``(C,)``."""
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


def _cholesky(matrix: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of a batch of symmetric PSD matrices, with growing jitter if needed."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if not bool((info > 0).any()):
        return factor
    diag = torch.diagonal(matrix, dim1=-2, dim2=-1)
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    for jitter in (1e-10, 1e-8, 1e-6, 1e-4, 1e-2):
        shifted = matrix + jitter * diag.abs().amax(-1, keepdim=True).unsqueeze(-1) * eye
        factor, info = torch.linalg.cholesky_ex(shifted)
        if not bool((info > 0).any()):
            return factor
    return torch.diag_embed(diag.clamp_min(torch.finfo(matrix.dtype).tiny).sqrt())
