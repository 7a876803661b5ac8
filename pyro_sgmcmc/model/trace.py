"""Trace a Pyro model once: its latent sites, subsampled plates, number of data, dtype and device.

Pyro's :func:`pyro.infer.mcmc.util.initialize_model` refuses models with subsampled plates, because an
exact MCMC kernel cannot work with a noisy density. Stochastic-gradient kernels need exactly that
noisy density, so the model room does the initialisation itself: the model is traced once, under
the init strategy, and :func:`trace_model` reads from that trace

* the subsampled plates (:class:`SubsamplePlate`: full ``size`` ``N_p`` and ``subsample_size`` ``B_p``,
  whose log-probabilities Pyro scales by ``N_p / B_p``);
* the latent sites (:class:`LatentSite`), each with the bijection ``T = biject_to(support)`` from
  unconstrained space, laid out in the sorted order of their names (Pyro's convention for ``MCMC``
  draws) at consecutive offsets of one flat vector of ``dim`` values;
* the number of data ``N``: over observed sites, the largest product of the *full* sizes of the plates
  around the site (``N = 1`` without a plate);
* the dtype (promoted over the latent values and the observed data) and the device.

It refuses, naming the site or plate, what a stochastic-gradient kernel cannot sample: discrete latent
sites, latent sites inside a subsampled plate, plate sizes that are not counts, observations that do
not broadcast with their distribution, and, when Pyro's validation is on, observations outside a discrete
support (:mod:`pyro_sgmcmc.model.observed_support`: the whole data, once, at set-up).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import pyro.distributions
import pyro.poutine as poutine
import torch
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import biject_to

from .observed_support import ObservedSources, support_violations, walk_full_data

__all__ = ["LatentSite", "ModelError", "ModelTrace", "SubsamplePlate", "is_identity", "trace_model"]


class ModelError(ValueError):
    """The model cannot be sampled by a stochastic-gradient kernel (the message says why)."""


@dataclass(frozen=True)
class LatentSite:
    """A latent sample site and where its unconstrained value lives in the flat position."""

    name: str
    shape: torch.Size  # constrained shape
    unconstrained_shape: torch.Size
    offset: int
    numel: int
    transform: torch.distributions.Transform  # unconstrained -> constrained
    has_jacobian: bool  # False for the identity (real support): no log-det term to add

    @property
    def slice(self) -> slice:
        return slice(self.offset, self.offset + self.numel)


@dataclass(frozen=True)
class SubsamplePlate:
    """A plate that was subsampled: its name, full ``size`` and ``subsample_size``.

    ``user_indices`` is True when the model passes ``pyro.plate(..., subsample=indices)`` itself:
    the kernels then leave the choice of minibatch to the model.
    """

    name: str
    size: int
    subsample_size: int
    user_indices: bool = False

    @property
    def scale(self) -> float:
        """Pyro's scale of the plate's log-probabilities, ``size / subsample_size``."""
        return self.size / self.subsample_size


@dataclass
class ModelTrace:
    """What one trace of the model tells (see the module's docstring)."""

    trace: poutine.Trace  #: the prototype trace, at the init strategy's values
    sites: List[LatentSite]
    subsample_plates: List[SubsamplePlate]
    values: Dict[str, torch.Tensor]  #: the latent sites' constrained values in the trace
    dtype: torch.dtype
    device: torch.device
    num_data: int
    init_fn: Callable  #: the init strategy made total (see :func:`_discrete_from_prior`)


def trace_model(
    model: Callable, args: tuple, kwargs: dict, init_strategy: Callable, num_data: Optional[int] = None
) -> ModelTrace:
    """Trace ``model(*args, **kwargs)`` once under ``init_strategy`` and read its layout (no side effects
    on the param store or outer handlers: the run is blocked).

    With Pyro's validation on (:func:`pyro.distributions.is_validation_enabled`), the trace is watched to
    find the argument each observed value is read from, and observations outside a discrete support are a
    :class:`ModelError` (:mod:`~pyro_sgmcmc.model.observed_support`)."""
    dtype_hint, device_hint = _data_dtype_and_device(args, kwargs)
    init_fn = _discrete_from_prior(init_strategy, dtype_hint, device_hint)
    sources = ObservedSources(model, args, kwargs) if pyro.distributions.is_validation_enabled() else None
    with poutine.block(), sources or contextlib.nullcontext():
        checked = _SubsampleCheck()(InitMessenger(init_fn)(model))
        trace = poutine.trace(checked).get_trace(*args, **kwargs)
    plates = _find_subsample_plates(trace)
    sites, values = _find_latent_sites(trace, plates)
    _check_observed_shapes(trace)
    if sources is not None:
        _check_observed_support(trace, sources, functools.partial(walk_full_data, model, args, kwargs, values, trace))
    observed = [
        site["value"] for site in trace.nodes.values()
        if site["type"] == "sample" and site["is_observed"] and torch.is_tensor(site["value"])
        and site["value"].is_floating_point()
    ]  # fmt: skip
    floating = [v.dtype for v in list(values.values()) + observed if v.is_floating_point()]
    dtype = _promote(floating or [torch.get_default_dtype()])
    device = device_hint if device_hint is not None else next(iter(values.values())).device
    num_data = _default_num_data(trace, plates) if num_data is None else check_num_data(num_data)
    return ModelTrace(trace, sites, plates, values, dtype, device, num_data, init_fn)


def is_identity(transform: torch.distributions.Transform) -> bool:
    """True for ``biject_to(constraints.real)`` and its ``IndependentTransform`` wrappings (no Jacobian)."""
    while isinstance(transform, torch.distributions.transforms.IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, torch.distributions.transforms.ComposeTransform) and not transform.parts


def check_num_data(num_data: object) -> int:
    """``num_data`` itself if it is a positive ``int``; a ValueError naming it otherwise."""
    if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1:
        raise ValueError(f"num_data must be a positive integer (the number of data N); got {num_data!r}")
    return num_data


# ---------------------------------------------------------------------- plates
class _SubsampleCheck(Messenger):
    """Fail early, naming the plate, on a plate size or ``subsample_size`` that is not a usable count.

    Pyro's own errors for these do not name the plate (``ZeroDivisionError`` for ``subsample_size=0``,
    "did you use different subsample_size in the model and guide?" for a negative one, a slice
    ``TypeError`` for ``32.0``) or accept them silently (``True`` is a subsample of one).
    """

    def _pyro_sample(self, msg) -> None:
        if site_is_subsample(msg):
            _check_plate(msg["name"], msg["fn"].size, msg["fn"].subsample_size)


def _check_plate(name: str, size, subsample_size) -> None:
    """Raise :class:`ModelError` naming plate ``name`` unless ``1 <= subsample_size <= size`` are integers."""
    accepted = "an integer >= 1 (a Python int, or a 0-d integer tensor)"
    if not _is_count(size) or int(size) < 1:
        raise ModelError(
            f"plate {name!r} has size={size!r}; a plate's size must be {accepted} (an empty plate has no data "
            "to subsample: leave the plate out, or check the data passed to the model)"
        )
    if subsample_size is None:
        return
    if not _is_count(subsample_size) or int(subsample_size) < 1:
        raise ModelError(
            f"plate {name!r} has subsample_size={subsample_size!r}; it must be {accepted}, at most the plate's "
            f"size={int(size)} (or None for no subsampling)"
        )
    if int(subsample_size) > int(size):
        raise ModelError(
            f"plate {name!r} has subsample_size={subsample_size!r} larger than its size={int(size)}; "
            f"use subsample_size <= {int(size)}"
        )


def _is_count(value) -> bool:
    """A Python ``int`` that is not a ``bool``, or a 0-d integer tensor (Pyro fails on NumPy integers)."""
    if torch.is_tensor(value):
        return (
            value.dim() == 0 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool
        )
    return isinstance(value, int) and not isinstance(value, bool)


def _find_subsample_plates(trace) -> List[SubsamplePlate]:
    plates = []
    for name, site in trace.nodes.items():
        if site_is_subsample(site):
            size = int(site["fn"].size)
            user_indices = site["fn"].subsample_size is None  # the model gave subsample=indices
            subsample_size = len(site["value"]) if user_indices else int(site["fn"].subsample_size)
            if subsample_size < size:
                plates.append(SubsamplePlate(name, size, subsample_size, user_indices))
    return plates


def _default_num_data(trace, subsample_plates) -> int:
    """Over observed sites, the largest product of the full sizes of the vectorised plates around them."""
    full_size = {p.name: p.size for p in subsample_plates}
    num_data = 1
    for site in trace.nodes.values():
        if site["type"] == "sample" and site["is_observed"]:
            sizes = [
                full_size.get(f.name, getattr(f, "full_size", None) or f.size)
                for f in site["cond_indep_stack"]
                if f.vectorized
            ]
            terms = math.prod(size for size in sizes if size is not None and size > 0)
            num_data = max(num_data, int(terms))
    return num_data


# ---------------------------------------------------------------------- sites
def _find_latent_sites(trace, subsample_plates) -> Tuple[List[LatentSite], Dict[str, torch.Tensor]]:
    subsampled = {p.name for p in subsample_plates}
    latent, discrete, local = [], [], []
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
            continue
        if site["fn"].support.is_discrete:
            discrete.append(name)
            continue
        plates = [f.name for f in site["cond_indep_stack"] if f.name in subsampled]
        if plates:
            local.append(f"{name!r} (in {plates})")
            continue
        latent.append(name)
    if discrete:
        raise ModelError(
            f"discrete latent sites {discrete} cannot be sampled by a gradient-based kernel; "
            "marginalise them out or observe them"
        )
    if local:
        raise ModelError(
            f"latent sites {', '.join(local)} are inside a subsampled plate; stochastic-gradient kernels "
            "sample global latent variables only (move them out of the plate or drop subsample_size)"
        )
    if not latent:
        raise ModelError("the model has no latent sample sites: there is nothing to sample")
    sites, values, offset = [], {}, 0
    for name in sorted(latent):
        site = trace.nodes[name]
        value = site["value"].detach()
        transform = biject_to(site["fn"].support)
        unconstrained = transform.inv(value)
        sites.append(
            LatentSite(
                name=name,
                shape=value.shape,
                unconstrained_shape=unconstrained.shape,
                offset=offset,
                numel=unconstrained.numel(),
                transform=transform,
                has_jacobian=not is_identity(transform),
            )
        )
        values[name] = value
        offset += unconstrained.numel()
    return sites, values


def _check_observed_shapes(trace) -> None:
    """An observed value must broadcast with its distribution's shape (e.g. data indexed by the plate)."""
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
            continue
        value = site["value"]
        if not torch.is_tensor(value):
            continue
        expected = site["fn"].batch_shape + site["fn"].event_shape
        if not _broadcastable(tuple(value.shape), tuple(expected)):
            plates = [f.name for f in site["cond_indep_stack"]]
            raise ModelError(
                f"observed site {name!r} has a value of shape {tuple(value.shape)} that does not broadcast with its "
                f"distribution's shape {tuple(expected)} (plates {plates}); in a subsampled plate, index the data "
                "with the plate's indices (obs=y[idx])"
            ) from None


def _check_observed_support(trace, sources: ObservedSources, walk: Callable) -> None:
    """Refuse observations outside their discrete support, naming the site, the distribution and the data."""
    violations = support_violations(trace, sources, walk)
    if violations:
        raise ModelError(
            "; ".join(violations) + ". Pyro's validation (on) refuses such values when it evaluates the "
            "likelihood, and without it they are scored without a word (a count of 2.5 has a finite, meaningless "
            "log-density): give the site values in its support (counts, 0/1 labels, classes 0 to K - 1)"
        )


def _broadcastable(a: Tuple[int, ...], b: Tuple[int, ...]) -> bool:
    """True if shapes ``a`` and ``b`` broadcast (NumPy's rule: aligned from the right, each pair of sizes
    equal or one of them 1; the shorter shape is padded with 1s on the left).

    Our own rule rather than ``torch.broadcast_shapes``, which imports ``torch._refs`` and, through
    ``torch.fx.experimental.symbolic_shapes``, sympy: a few seconds on the first run of a process."""
    return all(m == n or m == 1 or n == 1 for m, n in zip(reversed(a), reversed(b)))


# ---------------------------------------------------------------------- init strategy, dtype, device
def _discrete_from_prior(init_strategy: Callable, dtype=None, device=None) -> Callable:
    """Make an init strategy total: discrete sites are drawn from the prior (so the site check can
    name them), and sites whose distribution cannot be sampled (``ImproperUniform``, which Pyro's
    strategies call ``.sample()`` on) start at zero in unconstrained space, in the data's dtype."""

    def init(site):
        fn = site["fn"]
        if fn.support.is_discrete:
            return fn.sample().detach()
        try:
            return init_strategy(site)
        except NotImplementedError:
            transform = biject_to(fn.support)
            shape = transform.inverse_shape(fn.batch_shape + fn.event_shape)
            return transform(torch.zeros(shape, dtype=dtype, device=device)).detach()

    return init


def _data_dtype_and_device(args, kwargs):
    """The dtype and device of the first floating-point tensor among the model's arguments."""
    for value in list(args) + list(kwargs.values()):
        if torch.is_tensor(value) and value.is_floating_point():
            return value.dtype, value.device
    return None, None


def _promote(dtypes):
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, dtype)
    return result
