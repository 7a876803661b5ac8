"""A step-size schedule's own state in the checkpoint, for a schedule that keeps state and can save it.

A schedule that offers ``state_dict()`` and ``load_state_dict(state)``
(:func:`~pyro_sgmcmc.fingerprint.schedules.offers_state`) has its state saved beside the chains', in the
record ``kernel/step_size_schedule``, and given back to it when the run resumes, so that the resumed
run continues it as an uninterrupted run would. A schedule that keeps state without offering them is
refused before the first step (:func:`~pyro_sgmcmc.fingerprint.check_schedule_state`).
"""

from __future__ import annotations

from ..fingerprint.schedules import offers_state
from ..kernels.base import SGMCMCKernel

__all__ = ["RECORD", "restore_schedule_state", "state_with_schedule"]

#: The key of the schedule's state in the kernel's saved state.
RECORD = "step_size_schedule"


def state_with_schedule(kernel: SGMCMCKernel) -> dict:
    """``kernel.state_dict()``, with the step-size schedule's ``state_dict()`` when it offers one."""
    state = kernel.state_dict()
    if offers_state(kernel.step_size):
        state[RECORD] = kernel.step_size.state_dict()
    return state


def restore_schedule_state(kernel: SGMCMCKernel, saved: dict) -> None:
    """Give the step-size schedule its saved state (``saved``: the kernel's saved state), if it has one."""
    if RECORD in saved:
        kernel.step_size.load_state_dict(saved[RECORD])
