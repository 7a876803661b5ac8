"""The flat unconstrained layout of a model's latent sites: pack, unpack, transforms.

The position of one chain is a flat vector :math:`z \\in \\mathbb{R}^{d}`; site :math:`s` occupies
``z[offset_s : offset_s + numel_s]`` in unconstrained space, viewed with its unconstrained shape, and
its constrained value is :math:`\\theta_s = T_s(z_s)` with :math:`T_s` = ``biject_to(support_s)``. The
change of variables adds

.. math:: \\log |\\det J_{T}(z)| = \\sum_{s:\\, T_s \\neq \\mathrm{id}} \\log |\\det J_{T_s}(z_s)|

to the log density (the identity, on real support, adds nothing and is skipped). A batch of chains is
``(..., d)``; every method accepts the leading batch axes.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .trace import LatentSite

__all__ = ["Layout"]


class Layout:
    """Where each latent site lives in the flat position, and its transform to the support.

    Parameters
    ----------
    sites : sequence of LatentSite
        In the order of their offsets (sorted by name, as :func:`~pyro_sgmcmc.model.trace.trace_model`
        lays them out).
    dtype, device :
        Of the positions that :meth:`pack` builds.
    """

    def __init__(self, sites: Sequence[LatentSite], dtype: torch.dtype, device: torch.device) -> None:
        self.sites: List[LatentSite] = list(sites)
        self.dtype = dtype
        self.device = device
        self.dim = sum(site.numel for site in self.sites)
        self.site_names: List[str] = [site.name for site in self.sites]
        self.sizes: List[int] = [site.numel for site in self.sites]
        # per site, decided once: the shapes as plain tuples (which Tensor.view and as_strided parse faster
        # than torch.Size), the contiguous strides, and the transform or None for the identity
        self.shapes: List[Tuple[int, ...]] = [tuple(site.unconstrained_shape) for site in self.sites]
        self._views = [
            (site.name, shape, _contiguous_strides(shape), site.offset) for site, shape in zip(self.sites, self.shapes)
        ]
        self._evaluation = [
            (site.name, shape, site.transform if site.has_jacobian else None)
            for site, shape in zip(self.sites, self.shapes)
        ]

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        """The map ``{name: transform}`` from constrained to unconstrained space (Pyro's convention)."""
        return {site.name: site.transform.inv for site in self.sites}

    def unpack(self, position: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Split a flat position ``(..., dim)`` into unconstrained site values ``(..., *shape)`` (views)."""
        if position.dim() == 1 and position.stride(0) == 1:  # one chain (Pyro's sample(), at every step)
            # one strided view per site: one operation each, where split + view takes one more in all and
            # a slower one per site (4.9 against 10.0 us for six sites)
            start = position.storage_offset()
            return {
                name: position.as_strided(shape, stride, start + offset)
                for name, shape, stride, offset in self._views
            }
        batch = tuple(position.shape[:-1])
        parts = position.split(self.sizes, -1)
        return {name: part.reshape(batch + shape) for (name, shape, _, _), part in zip(self._views, parts)}

    def pack(self, params: Mapping[str, torch.Tensor], batch_shape: Tuple[int, ...] = ()) -> torch.Tensor:
        """Concatenate unconstrained site values ``{name: (*batch_shape, *shape)}`` into ``(*batch_shape, dim)``."""
        if not isinstance(params, Mapping):
            raise TypeError(
                f"initial_params must be a dict {{site name: unconstrained tensor}}; got {type(params).__name__}"
            )
        missing = [name for name in self.site_names if name not in params]
        unknown = sorted(set(params) - set(self.site_names))
        if missing or unknown:
            raise ValueError(
                f"initial_params must give exactly the latent sites {self.site_names}; "
                f"missing {missing}, unknown {unknown}"
            )
        parts = []
        for site in self.sites:
            try:
                value = torch.as_tensor(params[site.name], dtype=self.dtype, device=self.device)
            except (TypeError, ValueError, RuntimeError) as error:
                raise TypeError(
                    f"initial_params[{site.name!r}] must be a tensor or array of numbers; got {params[site.name]!r}"
                ) from error
            expected = tuple(batch_shape) + tuple(site.unconstrained_shape)
            if tuple(value.shape) != expected:
                raise ValueError(
                    f"initial_params[{site.name!r}] must have the unconstrained shape {expected}; "
                    f"got {tuple(value.shape)}"
                )
            parts.append(value.reshape(tuple(batch_shape) + (site.numel,)))
        return torch.cat(parts, dim=-1)

    def constrain(self, position: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Map a flat unconstrained position ``(..., dim)`` to constrained site values :math:`T_s(z_s)`."""
        return {site.name: site.transform(u) for site, u in zip(self.sites, self.unpack(position).values())}

    def unconstrain(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The flat position ``(dim,)`` of constrained site values (one chain): :math:`z_s = T_s^{-1}(\\theta_s)`."""
        return torch.cat([s.transform.inv(values[s.name]).reshape(-1) for s in self.sites]).to(self.dtype)

    def constrain_into(self, position: torch.Tensor, values: Dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
        """Write the constrained site values of one chain's ``position`` ``(dim,)`` into ``values`` and
        return :math:`\\log|\\det J_T(z)|` (``None`` when every site has real support).

        The hot path of every evaluation: one split into per-site views (cheaper under vmap than a slice
        per site), and nothing done for the identity (Pyro's own would return ``u`` itself)."""
        log_det = None
        for (name, shape, transform), flat in zip(self._evaluation, position.split(self.sizes)):
            u = flat.view(shape)
            if transform is None:
                values[name] = u
                continue
            x = values[name] = transform(u)
            term = transform.log_abs_det_jacobian(u, x).sum()
            log_det = term if log_det is None else log_det + term
        return log_det


def _contiguous_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (row-major)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
