"""The default warmup: find the typical set from any start, then adapt, then sample.

With ``adapt_step_size=True`` or ``adapt_mass_matrix=True`` (both the default, as for Pyro's NUTS),
``temperature > 0`` and at least ``MIN_ADAPTATION_WARMUP`` warmup steps, the ``W`` warmup steps of a kernel
run in three phases, shown in the progress bar
(``phase``) and in ``diagnostics()``:

1. **Approach** (the first ``APPROACH_FRACTION`` of warmup): no dynamics yet. Every chain descends its own
   minibatch potential with a vectorised sign-based method (iRprop-; Riedmiller and Braun 1993, Igel and
   Huesken 2000): each coordinate has its own step :math:`\\delta_{t,i}`,

   .. math::
       \\delta_{t,i} = \\min\\big(\\eta_{t,i}\\, \\delta_{t-1,i},\\ \\max(|z_{t,i}|, 1)\\big), \\qquad
       \\eta_{t,i} = \\begin{cases} 1.2 & g_{t,i}\\, g_{t-1,i} > 0 \\\\ 0.5 & g_{t,i}\\, g_{t-1,i} < 0 \\\\
       1 & \\text{otherwise} \\end{cases}, \\qquad
       z_{t+1,i} = z_{t,i} - \\delta_{t,i}\\, \\mathrm{sign}(g_{t,i})

   (no move, and a zero remembered sign, after a sign change), with :math:`g_t` the minibatch gradient and
   :math:`\\delta_0 = 0.01 \\max(|z_0|, 1)`. Only the *sign* of the gradient is used, so the size of the
   gradient does not matter: from ``init_to_uniform`` a regression on raw covariates has gradients of order
   :math:`10^4`, and a plain Langevin step throws ``log sigma`` to 100, from where it never returns; here
   it cannot. Far from the mode the signs persist and the steps grow geometrically (a coefficient of 300
   is reached from 0 in about 50 steps); near the mode the minibatch noise flips the signs about every
   other step, and the steps shrink geometrically, so the chain comes to rest at the scale where the
   gradient's signal and noise are equal, inside the posterior bulk whatever its scale, and a chain that
   starts there (a good ``init_to_value``) is not thrown out. A step to a non-finite point is refused (the
   chain stays, its steps are halved) and counted as ``approach rejections``, not as a divergence. Along
   strongly correlated directions the per-coordinate steps stall before the mode; the adaptation phase
   moves the chain the rest of the way.

2. **Adaptation** (the remaining warmup): the dynamics run, preconditioned. The metric (inverse mass
   matrix) is the regularised inverse curvature averaged over the chain's own draws and the step size
   follows from the preconditioned curvature and the gradient noise, in Stan-like windows
   (:mod:`~pyro_sgmcmc.kernels.preconditioning`). A divergence here halves the step size for the rest
   of the run.

3. **Sampling**: everything is frozen; the chains target the exact tempered posterior (up to the
   :math:`O(\\epsilon)` bias of the discretisation and the gradient noise). No adaptation code runs.

Divergences. A step is divergent when its potential or gradient is not finite, or when its minibatch
potential jumps up by more than

.. math:: \\Delta_{max} = \\texttt{max\\_delta\\_energy} + Z_{jump}\\, s_c,

where :math:`s_c` is the root-mean-square of chain ``c``'s step-to-step changes of the minibatch
potential over the second half of warmup (the minibatch noise of :math:`\\hat U` at ``N / B``
scale, plus the chain's own motion) and ``max_delta_energy`` = 1000 as in Pyro's NUTS. A chain that
leaves the posterior's range (a blow-up, a position of :math:`10^{100}`) raises its potential by far
more than that; a chain at stationarity never does (:math:`Z_{jump} = 10`: ten times the RMS of the
step-to-step noise). The jump check is active in sampling only, once :math:`s_c` is measured (at
least :data:`MIN_JUMP_STEPS` warmup steps); the finiteness check always.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

__all__ = [
    "APPROACH_FRACTION",
    "AUTO_CONTROL_VARIATE_EPOCH",
    "CONTROL_VARIATE_GAIN",
    "MAX_MINIBATCHES",
    "NOISE_Z",
    "ARRIVAL_Z",
    "STAGE_IMPROVEMENT",
    "PRELIMINARY_MAP_ITERATIONS",
    "AUTO_MAP_ITERATIONS",
    "CENTRE_TOLERANCE",
    "SLOW_MIXING_FRACTION",
    "minibatch_gradients",
    "MIN_ADAPTATION_WARMUP",
    "MAX_DELTA_ENERGY",
    "TypicalSetSearch",
    "JumpMonitor",
    "approach_length",
]

#: Share of the warmup spent in the approach (optimisation) phase.
APPROACH_FRACTION = 0.25
#: The approach's first step of each coordinate, relative to ``max(|z|, 1)``.
INITIAL_RELATIVE_STEP = 0.01
#: iRprop-'s factors: a coordinate's step grows by GROWTH while its gradient keeps its sign, and shrinks by
#: SHRINK when the sign changes (Igel and Huesken, 2000; Riedmiller and Braun, 1993).
GROWTH, SHRINK = 1.2, 0.5
#: The absolute part of the jump threshold (Pyro's NUTS ``max_delta_energy``).
MAX_DELTA_ENERGY = 1000.0
#: The jump threshold's multiple of the RMS step-to-step change of the minibatch potential.
JUMP_Z = 10.0
#: ``control_variate="auto"`` centres the gradients at the MAP when an epoch of the (single) subsampled plate
#: has at least this many minibatches (``N >= 10 B``): below, the gradient noise is small enough as it is.
AUTO_CONTROL_VARIATE_EPOCH = 10
#: Fewer warmup steps than this adapt nothing (the given ``step_size`` is used): too short to probe anything.
MIN_ADAPTATION_WARMUP = 20
#: ``control_variate="auto"`` keeps its candidate if it multiplies the gradient variance by less than this.
CONTROL_VARIATE_GAIN = 0.4
#: ``control_variate="auto"``: L-BFGS iterations of the preliminary centre (from the approach's best point) ...
PRELIMINARY_MAP_ITERATIONS = 5
#: ... moved on towards the MAP in stages of 10, 20, ... up to this many iterations while each stage lowers the
#: gradient variance by more than 10 % (``AutoControlVariate.decide``); each stage stops early ...
AUTO_MAP_ITERATIONS = 80
#: ... once 10 full-data evaluations lower the potential by less than this fraction of the chains' average
#: excess over the minimum, ``T d / 2`` nats (the centre's offset then adds at most about this fraction to the
#: control variate's variance).
CENTRE_TOLERANCE = 0.05
#: Minibatches per measurement of the gradient noise (warmup only).
NOISE_MINIBATCHES = 8
#: ``control_variate="auto"`` measures its ratios on a shared pool of minibatches, doubled from
#: ``NOISE_MINIBATCHES`` up to this many while a ratio is within ``NOISE_Z`` jackknife errors of its threshold ...
MAX_MINIBATCHES = 64
NOISE_Z = 2.0
#: ``control_variate="auto"`` measures a chain whose squared gradient, in units of ``T`` times its curvature,
#: exceeds ``d`` (its mean at the posterior, by integration by parts) by more than this many sds of a ``chi^2_d``
#: where it would arrive (:meth:`AutoControlVariate.decide`).
ARRIVAL_Z = 4.0
#: ... and a stage of the MAP search goes on if it lowers the log ratio by more than this (10 %).
STAGE_IMPROVEMENT = math.log(0.9)
#: A warning is given when a chain's relaxation time (in steps) under its adapted step exceeds this fraction
#: of the adaptation phase (``WarmupDriver``, at the end of warmup).
SLOW_MIXING_FRACTION = 0.2
#: Fewest warmup steps from which the jump threshold is measured; below, only non-finite steps diverge.
MIN_JUMP_STEPS = 20


def approach_length(warmup_steps: int) -> int:
    """Steps of the approach phase for ``warmup_steps`` steps of warmup."""
    return int(APPROACH_FRACTION * warmup_steps)


class TypicalSetSearch:
    """The approach phase: a vectorised sign-based descent (iRprop-) on the minibatch potential of each chain.

    Parameters
    ----------
    num_steps : int
        Length of the approach (``W_a``).
    position : Tensor ``(C, D)``
        Starting points: each coordinate's first step is ``INITIAL_RELATIVE_STEP * max(|z|, 1)``.
    """

    def __init__(self, num_steps: int, position: torch.Tensor) -> None:
        self.num_steps = int(num_steps)
        self.steps = INITIAL_RELATIVE_STEP * position.abs().clamp_min(1.0)  # (C, D) per-coordinate step
        self.previous_sign = torch.zeros_like(position)
        self.rejections = torch.zeros(position.shape[0], dtype=torch.long, device=position.device)

    def propose(self, position: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The next point of every chain from the minibatch ``grad = nabla U`` at ``position``."""
        sign = torch.sign(grad)
        agreement = sign * self.previous_sign
        growth = torch.where(agreement > 0, GROWTH, torch.where(agreement < 0, SHRINK, 1.0))
        limit = position.abs().clamp_min(1.0)  # at most a doubling of the coordinate per step
        self.steps = (self.steps * growth).minimum(limit)
        sign = torch.where(agreement < 0, torch.zeros_like(sign), sign)  # iRprop-: no move after a sign change
        self.previous_sign = sign
        return position - self.steps * sign

    def reject(self, refused: torch.Tensor) -> None:
        """Chains whose proposal was not finite stay, with all their steps halved."""
        keep = refused.unsqueeze(-1)
        self.steps = torch.where(keep, SHRINK * self.steps, self.steps)
        self.previous_sign = torch.where(keep, torch.zeros_like(self.previous_sign), self.previous_sign)
        self.rejections += refused.long()

    def typical_step(self) -> torch.Tensor:
        """``(C, 1)``: each chain's mean step (what the progress bar shows as the step size)."""
        return self.steps.mean(-1, keepdim=True)

    def state_dict(self) -> dict:
        return {
            "steps": self.steps.cpu().clone(),
            "previous_sign": self.previous_sign.cpu().clone(),
            "rejections": self.rejections.cpu().clone(),
        }

    def load_state_dict(self, saved: dict, device) -> None:
        self.steps = saved["steps"].to(device)
        self.previous_sign = saved["previous_sign"].to(device)
        self.rejections = saved["rejections"].to(device)


class JumpMonitor:
    """Measures the step-to-step changes of each chain's minibatch potential in warmup and gives the jump
    thresholds (module docstring): a running one during adaptation, from all its steps so far, and the
    sampling phase's, from the second half of warmup."""

    def __init__(self, warmup_steps: int, num_chains: int, device, max_delta_energy: float = MAX_DELTA_ENERGY):
        self.start = warmup_steps - warmup_steps // 2
        self.end = warmup_steps
        self.max_delta_energy = float(max_delta_energy)
        zeros = torch.zeros(num_chains, dtype=torch.float64, device=device)
        self.sum_squares = zeros  # second half of warmup
        self.count = 0
        self.running_sum_squares = zeros.clone()  # every recorded step
        self.running_count = 0

    def record(self, step: int, jump: torch.Tensor) -> None:
        """The change into state ``step`` (1-based count of steps taken) of every chain."""
        jump = jump.to(torch.float64)
        square = torch.where(torch.isfinite(jump), jump * jump, torch.zeros_like(jump))
        self.running_sum_squares += square
        self.running_count += 1
        if self.start < step <= self.end:
            self.sum_squares += square
            self.count += 1

    def running_threshold(self) -> Optional[torch.Tensor]:
        """``(C,)`` thresholds from every step recorded so far, or ``None`` before :data:`MIN_JUMP_STEPS`."""
        return self._threshold(self.running_sum_squares, self.running_count)

    def threshold(self) -> Optional[torch.Tensor]:
        """``(C,)`` thresholds of the sampling phase, or ``None`` when too few steps were measured."""
        return self._threshold(self.sum_squares, self.count)

    def _threshold(self, sum_squares: torch.Tensor, count: int) -> Optional[torch.Tensor]:
        if count < MIN_JUMP_STEPS:
            return None
        return self.max_delta_energy + JUMP_Z * (sum_squares / count).sqrt()

    def state_dict(self) -> dict:
        return {
            "sum_squares": self.sum_squares.cpu().clone(),
            "count": self.count,
            "running_sum_squares": self.running_sum_squares.cpu().clone(),
            "running_count": self.running_count,
        }

    def load_state_dict(self, saved: dict, device) -> None:
        self.sum_squares = saved["sum_squares"].to(device)
        self.count = saved["count"]
        self.running_sum_squares = saved["running_sum_squares"].to(device)
        self.running_count = saved["running_count"]


def minibatch_gradients(evaluate, position: torch.Tensor, minibatches, count: int = NOISE_MINIBATCHES) -> torch.Tensor:
    """``(count, C, D)``: the minibatch gradients at ``position`` on ``count`` successive minibatches."""
    return torch.stack([evaluate(position, minibatches.next())[1] for _ in range(count)])
