"""A step-size schedule in the fingerprint: its class, its code and its values, and whether it keeps state.

A :class:`~pyro_sgmcmc.Schedule` is described by its class's qualified name and, for a class of the
user's code, the SHA-256 of that code (:mod:`.content`); then by its instance attributes' values,
each by content, so that a schedule without a ``__repr__`` (whose default ``repr`` holds a memory
address) is the same in a new process. A schedule that offers ``state_dict()`` and
``load_state_dict(state)`` is described by class and code only: its values are state, saved with
the chains and given back to it on resume.

A schedule *keeps state* when calling it changes its attributes (a counter, a running average).
Without ``state_dict`` that state would not be checkpointed, and a resumed run would continue from
the schedule's initial state: :func:`check_schedule_state` refuses it, before the first step. It
calls a copy of the schedule at ``t = 0, 1, 2`` and compares its attributes' digests (the schedule
itself when it cannot be copied: it is then refused in any case).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List

from .content import content_digest
from .libraries import is_library_module, module_of
from .objects import instance_attributes, qualified_name

__all__ = ["PROBE_STEPS", "check_schedule_state", "describe_schedule", "offers_state"]

#: The step counters at which :func:`check_schedule_state` calls a copy of the schedule.
PROBE_STEPS = (0, 1, 2)


def offers_state(schedule: Any) -> bool:
    """Whether ``schedule`` saves and restores its own state (``state_dict`` and ``load_state_dict``)."""
    return callable(getattr(schedule, "state_dict", None)) and callable(getattr(schedule, "load_state_dict", None))


def describe_schedule(schedule: Any, describe: Callable[[Any], Any]) -> Dict[str, Any]:
    """``{"schedule": class, "code": sha256 (a user class), "attributes": {name: describe(value)}}``.

    ``describe`` turns each attribute's value into a JSON-able description (the kernel
    configuration's); a schedule with ``state_dict`` has ``"state": "saved with the chains"`` instead
    of its attributes.
    """
    cls = type(schedule)
    library = is_library_module(module_of(cls.__module__))
    out: Dict[str, Any] = {"schedule": qualified_name(cls) if library else cls.__qualname__}  # a script's: __main__
    if not library:
        out["code"] = content_digest(cls, f"the step-size schedule's class {cls.__qualname__}")
    if offers_state(schedule):
        out["state"] = "saved with the chains"
    else:
        attributes = instance_attributes(schedule) or {}
        out["attributes"] = {name: describe(value) for name, value in sorted(attributes.items())}
    return out


def check_schedule_state(schedule: Any, argument: str = "step_size") -> None:
    """Refuse a schedule that keeps state it cannot save (module docstring).

    Raises
    ------
    TypeError
        Naming the schedule's class and the attributes that its calls change.
    """
    if offers_state(schedule):
        return
    changed = _changed_by_calls(schedule)
    if changed:
        raise TypeError(
            f"{argument}: the schedule {qualified_name(type(schedule))} changes its attributes {changed} when it is "
            "called, so its state would not be checkpointed and a resumed run would not continue it: give it "
            "state_dict() and load_state_dict(state) methods (its state is then saved with the chains), make it "
            "keep no state (a function of the step counter t), or run without a checkpoint"
        )


def _changed_by_calls(schedule: Any) -> List[str]:
    """The attributes whose content differs after calls at :data:`PROBE_STEPS` (of a copy where possible)."""
    before = _attribute_digests(schedule)
    try:
        probe = copy.deepcopy(schedule)
    except Exception:  # noqa: BLE001 - an object that cannot be copied is probed itself
        probe = schedule
    for t in PROBE_STEPS:
        try:
            probe(t)
        except Exception:  # noqa: BLE001 - a schedule that fails here fails at that step, with its own error
            break
    after = _attribute_digests(probe)
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


def _attribute_digests(schedule: Any) -> Dict[str, str]:
    attributes = instance_attributes(schedule) or {}
    return {name: content_digest(value, f"the step-size schedule's {name!r}") for name, value in attributes.items()}
