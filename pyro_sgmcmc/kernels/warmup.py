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
   moves the chain the rest of the way. (The rule is :mod:`~pyro_sgmcmc.kernels.adapt.approach`.)

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
step-to-step noise). In adaptation the same check runs with a running :math:`s_c`, measured from the
approach's second half on (the chains at rest there: the changes are the minibatch noise), so that it
guards the very first steps under the first metric; a jump there is a divergence, the chain is put back and
its step halved. The jump check needs :data:`MIN_JUMP_STEPS` measured steps; the finiteness check runs
always. (The thresholds are :mod:`~pyro_sgmcmc.kernels.adapt.jumps`.)
"""

from __future__ import annotations

import math

from .adapt.jumps import JUMP_Z, MAX_DELTA_ENERGY, MIN_JUMP_STEPS

__all__ = [
    "APPROACH_FRACTION",
    "AUTO_CONTROL_VARIATE_EPOCH",
    "CONTROL_VARIATE_GAIN",
    "MAX_MINIBATCHES",
    "NOISE_Z",
    "NOISE_MINIBATCHES",
    "DRIFT_NOISE_MINIBATCHES",
    "ARRIVAL_Z",
    "STAGE_IMPROVEMENT",
    "PRELIMINARY_MAP_ITERATIONS",
    "AUTO_MAP_ITERATIONS",
    "CENTRE_TOLERANCE",
    "SLOW_MIXING_FRACTION",
    "MIN_ADAPTATION_WARMUP",
    "MAX_DELTA_ENERGY",
    "JUMP_Z",
    "MIN_JUMP_STEPS",
    "approach_length",
]

#: Share of the warmup spent in the approach (optimisation) phase.
APPROACH_FRACTION = 0.25
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
#: gradient variance by more than 10 % (``auto_decide``); each stage stops early ...
AUTO_MAP_ITERATIONS = 80
#: ... once 10 full-data evaluations lower the potential by less than this fraction of the chains' average
#: excess over the minimum, ``T d / 2`` nats (the centre's offset then adds at most about this fraction to the
#: control variate's variance).
CENTRE_TOLERANCE = 0.05
#: Minibatches per measurement of the gradient noise (warmup only) for ``control_variate="auto"``'s ratios.
NOISE_MINIBATCHES = 8
#: Minibatches per measurement of the drift noise that caps the step size (``kernels/adapt/step_size.py``). The
#: cap reads the *largest* coordinate's variance: from 8 minibatches each coordinate's estimate has a relative sd
#: of ``sqrt(2 / 7)`` = 53 % at a point, and the maximum over coordinates of such estimates is biased upwards, so
#: the adapted step was a seventh too small on average and varied by a third between seeds (posteriordb's
#: earnings, 6 seeds: 0.025-0.055). 32 give 25 % (6 seeds: a fifth, and no step under 0.035), for 32
#: gradient evaluations per slow-phase probe (about 5 % of a warmup's).
DRIFT_NOISE_MINIBATCHES = 32
#: ``control_variate="auto"`` measures its ratios on a shared pool of minibatches, doubled from
#: ``NOISE_MINIBATCHES`` up to this many while a ratio is within ``NOISE_Z`` jackknife errors of its threshold ...
MAX_MINIBATCHES = 64
NOISE_Z = 2.0
#: ``control_variate="auto"`` measures a chain whose squared gradient, in units of ``T`` times its curvature,
#: exceeds ``d`` (its mean at the posterior, by integration by parts) by more than this many sds of a ``chi^2_d``
#: where it would arrive (:func:`~pyro_sgmcmc.kernels.auto_control_variate.auto_decide`).
ARRIVAL_Z = 4.0
#: ... and a stage of the MAP search goes on if it lowers the log ratio by more than this (10 %).
STAGE_IMPROVEMENT = math.log(0.9)
#: A warning is given when a chain's relaxation time (in steps) under its adapted step exceeds this fraction
#: of the adaptation phase (``WarmupDriver``, at the end of warmup).
SLOW_MIXING_FRACTION = 0.2


def approach_length(warmup_steps: int) -> int:
    """Steps of the approach phase for ``warmup_steps`` steps of warmup."""
    return int(APPROACH_FRACTION * warmup_steps)
