r"""Pyro's run summary (``n_eff``, ``r_hat``, mean, sd, interval) in memory linear in the draws.

:meth:`pyro_sgmcmc.MCMC.summary` and :meth:`~pyro_sgmcmc.MCMC.diagnostics` give the numbers of
:func:`pyro.infer.mcmc.util.summary` and :func:`pyro.infer.mcmc.util.diagnostics`. Those call
:func:`pyro.ops.stats.effective_sample_size`, whose running minimum of the autocorrelation pairs
builds an ``(n, n)`` mask: 20 GB for one chain of 100,000 draws, far beyond the length of an
SG-MCMC run. :func:`effective_sample_size` here is the same estimator (Geyer's initial monotone
sequence, Stan's multi-chain autocorrelation) with the running minimum taken by
:func:`torch.cummin`, in ``O(n)`` memory.

With ``C`` chains of ``N`` draws, chain means :math:`\bar x_c`, chain variances :math:`s_c^2` and
per-chain autocovariances :math:`\gamma_{k,c}` at lag ``k``:

.. math::
    W = \frac1C \sum_c s_c^2, \qquad
    \widehat{\mathrm{var}} = \frac{N - 1}{N} W + \mathrm{var}_c(\bar x_c) \;(C > 1), \qquad
    \rho_k = \frac{\widehat{\mathrm{var}} - W + \frac1C \sum_c \gamma_{k,c}}{\widehat{\mathrm{var}}},

(with ``C = 1``, :math:`W = \widehat{\mathrm{var}}`), :math:`\rho_0 = 1`. The pair sums
:math:`P_m = \rho_{2m} + \rho_{2m+1}` are clipped at 0 and made non-increasing by a running minimum
(from :math:`m = 1`), and

.. math::
    \hat\tau = -1 + 2 P_0 + 2 \sum_{m \ge 1} \min_{1 \le j \le m} \max(P_j, 0), \qquad
    n_\mathrm{eff} = C N / \hat\tau.
"""

from __future__ import annotations

import traceback
import warnings
from collections import OrderedDict
from itertools import product
from typing import Dict

import pyro.ops.stats as stats
import torch

__all__ = ["effective_sample_size", "diagnostics", "summary", "print_summary"]


def effective_sample_size(draws: torch.Tensor) -> torch.Tensor:
    """Effective sample size of draws ``(chains, draws, *shape)``: Pyro's estimator in ``O(n)`` memory.

    Parameters
    ----------
    draws : Tensor
        At least two draws per chain.

    Returns
    -------
    Tensor of shape ``draws.shape[2:]``
        Equal to :func:`pyro.ops.stats.effective_sample_size` (``chain_dim=0, sample_dim=1``).
    """
    if draws.dim() < 2 or draws.shape[1] < 2:
        raise ValueError(f"effective_sample_size needs (chains, draws >= 2, ...) draws; got shape {tuple(draws.shape)}")
    values = draws.transpose(0, 1)  # (N, C, *shape)
    num_draws, num_chains = values.shape[0], values.shape[1]
    autocovariance = stats.autocovariance(values, dim=0)  # (N, C, *shape)
    var_within = values.var(dim=0).mean(dim=0)
    var_estimator = (num_draws - 1) / num_draws * var_within
    if num_chains > 1:
        var_estimator = var_estimator + values.mean(dim=0).var(dim=0)
    else:
        var_within = var_estimator
    rho = (var_estimator - var_within + autocovariance.mean(dim=1)) / var_estimator
    rho[0] = 1
    even = rho if num_draws % 2 == 0 else rho[:-1]
    pairs = even.reshape((num_draws // 2, 2) + even.shape[1:]).sum(dim=1)
    tau = -1 + 2 * pairs[0]
    if pairs.shape[0] > 1:
        tau = tau + 2 * torch.cummin(pairs[1:].clamp(min=0), dim=0).values.sum(dim=0)
    return num_chains * num_draws / tau


def _safe_ess(draws: torch.Tensor) -> torch.Tensor:
    """:func:`effective_sample_size`, or NaN with a warning when it fails (as Pyro's summary does)."""
    try:
        return effective_sample_size(draws)
    except Exception:
        warnings.warn(traceback.format_exc())
        return torch.full(draws.shape[2:], float("nan"), dtype=draws.dtype, device=draws.device)


def diagnostics(samples: Dict[str, torch.Tensor]) -> Dict[str, "OrderedDict[str, torch.Tensor]"]:
    """``n_eff`` and split ``r_hat`` of each site's draws ``(chains, draws, *shape)``, as Pyro's ``diagnostics``."""
    out = {}
    for name, value in samples.items():
        out[name] = OrderedDict(n_eff=_safe_ess(value), r_hat=stats.split_gelman_rubin(value))
    return out


def summary(samples: Dict[str, torch.Tensor], prob: float = 0.9) -> Dict[str, "OrderedDict[str, torch.Tensor]"]:
    """Pyro's :func:`~pyro.infer.mcmc.util.summary` of draws ``(chains, draws, *shape)``, in linear memory.

    Per site: mean, std, median, the ``prob`` highest-density interval (:func:`pyro.ops.stats.hpdi`),
    ``n_eff`` (:func:`effective_sample_size`) and split ``r_hat``.
    """
    out = {}
    for name, value in samples.items():
        flat = value.reshape((-1,) + value.shape[2:])
        lower, upper = stats.hpdi(flat, prob=prob)
        out[name] = OrderedDict(
            [
                ("mean", flat.mean(dim=0)),
                ("std", flat.std(dim=0)),
                ("median", flat.median(dim=0)[0]),
                (f"{50 * (1 - prob):.1f}%", lower),
                (f"{50 * (1 + prob):.1f}%", upper),
                ("n_eff", _safe_ess(value)),
                ("r_hat", stats.split_gelman_rubin(value)),
            ]
        )
    return out


def print_summary(samples: Dict[str, torch.Tensor], prob: float = 0.9) -> None:
    """Print :func:`summary` as Pyro's :func:`~pyro.infer.mcmc.util.print_summary` lays it out."""
    if not samples:
        return
    table = summary(samples, prob)
    rows = {k: k + "[" + ",".join(str(n - 1) for n in v.shape[2:]) + "]" for k, v in samples.items()}
    name_format = "{:>" + str(max(max(len(r) for r in rows.values()), 10)) + "}"
    columns = [""] + list(next(iter(table.values())).keys())
    print()
    print((name_format + " {:>9}" * 7).format(*columns))
    row_format = name_format + " {:>9.2f}" * 7
    for name, values in table.items():
        shape = values["mean"].shape
        if len(shape) == 0:
            print(row_format.format(name, *values.values()))
            continue
        for index in product(*map(range, shape)):
            label = name + "[" + ",".join(map(str, index)) + "]"
            print(row_format.format(label, *[v[index] for v in values.values()]))
    print()
