"""The adaptations' states in a checkpoint: each named tuple's fields under their own names, tensors on the CPU.

The keys are those of the classes the states replaced (format unchanged): ``"approach"`` holds ``steps``,
``previous_sign``, ``rejections``; ``"jumps"`` the sums of squares and counts (not ``start``, ``end`` and
``running_start``, which the warmup's length gives); ``"adaptation"`` the metric's and the step size's fields and
``num_extra_evaluations``.

Examples
--------
>>> import torch
>>> from .jumps import jumps_init
>>> saved = fields_of(jumps_init(10, 2, "cpu"), skip=("start", "end", "running_start"))
>>> sorted(saved), restore(jumps_init(10, 2, "cpu"), saved, "cpu").count
(['count', 'running_count', 'running_sum_squares', 'sum_squares'], 0)
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

from .windows import WindowedState

__all__ = ["fields_of", "restore", "adaptation_fields", "restore_adaptation"]


def _cpu(value):
    """A tensor copied to the CPU (a saved state never aliases the live one); anything else as it is."""
    return value.cpu().clone() if torch.is_tensor(value) else value


def _on(value, device):
    return value.to(device) if torch.is_tensor(value) else value


def fields_of(state: NamedTuple, skip: Iterable[str] = ()) -> dict:
    """``{field: value}`` of ``state`` but ``skip``, tensors copied to the CPU."""
    return {name: _cpu(value) for name, value in state.as_dict().items() if name not in skip}


def restore(state: NamedTuple, saved: dict, device) -> NamedTuple:
    """``state`` with the fields in ``saved`` (:func:`fields_of`) restored onto ``device``."""
    return state.replace(**{name: _on(saved[name], device) for name in state.as_dict() if name in saved})


def adaptation_fields(state: WindowedState) -> dict:
    """The windowed adaptation's fields, flat: the metric's, the step size's and ``num_extra_evaluations``."""
    return {
        **fields_of(state.metric),
        **fields_of(state.step),
        "num_extra_evaluations": state.num_extra_evaluations,
    }


def restore_adaptation(state: WindowedState, saved: dict, device) -> WindowedState:
    """:func:`adaptation_fields` back into ``state`` (every field must be in ``saved``)."""
    missing = [n for n in (*state.metric.as_dict(), *state.step.as_dict()) if n not in saved]
    if missing:
        raise KeyError(f"the saved adaptation lacks {missing}")
    return WindowedState(
        restore(state.metric, saved, device),
        restore(state.step, saved, device),
        saved["num_extra_evaluations"],
    )
