"""Data-parallel gradients: every rank one shard of the data, the same chains (see :mod:`pyro_sgmcmc.distributed`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from ..chains.minibatch import MinibatchSampler
from ..chains.streams import ChainGenerators
from ..kernels.gradients import MinibatchGradient, all_reduced
from ..model.potential import ModelError, ModelPotential
from .process import rank_and_size

__all__ = ["data_parallel", "DataParallelPotential"]

_MINIBATCH_STREAM_OFFSET = 2**40  # rank r's minibatch stream of chain c is (seed, c + (r + 1) * 2**40)


class _ShardScale(Messenger):
    """Multiply the log-probability of observed sites inside plate ``plate`` by ``factor``."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor
        self.plate: Optional[str] = None  # set once the sharded plate is known
        self.seen = False

    def _pyro_sample(self, msg) -> None:
        if self.plate is None or site_is_subsample(msg):
            return
        if not any(frame.name == self.plate for frame in msg["cond_indep_stack"]):
            return
        if not msg["is_observed"]:
            raise ModelError(
                f"latent site {msg['name']!r} is inside the sharded plate {self.plate!r}: with data_parallel every "
                "rank must hold the same latent variables (move it out of the plate)"
            )
        msg["scale"] = msg["scale"] * self.factor
        self.seen = True


class DataParallelPotential:
    """The potential of a model whose data plate is sharded over the ranks (see :func:`data_parallel`).

    Wraps the rank's :class:`~pyro_sgmcmc.ModelPotential` (built on the model with the sharded
    plate's likelihood scaled by ``P``) and behaves like it, except that

    * :meth:`batched_potential_and_grad` draws the rank's own minibatch and returns the average of
      ``(U_r, grad U_r)`` over the ranks (:func:`~pyro_sgmcmc.kernels.gradients.all_reduced` of the rank's
      :class:`~pyro_sgmcmc.kernels.gradients.MinibatchGradient`: one all-reduce of ``num_chains * (dim + 1)``
      numbers);
    * :meth:`initial_position` returns rank 0's starting point on every rank;
    * ``num_data`` is the global ``N`` (the sum of the ranks' plate sizes unless the kernel was
      given ``num_data``), and the subsampled plates are flagged ``user_indices`` so the kernel's
      own minibatch sampler leaves them (and the shared noise streams) alone.

    The first evaluation of each run checks that all ranks use the same seed and the same
    positions (a clear ``ValueError`` otherwise, rather than replicas that silently drift apart).
    """

    def __init__(
        self,
        inner: ModelPotential,
        streams: Callable[[], Optional[ChainGenerators]],
        scale: _ShardScale,
        num_data: int,
        group,
    ) -> None:
        self.inner = inner
        self.streams = streams  # the chains' current random streams (the kernel's, set by its setup)
        self.group = group
        self.rank, self.world_size = rank_and_size(group)
        self.scale = scale
        self.num_data = num_data
        self.sharded_plates = [p for p in inner.subsample_plates if not p.user_indices]
        self.subsample_plates = [replace(p, user_indices=True) for p in inner.subsample_plates]
        self.sampler: Optional[MinibatchSampler] = None
        self.sampler_streams: Optional[ChainGenerators] = None  # the streams the rank's minibatch streams follow
        # the rank's minibatch estimate on its shard (likelihood scaled by P), averaged over the ranks
        self.averaged = all_reduced(MinibatchGradient(inner), group)

    #: It draws the rank's minibatches itself: calling it again changes the run (``kernels/sampling.py``).
    draws_own_minibatches = True

    # -- the model's layout and data: the rank's ModelPotential's
    sites = property(lambda self: self.inner.sites, doc="The latent sites (as :class:`ModelPotential`).")
    site_names = property(lambda self: self.inner.site_names, doc="The latent sites' names.")
    transforms = property(lambda self: self.inner.transforms, doc="Per site: unconstrained -> constrained.")
    dim = property(lambda self: self.inner.dim, doc="Length of the flat unconstrained position.")
    dtype = property(lambda self: self.inner.dtype, doc="The positions' dtype.")
    device = property(lambda self: self.inner.device, doc="The positions' device.")
    model = property(lambda self: self.inner.model, doc="The model (its sharded plate scaled by ``P``).")
    model_args = property(lambda self: self.inner.model_args, doc="The rank's model arguments (its shard).")
    model_kwargs = property(lambda self: self.inner.model_kwargs, doc="The rank's model keyword arguments.")
    compiled = property(lambda self: self.inner.compiled, doc="Whether the rank's potential is compiled.")

    def unpack(self, position: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Flat unconstrained position(s) -> ``{site: value}`` (as :meth:`ModelPotential.unpack`)."""
        return self.inner.unpack(position)

    def pack(self, params, batch_shape: Tuple[int, ...] = ()) -> torch.Tensor:
        """``{site: value}`` -> flat unconstrained position(s) (as :meth:`ModelPotential.pack`)."""
        return self.inner.pack(params, batch_shape)

    def forget_compiled(self) -> None:
        """Trace the model afresh at the next evaluation (as :meth:`ModelPotential.forget_compiled`)."""
        self.inner.forget_compiled()

    def nonfinite_log_densities(self, *args, **kwargs):
        """The rank's sites whose log-density is not finite (as :meth:`ModelPotential.nonfinite_log_densities`)."""
        return self.inner.nonfinite_log_densities(*args, **kwargs)

    def initial_position(self, initial_params=None, max_tries: int = 100, fresh: bool = False) -> torch.Tensor:
        """A starting point as :class:`~pyro_sgmcmc.ModelPotential` draws it: rank 0's, on every rank."""
        position = self.inner.initial_position(initial_params, max_tries, fresh)
        if initial_params is None:  # drawn: take rank 0's (given ones are compared at the first step)
            dist.broadcast(position, src=0, group=self.group)
        return position

    def potential_and_grad(self, position: torch.Tensor, indices=None):
        """``(U, dU/dz)`` of one chain, all-reduced (as :meth:`batched_potential_and_grad`)."""
        potential, grad = self.batched_potential_and_grad(position.unsqueeze(0), {})
        return potential[0], grad[0]

    def batched_potential_and_grad(self, positions: torch.Tensor, indices) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(U, dU/dz)`` averaged over the ranks, each from its own shard's minibatch."""
        if self.sampler is None or self.sampler_streams is not self.streams():
            self._start_run(positions)
        own = dict(indices)
        own.update({name: _rows_for(rows, positions.shape[0]) for name, rows in self.sampler.next().items()})
        averaged = self.averaged(positions, own)  # every rank's shard estimate, averaged (one all-reduce)
        if not self.scale.seen:
            raise ValueError(
                f"data_parallel: no observed site lies inside the plate {self.scale.plate!r}; name the sharded "
                "data plate with data_parallel(kernel, plate=...)"
            )
        return averaged

    def _start_run(self, positions: torch.Tensor) -> None:
        """New chains (a new setup): per-rank minibatch streams, and a check that the replicas agree."""
        generators = self.streams()
        if generators is None or len(generators) != positions.shape[0]:
            streams = ChainGenerators(None, range(positions.shape[0]), positions.device)
        else:
            streams = generators
        seed = torch.tensor([streams.seed, -streams.seed], dtype=torch.int64, device=positions.device)
        dist.all_reduce(seed, op=dist.ReduceOp.MAX, group=self.group)
        if int(seed[0]) != streams.seed or -int(seed[1]) != streams.seed:
            raise ValueError(
                "data_parallel: the ranks use different seeds, so their noise would differ; pass the same "
                "seed= to pyro_sgmcmc.MCMC on every rank (or call pyro.set_rng_seed with the same value)"
            )
        spread = torch.cat([positions.reshape(-1), -positions.reshape(-1)])
        dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=self.group)
        half = positions.numel()
        if not torch.equal(spread[:half], -spread[half:]):
            raise ValueError(
                "data_parallel: the chains start from different points on different ranks; give the same "
                "initial_params on every rank (or none: the starting points are then drawn on rank 0)"
            )
        offset = (self.rank + 1) * _MINIBATCH_STREAM_OFFSET
        own = ChainGenerators(streams.seed, [c + offset for c in streams.chain_ids], positions.device)
        self.sampler = MinibatchSampler(self.sharded_plates, own)
        self.sampler_streams = generators


class _DataParallelFactory:
    """``SGMCMCKernel.potential_factory`` for :func:`data_parallel`."""

    def __init__(self, kernel, plate: Optional[str], group) -> None:
        self.kernel = kernel
        self.plate = plate
        self.group = group

    def __call__(self, model, args, kwargs, *, init_strategy, num_data, jit_compile="auto") -> DataParallelPotential:
        rank, world_size = rank_and_size(self.group)
        scale = _ShardScale(float(world_size))
        inner = ModelPotential(
            scale(model), args, kwargs, init_strategy=init_strategy, num_data=num_data, jit_compile=jit_compile
        )
        plates = [p.name for p in inner.subsample_plates if not p.user_indices]
        if self.plate is not None:
            scale.plate = self.plate
        elif len(plates) == 1:
            scale.plate = plates[0]
        else:
            raise ValueError(
                f"data_parallel: the model has {len(plates)} subsampled plates {plates}; name the sharded data "
                "plate with data_parallel(kernel, plate=...)"
            )
        if num_data is None:  # N = the sum of the shards' sizes
            total = torch.tensor([inner.num_data], dtype=torch.int64, device=inner.device)
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
            num_data = int(total)
        return DataParallelPotential(inner, self.streams, scale, num_data, self.group)

    def streams(self) -> Optional[ChainGenerators]:
        """The kernel's chain streams of its current run (``None`` before its first setup)."""
        return getattr(self.kernel, "generators", None)


def data_parallel(kernel, plate: Optional[str] = None, group=None):
    """Make ``kernel`` (SGLD, SGHMC, SGNHT) average its gradients over the ranks; returns the kernel.

    Run the same chains on every rank with the same ``seed`` and give each rank its shard of the
    data (e.g. ``pyro_sgmcmc.distributed.shard(x)``): the model's data plate then has the shard's
    size ``N_r`` and a per-rank ``subsample_size`` ``B_r``. Each step is the step of a one-process
    run on all ``N`` data with a minibatch of ``sum_r B_r`` (drawn stratified by shard); every rank
    holds the same draws. See the module docstring for the potential.

    Parameters
    ----------
    kernel : SGMCMCKernel
        The kernel; its ``num_data`` (if given) is the *global* ``N``.
    plate : str, optional
        The name of the sharded data plate (default: the model's only subsampled plate). Observed
        sites inside it are the data; everything outside it (priors, other observed sites) must
        be the same on every rank and is counted once.
    group : ProcessGroup, optional
        The process group (default: the default group).

    Notes
    -----
    Checkpoints resume these runs exactly except for the ranks' minibatch streams, which restart.
    :func:`~pyro_sgmcmc.to_inference_data` on a rank gives the posterior draws and that rank's
    shard of the data (``observed_data``, ``log_likelihood``).
    """
    from ..kernels.base import SGMCMCKernel

    if not isinstance(kernel, SGMCMCKernel):
        raise TypeError(f"data_parallel needs a pyro_sgmcmc kernel (SGLD, SGHMC, SGNHT); got {type(kernel).__name__}")
    if plate is not None and not isinstance(plate, str):
        raise TypeError(f"plate must be the name (str) of the sharded data plate; got {plate!r}")
    rank_and_size(group)
    kernel.potential_factory = _DataParallelFactory(kernel, plate, group)
    kernel.potential = None  # the next setup builds the data-parallel potential
    return kernel


def _rows_for(indices: torch.Tensor, rows: int) -> torch.Tensor:
    """This rank's minibatch indices ``(C, B)`` for a call on ``rows`` points: one row per chain, or, for the
    warmup's curvature probes and control variates (``kernels/preconditioning.py``, ``control_variates.py``),
    ``2 C K`` rows laid out as ``K`` points of chain 0, ..., ``K`` of chain ``C - 1``, twice over, each
    point with its chain's minibatch."""
    chains = indices.shape[0]
    if rows == chains:
        return indices
    if rows % (2 * chains):
        raise ValueError(f"data_parallel: {rows} points for {chains} chains (expected C or a multiple of 2 C)")
    per_chain = indices.repeat_interleave(rows // (2 * chains), 0)
    return torch.cat([per_chain, per_chain])
