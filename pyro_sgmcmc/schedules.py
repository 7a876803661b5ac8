"""Step-size schedules.

A schedule maps the chain's step counter ``t = 0, 1, 2, ...`` (warmup steps included)
to the step size :math:`\\epsilon_t` that multiplies the normalised drift
:math:`N^{-1} \\nabla \\log \\pi`. Schedules are small, picklable objects so that a
kernel, its state and its checkpoint can be serialised.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Union

__all__ = ["Schedule", "Constant", "RobbinsMonro", "make_schedule", "as_schedule"]


class Schedule:
    """Base class: a callable ``t -> step size`` with ``t`` the chain's step counter."""

    def __call__(self, t: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def validate(self, argument: str = "step_size") -> None:
        """Check that the first step size is positive and finite (callable schedules check every step)."""
        value = self(0)
        if not _is_positive_finite(value):
            raise ValueError(f"{argument} schedule gives step size {value!r} at t = 0; it must be positive and finite")


class Constant(Schedule):
    """Constant step size :math:`\\epsilon_t = \\epsilon`.

    With a constant step size the stationary distribution of an SG-MCMC chain is biased
    by :math:`O(\\epsilon)` (discretisation and gradient noise).

    Parameters
    ----------
    value : float
        The step size; positive and finite.
    """

    def __init__(self, value: float) -> None:
        if not _is_positive_finite(value):
            raise ValueError(f"step_size must be a positive, finite float; got {value!r}")
        self.value = float(value)

    def __call__(self, t: int) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class RobbinsMonro(Schedule):
    """Decaying step size :math:`\\epsilon_t = a (b + t)^{-\\gamma}`.

    For :math:`\\gamma \\in (0.5, 1]` the step sizes satisfy the Robbins-Monro conditions
    :math:`\\sum_t \\epsilon_t = \\infty`, :math:`\\sum_t \\epsilon_t^2 < \\infty`, under which
    the SGLD bias vanishes as :math:`t \\to \\infty` (Welling and Teh, 2011).

    Parameters
    ----------
    a : float
        Scale, positive.
    b : float
        Offset, positive (so that :math:`b + t > 0` from ``t = 0``).
    gamma : float
        Decay exponent in ``(0.5, 1]``.
    """

    def __init__(self, a: float, b: float = 1.0, gamma: float = 0.55) -> None:
        if not _is_positive_finite(a):
            raise ValueError(f"RobbinsMonro: a must be positive and finite; got {a!r}")
        if not _is_positive_finite(b):
            raise ValueError(f"RobbinsMonro: b must be positive and finite; got {b!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0.5 < gamma <= 1.0:
            raise ValueError(f"RobbinsMonro: gamma must be in (0.5, 1]; got {gamma!r}")
        self.a, self.b, self.gamma = float(a), float(b), float(gamma)

    def __call__(self, t: int) -> float:
        return self.a * (self.b + t) ** (-self.gamma)

    def __repr__(self) -> str:
        return f"RobbinsMonro(a={self.a!r}, b={self.b!r}, gamma={self.gamma!r})"


class _CallableSchedule(Schedule):
    def __init__(self, fn: Callable[[int], float]) -> None:
        self.fn = fn

    def __call__(self, t: int) -> float:
        value = self.fn(t)
        try:
            real = float(value)
        except (TypeError, ValueError, OverflowError):
            real = math.nan
        if isinstance(value, bool) or not (math.isfinite(real) and real > 0):
            raise ValueError(f"step_size schedule gives step size {value!r} at t = {t}; it must be positive and finite")
        return real

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"CallableSchedule({getattr(self.fn, '__module__', '')}.{name})"


_NAMED = {"constant": Constant, "robbins_monro": RobbinsMonro}


def make_schedule(name: str, **kwargs) -> Schedule:
    """Build a schedule by name: ``"constant"`` (``value=``) or ``"robbins_monro"`` (``a=, b=, gamma=``)."""
    if not isinstance(name, str) or name not in _NAMED:
        raise ValueError(f"unknown step-size schedule {name!r}; accepted: {sorted(_NAMED)}")
    return _NAMED[name](**kwargs)


def as_schedule(step_size: Union[float, Schedule, Callable[[int], float]], argument: str = "step_size") -> Schedule:
    """Turn a float, a :class:`Schedule` or a callable ``t -> float`` into a validated schedule."""
    if isinstance(step_size, Schedule):
        schedule = step_size
    elif isinstance(step_size, bool) or isinstance(step_size, str):
        raise ValueError(
            f"{argument} must be a positive float, a Schedule (Constant, RobbinsMonro) or a callable t -> float; "
            f"got {step_size!r}"
            + (" (use make_schedule(name, ...) for named schedules)" if isinstance(step_size, str) else "")
        )
    elif isinstance(step_size, numbers.Real):
        if not _is_positive_finite(step_size):
            raise ValueError(f"{argument} must be positive and finite; got {step_size!r}")
        return Constant(step_size)
    elif callable(step_size):
        schedule = _CallableSchedule(step_size)
    else:
        raise ValueError(
            f"{argument} must be a positive float, a Schedule (Constant, RobbinsMonro) or a callable t -> float; "
            f"got {type(step_size).__name__}"
        )
    schedule.validate(argument)
    return schedule


def _is_positive_finite(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        real = float(value)
    except OverflowError:  # an int beyond the float range
        return False
    return math.isfinite(real) and real > 0
