"""Data passed as a list, a string or a NumPy array: name the argument when it breaks the model.

A subsampled plate indexes the data with a tensor of indices, ``x[idx]``, which a torch tensor
supports and a Python list, tuple or string does not (a NumPy array is indexed, but its rows then
meet tensors in arithmetic that fails, or silently leaves autograd). The failure is torch's or
Python's, raised deep inside the user's model, and does not say which argument is at fault.

Nothing is refused up front: a model may take a string (a flag) or a list (layer sizes) that it
does not index. Only when the model's first runs fail (its trace, or its first log-density and
gradient: a NumPy array passes the trace and fails there) are its arguments examined
(:func:`naming_non_tensor_data`), and :func:`data_type_error` names the one at fault:

* a list, tuple or NumPy array of numbers is at fault when the model, run again with it as
  ``torch.as_tensor(value)``, runs: the diagnosis is then certain;
* a string cannot be made a tensor; if no list or array explains the failure, a string argument is
  named as the likely cause (the message says so and keeps the original error).

The model's own error stays attached as the ``ModelError``'s ``__cause__`` (``raise ... from``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np
import torch

from .checks import parameter_names
from .trace import ModelError

__all__ = ["data_type_error", "naming_non_tensor_data"]


def _labelled(args: tuple, kwargs: dict, names: List[str]) -> List[Tuple[str, Optional[int], Optional[str], object]]:
    """``(label, position, keyword, value)`` of each argument, labelled ``argument 1 ('y')`` or ``argument 'y'``."""
    positional = [
        (f"argument {i}" + (f" ({names[i]!r})" if i < len(names) else ""), i, None, value)
        for i, value in enumerate(args)
    ]
    return positional + [(f"argument {key!r}", None, key, value) for key, value in kwargs.items()]


def _as_tensor(value) -> Optional[torch.Tensor]:
    """``torch.as_tensor(value)`` for a list, tuple or array of numbers; ``None`` for anything else."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        return None
    if (value.size if isinstance(value, np.ndarray) else len(value)) == 0:
        return None
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):  # strings, ragged lists, lists of tensors, objects
        return None


def _kind(value) -> str:
    return "a NumPy array" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"


def _runs(rerun: Callable[[tuple, dict], object], args: tuple, kwargs: dict, converted: dict) -> bool:
    """Does the model run with the arguments in ``converted`` (``{position or keyword: tensor}``) replaced?"""
    args = tuple(converted.get(i, value) for i, value in enumerate(args))
    kwargs = {key: converted.get(key, value) for key, value in kwargs.items()}
    try:
        rerun(args, kwargs)
    except Exception:  # noqa: BLE001 - any failure: these conversions do not explain it
        return False
    return True


def data_type_error(
    model: Callable, args: tuple, kwargs: dict, error: Exception, rerun: Callable[[tuple, dict], object]
) -> Optional[ModelError]:
    """The ``ModelError`` that names the non-tensor argument behind ``error``, or ``None`` if none is.

    If the model runs on the arguments as given (``rerun`` sets up and evaluates it as the potential
    does, but the failure came from elsewhere, e.g. ``initial_params``), none is named. Otherwise the
    lists, tuples and arrays of numbers are all made tensors; if the model then runs, each is given
    back in turn and stays a tensor only if the model needs it to be (at most ``k + 2`` runs for ``k``
    such arguments, on this failure path only), so a list of layer sizes beside list data is not named.

    Parameters
    ----------
    model : callable
        The model (for its parameter names).
    args, kwargs :
        The arguments of the run that failed.
    error : Exception
        What the model's first run raised.
    rerun : callable
        ``rerun(args, kwargs)`` runs the model again, raising if it fails.
    """
    if _runs(rerun, args, kwargs, {}):  # the arguments as given run: the failure is not theirs
        return None
    labelled = _labelled(args, kwargs, parameter_names(model))
    failure = f"{type(error).__name__}: {error}".splitlines()[0]
    converted = {}
    for _, position, keyword, value in labelled:
        tensor = _as_tensor(value)
        if tensor is not None:
            converted[keyword if position is None else position] = tensor
    if not (converted and _runs(rerun, args, kwargs, converted)):
        converted = {}
    for key in list(converted):  # give each back: is it needed as a tensor?
        needed = converted.pop(key)
        if not converted or not _runs(rerun, args, kwargs, converted):  # none converted: fails (above)
            converted[key] = needed
    if converted:
        named = "; ".join(
            f"{label} is {_kind(value)}" for label, position, keyword, value in labelled
            if (keyword if position is None else position) in converted
        )  # fmt: skip
        them = "it" if len(converted) == 1 else "them"
        return ModelError(
            f"the data must be torch tensors: {named}. The model fails with {them} as given ({failure}) and runs "
            f"with torch.as_tensor(...) of {them}. A subsampled plate indexes the data with a tensor of indices: "
            "pass tensors, e.g. torch.as_tensor(x, dtype=torch.float32) (the chains run on the data's device)"
        )
    strings = [label for label, _, _, value in labelled if isinstance(value, str)]
    if strings:
        return ModelError(
            f"the model fails at set-up ({failure}) and {', '.join(strings)} "
            f"{'is a str' if len(strings) == 1 else 'are strs'}, not a torch.Tensor: if it holds data, pass a "
            "tensor of the numbers (e.g. torch.as_tensor of the parsed values), which a subsampled plate can "
            "index; a string the model only reads as a flag is fine, and the error is then elsewhere"
        )
    return None


@contextmanager
def naming_non_tensor_data(
    model: Callable, args: tuple, kwargs: dict, rerun: Callable[[tuple, dict], object]
) -> Iterator[None]:
    """Turn an error of the model's first run into a ``ModelError`` naming a non-tensor argument at fault
    (:func:`data_type_error`, the error chained); any other error passes unchanged, a ``ModelError`` too."""
    try:
        yield
    except ModelError:
        raise
    except Exception as error:
        named = data_type_error(model, args, kwargs, error, rerun)
        if named is None:
            raise
        raise named from error
