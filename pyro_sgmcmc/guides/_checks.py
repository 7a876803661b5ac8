"""Argument checks shared by the guides: a ``ValueError``/``TypeError`` that names the argument."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Mapping, Tuple

import torch

__all__ = [
    "check_bool",
    "check_callable",
    "check_positive_int",
    "check_positive_real",
    "check_precision",
    "renamed_argument",
    "NOT_GIVEN",
]


def check_bool(value, name: str) -> bool:
    """``value`` must be ``True`` or ``False`` (a NumPy bool is accepted)."""
    if type(value).__name__ == "bool_" and type(value).__module__ == "numpy":
        return bool(value)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return value


def check_callable(value, name: str):
    if not callable(value):
        raise TypeError(f"{name} must be callable; got {value!r}")
    return value


def check_positive_int(value, name: str, low: int = 1) -> int:
    """A Python ``int`` (not ``bool``) ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int >= {low}; got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    return value


def check_positive_real(value, name: str, hint: str = "") -> float:
    """A positive finite real number as a ``float`` (``True`` and strings refused); ``hint`` ends the message."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive finite number; got {value!r}")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a positive finite number; got {value!r}{hint}")
    return number


def _check_one_precision(value, name: str, allow_tensor_shape: bool) -> None:
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or (value.dim() != 0 and not allow_tensor_shape):
            raise TypeError(f"{name} must be a positive finite number or a 0-d floating tensor; got {value!r}")
        if value.numel() == 0 or not (torch.isfinite(value).all() and (value > 0).all()):
            raise ValueError(f"{name} must be positive and finite; got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive finite number; got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be positive and finite; got {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be positive and finite; got {value!r}")


def check_precision(value, name: str = "prior_precision") -> None:
    """A positive finite number (or 0-d floating tensor), or ``{site: such a value}``.

    The values of a mapping may also be tensors of positive finite entries (one per coordinate of
    the site); their shape is checked against the site when they are used.
    """
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{name} must map site names (str) to precisions; got the key {key!r}")
            _check_one_precision(item, f"{name}[{key!r}]", allow_tensor_shape=True)
        return
    _check_one_precision(value, name, allow_tensor_shape=False)


class _NotGiven:
    """The default of a deprecated argument spelling: the caller did not pass it."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


#: Default of deprecated argument spellings (``None`` may be a value the caller passed).
NOT_GIVEN = _NotGiven()


def renamed_argument(old_name: str, old_value, new_name: str, new_value) -> Tuple[object, str]:
    """``(value, name)`` of an argument renamed from ``old_name`` to ``new_name`` (kept for one release).

    ``old_value`` is what the caller passed under the old spelling (:data:`NOT_GIVEN`: nothing).
    Passing it emits a ``FutureWarning`` naming the new spelling, and ``name`` is then the old
    spelling, so that a later check names the argument the caller wrote.
    """
    if old_value is NOT_GIVEN:
        return new_value, new_name
    warnings.warn(
        f"{old_name}= is deprecated and will be removed in the next release; use {new_name}= instead",
        FutureWarning,
        stacklevel=3,
    )
    return old_value, old_name
