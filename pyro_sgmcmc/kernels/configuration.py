"""A kernel's configuration as JSON-able values: what changes the draws, for checkpoint fingerprints.

Numbers, strings, bools and ``None`` stay as they are; a schedule is its ``repr``; a callable (an init strategy,
a step-size function) is its qualified name, with the keywords of a :func:`functools.partial` (Pyro's
``init_to_value(values=...)``) described in turn; a tensor, or a dict of tensors (a ``control_variate`` centre),
is a SHA-256 digest of its dtypes, shapes and bytes, so that two different centres never share a fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import numbers
from typing import Any, Mapping

import torch

from ..schedules import Schedule

__all__ = ["describe", "tensor_digest"]


def tensor_digest(values: Mapping[str, Any]) -> str:
    """SHA-256 of ``{name: tensor or number}``: names, dtypes, shapes and bytes, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(values):
        tensor = torch.as_tensor(values[name]).detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def describe(value: Any) -> Any:
    """A JSON-able, address-free description of ``value`` (module docstring)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if torch.is_tensor(value):
        return {"tensor": tensor_digest({"": value})}
    if isinstance(value, Schedule):
        return repr(value)
    if isinstance(value, Mapping):
        if all(torch.is_tensor(v) or isinstance(v, numbers.Number) for v in value.values()):
            return {"sha256": tensor_digest(value)}
        return {str(k): describe(v) for k, v in sorted(value.items(), key=lambda item: str(item[0]))}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, functools.partial):
        keywords = {k: describe(v) for k, v in sorted(value.keywords.items())}
        return {"function": describe(value.func), "args": [describe(a) for a in value.args], "keywords": keywords}
    if callable(value):
        module = getattr(value, "__module__", None) or type(value).__module__
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"{module}.{name}"
    return type(value).__name__
