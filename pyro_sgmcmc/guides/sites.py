"""The latent sites of a guide's prototype trace: unconstrained shapes, slices, and per-site priors.

Pyro's ``AutoContinuous`` lays all latent sites out in one flat unconstrained vector, in the order
the model samples them; the shape of site :math:`s` there is that of
:math:`g_s^{-1}(\\theta_s)`, :math:`g_s` = ``biject_to(support)``. These helpers recompute that
layout from the public prototype trace, so no module reads another guide's private fields.
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, Tuple

import pyro.distributions as dist
import torch
from torch.distributions import biject_to
from torch.distributions.transforms import ComposeTransform, IndependentTransform, ReshapeTransform

__all__ = [
    "unconstrained_shapes",
    "site_slices",
    "split_latent",
    "is_identity_transform",
    "site_prior",
    "reshaped",
    "potential_permutation",
]


def unconstrained_shapes(trace) -> Dict[str, torch.Size]:
    """``{site: shape of its unconstrained value}`` for the latent sites of ``trace`` (model order)."""
    return {
        name: biject_to(site["fn"].support).inv(site["value"]).shape for name, site in trace.iter_stochastic_nodes()
    }


def site_slices(trace, shapes) -> Dict[str, slice]:
    """``{site: slice}`` of each latent site in the flat vector (model order), for the sites in ``shapes``."""
    slices, offset = {}, 0
    for name, _ in trace.iter_stochastic_nodes():
        if name in shapes:
            numel = math.prod(shapes[name])
            slices[name] = slice(offset, offset + numel)
            offset += numel
    return slices


def split_latent(trace, shapes, latent: torch.Tensor) -> Iterator[Tuple[dict, torch.Tensor]]:
    """``(site, value (*batch, *unconstrained_shape))`` for a flat ``(*batch, dim)`` latent."""
    batch = latent.shape[:-1]
    for name, where in site_slices(trace, shapes).items():
        yield trace.nodes[name], latent[..., where].reshape(batch + shapes[name])


def is_identity_transform(transform) -> bool:
    """Is ``transform`` (``biject_to`` of a real support) the identity?"""
    while isinstance(transform, IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, ComposeTransform) and not transform.parts


def reshaped(base: dist.Distribution, shape) -> dist.Distribution:
    """A distribution over a flat block, its event reshaped to the site's unconstrained ``shape``."""
    if tuple(shape) == tuple(base.event_shape):
        return base
    return dist.TransformedDistribution(base, [ReshapeTransform(base.event_shape, shape)])


def site_prior(base: dist.Distribution, site: dict) -> dist.Distribution:
    """``base`` (over the unconstrained value) pushed through the site's ``biject_to(support)``."""
    transform = biject_to(site["fn"].support)
    return base if is_identity_transform(transform) else dist.TransformedDistribution(base, [transform])


def potential_permutation(names, shapes, potential) -> torch.Tensor:
    """Indices ``perm`` with ``guide_vector = potential_vector[perm]`` for the guide's sites ``names``.

    The guide lays sites out in model order, :class:`~pyro_sgmcmc.ModelPotential` in sorted-name
    order; ``shapes`` are the guide's unconstrained shapes (checked against the potential's).
    """
    by_name = {site.name: site for site in potential.sites}
    if sorted(names) != sorted(by_name):
        raise ValueError(f"the guide's latent sites {list(names)} differ from the model's {sorted(by_name)}")
    parts = []
    for name in names:
        site = by_name[name]
        if tuple(site.unconstrained_shape) != tuple(shapes[name]):
            raise ValueError(f"site {name!r} changed shape since the guide was set up")
        parts.append(torch.arange(site.offset, site.offset + site.numel))
    return torch.cat(parts)
