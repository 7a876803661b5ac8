"""The model's part of a run's fingerprint: its code, and each of its arguments by value.

:func:`model_fingerprint` gives ``{component: description}``, one entry per thing a mismatch should
name:

* ``"argument 'x'"`` for each argument, named by the model's signature (a positional argument that
  it does not name is ``"argument 0"``); a dict, list or tuple argument is listed entry by entry,
  ``"argument 'data[\\"x\\"]'"``, level by level while the listing stays within
  :data:`MAX_LISTED` entries (a larger container is one entry). Each entry is readable: a short
  number or string is its ``repr``, a tensor or array its dtype, shape and SHA-256, anything else
  its type and the SHA-256 of its content (:mod:`.content`);
* ``"the model"``: the model itself (a function is its name; a callable object, such as a
  ``PyroModule``, its attributes by value);
* ``"the model's code: <function>"`` for each user function that the model or its arguments reach
  (the functions it calls, through globals, closures, classes and user modules): the SHA-256 of
  its own code and of the constants and globals it reads. A changed prior scale written as a
  constant changes the entry of the function that holds it. Beyond :data:`MAX_LISTED` functions the
  rest share one entry.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import torch

from .content import ContentHasher

__all__ = ["MAX_LISTED", "model_fingerprint"]

#: The most arguments' entries listed one by one (and, separately, the most functions).
MAX_LISTED = 64

_SHORT = 60  # the longest repr written as is


def model_fingerprint(model: Callable, args: tuple, kwargs: dict) -> Dict[str, str]:
    """``{component: description}`` of the model's code and arguments (module docstring).

    Raises
    ------
    Unfingerprintable
        A ``TypeError`` naming the argument (or the function and global) whose content cannot be read.
    """
    hasher = ContentHasher()
    listed = _listed(model, args, kwargs)
    entries = {f"argument {name}": _describe(hasher, value, f"argument {name}") for name, value in listed}
    entries["the model"] = _describe(hasher, model, "the model")
    units = list(hasher.units.items())
    for name, digest in units[: MAX_LISTED - 1] if len(units) > MAX_LISTED else units:
        entries[f"the model's code: {name}"] = digest
    if len(units) > MAX_LISTED:
        rest = hashlib.sha256("|".join(f"{n}={d}" for n, d in sorted(units[MAX_LISTED - 1 :])).encode())
        entries[f"the model's code: {len(units) - MAX_LISTED + 1} more functions"] = rest.hexdigest()
    return entries


def _named_arguments(model: Callable, args: tuple, kwargs: dict) -> List[Tuple[str, Any]]:
    """``(name, value)`` per argument: the model's parameter names (a module's ``forward``'s) where they bind."""
    called = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        parameters = inspect.signature(called).parameters
        bound = inspect.signature(called).bind(*args, **kwargs)
    except (TypeError, ValueError):  # no signature, or one the arguments do not fit: positions and keywords
        return [(str(i), value) for i, value in enumerate(args)] + [(repr(k), v) for k, v in kwargs.items()]
    named = []
    for name, value in bound.arguments.items():
        kind = parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            named += [(f"'{name}[{i}]'", item) for i, item in enumerate(value)]
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named += [(repr(key), item) for key, item in value.items()]
        else:
            named.append((repr(name), value))
    return named


def _listed(model: Callable, args: tuple, kwargs: dict) -> List[Tuple[str, Any]]:
    """The arguments, their plain containers opened level by level while at most ``MAX_LISTED`` are listed."""
    listed = _named_arguments(model, args, kwargs)
    opened = True
    while opened:
        opened, level = False, []
        for index, (name, value) in enumerate(listed):
            room = MAX_LISTED - len(level) - (len(listed) - index - 1)
            children = _children(name, value) if type(value) in (dict, list, tuple) and len(value) <= room else []
            if children:
                level += children
                opened = True
            else:
                level.append((name, value))
        listed = level
    return listed


def _children(name: str, value: Any) -> List[Tuple[str, Any]]:
    """The entries of a dict, list or tuple argument, named ``name["key"]`` / ``name[0]``."""
    quoted = name.startswith("'") and name.endswith("'")
    stem = name[1:-1] if quoted else name
    if type(value) is dict and all(isinstance(k, (str, int)) for k in value):
        items = [(f"{stem}[{json.dumps(k)}]", v) for k, v in value.items()]
    elif type(value) in (list, tuple):
        items = [(f"{stem}[{i}]", v) for i, v in enumerate(value)]
    else:
        return []
    return [(f"'{n}'" if quoted else n, v) for n, v in items]


def _describe(hasher: ContentHasher, value: Any, where: str) -> str:
    """A readable entry: a short plain value as is, a tensor or array by dtype, shape and SHA-256, else its type
    and SHA-256."""
    if value is None or type(value) in (bool, int, float, str):
        text = repr(value)
        if len(text) <= _SHORT:
            return text
    digest = hasher.digest(value, where)
    if isinstance(value, torch.Tensor):
        return f"tensor {value.dtype} {tuple(value.shape)} sha256 {digest}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {value.shape} sha256 {digest}"
    return f"{type(value).__qualname__} sha256 {digest}"
