r"""The per-example route: exact per-example gradients of the rows, one chunk of the plate at a time.

For a model with one subsampled plate the model runs on a chunk of ``subsample_size`` examples
(the plate always gets a subsample of the length it declares), the rows of every estimator
(:mod:`~pyro_sgmcmc.guides.curvature.rows`) are gathered *per example*, ``(B, K)``, and batched
backward passes with one-hot cotangents give :math:`\nabla r_{nk}` for every example and column:

.. math:: H_{\mathrm{diag}} = \sum_n \sum_k (\nabla r_{nk})^{\circ 2}, \qquad
          H_{\mathrm{full}} = \sum_n \sum_k \nabla r_{nk} \nabla r_{nk}^\top .

The empirical Fisher has one row per example, :math:`r_n = \sum_{\text{sites}} \ell_n`: the
squared gradient of the example's whole log-likelihood. A site outside the plate is one term,
counted with example 0. Each batched call handles at most ``VMAP_BUDGET`` gradient entries, so
the diagonal needs :math:`O(d)` memory beyond that.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import pyro
import torch

from .kinds import Curvature, LikelihoodCurvature
from .rows import check_ggn_sites, keep_scales, masked_log_prob, observed_sites, site_rows, site_weight, trace_sites
from .walk import VMAP_BUDGET, chunks, or_zeros, progress, site_values

__all__ = ["per_example_sweep", "chunk_curvature", "example_rows"]


def example_rows(
    trace, latent_names, plate_name: str, kind: Curvature, num_mc_samples: int, keep_scale: Dict[str, bool],
    monte_carlo_fisher: bool, first: bool, batch: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows ``(B, K)`` (one line per example of the chunk) and the weighted log-likelihood per example ``(B,)``.

    ``first``: this chunk holds example 0, which also carries the sites outside the plate.
    """  # fmt: skip
    rows, loglik = [], None
    for site in observed_sites(trace, latent_names):
        frames = [f for f in site["cond_indep_stack"] if f.name == plate_name]
        weight = float(site_weight(site))
        log_prob = masked_log_prob(site)
        srows = site_rows(site, kind, num_mc_samples, keep_scale.get(site["name"], False), monte_carlo_fisher)
        if frames:  # one line per example: move the plate's axis first
            axis = log_prob.dim() + frames[0].dim
            per_example = log_prob.movedim(axis, 0).reshape(batch, -1).sum(-1)
            lines = srows.movedim(axis, 0).reshape(batch, -1)
        else:  # a term outside the plate: example 0 of the first chunk carries it
            count = float(first)
            per_example = torch.cat([(count * log_prob.sum()).reshape(1), log_prob.new_zeros(batch - 1)])
            flat = (count * srows).reshape(1, -1)
            lines = torch.cat([flat, flat.new_zeros(batch - 1, flat.shape[1])])
        term = weight * per_example
        loglik = term if loglik is None else loglik + term
        lines = math.sqrt(weight) * lines
        rows.append(lines.sum(-1, keepdim=True) if kind is Curvature.DIAG_EF else lines)
    rows = torch.cat(rows, dim=-1)
    if kind is Curvature.DIAG_EF:
        rows = rows.sum(-1, keepdim=True)
    return rows, loglik


def chunk_curvature(potential, position, plate_name: str, index: torch.Tensor, keep: torch.Tensor, first: bool,
                    kind: Curvature, num_mc_samples: int, keep_scale, monte_carlo_fisher: bool):
    """The curvature ``(d,)`` or ``(d, d)`` and log-likelihood of the examples ``index[keep]`` of one chunk."""
    d = position.shape[0]
    diagonal = kind.is_diagonal
    total = position.new_zeros(d) if diagonal else position.new_zeros(d, d)
    with torch.enable_grad():
        leaves = [v.detach().clone().requires_grad_(True) for v in site_values(potential, position)]
        trace = trace_sites(potential, leaves, {plate_name: index})
        rows, loglik = example_rows(trace, set(potential.site_names), plate_name, kind, num_mc_samples, keep_scale,
                                    monte_carlo_fisher, first, index.shape[0])  # fmt: skip
        loglik = (loglik * keep.to(loglik.dtype)).sum().detach()
        flat = rows[keep].reshape(-1)
        if not flat.requires_grad:
            return total, loglik
        step = max(1, VMAP_BUDGET // max(d, 1))
        for start in range(0, flat.shape[0], step):
            count = min(step, flat.shape[0] - start)
            basis = flat.new_zeros(count, flat.shape[0])
            basis[torch.arange(count), start + torch.arange(count)] = 1.0
            try:
                grads = torch.autograd.grad(flat, leaves, grad_outputs=basis, retain_graph=True,
                                            is_grads_batched=True, allow_unused=True)  # fmt: skip
            except RuntimeError:  # an op without a batching rule: one backward pass per row
                singles = [torch.autograd.grad(flat, leaves, grad_outputs=b, retain_graph=True, allow_unused=True)
                           for b in basis]  # fmt: skip
                grads = [None if g[0] is None else torch.stack(g) for g in zip(*singles)]
            jac = torch.cat([
                or_zeros(g, leaf.new_zeros(count, *leaf.shape)).reshape(count, -1) for g, leaf in zip(grads, leaves)
            ], dim=1).detach()  # fmt: skip
            total += (jac**2).sum(0) if diagonal else jac.T @ jac
    return total, loglik


def per_example_sweep(potential, position, kind: Curvature, num_mc_samples: int, monte_carlo_fisher: bool,
                      disable_progbar: bool) -> LikelihoodCurvature:
    """The curvature on the full data from per-example gradients, chunk by chunk (see the module)."""
    (plate,) = potential.subsample_plates
    first_indices = {plate.name: torch.arange(plate.subsample_size, device=position.device)}
    keep_scale = keep_scales(potential, position, first_indices) if kind is not Curvature.DIAG_EF else {}
    if kind is not Curvature.DIAG_EF:
        check_ggn_sites(potential, position, first_indices, monte_carlo_fisher)
    d = position.shape[0]
    curvature = position.new_zeros(d) if kind.is_diagonal else position.new_zeros(d, d)
    loglik = position.new_zeros(())
    pieces = chunks(plate.size, plate.subsample_size, position.device)
    with pyro.validation_enabled(False):
        for number, (index, new) in enumerate(progress(pieces, len(pieces), disable_progbar, "Laplace curvature")):
            part, ll = chunk_curvature(potential, position, plate.name, index, new, number == 0, kind,
                                       num_mc_samples, keep_scale, monte_carlo_fisher)  # fmt: skip
            curvature += part
            loglik += ll
    return LikelihoodCurvature(curvature, loglik, plate.size, "per-example")
