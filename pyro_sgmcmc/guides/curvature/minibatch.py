r"""The minibatch-Jacobian route (any number of subsampled plates) and the exact Hessian (``"full"``).

The plates are walked in consecutive chunks of their own ``subsample_size`` (every combination
of chunks for several plates; overlaps masked). A *term* is one element of an observed site's
batch shape: the Jacobian of the vector of terms' rows is taken by batched backward passes
(``B`` passes per chunk: for small models). ``"full"`` differentiates the gradient of the
chunk's log-likelihood once more: :math:`H = -\sum_n \nabla^2 \ell_n`, exact, not PSD away from a
maximum.
"""

from __future__ import annotations

import math

import torch

from .kinds import Curvature, LikelihoodCurvature
from .rows import check_ggn_sites, keep_scales, masked_log_prob, observed_sites, site_rows, site_weight, trace_at
from .walk import combinations, jacobian, overlap_mask, progress

__all__ = ["jacobian_sweep", "hessian_sweep"]


def jacobian_sweep(potential, position, kind, num_mc_samples, monte_carlo_fisher,
                   disable_progbar) -> LikelihoodCurvature:  # fmt: skip
    """The curvature from Jacobians of the terms of every chunk combination (see the module)."""
    d = position.shape[0]
    latent_names = set(potential.site_names)
    combos = list(combinations(potential)) or [({}, {})]
    keep_scale = keep_scales(potential, position, combos[0][0]) if kind is not Curvature.DIAG_EF else {}
    if kind is not Curvature.DIAG_EF:
        check_ggn_sites(potential, position, combos[0][0], monte_carlo_fisher)
    curvature = position.new_zeros(d) if kind.is_diagonal else position.new_zeros(d, d)
    loglik, num_terms = position.new_zeros(()), 0
    for indices, flags in progress(combos, len(combos), disable_progbar, "Laplace curvature"):
        with torch.enable_grad():
            z = position.clone().requires_grad_(True)
            trace = trace_at(potential, z, indices)
            rows = []
            for site in observed_sites(trace, latent_names):
                weight = site_weight(site)
                log_prob = masked_log_prob(site)
                mask = overlap_mask(site, log_prob.shape, flags).to(log_prob)
                loglik = loglik + (weight * mask * log_prob).sum().detach()
                num_terms += int(mask.sum())
                lines = site_rows(site, kind, num_mc_samples, keep_scale.get(site["name"], False), monte_carlo_fisher)
                rows.append((math.sqrt(weight) * mask.sqrt().unsqueeze(-1) * lines).reshape(-1))
            rows = torch.cat(rows)
            jac = jacobian(rows, z)
        curvature += (jac**2).sum(0) if kind.is_diagonal else jac.T @ jac
    return LikelihoodCurvature(curvature, loglik, num_terms, "jacobian")


def hessian_sweep(potential, position, disable_progbar) -> LikelihoodCurvature:
    """The exact Hessian of the negative log-likelihood, chunk by chunk (``"full"``)."""
    d = position.shape[0]
    latent_names = set(potential.site_names)
    combos = list(combinations(potential)) or [({}, {})]
    curvature = position.new_zeros(d, d)
    loglik, num_terms = position.new_zeros(()), 0
    for indices, flags in progress(combos, len(combos), disable_progbar, "Laplace curvature"):
        with torch.enable_grad():
            z = position.clone().requires_grad_(True)
            trace = trace_at(potential, z, indices)
            total = z.new_zeros(())
            for site in observed_sites(trace, latent_names):
                log_prob = masked_log_prob(site)
                mask = overlap_mask(site, log_prob.shape, flags).to(log_prob)
                total = total + site_weight(site) * (mask * log_prob).sum()
                num_terms += int(mask.sum())
            loglik += total.detach()
            if total.requires_grad:
                (grad,) = torch.autograd.grad(total, z, create_graph=True)
                curvature -= jacobian(grad, z)
    return LikelihoodCurvature(0.5 * (curvature + curvature.T), loglik, num_terms, "hessian")

