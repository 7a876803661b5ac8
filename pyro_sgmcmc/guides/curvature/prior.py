"""The prior's terms in unconstrained space: log density, gradient, exact negative Hessian and mean."""

from __future__ import annotations

import torch

from .kinds import PriorTerms
from .rows import WRAPPERS, masked_log_prob, trace_at
from .walk import jacobian, or_zeros

__all__ = ["prior_terms"]


def _is_elementwise(site, fn) -> bool:
    """True when the site's prior and transform act element by element (a diagonal prior Hessian block)."""
    while isinstance(fn, WRAPPERS):
        fn = fn.base_dist
    if tuple(fn.event_shape) != ():
        return False
    transform = site.transform
    while isinstance(transform, torch.distributions.transforms.IndependentTransform):
        transform = transform.base_transform
    parts = transform.parts if isinstance(transform, torch.distributions.transforms.ComposeTransform) else [transform]
    return all(p.domain.event_dim == 0 and p.codomain.event_dim == 0 for p in parts)


def _prior_mean(site, fn, dtype) -> torch.Tensor:
    """The prior mean of a real site (unconstrained = constrained), 0 for constrained sites."""
    zeros = torch.zeros(site.numel, dtype=dtype)
    if site.has_jacobian:
        return zeros
    try:
        mean = fn.mean.detach()
        mean = mean.expand(site.unconstrained_shape).reshape(-1).to(dtype)
    except (NotImplementedError, RuntimeError, AttributeError):
        return zeros
    return mean if torch.isfinite(mean).all() else zeros


def prior_terms(potential, position: torch.Tensor, full: bool = False) -> PriorTerms:
    """Log prior (unconstrained space), its gradient, its negative Hessian and the prior means.

    The negative Hessian is exact: for a site whose prior and constraining transform act element
    by element (``Normal(...).expand(...).to_event(k)``, a positive site with an ``exp`` transform,
    ...) its diagonal block is diagonal and one Hessian-vector product with the site's indicator
    gives it; other sites (``MultivariateNormal``, simplex, ...) get one product per coordinate.
    For a ``Normal(m, sigma)`` prior the result is the precision ``1 / sigma^2``.

    Parameters
    ----------
    potential : ModelPotential
    position : Tensor ``(d,)``
    full : bool
        Return the dense ``(d, d)`` negative Hessian instead of its diagonal.
    """
    indices = {p.name: torch.arange(p.subsample_size, device=position.device) for p in potential.subsample_plates}
    with torch.enable_grad():
        z = position.detach().clone().requires_grad_(True)
        trace = trace_at(potential, z, indices)
        log_density = z.new_zeros(())
        fns = {}
        for site in potential.sites:
            node = trace.nodes[site.name]
            fns[site.name] = node["fn"]
            log_prob = masked_log_prob(node)
            log_density = log_density + (node["scale"] * log_prob).sum()
            if site.has_jacobian:
                u = z[site.slice].reshape(site.unconstrained_shape)
                log_density = log_density + site.transform.log_abs_det_jacobian(u, node["value"]).sum()
        if log_density.requires_grad:
            (grad,) = torch.autograd.grad(log_density, z, create_graph=True, allow_unused=True)
            grad = or_zeros(grad, z)
        else:
            grad = torch.zeros_like(z)
        d = z.shape[0]
        if not grad.requires_grad:
            curvature = z.new_zeros(d, d) if full else z.new_zeros(d)
        elif full:
            curvature = -jacobian(grad, z)
            curvature = 0.5 * (curvature + curvature.T)
        else:
            curvature = z.new_zeros(d)
            for site in potential.sites:
                block = grad[site.slice]
                if _is_elementwise(site, fns[site.name]):
                    (hv,) = torch.autograd.grad(block.sum(), z, retain_graph=True, allow_unused=True)
                    curvature[site.slice] = -or_zeros(hv, z)[site.slice].detach()
                else:
                    rows = jacobian(block, z)[:, site.slice]
                    curvature[site.slice] = -rows.diagonal()
    mean = torch.cat([_prior_mean(site, fns[site.name], position.dtype) for site in potential.sites])
    return PriorTerms(log_density.detach(), grad.detach(), curvature.detach(), mean.to(position.device))
