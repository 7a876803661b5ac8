"""The jump thresholds of the divergence check, from the step-to-step changes of each chain's minibatch potential.

A step diverges when its minibatch potential jumps up by more than

.. math:: \\Delta_{max} = \\texttt{max\\_delta\\_energy} + Z_{jump}\\, s_c, \\qquad
          s_c = \\sqrt{\\tfrac{1}{n} \\textstyle\\sum_t (\\hat U_{t} - \\hat U_{t-1})^2},

the root-mean-square over chain ``c``'s warmup steps, once at least :data:`MIN_JUMP_STEPS` steps are measured
(see :mod:`~pyro_sgmcmc.kernels.warmup`). The sampling phase's threshold is measured over the second half of
warmup. The adaptation's is a running one, measured from ``running_start`` on: the second half of the approach,
where the chains have come to rest and the changes are the minibatch noise. The approach's first steps descend
from the starting point, by changes that say nothing of that noise (from a far start, :math:`10^4` and more):
counted, they would raise the threshold past the blow-up it is there to catch.

Examples
--------
>>> import torch
>>> state = jumps_init(40, 1, "cpu")
>>> for step in range(1, 41):
...     state = jumps_update(state, step, torch.tensor([2.0]))
>>> jumps_final(state), running_threshold(state)
(tensor([1020.], dtype=torch.float64), tensor([1020.], dtype=torch.float64))
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import Adaptation

__all__ = [
    "MAX_DELTA_ENERGY",
    "JUMP_Z",
    "MIN_JUMP_STEPS",
    "JumpState",
    "jumps_init",
    "jumps_update",
    "jumps_final",
    "running_threshold",
    "jump_thresholds",
]

#: The absolute part of the jump threshold (Pyro's NUTS ``max_delta_energy``).
MAX_DELTA_ENERGY = 1000.0
#: The jump threshold's multiple of the RMS step-to-step change of the minibatch potential.
JUMP_Z = 10.0
#: Fewest warmup steps from which the jump threshold is measured; below, only non-finite steps diverge.
MIN_JUMP_STEPS = 20


class JumpState(NamedTuple):
    """The sums of squared step-to-step changes (module docstring).

    Attributes
    ----------
    start, end : int
        The second half of warmup: steps ``start < t <= end`` count for the sampling phase's threshold.
    running_start : int
        Steps ``t > running_start`` count for the running threshold.
    sum_squares : Tensor ``(C,)`` float64
        Over the second half of warmup, and ``count`` its steps.
    running_sum_squares : Tensor ``(C,)`` float64
        Over the steps after ``running_start``, and ``running_count`` their number.
    """

    start: int
    end: int
    sum_squares: torch.Tensor
    count: int
    running_sum_squares: torch.Tensor
    running_count: int
    running_start: int = 0

    def replace(self, **changes) -> "JumpState":
        """A copy with the named fields replaced (the others shared, not copied)."""
        return self._replace(**changes)

    def as_dict(self) -> dict:
        """``{field: value}`` in field order."""
        return dict(zip(self._fields, self))


def jumps_init(warmup_steps: int, num_chains: int, device, running_start: int = 0) -> JumpState:
    """No change recorded yet, for a warmup of ``warmup_steps`` steps whose running threshold counts the steps after
    ``running_start``."""
    zeros = torch.zeros(num_chains, dtype=torch.float64, device=device)
    return JumpState(warmup_steps - warmup_steps // 2, warmup_steps, zeros, 0, zeros.clone(), 0, running_start)


def jumps_update(state: JumpState, step: int, jump: torch.Tensor) -> JumpState:
    """Record the change ``jump`` ``(C,)`` into state ``step`` (1-based count of steps taken); a non-finite change
    counts as zero."""
    jump = jump.to(torch.float64)
    square = torch.where(torch.isfinite(jump), jump * jump, torch.zeros_like(jump))
    running = state
    if step > state.running_start:
        running = state.replace(
            running_sum_squares=state.running_sum_squares + square, running_count=state.running_count + 1
        )
    if state.start < step <= state.end:
        return running.replace(sum_squares=state.sum_squares + square, count=state.count + 1)
    return running


def _threshold(sum_squares: torch.Tensor, count: int, max_delta_energy: float) -> Optional[torch.Tensor]:
    if count < MIN_JUMP_STEPS:
        return None
    return max_delta_energy + JUMP_Z * (sum_squares / count).sqrt()


def running_threshold(state: JumpState, max_delta_energy: float = MAX_DELTA_ENERGY) -> Optional[torch.Tensor]:
    """``(C,)`` thresholds from the steps recorded after ``running_start``, or ``None`` before :data:`MIN_JUMP_STEPS`
    of them."""
    return _threshold(state.running_sum_squares, state.running_count, max_delta_energy)


def jumps_final(state: JumpState, max_delta_energy: float = MAX_DELTA_ENERGY) -> Optional[torch.Tensor]:
    """``(C,)`` thresholds of the sampling phase, or ``None`` when too few steps were measured."""
    return _threshold(state.sum_squares, state.count, max_delta_energy)


#: The jump thresholds as ``(init, update, final)``.
jump_thresholds = Adaptation(jumps_init, jumps_update, jumps_final)
