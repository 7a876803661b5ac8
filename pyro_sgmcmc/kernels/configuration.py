"""A kernel's configuration as JSON-able values: what changes the draws, for checkpoint fingerprints.

Numbers, strings, bools and ``None`` stay as they are; a tensor, or a dict of tensors (a
``control_variate`` centre), is a SHA-256 digest of its dtypes, shapes and bytes, so that two
different centres never share a fingerprint. A schedule is its class and its values (or its class
alone when it saves its own state; :mod:`pyro_sgmcmc.fingerprint.schedules`), never its ``repr``. A
library callable (Pyro's ``init_to_median``) is its qualified name, with the keywords of a
:func:`functools.partial` (``init_to_value(values=...)``) described in turn; a callable of the
user's code (a step-size function, an init strategy) is its qualified name and the SHA-256 of its
code and of the values it reads (:mod:`pyro_sgmcmc.fingerprint.content`); any other object, its
class and the SHA-256 of its content. Nothing is described by a memory address.
"""

from __future__ import annotations

import functools
import hashlib
import numbers
from types import FunctionType
from typing import Any, Mapping

import torch

from ..fingerprint import content_digest, describe_schedule
from ..fingerprint.libraries import is_library_file, is_library_module, module_of
from ..fingerprint.objects import qualified_name, tensor_bytes
from ..schedules import Schedule

__all__ = ["describe", "tensor_digest"]


def tensor_digest(values: Mapping[str, Any]) -> str:
    """SHA-256 of ``{name: tensor or number}``: names, dtypes, shapes and bytes, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(values):
        tensor = torch.as_tensor(values[name])
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.numel():
            digest.update(tensor_bytes(tensor))
    return digest.hexdigest()


def describe(value: Any, where: str = "the kernel's settings") -> Any:
    """A JSON-able, address-free description of ``value`` (module docstring); ``where`` names it in an error."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if torch.is_tensor(value):
        return {"tensor": tensor_digest({"": value})}
    if isinstance(value, Schedule):
        return describe_schedule(value, lambda attribute: describe(attribute, f"{where} (a schedule's attribute)"))
    if isinstance(value, Mapping):
        if all(torch.is_tensor(v) or isinstance(v, numbers.Number) for v in value.values()):
            return {"sha256": tensor_digest(value)}
        return {str(k): describe(v, f"{where}[{k!r}]") for k, v in sorted(value.items(), key=lambda item: str(item[0]))}
    if isinstance(value, (list, tuple)):
        return [describe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, functools.partial):
        keywords = {k: describe(v, f"{where}.keywords[{k!r}]") for k, v in sorted(value.keywords.items())}
        return {
            "function": describe(value.func, f"{where}.func"),
            "args": [describe(a, f"{where}.args[{i}]") for i, a in enumerate(value.args)],
            "keywords": keywords,
        }
    if _is_library_code(value):
        return qualified_name(value)
    kind = "function" if callable(value) and hasattr(value, "__qualname__") else "object"
    name = value.__qualname__ if kind == "function" else type(value).__qualname__  # no module: __main__ or not
    return {kind: name, "sha256": content_digest(value, where)}


def _is_library_code(value: Any) -> bool:
    """A library's function, class or builtin (known by its qualified name; see :mod:`.fingerprint.libraries`)."""
    if isinstance(value, FunctionType):
        return is_library_file(value.__code__.co_filename)
    if isinstance(value, type):
        return is_library_module(module_of(value.__module__))
    return callable(value) and not hasattr(value, "__dict__") and hasattr(value, "__qualname__")
