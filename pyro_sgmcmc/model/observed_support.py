r"""Observed values outside their distribution's support, named at set-up when Pyro's validation is on.

A likelihood with a discrete support (a count, a label, a class: ``Poisson``, ``Bernoulli``,
``Binomial``, ``Categorical``, ``NegativeBinomial``, ``Geometric``, ...) scores a value outside that
support without a word when validation is off: ``Poisson(rate).log_prob(2.5)`` is the finite
:math:`2.5 \log r - r - \log\Gamma(3.5)`, ``Categorical.log_prob(1.5)`` reads class 1. With Pyro's
validation on (:func:`pyro.distributions.is_validation_enabled`, which :class:`pyro.infer.MCMC` and
:class:`pyro_sgmcmc.MCMC` turn off unless ``disable_validation=False``), Pyro refuses such a value when it
evaluates the likelihood, with PyTorch's message, which names neither the site nor the datum, and only on a
minibatch that holds it. This module names them at set-up instead, once, for every observed site whose
distribution's ``support`` is discrete, with nothing left for the steps to do.

Which values are checked: all the data, at set-up, in one of two ways.

* **From the argument** (:class:`ObservedSources`, a :class:`~torch.overrides.TorchFunctionMode` that watches
  the set-up trace): an observed value made by indexing a tensor argument of the model along its first
  dimension with a subsampled plate's own indices (``obs=y[idx]``, ``y[idx, ...]``, ``y.index_select(0, idx)``)
  comes from that argument, whose first :math:`N` rows (the plate's size) are every value the site will see;
  ``support.check`` runs on them in one vectorised pass, with no model evaluation.
* **Over every minibatch** (:func:`walk_full_data`), for the other sites in a subsampled plate (a value computed
  from the data, ``y[idx].long()``; a support whose bounds have the minibatch's shape, such as ``Binomial``'s,
  whose ``total_count`` PyTorch broadcasts to the batch shape): the model is traced on every chunk of the full
  data (:class:`~pyro_sgmcmc.model.full_data.PlateChunks`), many chunks per call under
  :func:`torch.func.vmap`, without gradients, and ``support.check`` applied to the site's value in each.

An observation outside every subsampled plate is the whole data already: its traced value is checked. Only
where the walk cannot be made (a model that cannot run under vmap, a plate whose indices the model draws
itself) is the set-up's minibatch all that is checked, and the message says so.

Supports are not listed by distribution: the distribution's own ``support.check(value)`` decides, as
PyTorch's validation does. Continuous supports are left out: a value outside them has log-density
:math:`-\infty`, which a step reports as a divergence naming the site and the data indices.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import pyro
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample
from torch.overrides import TorchFunctionMode

__all__ = ["ObservedSources", "support_violations", "walk_full_data"]

#: data indices and values quoted in a message
EXAMPLES = 5


class ObservedSources(TorchFunctionMode):
    """While active, remember which tensor argument each indexed tensor was read from, and with which index.

    ``sources[id(result)] = (label, argument, index)`` for every ``argument[index]``,
    ``argument[index, ...]`` or ``argument.index_select(0, index)`` with ``index`` a tensor: the rows of the
    argument that ``index`` selects. The results and indices are kept alive with the record (set-up only), so
    that an object's ``id`` is not reused while the record is read.

    Parameters
    ----------
    model : callable
        The model (its signature names the positional arguments).
    args, kwargs :
        Its arguments: tensors, and tensors held in a dict, list or tuple argument.
    """

    def __init__(self, model: Callable, args: tuple, kwargs: dict) -> None:
        super().__init__()
        from .checks import parameter_names  # checks imports the trace, which uses this module

        arguments = _tensor_arguments(args, kwargs, parameter_names(model))
        self.arguments = {id(value): (label, value) for label, value in arguments}
        self.sources: Dict[int, Tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.Tensor.__getitem__ and len(args) == 2:
            self._record(args[0], _leading_index(args[1]), result)
        elif func in (torch.Tensor.index_select, torch.index_select) and len(args) == 3 and args[1] == 0:
            self._record(args[0], args[2], result)
        return result

    def _record(self, tensor, index, result) -> None:
        if index is None or not torch.is_tensor(result) or id(tensor) not in self.arguments:
            return
        label, value = self.arguments[id(tensor)]
        self.sources[id(result)] = (label, value, index, result)

    def source(self, value) -> Optional[Tuple[str, torch.Tensor, torch.Tensor]]:
        """``(label, argument, index)`` if ``value`` was read from an argument by a tensor index, else ``None``."""
        found = self.sources.get(id(value))
        if found is None or found[3] is not value:
            return None
        return found[0], found[1], found[2]


def support_violations(trace, sources: Optional[ObservedSources], walk: Optional[Callable] = None) -> List[str]:
    """One sentence per observed site of discrete support given values outside it (module docstring).

    Parameters
    ----------
    trace : pyro.poutine.Trace
        The set-up trace of the model.
    sources : ObservedSources, optional
        The watch that was active during the trace (``None``: no value is traced back to an argument).
    walk : callable, optional
        ``walk(names) -> {name: (bad data indices, examples)}`` or ``None``: the sites ``names`` checked over
        every minibatch of the full data (:func:`walk_full_data` with the model bound); ``None``: not walked.
    """
    plates = _subsample_indices(trace)
    found: Dict[str, str] = {}
    unresolved = []
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
            continue
        support = getattr(site["fn"], "support", None)
        if support is None or not support.is_discrete or not torch.is_tensor(site["value"]):
            continue
        problem = _whole_argument(name, site, support, sources, plates)
        if problem is None and any(frame.name in plates for frame in site["cond_indep_stack"]):
            unresolved.append(name)
        elif problem is None:  # outside every subsampled plate: the traced value is the whole data
            found[name] = _traced_value(name, site, support, plates)
        else:
            found[name] = problem
    walked = walk(unresolved) if walk is not None and unresolved else None
    for name in unresolved:
        site = trace.nodes[name]
        if walked is None:
            found[name] = _traced_value(name, site, site["fn"].support, plates)
        elif name in walked:
            found[name] = _walked(name, site, plates, *walked[name])
    return [found[name] for name in trace.nodes if found.get(name)]


def _whole_argument(name, site, support, sources, plates) -> Optional[str]:
    """The check over every row of the argument the site's value was indexed from by its plate's indices; ``""``
    if they are all in the support, ``None`` if there is no such argument or the support's bounds have the
    minibatch's shape (``Binomial(n[idx])``, and PyTorch broadcasts even a scalar ``total_count`` so)."""
    source = None if sources is None else sources.source(site["value"])
    if source is None:
        return None
    label, argument, index = source
    frames = [frame for frame in site["cond_indep_stack"] if frame.name in plates and plates[frame.name][0] is index]
    if not frames:
        return None
    rows = argument[: plates[frames[0].name][1]]  # the plate's data (rows beyond its size are never read)
    with torch.no_grad():
        try:
            ok = support.check(rows)
        except (RuntimeError, TypeError, ValueError):  # bounds of the minibatch's shape
            return None
    if tuple(ok.shape) != tuple(rows.shape[: rows.dim() - support.event_dim]):
        return None
    bad = ~ok
    if not bool(bad.any()):
        return ""
    where = bad.reshape(bad.shape[0], -1).any(-1).nonzero().flatten()
    shown = ", ".join(f"data index {i} = {_shown(rows[i])}" for i in where[:EXAMPLES].tolist())
    return (
        f"{_site(name, site)} is given {len(where)} of {len(rows)} data points outside its support by {label} "
        f"(indexed by plate {frames[0].name!r}; all its {len(rows)} rows checked): {shown}"
    )


def _traced_value(name, site, support, plates) -> str:
    """The check of the value the trace saw, its bad positions mapped to data indices through the plate."""
    value = site["value"]
    with torch.no_grad():
        try:
            ok = torch.broadcast_to(support.check(value), value.shape[: value.dim() - support.event_dim])
        except (RuntimeError, TypeError, ValueError):  # the distribution's own log_prob will say what is wrong
            return ""
    bad = ~ok
    if not bool(bad.any()):
        return ""
    frame = next(
        (f for f in site["cond_indep_stack"] if f.name in plates and f.dim is not None and bad.dim() >= -f.dim), None
    )
    if frame is None:
        positions = bad.nonzero()[:EXAMPLES]
        shown = ", ".join(f"{list(p)} = {_shown(value[tuple(p)])}" for p in positions.tolist())
        return f"{_site(name, site)} is given {int(bad.sum())} of {bad.numel()} values outside its support: at {shown}"
    along = bad.movedim(frame.dim, 0).reshape(bad.shape[frame.dim], -1).any(-1).nonzero().flatten()
    indices, size = plates[frame.name]
    data = indices[along].tolist()
    values = value.movedim(frame.dim - support.event_dim, 0) if value.dim() >= support.event_dim - frame.dim else value
    shown = ", ".join(
        f"data index {d} = {_shown(values[p])}" for d, p in zip(data[:EXAMPLES], along[:EXAMPLES].tolist())
    )
    return (
        f"{_site(name, site)} is given {len(data)} data points outside its support in the minibatch of plate "
        f"{frame.name!r} traced at set-up ({len(indices)} of {size} data points checked: the model could not be "
        f"traced over the full data under torch.func.vmap, or chooses the plate's indices itself): {shown}"
    )


def walk_full_data(model: Callable, args: tuple, kwargs: dict, values: Mapping[str, torch.Tensor], trace, names):
    """``{site: (bad data indices, [(index, value), ...])}`` for the sites ``names`` over the full data, or
    ``None`` when the walk cannot be made (a plate whose indices the model gives itself, a model that cannot run
    under :func:`torch.func.vmap`).

    Every combination of the subsampled plates' covering chunks (:class:`~pyro_sgmcmc.model.full_data.PlateChunks`)
    is traced at the latent ``values``, :data:`~pyro_sgmcmc.model.full_data.DATA_PER_CALL` data per vectorised
    call, and ``support.check`` applied to each site's value there: the minibatches the steps will see, all of
    them, without a gradient.
    """
    from .full_data import DATA_PER_CALL, PlateChunks  # the full-data walker imports the trace, which imports this
    from .trace import SubsamplePlate

    plates = {}
    for name, site in trace.nodes.items():
        if site_is_subsample(site) and len(site["value"]) < int(site["fn"].size):
            if site["fn"].subsample_size is None:  # indices the model chooses: they cannot be walked
                return None
            plates[name] = PlateChunks(
                SubsamplePlate(name, int(site["fn"].size), len(site["value"])), site["value"].device
            )
    combinations = math.prod(len(chunks) for chunks in plates.values())
    per_call = max(1, DATA_PER_CALL // math.prod(chunks.plate.subsample_size for chunks in plates.values()))

    chunk_rows = {name: chunks.rows() for name, chunks in plates.items()}  # (chunks, B): O(N) indices per plate

    def rows(start: int, stop: int) -> Dict[str, torch.Tensor]:
        """The indices of combinations ``start`` to ``stop`` (the first plate's chunk varying slowest)."""
        linear, out, stride = torch.arange(start, stop), {}, combinations
        for name, table in chunk_rows.items():
            stride //= len(table)
            out[name] = table[(linear // stride) % len(table)]
        return out

    def checked(indices):
        traced = poutine.trace(poutine.condition(model, data={**indices, **values})).get_trace(*args, **kwargs)
        out = {}
        for name in names:
            value, support = traced.nodes[name]["value"], traced.nodes[name]["fn"].support
            out[name] = (
                torch.broadcast_to(support.check(value), value.shape[: value.dim() - support.event_dim]),
                value,
            )
        return out

    over_minibatches = torch.func.vmap(checked, randomness="different")
    bad: Dict[str, List[torch.Tensor]] = {name: [] for name in names}
    examples: Dict[str, list] = {name: [] for name in names}
    try:
        with poutine.block(), pyro.validation_enabled(False), torch.no_grad():
            for start in range(0, combinations, per_call):
                block = rows(start, min(start + per_call, combinations))
                for name, (ok, value) in over_minibatches(block).items():
                    frame = _plate_frame(trace.nodes[name], plates, ok.dim() - 1)
                    if frame is None:
                        return None
                    axis = ok.dim() + frame.dim
                    along = (~ok).movedim(axis, 1).reshape(ok.shape[0], ok.shape[axis], -1).any(-1)
                    data = block[frame.name][along]
                    bad[name].append(data)
                    moved = value.movedim(axis, 1)[along]
                    examples[name] += list(zip(data[:EXAMPLES].tolist(), moved[:EXAMPLES]))
    except Exception as error:  # noqa: BLE001 - vmap refuses the model: the set-up's minibatch is checked instead
        if isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error):
            raise
        return None
    found = {}
    for name in names:
        indices = torch.unique(torch.cat(bad[name])) if bad[name] else torch.empty(0, dtype=torch.long)
        if len(indices):
            first = dict(sorted(examples[name], key=lambda pair: pair[0]))  # a datum seen twice: once
            found[name] = (indices, list(first.items())[:EXAMPLES])
    return found


def _plate_frame(site, plates, batch_dims: int):
    """The site's first frame of a walked plate whose dim lies within ``batch_dims`` (``None`` if none)."""
    return next(
        (f for f in site["cond_indep_stack"] if f.name in plates and f.dim is not None and batch_dims >= -f.dim), None
    )


def _walked(name, site, plates, indices: torch.Tensor, examples: list) -> str:
    frame = next(f for f in site["cond_indep_stack"] if f.name in plates)
    size = plates[frame.name][1]
    shown = ", ".join(f"data index {i} = {_shown(value)}" for i, value in examples)
    return (
        f"{_site(name, site)} is given {len(indices)} of {size} data points outside its support (plate "
        f"{frame.name!r}; every minibatch of the full data checked): {shown}"
    )


def _site(name: str, site: Mapping) -> str:
    """``observed site 'y' (Poisson, support IntegerGreaterThan(lower_bound=0))``; a support whose bounds are
    tensors of the minibatch's shape by its class name only."""
    fn, wrappers = site["fn"], []
    while hasattr(fn, "base_dist"):  # Independent, Masked, ... : name the distribution inside
        wrappers.append(type(fn).__name__)
        fn = fn.base_dist
    described = "".join(f"{w}(" for w in wrappers) + type(fn).__name__ + ")" * len(wrappers)
    support = repr(site["fn"].support)
    support = support if len(support) <= 80 else type(site["fn"].support).__name__.lstrip("_")
    return f"observed site {name!r} ({described}, support {support})"


def _shown(value: torch.Tensor) -> str:
    """A value as text: a number, or a short list."""
    return str(value.tolist()) if value.numel() <= 8 else f"{value.reshape(-1)[:8].tolist()[:-1]} ..."


def _subsample_indices(trace) -> Dict[str, Tuple[torch.Tensor, int]]:
    """``{plate: (indices, size)}`` of every plate that draws a proper subsample of its data."""
    plates = {}
    for name, site in trace.nodes.items():
        if site_is_subsample(site) and torch.is_tensor(site["value"]) and len(site["value"]) < int(site["fn"].size):
            plates[name] = (site["value"], int(site["fn"].size))
    return plates


def _leading_index(index):
    """The tensor that selects rows in ``x[index]`` when every other position is a full slice, else ``None``."""
    if torch.is_tensor(index):
        integral = not index.is_floating_point() and not index.is_complex() and index.dtype != torch.bool
        return index if index.dim() == 1 and integral else None
    if isinstance(index, tuple) and index and torch.is_tensor(index[0]):
        rest = index[1:]
        if all(item is Ellipsis or item == slice(None) for item in rest):
            return _leading_index(index[0])
    return None


def _tensor_arguments(args: tuple, kwargs: dict, names: List[str]) -> List[Tuple[str, torch.Tensor]]:
    """``(label, tensor)`` of each tensor argument, and of each tensor in a dict, list or tuple argument."""
    labelled = [
        (f"argument {i}" + (f" ({names[i]!r})" if i < len(names) else ""), value) for i, value in enumerate(args)
    ] + [(f"argument {key!r}", value) for key, value in kwargs.items()]
    found = []
    for label, value in labelled:
        if torch.is_tensor(value):
            found.append((label, value))
        elif isinstance(value, Mapping):
            found += [(f"{label}[{key!r}]", item) for key, item in value.items() if torch.is_tensor(item)]
        elif isinstance(value, (list, tuple)):
            found += [(f"{label}[{i}]", item) for i, item in enumerate(value) if torch.is_tensor(item)]
    return found
