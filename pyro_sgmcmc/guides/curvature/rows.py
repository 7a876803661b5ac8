r"""The rows of each curvature estimator: what a sweep differentiates, example by example.

Every estimator writes the curvature of :math:`-\sum_n \ell_n` as :math:`\sum_n \sum_k \nabla r_{nk}
\nabla r_{nk}^\top` for some *rows* :math:`r_{nk}(\theta)`, so one sweep serves them all:

* **empirical Fisher** (``diag_ef``): one row per example, :math:`r_n = \ell_n = \log p(y_n\mid\theta)`;
* **GGN / exact Fisher** (``*_ggn``, ``kron``): :math:`r_{nk} = (A^\top f_n)_k` with
  :math:`F(f_n) = A A^\top` held constant (:func:`exact_fisher_rows`), so that
  :math:`\sum_k \nabla r_{nk} \nabla r_{nk}^\top = J_n^\top F J_n`;
* **Monte Carlo Fisher** (any other likelihood, or ``monte_carlo_fisher=True``):
  :math:`r_{ns} = \log p(\hat y_s \mid \theta) / \sqrt S`, :math:`\hat y_s \sim p(y \mid f_n)`
  (:func:`monte_carlo_fisher_rows`), an unbiased estimate of the same matrix.

The likelihood terms carry the site's own scale :math:`w` (``poutine.scale``) without the
:math:`N/B` of a subsampled plate (:func:`site_weight`): rows are multiplied by :math:`\sqrt w`.
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence

import pyro.poutine as poutine
import torch
from pyro.distributions import Unit
from pyro.distributions.torch_distribution import ExpandedDistribution, MaskedDistribution
from pyro.poutine.util import site_is_subsample
from torch.distributions import Independent

from ..._compat import distribution_mask
from .kinds import Curvature, UserFacingError

__all__ = [
    "trace_at",
    "trace_sites",
    "observed_sites",
    "site_weight",
    "masked_log_prob",
    "exact_fisher_rows",
    "monte_carlo_fisher_rows",
    "site_rows",
    "keep_scales",
    "check_ggn_sites",
    "WRAPPERS",
]

#: Distributions that wrap another one without changing its Fisher information per element.
WRAPPERS = (Independent, MaskedDistribution, ExpandedDistribution)
_EXACT = (torch.distributions.Normal, torch.distributions.Bernoulli, torch.distributions.Categorical)


def trace_sites(potential, unconstrained: Sequence[torch.Tensor], indices: Dict[str, torch.Tensor]):
    """Trace the model at per-site unconstrained values (one tensor per site, potential order)."""
    data = dict(indices)
    for site, u in zip(potential.sites, unconstrained):
        data[site.name] = site.transform(u)
    model = poutine.condition(potential.model, data=data)
    return poutine.trace(model).get_trace(*potential.model_args, **potential.model_kwargs)


def trace_at(potential, position: torch.Tensor, indices: Dict[str, torch.Tensor]):
    """Trace the model at the flat unconstrained ``position`` with the given plate indices."""
    values = [position[site.slice].reshape(site.unconstrained_shape) for site in potential.sites]
    return trace_sites(potential, values, indices)


def observed_sites(trace, latent_names) -> List[dict]:
    """The observed sample sites of ``trace`` (the likelihood), plate subsample sites excluded."""
    return [
        site for name, site in trace.nodes.items() if site["type"] == "sample" and site["is_observed"]
        and name not in latent_names and not site_is_subsample(site)
    ]  # fmt: skip


def site_weight(site) -> float:
    """The site's own scale: ``site["scale"]`` without the ``size / subsample_size`` of its plates."""
    plate_factor = 1.0
    for frame in site["cond_indep_stack"]:
        if frame.full_size is not None and frame.size not in (None, 0):
            plate_factor *= frame.full_size / frame.size
    return site["scale"] / plate_factor


def masked_log_prob(site) -> torch.Tensor:
    """``log p(value)`` of a site with its ``poutine.mask`` applied (masked elements give 0)."""
    log_prob = site["fn"].log_prob(site["value"])
    mask = site["mask"]
    if mask is not None and mask is not True:
        log_prob = torch.where(torch.as_tensor(mask, device=log_prob.device), log_prob, torch.zeros_like(log_prob))
    return log_prob


def _unwrap(fn):
    while isinstance(fn, WRAPPERS):
        fn = fn.base_dist
    return fn


def exact_fisher_rows(fn, keep_scale: bool) -> torch.Tensor:
    r"""Whitened outputs ``v`` (``batch_shape + (K,)``) with :math:`\sum_k \nabla v_k \nabla v_k^\top = J^\top F J`.

    ``v = A^T f`` with ``F = A A^T`` evaluated at the current point and held constant (detached):
    ``Normal(loc, scale)``: ``loc / sigma`` and, if the scale depends on theta, ``sqrt(2) scale / sigma``;
    ``Bernoulli``: ``sqrt(p (1 - p)) * logit``; ``Categorical``: ``sqrt(p_k) (l_k - sum_j p_j l_j)``
    (``l`` the normalised logits). ``fn`` must be one of these three (unwrapped).
    """
    if isinstance(fn, torch.distributions.Normal):
        sigma = fn.scale.detach()
        columns = [fn.loc.expand(fn.batch_shape) / sigma]
        if keep_scale:
            columns.append(math.sqrt(2.0) * fn.scale.expand(fn.batch_shape) / sigma)
        return torch.stack(columns, dim=-1)
    if isinstance(fn, torch.distributions.Bernoulli):
        p = torch.sigmoid(fn.logits.detach())
        return (torch.sqrt(p * (1 - p)) * fn.logits).unsqueeze(-1)
    logits = fn.logits  # Categorical: normalised by torch, log-probabilities
    p = logits.detach().exp()
    return p.sqrt() * (logits - (p * logits).sum(-1, keepdim=True))


def monte_carlo_fisher_rows(fn, num_mc_samples: int) -> torch.Tensor:
    r"""``log p(y_s | theta) / sqrt(S)`` for ``S`` labels :math:`\hat y_s` drawn from ``fn``: ``batch_shape + (S,)``."""
    try:
        labels = fn.sample((num_mc_samples,)).detach()
    except NotImplementedError as error:
        raise ValueError(
            f"curvature 'diag_ggn'/'full_ggn' needs to sample the likelihood {type(fn).__name__} for "
            "Monte Carlo labels and it cannot be sampled; use curvature='diag_ef'"
        ) from error
    return fn.log_prob(labels).movedim(0, -1) / math.sqrt(num_mc_samples)


def _fisher_rows(fn, num_mc_samples: int, keep_scale: bool, monte_carlo_fisher: bool) -> torch.Tensor:
    """GGN rows of a (possibly wrapped) distribution: exact where known, else Monte Carlo labels."""
    if isinstance(fn, WRAPPERS):
        rows = _fisher_rows(fn.base_dist, num_mc_samples, keep_scale, monte_carlo_fisher)
        if isinstance(fn, Independent):
            return rows.reshape(fn.batch_shape + (-1,))
        if isinstance(fn, ExpandedDistribution):
            return rows.expand(fn.batch_shape + rows.shape[-1:])
        mask = distribution_mask(fn)
        if isinstance(mask, bool):
            return rows if mask else torch.zeros_like(rows)
        return rows * mask.expand(fn.batch_shape).unsqueeze(-1).to(rows.dtype)
    if isinstance(fn, _EXACT) and not monte_carlo_fisher:
        return exact_fisher_rows(fn, keep_scale)
    return monte_carlo_fisher_rows(fn, num_mc_samples)


def site_rows(site, kind: Curvature, num_mc_samples: int, keep_scale: bool, monte_carlo_fisher: bool) -> torch.Tensor:
    """Rows of one observed site, shape ``batch_shape + (K,)`` (weights not applied)."""
    if kind is Curvature.DIAG_EF:
        return masked_log_prob(site).unsqueeze(-1)
    rows = _fisher_rows(site["fn"], num_mc_samples, keep_scale, monte_carlo_fisher)
    mask = site["mask"]
    if mask is not None and mask is not True:
        rows = rows * torch.as_tensor(mask, device=rows.device).expand(rows.shape[:-1]).unsqueeze(-1).to(rows.dtype)
    return rows


def keep_scales(potential, position, indices) -> Dict[str, bool]:
    """Which observed Normal sites have a scale that depends on theta (outside any transform)."""
    with torch.enable_grad():
        trace = trace_at(potential, position.detach().requires_grad_(True), indices)
    return {
        site["name"]: isinstance(_unwrap(site["fn"]), torch.distributions.Normal)
        and _unwrap(site["fn"]).scale.requires_grad
        for site in observed_sites(trace, potential.site_names)
    }


def check_ggn_sites(potential, position, indices, monte_carlo_fisher: bool) -> None:
    """Every likelihood without an exact Fisher here must be sampleable (Monte Carlo labels)."""
    with torch.no_grad():
        trace = trace_at(potential, position, indices)
    for site in observed_sites(trace, potential.site_names):
        fn = _unwrap(site["fn"])
        if isinstance(fn, _EXACT) and not monte_carlo_fisher:
            continue
        try:
            if isinstance(fn, Unit):  # pyro.factor: a log-density without a distribution over data
                raise NotImplementedError
            fn.sample()
        except NotImplementedError:
            raise UserFacingError(
                f"observed site {site['name']!r} ({type(fn).__name__}) cannot be sampled, so its Fisher "
                "cannot be estimated with Monte Carlo labels; use curvature='diag_ef'"
            ) from None
