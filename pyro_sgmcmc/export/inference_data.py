"""Export an SG-MCMC run to :class:`arviz.InferenceData`.

The draws and sampling statistics are copied as they are. Everything that depends on the data
(``log_likelihood``, ``observed_data``, ``posterior_predictive``) is recomputed on the *full* data, all
draws in vectorised blocks of bounded memory, in the model's dtype
(:mod:`~pyro_sgmcmc.export.pointwise`); the in-memory groups are checked against a memory cap before
anything is allocated, and the log-likelihood can go to a netCDF file block by block instead
(:mod:`~pyro_sgmcmc.export.destinations`).
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Union

import numpy as np
import pyro.infer
import torch

from .._compat import pyro_chain_diagnostics
from ..run.partial import RunNotFinished
from .destinations import check_fits, in_memory, site_dims, to_netcdf_file
from .pointwise import FullData

__all__ = ["to_inference_data"]


def to_inference_data(
    mcmc,
    *,
    log_likelihood: bool = False,
    observed_data: bool = True,
    posterior_predictive: bool = False,
    coords: Optional[dict] = None,
    dims: Optional[Dict[str, List[str]]] = None,
    chunk_size: int = 256,
    log_likelihood_dtype: Optional[torch.dtype] = None,
    log_likelihood_path: Union[str, "os.PathLike[str]", None] = None,
    max_memory: Optional[int] = None,
):
    """Convert a finished :class:`pyro_sgmcmc.MCMC` (or :class:`pyro.infer.MCMC` with an SG-MCMC kernel) run.

    Parameters
    ----------
    mcmc : pyro_sgmcmc.MCMC or pyro.infer.MCMC
        A run whose kernel is one of ``SGLD``, ``SGHMC``, ``SGNHT``.
    log_likelihood : bool
        Add the pointwise log-likelihood of every observed site on the full data (for ``az.loo``).
    observed_data : bool
        Add the full observed data.
    posterior_predictive : bool
        Add one posterior-predictive draw of every observed site per posterior draw, on the full data.
    coords, dims :
        As for :func:`arviz.from_dict`. Vector sites get ``<site>_dim_<i>`` dims by default, and
        each plate's axis of an observed site is named after the plate.
    chunk_size : int
        Posterior draws evaluated per vectorised model call (fewer when one call would hold more than
        :func:`~pyro_sgmcmc.export.pointwise.elements_per_call` values of a site); the results do not
        depend on it.
    log_likelihood_dtype : torch.dtype, optional
        The log-likelihood's dtype. By default the model's: float32 data give a float32
        log-likelihood (half the bytes of float64). Computed in the model's dtype either way.
    log_likelihood_path : str or os.PathLike, optional
        Write the log-likelihood to this netCDF-4 file (needs ``h5netcdf``), as the ``log_likelihood``
        group of an ArviZ file (``arviz.from_netcdf`` reads it), 64 MB of draws at a time, instead of
        holding it in memory; the returned ``log_likelihood`` group is read lazily from the file. For a
        log-likelihood larger than the memory. The file is replaced if it exists.
    max_memory : int, optional
        Bytes the in-memory data groups (``log_likelihood`` unless written to a file, and
        ``posterior_predictive``) may take; a larger request raises ``MemoryError`` naming the sizes
        before anything is computed. By default the memory the system reports available.

    Returns
    -------
    arviz.InferenceData
        ``posterior`` (dims ``chain``, ``draw``, ...; a ``superchain`` coordinate on ``chain``),
        ``sample_stats`` (``lp``, ``step_size``, ``diverging``: ArviZ's meanings; ``temperature``,
        ``kinetic_energy``, ``thermostat``: ours; ``sampling_stage`` and ``cycle`` with a
        :class:`~pyro_sgmcmc.Cyclical` schedule, whose exploration draws are not returned: both groups then
        say so in their ``draws_kept`` attribute), and the requested data groups.

    Notes
    -----
    The pointwise log-likelihood of draw :math:`s` and datum :math:`n` is
    :math:`\\log p(y_n \\mid \\theta_s)`, the observed site's ``fn.log_prob(value)`` as Pyro's trace
    records it in ``unscaled_log_prob`` (no plate scale, no mask). It is evaluated for all draws in blocks:
    the memory used is the output arrays plus one block (tens of MB), and the time is a few passes over the
    output (``benchmarks/loglik_export.py``).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import MCMC, SGLD, to_inference_data
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
    ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
    ...         pyro.sample("obs", dist.Normal(mu, 1.), obs=y[idx])
    >>> y = torch.randn(50, generator=torch.Generator().manual_seed(0))
    >>> mcmc = MCMC(SGLD(model, step_size=0.02), num_samples=20, warmup_steps=20, num_chains=4,
    ...             num_superchains=2, chain_method="vectorized", seed=0, disable_progbar=True)
    >>> mcmc.run(y)
    >>> idata = to_inference_data(mcmc, log_likelihood=True)
    >>> idata.log_likelihood["obs"].dims, idata.posterior.superchain.values.tolist()
    (('chain', 'draw', 'data'), [0, 0, 1, 1])
    """
    import arviz as az

    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size!r}")
    if max_memory is not None and (isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory < 0):
        raise ValueError(f"max_memory must be None or a non-negative integer (bytes); got {max_memory!r}")
    if log_likelihood_dtype is not None and not (
        isinstance(log_likelihood_dtype, torch.dtype) and log_likelihood_dtype.is_floating_point
    ):
        raise TypeError(f"log_likelihood_dtype must be None or a floating torch.dtype; got {log_likelihood_dtype!r}")
    if log_likelihood_path is not None and not isinstance(log_likelihood_path, (str, os.PathLike)):
        raise TypeError(f"log_likelihood_path must be None or a path; got {type(log_likelihood_path).__name__}")
    from ..mcmc import MCMC

    if not isinstance(mcmc, (MCMC, pyro.infer.MCMC)):
        raise TypeError(f"mcmc must be a pyro_sgmcmc.MCMC or pyro.infer.MCMC run; got {type(mcmc).__name__}")
    for name, value in (("coords", coords), ("dims", dims)):
        if value is not None and not isinstance(value, Mapping):
            raise TypeError(f"{name} must be a dict (as for arviz.from_dict); got {type(value).__name__}")
    from ..kernels.base import SGMCMCKernel

    if not isinstance(mcmc.kernel, SGMCMCKernel):
        raise TypeError(
            "to_inference_data needs a run of an SG-MCMC kernel (SGLD, SGHMC, SGNHT); "
            f"got a {type(mcmc.kernel).__name__} run"
        )
    kernel = mcmc.kernel
    potential = getattr(kernel, "potential", None)
    try:
        grouped = None if potential is None else mcmc.get_samples(group_by_chain=True)
    except RunNotFinished:
        grouped = None
    if grouped is None:
        partial = getattr(mcmc, "partial", None)
        raise ValueError(
            "to_inference_data needs the draws of a run of an SG-MCMC kernel: "
            + ("call mcmc.run(...) first" if partial is None else f"none were kept: {partial.describe()}")
        )
    samples = {k: v.detach().cpu().numpy() for k, v in grouped.items()}
    num_chains, num_draws = next(iter(samples.values())).shape[:2]
    user_dims = dict(dims or {})
    dims = dict(user_dims)
    groups = {"posterior": samples, "sample_stats": _sample_stats(mcmc, num_chains, num_draws)}
    log_likelihood_group = None

    if observed_data or log_likelihood or posterior_predictive:
        data = FullData(potential, kernel.state.position[0])
        for name, layout in data.layouts["observed_data"].items():
            dims.setdefault(name, list(layout.dims))
        total = num_chains * num_draws
        held = {
            "log_likelihood": log_likelihood and log_likelihood_path is None,
            "posterior_predictive": posterior_predictive,
        }
        sizes = {group: data.nbytes(group, total, log_likelihood_dtype if group == "log_likelihood" else None)
                 for group, wanted in held.items() if wanted}  # fmt: skip
        check_fits(sizes, max_memory, "log_likelihood_path")
        if observed_data:
            one = kernel.state.position[:1]
            groups["observed_data"] = {k: v[0] for k, v in in_memory(data, "observed_data", one, 1, None).items()}
    if log_likelihood or posterior_predictive:
        positions = _unconstrained_draws(mcmc, potential, samples)
        if posterior_predictive:
            values = in_memory(data, "posterior_predictive", positions, chunk_size, None)
            groups["posterior_predictive"] = _by_chain(values, num_chains)
        if log_likelihood and log_likelihood_path is not None:
            log_likelihood_group = to_netcdf_file(
                log_likelihood_path, data, positions, num_chains, chunk_size, log_likelihood_dtype, user_dims
            )
        elif log_likelihood:
            values = in_memory(data, "log_likelihood", positions, chunk_size, log_likelihood_dtype)
            values = _by_chain(values, num_chains)
            layouts = data.layouts["log_likelihood"]
            log_likelihood_group = az.dict_to_dataset(
                values, coords=coords, dims={k: site_dims(k, layouts[k], user_dims) for k in values}
            )
    idata = az.from_dict(**groups, coords=coords, dims=dims)
    if log_likelihood_group is not None:
        idata.add_groups(log_likelihood=log_likelihood_group, coords=coords)
    superchains = np.asarray(getattr(mcmc, "superchain_ids", torch.arange(num_chains)))
    partial = getattr(mcmc, "partial", None)
    # a cyclical schedule under pyro_sgmcmc.MCMC: only the sampling stages' draws are kept (pyro.infer.MCMC keeps all)
    staged = kernel.step_size if kernel.step_size.staged and isinstance(mcmc, MCMC) else None
    for group in ("posterior", "sample_stats") if groups["sample_stats"] else ("posterior",):
        setattr(idata, group, getattr(idata, group).assign_coords(superchain=("chain", superchains)))
        if staged is not None:
            getattr(idata, group).attrs["draws_kept"] = f"sampling stages only (sampling_stage), of {staged!r}"
        if partial is not None:  # an interrupted run: its draws, marked as such
            getattr(idata, group).attrs["partial_run"] = partial.describe()
    return idata


# ---------------------------------------------------------------------- pieces
def _sample_stats(mcmc, num_chains: int, num_draws: int) -> Dict[str, np.ndarray]:
    stats = getattr(mcmc, "sample_stats", None)
    if stats:
        return {k: v.detach().cpu().numpy() for k, v in stats.items()}
    # chain_method="parallel" or pyro.infer.MCMC: only the divergences are recorded per draw
    draws = getattr(mcmc, "draws", None)
    per_chain = draws.chain_diagnostics if draws is not None else pyro_chain_diagnostics(mcmc)
    if any("divergences" not in info for info in per_chain):  # an interrupted run's worker processes: not known
        return {}
    diverging = np.zeros((num_chains, num_draws), dtype=bool)
    for chain, info in enumerate(per_chain):
        diverging[chain, info["divergences"]] = True
    return {"diverging": diverging}


def _unconstrained_draws(mcmc, potential, samples) -> torch.Tensor:
    missing = [name for name in potential.site_names if name not in samples]
    if missing:
        raise ValueError(
            f"log_likelihood and posterior_predictive need every latent site, but the run did not save {missing} "
            "(save_params)"
        )
    transforms = potential.transforms
    flat = {}
    for name in potential.site_names:
        value = torch.as_tensor(samples[name], dtype=potential.dtype, device=potential.device)
        value = value.reshape(-1, *value.shape[2:])
        flat[name] = transforms[name](value)
    return potential.pack(flat, (next(iter(flat.values())).shape[0],))


def _by_chain(values: Dict[str, np.ndarray], num_chains: int) -> Dict[str, np.ndarray]:
    """``(chains * draws, ...)`` arrays, chain-major, as ``(chains, draws, ...)`` views."""
    return {k: v.reshape(num_chains, v.shape[0] // num_chains, *v.shape[1:]) for k, v in values.items()}
