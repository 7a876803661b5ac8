"""Export an SG-MCMC run to :class:`arviz.InferenceData`.

The minibatches seen while sampling are random subsets, so everything that depends on the data
(``log_likelihood``, ``observed_data``, ``posterior_predictive``) is recomputed here on the *full*
data set: each subsampled plate is walked through in consecutive chunks of its own
``subsample_size`` (the size the model's plate statement expects; the last chunk overlaps the one
before it), every combination of chunks of all subsampled plates is evaluated, and the pieces are
assembled along the plates' axes. Posterior draws are processed ``chunk_size`` at a time under
:func:`torch.func.vmap`.
"""

from __future__ import annotations

import itertools
from typing import Dict, List, Mapping, Optional

import numpy as np
import pyro
import pyro.infer
import pyro.poutine as poutine
import torch

from .._compat import pyro_chain_diagnostics
from ..run.partial import RunNotFinished

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
        Posterior draws evaluated per vectorised model call.

    Returns
    -------
    arviz.InferenceData
        ``posterior`` (dims ``chain``, ``draw``, ...; a ``superchain`` coordinate on ``chain``),
        ``sample_stats`` (``lp``, ``step_size``, ``diverging``: ArviZ's meanings; ``temperature``,
        ``kinetic_energy``, ``thermostat``: ours; ``sampling_stage`` and ``cycle`` with a
        :class:`~pyro_sgmcmc.Cyclical` schedule, whose exploration draws are not returned: both groups then
        say so in their ``draws_kept`` attribute), and the requested data groups.

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
    dims = dict(dims or {})
    groups = {"posterior": samples, "sample_stats": _sample_stats(mcmc, num_chains, num_draws)}

    if observed_data or log_likelihood or posterior_predictive:
        data = _FullData(potential, kernel.state.position[0])
        for name, axes in data.observed_axes.items():
            dims.setdefault(name, axes)
        if observed_data:
            groups["observed_data"] = data.observed_values(kernel.state.position[0])
    if log_likelihood or posterior_predictive:
        positions = _unconstrained_draws(mcmc, potential, samples)
        for group, wanted in (("log_likelihood", log_likelihood), ("posterior_predictive", posterior_predictive)):
            if wanted:
                values = data.evaluate(positions, chunk_size, predictive=group == "posterior_predictive")
                groups[group] = {k: v.reshape(num_chains, num_draws, *v.shape[1:]) for k, v in values.items()}
    idata = az.from_dict(**groups, coords=coords, dims=dims)
    superchains = np.asarray(getattr(mcmc, "superchain_ids", torch.arange(num_chains)))
    partial = getattr(mcmc, "partial", None)
    # a cyclical schedule under pyro_sgmcmc.MCMC: only the sampling stages' draws are kept (pyro.infer.MCMC keeps all)
    staged = kernel.step_size if kernel.step_size.staged and isinstance(mcmc, MCMC) else None
    for group in ("posterior", "sample_stats"):
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
    diverging = np.zeros((num_chains, num_draws), dtype=bool)
    for chain, info in enumerate(per_chain):
        diverging[chain, info["divergences"]] = True
    return {"diverging": diverging}


class _FullData:
    """Evaluate observed sites on the full data, chunk by chunk of each subsampled plate."""

    def __init__(self, potential, position: torch.Tensor) -> None:
        self.potential = potential
        self.plates = list(potential.subsample_plates)
        self.chunks = [_plate_chunks(p.size, p.subsample_size, potential.device) for p in self.plates]
        first = {p.name: chunks[0] for p, chunks in zip(self.plates, self.chunks)}
        trace = _trace(potential, potential.unpack(position), first)
        plate_names = {p.name for p in self.plates}
        self.observed = [
            name for name, site in trace.nodes.items() if site["type"] == "sample" and site["is_observed"]
            and name not in potential.site_names and name not in plate_names
        ]  # fmt: skip
        self.observed_axes = {name: _plate_dims(name, trace.nodes[name]) for name in self.observed}
        sizes = {p.name: p.size for p in self.plates}
        self.full_shapes = {}
        for name in self.observed:
            shape = list(trace.nodes[name]["value"].shape)
            for axis, dim_name in enumerate(self.observed_axes[name]):
                if dim_name in sizes:
                    shape[axis] = sizes[dim_name]
            self.full_shapes[name] = tuple(shape)

    def _combinations(self):
        for combination in itertools.product(*self.chunks):
            yield {p.name: chunk for p, chunk in zip(self.plates, combination)}

    def observed_values(self, position: torch.Tensor) -> Dict[str, np.ndarray]:
        out = {name: np.zeros(shape) for name, shape in self.full_shapes.items()}
        for indices in self._combinations():
            trace = _trace(self.potential, self.potential.unpack(position), indices)
            for name in self.observed:
                self._assign(out[name], (), name, indices, trace.nodes[name]["value"].detach().cpu().numpy())
        return out

    def evaluate(self, positions: torch.Tensor, chunk_size: int, predictive: bool) -> Dict[str, np.ndarray]:
        potential, names = self.potential, self.observed
        num_draws = positions.shape[0]
        out = {name: np.zeros((num_draws, *shape)) for name, shape in self.full_shapes.items()}
        model = poutine.uncondition(potential.model) if predictive else None

        def one_draw(position, indices):
            trace = _trace(potential, potential.unpack(position), indices, model=model)
            if predictive:
                return {name: trace.nodes[name]["value"] for name in names}
            return {name: trace.nodes[name]["fn"].log_prob(trace.nodes[name]["value"]) for name in names}

        batched = torch.func.vmap(one_draw, in_dims=(0, None), randomness="different")
        with pyro.validation_enabled(False), torch.no_grad():
            for start in range(0, num_draws, chunk_size):
                chunk = positions[start : start + chunk_size]
                for indices in self._combinations():
                    try:
                        values = batched(chunk, indices)
                    except RuntimeError:  # an op without a batching rule: evaluate draw by draw
                        rows = [one_draw(z, indices) for z in chunk]
                        values = {k: torch.stack([r[k] for r in rows]) for k in names}
                    for name in names:
                        target = out[name][start : start + chunk.shape[0]]
                        self._assign(target, (slice(None),), name, indices, values[name].detach().cpu().numpy())
        return out

    def _assign(self, target: np.ndarray, lead: tuple, name: str, indices, value: np.ndarray) -> None:
        axes = self.observed_axes[name]
        index = list(lead)
        for axis, dim_name in enumerate(axes):
            index.append(
                indices[dim_name].cpu().numpy() if dim_name in indices else np.arange(value.shape[len(lead) + axis])
            )
        if lead:
            index[0] = np.arange(value.shape[0])
        target[np.ix_(*index)] = value


def _plate_chunks(size: int, subsample_size: int, device) -> List[torch.Tensor]:
    """Consecutive index chunks of length ``subsample_size`` covering ``range(size)`` (the last overlaps)."""
    starts = list(range(0, size - subsample_size + 1, subsample_size))
    if starts[-1] + subsample_size < size:
        starts.append(size - subsample_size)
    return [torch.arange(s, s + subsample_size, device=device) for s in starts]


def _trace(potential, values: Dict[str, torch.Tensor], indices: Dict[str, torch.Tensor], model=None):
    """Trace the model at unconstrained ``values`` with the given plate indices (not scaled, not summed)."""
    data = dict(indices)
    for site in potential.sites:
        data[site.name] = site.transform(values[site.name])
    model = poutine.condition(model or potential.model, data=data)
    return poutine.trace(model).get_trace(*potential.model_args, **potential.model_kwargs)


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


def _plate_dims(name: str, site) -> List[str]:
    """Dim names of an observed site's value: plates by name, the rest ``<site>_dim_<i>``."""
    value = site["value"]
    event_dim = site["fn"].event_dim
    batch_ndim = value.dim() - event_dim
    names = [f"{name}_dim_{i}" for i in range(value.dim())]
    for frame in site["cond_indep_stack"]:
        if frame.vectorized and frame.dim is not None and -frame.dim <= batch_ndim:
            names[batch_ndim + frame.dim] = frame.name
    return names
