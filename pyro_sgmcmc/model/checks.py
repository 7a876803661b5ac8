"""What is not finite, and where: the data check at set-up and the naming of sites on failure paths.

Not on the hot path. At set-up, :func:`nonfinite_arguments` makes one ``isfinite`` pass over each
floating-point argument of the model; only if one holds a NaN or an infinity does
:func:`nonfinite_observations` walk the full data (:mod:`pyro_sgmcmc.model.full_data`) to find the
observed sites whose values or log-densities it makes non-finite (non-finite values the model never
uses, or masks, are accepted). When a step is not finite, :func:`nonfinite_sites` names the sites whose
log-density :math:`\\log p` (unscaled) or log-Jacobian :math:`\\log|\\det J_{T_s}|` is not finite, with the
data indices at fault.
"""

from __future__ import annotations

import inspect
import math
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import pyro
import torch
from pyro.poutine.util import site_is_subsample

from .full_data import chunk_combinations, trace_at

__all__ = ["nonfinite_arguments", "nonfinite_observations", "nonfinite_sites", "parameter_names"]


def nonfinite_sites(potential, position: torch.Tensor, indices: Optional[Mapping[str, torch.Tensor]]) -> List[str]:
    """Name the sites whose log-density is not finite at ``position`` (``(dim,)``) on a minibatch.

    The model is traced once, each site's log-density computed apart (unscaled). Each entry names the
    site, how many values are ``-inf``, ``+inf`` or NaN, and for an observed site in a subsampled plate
    the data indices at fault (the first five).
    """
    unconstrained = potential.unpack(position)
    values = {site.name: site.transform(unconstrained[site.name]) for site in potential.sites}
    indices = dict(indices or {})
    with pyro.validation_enabled(False), torch.no_grad():
        trace = trace_at(potential.model, potential.model_args, potential.model_kwargs, values, indices)
        found = []
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            log_prob = _site_log_prob_unscaled(site)
            if bool(torch.isfinite(log_prob).all()):
                continue
            kind = "observed site" if site["is_observed"] and name not in values else "site"
            where = _data_indices(site, ~torch.isfinite(log_prob), indices)
            found.append(f"{kind} {name!r}: log-density {_count_nonfinite(log_prob)}{where}")
        for site in potential.sites:
            u = unconstrained[site.name]
            if site.has_jacobian and not bool(
                torch.isfinite(site.transform.log_abs_det_jacobian(u, values[site.name])).all()
            ):
                found.append(f"site {site.name!r}: log-Jacobian of its transform to the support is not finite")
    return found


def parameter_names(model: Callable) -> List[str]:
    """The model's positional parameter names (empty if its signature cannot be read)."""
    try:
        return [
            p.name
            for p in inspect.signature(model).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return []


def nonfinite_arguments(args: tuple, kwargs: dict, names: Sequence[str] = ()) -> List[str]:
    """``"argument 1 ('y'): 3 NaN, 1 inf of 300 values"`` for each floating tensor argument not finite."""
    found = []
    named = [
        (f"argument {i}" + (f" ({names[i]!r})" if i < len(names) else ""), value) for i, value in enumerate(args)
    ] + [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        items = (
            value.items()
            if isinstance(value, Mapping)
            else enumerate(value)
            if isinstance(value, (list, tuple))
            else None
        )
        tensors = [(label, value)] if items is None else [(f"{label}[{key!r}]", item) for key, item in items]
        for where, tensor in tensors:
            if torch.is_tensor(tensor) and (tensor.is_floating_point() or tensor.is_complex()):
                if not bool(torch.isfinite(tensor).all()):
                    found.append(f"{where}: {_count_nonfinite(tensor)} of {tensor.numel()} values")
    return found


def nonfinite_observations(potential, values: Mapping[str, torch.Tensor]) -> List[str]:
    """Per observed site, the data points (over the full data) whose value or log-density is not finite,
    with the latent sites at constrained ``values`` (finite on a minibatch)."""
    bad: Dict[str, set] = {}
    totals: Dict[str, int] = {}
    with pyro.validation_enabled(False), torch.no_grad():
        for indices in chunk_combinations(potential.subsample_plates, potential.device):
            trace = trace_at(potential.model, potential.model_args, potential.model_kwargs, values, indices)
            for name, site in trace.nodes.items():
                if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
                    continue
                if name in values:
                    continue
                value = site["value"]
                mask = ~torch.isfinite(value) if torch.is_tensor(value) and value.is_floating_point() else None
                # non-finite data make the log-density NaN or infinite (an infinite covariate: -inf); the
                # latent values are the prototype's, finite on a minibatch (checked first by initial_position)
                nan = ~torch.isfinite(_site_log_prob_unscaled(site))
                if mask is not None:  # a non-finite observation the distribution does not see as such
                    mask = mask.reshape(mask.shape[: mask.dim() - site["fn"].event_dim] + (-1,)).any(-1)
                    try:
                        nan = nan | torch.broadcast_to(mask, nan.shape)
                    except RuntimeError:  # shapes that do not line up: the log-density's NaN alone
                        pass
                if not bool(nan.any()):
                    continue
                points = _bad_points(site, nan, indices)
                bad.setdefault(name, set()).update(points)
                totals[name] = _plate_total(site, potential)
    return [
        f"observed site {name!r} has {len(points)} of {totals[name]} data points with a non-finite value or "
        f"log-density (first: {sorted(points)[:5]})"
        for name, points in bad.items()
    ]


def _site_log_prob_unscaled(site) -> torch.Tensor:
    log_prob = site["fn"].log_prob(site["value"])
    if site["mask"] is not None:
        log_prob = torch.where(torch.as_tensor(site["mask"]), log_prob, torch.zeros_like(log_prob))
    return log_prob


def _count_nonfinite(tensor: torch.Tensor) -> str:
    """``"2 -inf, 1 NaN"``: the non-finite values of ``tensor`` by kind."""
    counts = [
        (int(torch.isnan(tensor).sum()), "NaN"),
        (int((tensor == math.inf).sum()), "+inf" if bool((tensor == -math.inf).any()) else "inf"),
        (int((tensor == -math.inf).sum()), "-inf"),
    ]
    return ", ".join(f"{n} {kind}" for n, kind in counts if n)


def _subsampled_axis(site, indices: Mapping[str, torch.Tensor]):
    """``(plate name, axis of the log-density)`` of the site's first subsampled plate in ``indices``."""
    for frame in site["cond_indep_stack"]:
        if frame.name in indices and frame.dim is not None:
            return frame.name, frame.dim
    return None


def _bad_points(site, bad: torch.Tensor, indices: Mapping[str, torch.Tensor]) -> set:
    """The data indices (along the site's subsampled plate) where ``bad`` holds; flat positions otherwise."""
    plate = _subsampled_axis(site, indices)
    if plate is None or bad.dim() < -plate[1]:
        return set(bad.reshape(-1).nonzero().flatten().tolist())
    name, axis = plate
    along = bad.movedim(axis, 0).reshape(bad.shape[axis], -1).any(-1)
    return set(indices[name][along.nonzero().flatten()].tolist())


def _plate_total(site, potential: object) -> int:
    sizes = {p.name: p.size for p in potential.subsample_plates}
    for frame in site["cond_indep_stack"]:
        if frame.name in sizes:
            return sizes[frame.name]
    return int(site["fn"].batch_shape.numel()) if site["fn"].batch_shape else 1


def _data_indices(site, bad: torch.Tensor, indices: Mapping[str, torch.Tensor]) -> str:
    """`` at data indices [3, 17]`` for an observed site in a subsampled plate (the first five), else ``""``."""
    plate = _subsampled_axis(site, indices)
    if plate is None or bad.dim() < -plate[1]:
        return f" ({int(bad.sum())} of {bad.numel()} values)"
    points = sorted(_bad_points(site, bad, indices))
    if len(points) == len(indices[plate[0]]):  # every point: the latent values, not particular data
        return f" at all {len(points)} minibatch data points"
    return f" at {len(points)} of {len(indices[plate[0]])} minibatch data points (data indices {points[:5]})"
