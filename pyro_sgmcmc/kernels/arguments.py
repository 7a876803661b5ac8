"""The kernels' shared keyword signature: argument checks and the deprecated spellings.

Every kernel takes ``model`` and ``step_size`` (by position or keyword) and everything else by keyword, with
Pyro's names (``adapt_step_size``, ``adapt_mass_matrix``, ``full_mass``, ``init_strategy``, ``jit_compile``) and
Pyro's ``init_*`` convention for starting values (``init_momentum``, ``init_thermostat``, ``init_to_centre``).
The spellings of the previous release (``initial_momentum``, ``initial_thermostat``, ``start_at_centre``, and
the arguments after ``step_size`` by position) keep working for one release with a :class:`FutureWarning`
naming the new spelling (:func:`resolve_legacy_arguments`).
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from ..schedules import Constant, Cyclical

__all__ = [
    "RENAMED_ARGUMENTS",
    "NUTS_ONLY_ARGUMENTS",
    "reject_nuts_arguments",
    "resolve_legacy_arguments",
    "respelled",
    "kernel_signature",
    "keyword_names",
    "renamed_attribute",
    "as_real",
    "non_negative",
    "positive",
    "choice",
    "flag",
    "positive_int",
    "check_adaptation",
    "check_control_variate",
    "check_init_to_centre",
]

#: Old spelling -> new spelling (deprecated in this release, removed in the next).
RENAMED_ARGUMENTS = {
    "initial_momentum": "init_momentum",
    "initial_thermostat": "init_thermostat",
    "start_at_centre": "init_to_centre",
}

#: Arguments of Pyro's HMC/NUTS that have no meaning here, and why.
NUTS_ONLY_ARGUMENTS = {
    "target_accept_prob": (
        "there is no Metropolis acceptance step. With adapt_step_size=True (the default) the warmup sets each "
        "chain's step from the curvature and the minibatch gradient noise (docs/preconditioning.rst); pass "
        "step_size= with adapt_step_size=False for a fixed step."
    ),
    "max_tree_depth": "there are no trajectories to build: every step is one gradient evaluation.",
    "trajectory_length": "there are no trajectories to build: every step is one gradient evaluation.",
    "num_steps": "there are no trajectories to build: every step is one gradient evaluation.",
}


def reject_nuts_arguments(kernel_name: str, kwargs: Mapping[str, Any]) -> None:
    """A clear ``TypeError`` for an argument of Pyro's HMC/NUTS instead of Python's bare one."""
    for name, reason in NUTS_ONLY_ARGUMENTS.items():
        if name in kwargs:
            raise TypeError(f"{kernel_name}: {name} is an argument of Pyro's HMC/NUTS, not of SG-MCMC: {reason}")


def resolve_legacy_arguments(
    kernel_name: str,
    positional: Sequence[Any],
    positional_names: Sequence[str],
    keywords: Dict[str, Any],
    explicit: Dict[str, Any],
) -> List[str]:
    """Move the previous release's spellings to the new ones, with one :class:`FutureWarning`.

    ``positional`` are the arguments given by position after ``step_size`` (the previous release's order was
    ``positional_names``); ``keywords`` the keyword arguments the shared signature does not name (the kernel's
    own, and old names); ``explicit`` the shared keyword arguments. Each value moves to its new name, in
    ``explicit`` if the shared signature has it, else in ``keywords`` (both updated in place); a value given
    twice is a ``TypeError``, as in Python. Returns the old names used (error messages keep them).
    """
    if len(positional) > len(positional_names):
        raise TypeError(
            f"{kernel_name}() takes 2 positional arguments (model, step_size) but {2 + len(positional)} were given"
        )
    by_position = list(zip(positional_names, positional))
    old_names = [name for name in keywords if name in RENAMED_ARGUMENTS]
    by_old_name = [(name, keywords.pop(name)) for name in old_names]
    if not by_position and not by_old_name:
        return []
    moved = set()
    for name, value in by_position + by_old_name:
        new = RENAMED_ARGUMENTS.get(name, name)
        if new in keywords or new in moved:
            raise TypeError(f"{kernel_name}() got multiple values for argument {new!r}")
        (explicit if new in explicit else keywords)[new] = value
        moved.add(new)
    parts = []
    if by_position:
        names = [RENAMED_ARGUMENTS.get(name, name) for name, _ in by_position]
        parts.append(f"passing {', '.join(names)} by position (pass {', '.join(n + '=' for n in names)} by keyword)")
    if by_old_name:
        parts.append(", ".join(f"{name}= (now {RENAMED_ARGUMENTS[name]}=)" for name in old_names))
    warnings.warn(
        f"{kernel_name}: {' and '.join(parts)} is deprecated and stops working in the next release",
        FutureWarning,
        stacklevel=3,
    )
    return [name for name, _ in by_position + by_old_name if name in RENAMED_ARGUMENTS]


def respelled(error: Exception, old_names: Sequence[str]) -> Exception:
    """``error`` with each new argument name in its message written as the old one the caller used."""
    message = str(error)
    for old in old_names:
        message = re.sub(rf"\b{RENAMED_ARGUMENTS[old]}\b", old, message)
    return type(error)(message)


def renamed_attribute(old: str, new: str) -> property:
    """A read-only attribute ``old`` that gives ``new``'s value with a :class:`FutureWarning`."""

    def read(kernel):
        warnings.warn(f"{old} is deprecated: read {new}", FutureWarning, stacklevel=2)
        return getattr(kernel, new)

    return property(read, doc=f"Deprecated spelling of ``{new}``.")


def keyword_names(function) -> Tuple[str, ...]:
    """The keyword-only parameters of ``function`` (a kernel's ``configure_dynamics``)."""
    parameters = inspect.signature(function).parameters.values()
    return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def kernel_signature(init, dynamics) -> inspect.Signature:
    """The signature a kernel class shows: ``init``'s parameters without its catch-alls (the deprecated
    positional arguments and the kernel's own keywords), followed by ``dynamics``'s keyword-only parameters."""
    shared = [
        p
        for p in inspect.signature(init).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) and p.name != "self"
    ]
    own = [p for p in inspect.signature(dynamics).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return inspect.Signature(shared + own)


# ---------------------------------------------------------------------------- value checks
def as_real(value, name: str) -> float:
    """``float(value)`` for a real number (bools, strings, arrays refused); huge ints become inf."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def non_negative(value, name: str, meaning: str) -> float:
    """A finite float ``>= 0``, or a ``ValueError`` naming ``name`` and its ``meaning``."""
    real = as_real(value, name)
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"{name} must be a finite float >= 0 ({meaning}); got {value!r}")
    return real


def positive(value, name: str) -> float:
    """A finite float ``> 0``, or a ``ValueError`` naming ``name``."""
    real = as_real(value, name)
    if not math.isfinite(real) or real <= 0:
        raise ValueError(f"{name} must be a finite float > 0; got {value!r}")
    return real


def choice(value, name: str, accepted: Iterable[str]) -> str:
    """One of the ``accepted`` strings, or a ``ValueError`` listing them."""
    accepted = tuple(accepted)
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"{name} must be one of {accepted}; got {value!r}")
    return value


def flag(value, name: str) -> bool:
    """``True`` or ``False`` (not 0, 1 or None), or a ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return value


def positive_int(value, name: str, minimum: int = 1) -> int:
    """An ``int >= minimum`` (bools refused), or a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be a {kind} integer; got {value!r}")
    return value


def check_adaptation(step_size, adapt_step_size, adapt_mass_matrix, full_mass) -> Tuple[bool, bool, Any]:
    """The adaptation flags, checked together with the step size they adapt."""
    flag(adapt_step_size, "adapt_step_size")
    flag(adapt_mass_matrix, "adapt_mass_matrix")
    if full_mass is not None and not isinstance(full_mass, bool):
        raise TypeError(f"full_mass must be None (dense for dim <= 64), True or False; got {full_mass!r}")
    if full_mass and not adapt_mass_matrix:
        raise ValueError("full_mass=True needs adapt_mass_matrix=True (the dense mass matrix is adapted in warmup)")
    if adapt_step_size and step_size is not None and not isinstance(step_size, (numbers.Real, Constant, Cyclical)):
        raise ValueError(
            "a step-size schedule cannot be adapted: pass adapt_step_size=False with a schedule or callable "
            f"step_size, or a float (the initial step size) with adapt_step_size=True; got {step_size!r}"
        )
    return adapt_step_size, adapt_mass_matrix, full_mass


def check_control_variate(control_variate):
    """``"auto"``, ``None``, ``"map"`` or a dict ``{site: constrained value}``."""
    if control_variate is not None and not isinstance(control_variate, (str, Mapping)):
        raise TypeError(
            "control_variate must be 'auto', None, 'map' or a dict {site: constrained value}; "
            f"got {type(control_variate).__name__}"
        )
    if isinstance(control_variate, str) and control_variate not in ("auto", "map"):
        raise ValueError(f"control_variate must be 'auto', None, 'map' or a dict; got {control_variate!r}")
    return control_variate


def check_gradient_estimator(factory, control_variate) -> Optional[Callable]:
    """``gradient_estimator``: None, or a callable ``potential -> estimator`` (``kernels/gradients.py``); it replaces
    the control variate, so it cannot be combined with ``control_variate="map"`` or a dict."""
    if factory is None:
        return None
    if not callable(factory):
        raise TypeError(
            "gradient_estimator must be None or a callable taking the model's potential (a ModelPotential) and "
            f"returning an estimator (positions, indices) -> (U, grad U); got {type(factory).__name__}"
        )
    if control_variate not in (None, "auto"):
        shown = repr(control_variate) if isinstance(control_variate, str) else "a dict"
        raise ValueError(
            f"gradient_estimator replaces the control variate: pass control_variate=None with it, not {shown} "
            "(a ControlVariate can be built inside gradient_estimator)"
        )
    return factory


def mean_value(values) -> float:
    """The mean of a tensor as a float (one chain: its value, without a reduction); a number as it is."""
    if not torch.is_tensor(values):
        return float(values)
    return float(values) if values.numel() == 1 else float(values.mean())


def check_init_to_centre(value, control_variate) -> bool:
    """``init_to_centre`` needs a centre known before the chains start (``"map"`` or a dict)."""
    flag(value, "init_to_centre")
    if value and (control_variate is None or control_variate == "auto"):
        raise ValueError(
            "init_to_centre=True needs control_variate='map' or a dict (the centre is where the chains start)"
        )
    return value


#: ``init_momentum`` of SGHMC and SGNHT: at rest, or drawn from the stationary momentum.
INIT_MOMENTA = ("zero", "stationary")
