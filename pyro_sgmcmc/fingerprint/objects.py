"""What an object is made of, for :mod:`.content`: its attributes, a repr without an address, the names its
code reads, and the qualified names by which library code is known."""

from __future__ import annotations

import dis
import functools
import re
from types import CodeType
from typing import Any, Dict, FrozenSet, Optional

import numpy as np
import torch

__all__ = [
    "tensor_bytes",
    "instance_attributes",
    "qualified_name",
    "global_names",
    "referenced_names",
    "short_repr",
    "stable_repr",
]

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def qualified_name(obj: Any) -> str:
    """``module.qualname`` of a function, class or builtin (its owner class's module for a method descriptor)."""
    module = getattr(obj, "__module__", None) or getattr(getattr(obj, "__objclass__", None), "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{name}" if isinstance(module, str) and module else str(name)


@functools.lru_cache(maxsize=1024)
def referenced_names(code: CodeType) -> FrozenSet[str]:
    """The global and attribute names ``code`` reads, its nested code's included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= referenced_names(constant)
    return frozenset(names)


@functools.lru_cache(maxsize=1024)
def global_names(code: CodeType) -> FrozenSet[str]:
    """The names ``code`` loads as globals (not its attribute names), its nested code's included."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= global_names(constant)
    return frozenset(names)


def instance_attributes(value: Any) -> Optional[Dict[str, Any]]:
    """An object's instance attributes (``__dict__`` and ``__slots__``); ``None`` if it has neither."""
    attributes: Optional[Dict[str, Any]] = None
    try:
        namespace = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        namespace = None
    if isinstance(namespace, dict):
        attributes = dict(namespace)
    for klass in type(value).__mro__:
        slots = vars(klass).get("__slots__")
        if slots is None:
            continue
        attributes = {} if attributes is None else attributes
        for slot in [slots] if isinstance(slots, str) else slots:
            if slot in ("__dict__", "__weakref__"):
                continue
            private = slot.startswith("__") and not slot.endswith("__")
            stored = f"_{klass.__name__.lstrip('_')}{slot}" if private else slot
            try:
                attributes[stored] = object.__getattribute__(value, stored)
            except AttributeError:  # an unset slot
                pass
    return attributes


def stable_repr(value: Any) -> Optional[str]:
    """``repr(value)`` when it holds no memory address (the same in every process), else ``None``."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails is no stable description
        return None
    return None if _ADDRESS.search(text) else text


def short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        return f"<{type(value).__qualname__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as bytes in row-major order (on the CPU; dense; conjugation and negation resolved)."""
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    flat = tensor.resolve_conj().resolve_neg().cpu().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # an expanded (stride 0) single element is "contiguous"
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.contiguous().view(torch.uint8).numpy()
