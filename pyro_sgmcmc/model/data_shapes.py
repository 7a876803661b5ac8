"""Data that disagree with their plates: an observation that widens its site, an argument too short.

Two failures of a subsampled model that were silent or unnamed, checked once at set-up.

**An observed value that widens its site** (:func:`check_observed_batch_shapes`). Inside the plates
around it, a site's distribution has a batch shape :math:`b` that holds every plate's subsample size
at the plate's dim (Pyro broadcasts the distribution to it). The log-density of an observed value
:math:`y` has the broadcast shape of :math:`b` and of :math:`y`'s batch shape (``y.shape`` less the
event shape). If :math:`y` has more batch dimensions than :math:`b` and their sizes multiply to more
than 1, each log-density term is repeated across them: ``y`` of shape ``(B, 1)`` under a ``Normal``
with :math:`b = (B,)` broadcasts to ``(B, B)`` terms, every :math:`y_i` scored under every
:math:`\\mu_j`, all scaled by :math:`N / B`, and the posterior is silently wrong. Inside a subsampled
plate this is a :class:`ModelError` naming the site, its plates and both shapes. A value broadcast
over a dimension the distribution has (size 1 there), an event shape (``.to_event``) and nested
plates are accepted: the rule refuses only batch dimensions that no plate and no distribution has.

**An argument shorter than the plate that indexes it** (:func:`naming_short_data`,
:func:`probe_last_rows`). A plate of size :math:`N` indexes the data with indices in
:math:`[0, N)`; an argument with fewer rows fails with a bare ``IndexError``, and only on the
minibatches that hold one of its missing rows (at random, mid-run). At set-up the model is traced
once more on the plates' last :math:`B` rows, :math:`\\{N - B, \\dots, N - 1\\}`, so an indexed argument
shorter than its plate fails there; an ``IndexError`` of the set-up is a :class:`ModelError` naming
the tensor arguments with fewer leading rows than a plate the model entered, the plate and both
sizes, the model's error chained.

**An argument longer than the plate that indexes it.** During that same trace the tensor operations are
watched (a :class:`~torch.overrides.TorchFunctionMode`): an argument indexed along its first dimension
by a plate's own index tensor (``x[idx]``, ``x[idx, j]``, ``x.index_select(0, idx)``) is indexed by that
plate. If it has more rows than the plate's size, its last rows are never used: a ``RuntimeWarning``
names the argument, its rows, the plate and its size (a warning, not an error: rows kept for
prediction after the training rows are legitimate). An argument the plate does not index (a table of
another length) is not named.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Tuple

import pyro.poutine as poutine
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.overrides import TorchFunctionMode

from .checks import parameter_names
from .full_data import trace_at
from .trace import ModelError, ModelTrace

__all__ = ["check_observed_batch_shapes", "naming_short_data", "probe_last_rows"]


# ---------------------------------------------------------------------- observed values
def check_observed_batch_shapes(traced: ModelTrace) -> None:
    """Refuse an observed site in a subsampled plate whose value adds batch dimensions (module docstring).

    With :math:`b` the distribution's batch shape and :math:`v` the value's batch shape, the site is
    refused when ``len(v) > len(b)`` and :math:`\\prod_{i < len(v) - len(b)} v_i > 1`: the value would
    multiply the site's log-density terms by that product.
    """
    subsampled = {plate.name for plate in traced.subsample_plates}
    for name, site in traced.trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
            continue
        plates = [frame for frame in site["cond_indep_stack"] if frame.name in subsampled]
        value = site["value"]
        if not plates or not torch.is_tensor(value):
            continue
        batch_shape = tuple(site["fn"].batch_shape)
        event_dim = len(site["fn"].event_shape)
        value_batch = tuple(value.shape[: value.dim() - event_dim])
        extra = value_batch[: max(len(value_batch) - len(batch_shape), 0)]
        if math.prod(extra) > 1:
            raise ModelError(_widened_message(name, site, plates, tuple(value.shape), batch_shape, len(extra)))


def _widened_message(name: str, site: dict, plates: list, value_shape: tuple, batch_shape: tuple, extra: int) -> str:
    frames = ", ".join(f"{frame.name!r} (dim {frame.dim}, subsample size {frame.size})" for frame in plates)
    log_prob_shape = value_shape[:extra] + batch_shape
    event = tuple(site["fn"].event_shape)
    event_text = f" and event shape {event}" if event else ""
    return (
        f"observed site {name!r} in plate {frames} has a value of shape {value_shape}, which broadcasts its "
        f"distribution's batch shape {batch_shape}{event_text} to {log_prob_shape}: every term of the likelihood "
        f"would be counted {math.prod(value_shape[:extra])} times and the posterior would be wrong. Give the "
        f"value the distribution's batch shape, e.g. obs=y[idx].squeeze(-1) for data of shape (N, 1), or declare "
        f"trailing dimensions as one event with .to_event(1) (shape (B, K) observations)"
    )


# ---------------------------------------------------------------------- arguments shorter than a plate
def probe_last_rows(model: Callable, args: tuple, kwargs: dict, traced: ModelTrace) -> None:
    """Trace ``model`` once on the last ``B`` rows of every subsampled plate it subsamples itself, so that an
    argument it indexes with fewer than ``N`` rows fails now (named by :func:`naming_short_data`); warn, naming
    it, of an argument a plate indexes that has more rows than the plate (module docstring)."""
    indices = {
        plate.name: torch.arange(plate.size - plate.subsample_size, plate.size, device=traced.device)
        for plate in traced.subsample_plates
        if not plate.user_indices
    }
    if not indices:
        return
    arguments = _tensor_arguments(args, kwargs, parameter_names(model))
    watch = _PlateIndexing(arguments, indices)
    with naming_short_data(model, args, kwargs), poutine.block(), torch.no_grad(), watch:
        trace_at(model, args, kwargs, traced.values, indices)
    sizes = {plate.name: plate.size for plate in traced.subsample_plates}
    for label, rows, plate in sorted(watch.indexed):
        if rows > sizes[plate]:
            warnings.warn(
                f"{label} has {rows} rows but is indexed by plate {plate!r} of size {sizes[plate]}: its last "
                f"{rows - sizes[plate]} rows are never used. If they are data, give the plate the data's length "
                f"(e.g. pyro.plate({plate!r}, len(y), ...)); if they are kept for prediction, slice them off",
                RuntimeWarning,
                stacklevel=4,
            )


class _PlateIndexing(TorchFunctionMode):
    """Record ``(label, rows, plate)`` for every tensor argument indexed along its first dimension by a plate's
    own index tensor (``x[idx]``, ``x[idx, ...]``, ``x.index_select(0, idx)``), found by identity."""

    def __init__(self, arguments: List[Tuple[str, torch.Tensor]], indices: Dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.arguments = {id(value): (label, value) for label, value in arguments if value.dim() > 0}
        self.plates = {id(index): name for name, index in indices.items()}
        self.indexed: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ and len(args) == 2:
            index = args[1][0] if isinstance(args[1], tuple) and args[1] else args[1]
            self._record(args[0], index)
        elif func in (torch.Tensor.index_select, torch.index_select) and len(args) == 3 and args[1] == 0:
            self._record(args[0], args[2])
        return func(*args, **kwargs)

    def _record(self, tensor, index) -> None:
        if id(tensor) in self.arguments and id(index) in self.plates:
            label, value = self.arguments[id(tensor)]
            self.indexed.add((label, int(value.shape[0]), self.plates[id(index)]))


@contextmanager
def naming_short_data(model: Callable, args: tuple, kwargs: dict) -> Iterator[None]:
    """Turn an ``IndexError`` of the model's set-up into a :class:`ModelError` naming the tensor arguments with
    fewer leading rows than a subsampled plate the model enters (the error chained); any other error, and an
    ``IndexError`` no such argument explains, passes unchanged."""
    try:
        yield
    except IndexError as error:
        sizes = _plate_sizes(model, args, kwargs)
        short = [
            (label, int(value.shape[0]), plate, size)
            for label, value in _tensor_arguments(args, kwargs, parameter_names(model))
            for plate, size in sizes.items()
            if value.dim() > 0 and value.shape[0] < size
        ]
        if not short:
            raise
        named = "; ".join(
            f"{label} has {rows} rows, plate {plate!r} has size {size}" for label, rows, plate, size in short
        )
        raise ModelError(
            f"the data are shorter than the plate that indexes them: {named}. The plate draws indices up to its "
            f"size - 1, which these rows lack (IndexError: {str(error).splitlines()[0]}); give every argument the "
            "plate indexes one row per datum, and the plate the data's length (e.g. pyro.plate('data', len(y), ...))"
        ) from error


class _PlateRecorder(Messenger):
    """Record ``{name: full size}`` of every subsampled plate the model enters."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: Dict[str, int] = {}

    def _pyro_sample(self, msg) -> None:
        if site_is_subsample(msg) and msg["fn"].subsample_size is not None:
            self.sizes[msg["name"]] = int(msg["fn"].size)


def _plate_sizes(model: Callable, args: tuple, kwargs: dict) -> Dict[str, int]:
    """The subsampled plates the model enters before it fails (it is run again; its error is dropped)."""
    recorder = _PlateRecorder()
    try:
        with poutine.block(), torch.no_grad():
            recorder(model)(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the failure being named: only the plates entered before it are needed
        pass
    return recorder.sizes


def _tensor_arguments(args: tuple, kwargs: dict, names: List[str]) -> List[Tuple[str, torch.Tensor]]:
    """``(label, tensor)`` of each tensor argument: ``argument 1 ('y')`` by position, ``argument 'y'`` by keyword."""
    positional = [
        (f"argument {i}" + (f" ({names[i]!r})" if i < len(names) else ""), value)
        for i, value in enumerate(args)
        if torch.is_tensor(value)
    ]
    return positional + [(f"argument {key!r}", value) for key, value in kwargs.items() if torch.is_tensor(value)]
