"""A MAP the user already has: ``AutoLaplace(model, map_values=...)``, checked against the model's latent sites.

A Laplace approximation needs only the MAP :math:`\\theta_*` and one sweep of the data; how the MAP
was found (SVI, :meth:`~pyro_sgmcmc.guides.AutoLaplace.fit_map`, a hand-written ``torch`` loop, a
checkpoint) does not matter. ``map_values`` gives it as ``{site: constrained value}`` or as a
trained ``torch.nn.Module`` whose parameter names are the model's site names (a ``PyroModule``
network with ``PyroSample`` weights names its sites ``"fc1.weight"``, as
``torch.nn.Module.named_parameters`` names a plain module of the same layout). The guide then
starts at exactly those values (Pyro's ``init_to_value``), and
:meth:`~pyro_sgmcmc.guides.AutoLaplace.laplace_approximation` may be called with no fit.
"""

from __future__ import annotations

from typing import Dict, Mapping, Union

import torch
from pyro.infer.autoguide.initialization import init_to_median
from pyro.poutine.util import site_is_subsample
from torch.distributions import biject_to

__all__ = ["MapValues", "as_map_values", "check_map_values", "init_to_map_values", "unconstrained_map"]

MapValues = Union[Mapping[str, torch.Tensor], torch.nn.Module]


def as_map_values(value: MapValues) -> Dict[str, torch.Tensor]:
    """``{name: detached tensor}`` from a mapping of tensors or a module's ``named_parameters()``."""
    if isinstance(value, torch.nn.Module):
        value = dict(value.named_parameters())
    if not isinstance(value, Mapping) or not value:
        raise TypeError(
            "map_values must be a non-empty {site name: tensor} dict (constrained values) or a trained "
            f"torch.nn.Module whose parameter names are the model's site names; got {value!r}"
        )
    result = {}
    for name, tensor in value.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError(f"map_values must map site names (str) to floating tensors; got {name!r}: {tensor!r}")
        result[name] = tensor.detach().clone()
    return result


def init_to_map_values(values: Mapping[str, torch.Tensor]):
    """Pyro init strategy: ``values[site]``, checked against the site's shape (a ``ValueError`` naming it);
    a site left out starts at ``init_to_median`` (:func:`check_map_values` then names it)."""

    def init(site):
        name = site["name"]
        if name not in values:
            return init_to_median(site)
        shape = site["fn"].shape()
        if values[name].shape != shape:
            raise ValueError(
                f"map_values[{name!r}] has shape {tuple(values[name].shape)}; the site's value has shape {tuple(shape)}"
            )
        return values[name]

    return init


def check_map_values(trace, values: Mapping[str, torch.Tensor]) -> None:
    """Every latent site of ``trace`` has a value in ``values``, of the site's shape.

    Raises
    ------
    ValueError
        Naming the latent sites without a value (and the names given that are not latent sites),
        or a site whose value has the wrong shape.
    """
    latent = {name: site for name, site in trace.iter_stochastic_nodes() if not site_is_subsample(site)}
    missing = [name for name in latent if name not in values]
    if missing:
        unknown = sorted(set(values) - set(latent))
        raise ValueError(
            f"map_values has no value for the latent sites {missing}" + (f"; it names {unknown}, which are not latent "
            "sites of the model" if unknown else "") + f". Latent sites: {list(latent)}"
        )  # fmt: skip
    for name, site in latent.items():
        if values[name].shape != site["value"].shape:
            raise ValueError(
                f"map_values[{name!r}] has shape {tuple(values[name].shape)}; the site's value has shape "
                f"{tuple(site['value'].shape)}"
            )


def unconstrained_map(trace, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The flat unconstrained vector of ``values`` in the order of ``trace``'s latent sites (a guide's ``loc``):
    :math:`g_s^{-1}(\\theta_s)` per site, :math:`g_s` = ``biject_to(support)``."""
    parts = [
        biject_to(site["fn"].support).inv(values[name]).reshape(-1)
        for name, site in trace.iter_stochastic_nodes()
        if not site_is_subsample(site)
    ]
    return torch.cat(parts)
