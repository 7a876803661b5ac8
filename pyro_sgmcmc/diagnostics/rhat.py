"""Convergence diagnostics for many short chains: nested R-hat.

Nested R-hat (Margossian, Hoffman, Sountsov, Riou-Durand, Vehtari and Gelman, "Nested R-hat:
assessing the convergence of Markov chain Monte Carlo when running many short chains", Bayesian
Analysis 2024) groups the chains into ``K`` superchains of ``M`` chains each; the chains of a
superchain start from one point and differ only by their randomness. With ``N`` draws per chain,
chain means :math:`\\bar f_{mk}`, superchain means :math:`\\bar f_k` and overall mean :math:`\\bar f`:

.. math::
    B &= \\frac{1}{K - 1} \\sum_k (\\bar f_k - \\bar f)^2, \\\\
    \\tilde B_k &= \\frac{1}{M - 1} \\sum_m (\\bar f_{mk} - \\bar f_k)^2 \\quad (0 \\text{ if } M = 1), \\\\
    \\tilde W_k &= \\frac{1}{M} \\sum_m \\frac{1}{N - 1} \\sum_n (f_{nmk} - \\bar f_{mk})^2
        \\quad (0 \\text{ if } N = 1), \\\\
    W &= \\frac{1}{K} \\sum_k (\\tilde B_k + \\tilde W_k), \\qquad
    \\hat R_\\nu = \\sqrt{1 + B / W}.

``B`` measures how far the superchains still disagree (they forget their starting points only once
the chains have mixed); ``W`` the spread within a superchain. Unlike classic R-hat it is defined
for ``N = 1`` draw per chain (the last state of each of many chains).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Optional, Sequence, Union

import numpy as np
import torch

__all__ = ["nested_rhat", "nested_rhat_threshold"]


def _array_like(data) -> bool:
    return isinstance(data, (torch.Tensor, np.ndarray, list, tuple)) or hasattr(data, "__array__")


def nested_rhat(data, superchain_ids: Optional[Union[Sequence[int], np.ndarray, torch.Tensor]] = None, var_names=None):
    """Nested R-hat of every parameter.

    Parameters
    ----------
    data : array, InferenceData, xarray.Dataset, MCMC run or dict of arrays
        Draws with axes ``(chain, draw, *parameter_shape)`` (NumPy or torch), a dict of such
        arrays, an ``arviz.InferenceData`` (its ``posterior`` group) or ``xarray.Dataset`` with
        ``chain`` and ``draw`` dims, or a finished :class:`pyro_sgmcmc.MCMC` or
        :class:`pyro.infer.MCMC` run (Pyro's has no superchains: pass ``superchain_ids``).
    superchain_ids : sequence of int, optional
        The superchain of each chain (``K`` groups of equal size ``M``). By default read from the
        data (``MCMC.superchain_ids``, or the ``superchain`` coordinate that
        :func:`pyro_sgmcmc.to_inference_data` writes on the ``chain`` dim); if the data carry none,
        every chain is its own superchain (``M = 1``).
    var_names : list of str, optional
        Only these variables (for dict, InferenceData, Dataset and MCMC input).

    Returns
    -------
    xarray.Dataset or ndarray
        As ``arviz.rhat`` does: for named input (a dict, an MCMC run, InferenceData or a Dataset),
        an ``xarray.Dataset`` with one variable per parameter, whose dims are the parameter dims
        (those of the Dataset, or ArviZ's defaults ``<name>_dim_0``, ``<name>_dim_1``, ... with
        integer coordinates for a dict or an MCMC run); for a bare array, an ndarray of shape
        ``parameter_shape``. ``result["x"]`` is then an ``xarray.DataArray``: ``float(...)`` of a
        scalar parameter's, ``.values`` for an array.

    Notes
    -----
    Thresholds. :math:`\\hat R_\\nu` is bounded below: with one draw per chain and perfectly mixed
    chains, :math:`W \\approx \\sigma^2` and :math:`B \\approx \\sigma^2 / M`, so
    :math:`\\hat R_\\nu \\approx \\sqrt{1 + 1/M}`. The authors recommend :math:`\\hat R_\\nu < 1.01`,
    which needs ``M`` of about 50 or more when ``N = 1``; for smaller ``M`` use the floor-aware
    threshold :math:`\\sqrt{1 + 1/M + \\tau}` with :math:`\\tau = 10^{-4}`
    (:func:`nested_rhat_threshold`). Both describe the *expected* value for mixed chains; with few
    superchains ``B`` is itself noisy (about :math:`\\sigma^2 \\chi^2_{K-1} / ((K-1) M)`), so use
    ``K`` of 8 or more and read values just above the threshold with that spread in mind. Values
    well above it (e.g. 1.2) mean the superchains have not forgotten their starting points: more
    warmup, or a bigger step size, is needed.

    ArviZ's R-hat (``arviz.rhat``, ``arviz.summary``) compares chains, not superchains: at
    stationarity it is about :math:`1 + (\\tau_{\\mathrm{int}} - 1) / N` for ``N`` draws per chain
    with integrated autocorrelation time :math:`\\tau_{\\mathrm{int}}`, however many chains there
    are, so short chains stay above its 1.01 rule after they have mixed. "Which R-hat to believe"
    in the concepts page derives both and measures them on one run.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> mixed = rng.normal(size=(64, 1))                   # 64 chains, one draw each
    >>> superchains = np.repeat(np.arange(8), 8)           # K = 8 superchains of M = 8 chains
    >>> round(float(nested_rhat(mixed, superchains)), 3)  # floor sqrt(1 + 1/8) = 1.06, plus noise
    1.155
    >>> stuck = mixed + np.repeat([0.0, 3.0], 32)[:, None]  # half of the superchains in another mode
    >>> round(float(nested_rhat(stuck, superchains)), 3)
    2.449
    >>> named = nested_rhat({"x": stuck}, superchains)    # named input: a Dataset, as from arviz.rhat
    >>> type(named).__name__, named["x"].dims, round(float(named["x"]), 3)
    ('Dataset', (), 2.449)
    """
    import pyro.infer  # local: pyro.infer is heavier than this module

    from ..mcmc import MCMC  # local: pyro_sgmcmc.mcmc imports this package

    if isinstance(data, (MCMC, pyro.infer.MCMC)):  # ours (with its superchains) or Pyro's (every chain its own)
        ids = getattr(data, "superchain_ids", None) if superchain_ids is None else superchain_ids
        samples = data.get_samples(group_by_chain=True)
        names = var_names or list(samples)
        return _named_dataset({name: _nested_rhat_array(samples[name], ids) for name in names})
    readable = isinstance(data, dict) or hasattr(data, "posterior") or hasattr(data, "data_vars")
    if not (readable or _array_like(data)):
        raise TypeError(
            "nested_rhat: data must be an array of draws (chain, draw, ...), a dict of them, an "
            f"arviz.InferenceData, an xarray.Dataset or an MCMC run; got {type(data).__name__}"
        )
    if isinstance(data, dict):
        names = var_names or list(data)
        return _named_dataset({name: _nested_rhat_array(data[name], superchain_ids) for name in names})
    if hasattr(data, "posterior") and hasattr(data, "groups"):  # arviz.InferenceData
        data = data.posterior
    if hasattr(data, "data_vars"):  # xarray.Dataset
        import xarray as xr

        if superchain_ids is None and "superchain" in data.coords:
            superchain_ids = data.coords["superchain"].values
        names = var_names or list(data.data_vars)
        out = {}
        for name in names:
            array = data[name].transpose("chain", "draw", ...)
            value = _nested_rhat_array(array.values, superchain_ids)
            out[name] = xr.DataArray(
                value, dims=array.dims[2:], coords={d: array.coords[d] for d in array.dims[2:] if d in array.coords}
            )
        return xr.Dataset(out)
    return _nested_rhat_array(data, superchain_ids)


def _named_dataset(values: dict):
    """An ``xarray.Dataset`` of per-parameter values, with ArviZ's default dims ``<name>_dim_<i>``
    (and integer coordinates), as ``arviz.from_dict`` names a variable's parameter axes."""
    import xarray as xr

    variables = {}
    for name, value in values.items():
        dims = [f"{name}_dim_{i}" for i in range(value.ndim)]
        coords = {dim: np.arange(size) for dim, size in zip(dims, value.shape)}
        variables[name] = xr.DataArray(value, dims=dims, coords=coords)
    return xr.Dataset(variables)


def nested_rhat_threshold(chains_per_superchain: int, num_draws: int = 1, tau: float = 1e-4) -> float:
    """A convergence threshold for nested R-hat that respects its floor.

    With ``M`` chains per superchain and ``N`` (independent) draws per chain, perfectly mixed chains
    give :math:`\\hat R_\\nu \\approx \\sqrt{1 + 1/(M N)}`. The threshold is
    :math:`\\max(1.01, \\sqrt{1 + 1/(M N) + \\tau})`: the floor plus a tolerance :math:`\\tau`
    (``1e-4`` after Margossian et al.), and never below the authors' 1.01. For ``N = 1`` it is
    :math:`\\sqrt{1 + 1/M + \\tau}` whenever ``M < 50``.
    """
    if (
        isinstance(chains_per_superchain, bool)
        or not isinstance(chains_per_superchain, int)
        or chains_per_superchain < 1
    ):
        raise ValueError(f"chains_per_superchain must be a positive integer; got {chains_per_superchain!r}")
    if isinstance(num_draws, bool) or not isinstance(num_draws, int) or num_draws < 1:
        raise ValueError(f"num_draws must be a positive integer; got {num_draws!r}")
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau must be a finite float >= 0; got {tau!r}")
    count = chains_per_superchain * num_draws
    return max(1.01, math.sqrt(1.0 + (1.0 / count if count < 1e300 else 0.0) + tau))


def _nested_rhat_array(data, superchain_ids) -> np.ndarray:
    draws = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    if draws.dtype.kind not in "biuf":
        raise TypeError(f"data must hold real numbers; got an array of dtype {draws.dtype}")
    if draws.ndim < 2 or draws.shape[0] == 0 or draws.shape[1] == 0:
        raise ValueError(
            f"data must have axes (chain, draw, ...) with at least one chain and one draw; got shape {draws.shape}"
        )
    num_chains, num_draws = draws.shape[:2]
    ids = np.arange(num_chains) if superchain_ids is None else _as_ids(superchain_ids)
    if ids.shape != (num_chains,):
        raise ValueError(f"superchain_ids must have one entry per chain ({num_chains}); got shape {ids.shape}")
    labels, ids = np.unique(ids, return_inverse=True)
    counts = np.bincount(ids)
    if counts.min() != counts.max():
        raise ValueError(
            f"superchain_ids: every superchain must hold the same number of chains; got sizes {counts.tolist()}"
        )
    num_superchains, per_superchain = len(labels), int(counts[0])
    if num_superchains < 2:
        raise ValueError("superchain_ids: nested R-hat needs at least 2 superchains")
    if per_superchain == 1 and num_draws == 1:
        raise ValueError(
            "superchain_ids: with one draw per chain, each superchain needs several chains (W is 0 otherwise); "
            "run with num_superchains < num_chains"
        )
    order = np.argsort(ids, kind="stable")
    grouped = draws[order].reshape(num_superchains, per_superchain, num_draws, *draws.shape[2:]).astype(np.float64)
    # centre and scale each parameter: the ratio B / W is invariant, and tiny or huge values do not underflow
    grouped = grouped - grouped.mean(axis=(0, 1, 2))
    scale = np.abs(grouped).max(axis=(0, 1, 2))
    grouped = grouped / np.where(scale > 0, scale, 1.0)
    chain_means = grouped.mean(axis=2)  # (K, M, ...)
    superchain_means = chain_means.mean(axis=1)  # (K, ...)
    between_superchains = superchain_means.var(axis=0, ddof=1)
    between_chains = chain_means.var(axis=1, ddof=1) if per_superchain > 1 else np.zeros_like(superchain_means)
    within_chains = grouped.var(axis=2, ddof=1).mean(axis=1) if num_draws > 1 else np.zeros_like(superchain_means)
    within = (between_chains + within_chains).mean(axis=0)
    constant = (within == 0) & (between_superchains == 0)
    if np.any(constant):
        warnings.warn("nested_rhat: some parameters are constant over all draws; their value is NaN", RuntimeWarning)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(1.0 + between_superchains / within)


def _as_ids(superchain_ids) -> np.ndarray:
    if isinstance(superchain_ids, torch.Tensor):
        superchain_ids = superchain_ids.cpu().numpy()
    try:
        ids = np.asarray(superchain_ids).reshape(-1)
    except Exception as error:
        raise TypeError(f"superchain_ids must be a sequence of integer labels; got {superchain_ids!r}") from error
    if ids.dtype.kind not in "biu":
        if ids.dtype.kind == "f" and np.all(np.isfinite(ids)) and np.all(ids == np.round(ids)):
            return ids.astype(np.int64)
        raise TypeError(f"superchain_ids must be integer labels, one per chain; got {superchain_ids!r}")
    return ids
