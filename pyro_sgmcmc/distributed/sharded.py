"""Sharded minibatches: each rank's own minibatch of its shard of the data, as a gradient-estimator value.

:func:`sharded` wraps any estimator (:mod:`~pyro_sgmcmc.kernels.gradients`) of a model whose data plate holds
the rank's shard (``N_r`` data, minibatches of ``B_r``): it keeps the estimator's signature
``estimator(positions, indices) -> (U, grad U)`` and replaces the indices of the sharded plates by the rank's own
draws: rank 0 keeps the kernel's (chain ``c``'s minibatch stream ``(seed, c)``, so that a one-rank run is the
one-process run), rank ``r > 0`` draws from streams of its own, ``(seed, c + r 2^40)``: independent across ranks,
while the injected noise (drawn from ``(seed, c)`` by another method, ``chains/philox.py``) is the same on every
rank.
Composed with :func:`~pyro_sgmcmc.kernels.gradients.all_reduced` and the likelihood of the sharded plate scaled by
the number of ranks ``P`` (:class:`ShardScale`), the average over the ranks is the estimate of a one-process run
on all ``N = sum_r N_r`` data with a minibatch of ``sum_r B_r``, drawn stratified by shard (see
:mod:`pyro_sgmcmc.distributed`).

The value draws minibatches itself, so it is not ``replayable`` (calling it again moves its streams). The kernel
hands it the chains' streams through :meth:`ShardedMinibatches.use_streams` whenever it makes them (a new run, a
restore); the first evaluation after that checks that every rank uses the same seed and the same positions.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from ..chains.minibatch import MinibatchSampler
from ..chains.streams import ChainGenerators
from ..kernels.gradients import as_estimator
from ..model.potential import ModelError, SubsamplePlate
from .process import rank_and_size

__all__ = ["MINIBATCH_STREAM_OFFSET", "ShardScale", "ShardedMinibatches", "sharded", "rows_for"]

#: Rank ``r > 0``'s minibatch stream of chain ``c`` is ``(seed, c + r * MINIBATCH_STREAM_OFFSET)``; rank 0's is the
#: kernel's own, ``(seed, c)``.
MINIBATCH_STREAM_OFFSET = 2**40


class ShardScale(Messenger):
    """Multiply the log-probability of the observed sites inside the plate ``plate`` by ``factor`` (``P``).

    A latent site inside the plate is refused (every rank must hold the same latent variables); :attr:`seen`
    records that an observed site was scaled (a plate holding none is named in an error by the estimator).
    """

    def __init__(self, factor: float, plate: Optional[str] = None) -> None:
        super().__init__()
        self.factor = factor
        self.plate = plate
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


class ShardedMinibatches:
    """:func:`sharded`'s value: ``inner`` evaluated on the rank's own minibatches of the ``plates``.

    Attributes
    ----------
    inner : GradientEstimator
        The estimator called with the rank's indices.
    plates : list of SubsamplePlate
        The sharded plates whose indices the rank draws (empty when the shards are not subsampled).
    sampler : MinibatchSampler or None
        The rank's minibatch streams of the current run (``None`` until its first evaluation, and on rank 0, which
        uses the kernel's).
    control_variate_potential : ShardedPotential or None
        The global potential a control variate of this run is built on (set by
        :class:`~pyro_sgmcmc.distributed.data_parallel.DataParallel`; see ``distributed/sharded_potential.py``).
    """

    #: It draws the rank's minibatches itself: calling it again changes the run (``kernels/sampling.py``).
    replayable = False

    def __init__(
        self, inner, plates: Sequence[SubsamplePlate], scale: Optional[ShardScale] = None, group=None, *,
        potential=None, num_data: Optional[int] = None,
    ) -> None:  # fmt: skip
        self.inner = as_estimator(inner)
        self.potential = getattr(self.inner, "potential", None) if potential is None else potential
        self.num_data = num_data  # the N of the estimate (None: the potential's); the kernel reads it
        self.plates = list(plates)
        self.scale = scale
        self.group = group
        self.rank, self.world_size = rank_and_size(group)
        self.streams: Optional[ChainGenerators] = None  # the chains' streams (use_streams), None: drawn at need
        self.sampler: Optional[MinibatchSampler] = None
        self.started = False  # the first evaluation of the run (the replicas' check) is done
        self.control_variate_potential = None

    def use_streams(self, generators: ChainGenerators) -> None:
        """The chains' streams of a new run or of a restored one: the rank's minibatch streams restart from them
        (a checkpoint does not hold them) at the next evaluation, which checks the ranks' seeds and positions."""
        self.streams, self.sampler, self.started = generators, None, False

    def own_indices(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        """The kernel's ``indices`` for ``positions`` (``(C, D)``, or the ``2 C K`` rows of the warmup's probes or
        the ``2 C`` of a control variate, see :func:`rows_for`) with the sharded plates' replaced by the rank's next
        own minibatch; rank 0's are the kernel's. The first call of a run checks that the replicas agree."""
        if not self.started:
            self.sampler, self.started = self._start_run(positions), True
        if self.sampler is None:  # rank 0
            return indices
        own = dict(indices)
        own.update({name: rows_for(rows, positions.shape[0]) for name, rows in self.sampler.next().items()})
        return own

    def potential_and_grad(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        """The inner estimate at ``(C, D)`` positions (or the ``2 C K`` rows of the warmup's probes, see
        :func:`rows_for`), the sharded plates' indices replaced by the rank's own draws (:meth:`own_indices`)."""
        result = self.inner.potential_and_grad(positions, self.own_indices(positions, indices))
        if self.scale is not None and not self.scale.seen:
            raise ValueError(
                f"data_parallel: no observed site lies inside the plate {self.scale.plate!r}; name the sharded "
                "data plate with data_parallel(kernel, plate=...)"
            )
        return result

    __call__ = potential_and_grad

    def _start_run(self, positions: torch.Tensor) -> Optional[MinibatchSampler]:
        """New chains: a check that the replicas agree (seed, positions), and the rank's minibatch streams (none
        on rank 0, which uses the kernel's)."""
        streams = self.streams
        if streams is None or len(streams) != positions.shape[0]:  # called outside a kernel's run
            streams = ChainGenerators(None, range(positions.shape[0]), positions.device)
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
                "initial_params on every rank (or none: the same seed then draws the same points)"
            )
        if self.rank == 0:
            return None
        offset = self.rank * MINIBATCH_STREAM_OFFSET
        own = ChainGenerators(streams.seed, [c + offset for c in streams.chain_ids], positions.device)
        return MinibatchSampler(self.plates, own)


def sharded(
    estimator, plates: Sequence[SubsamplePlate], scale: Optional[ShardScale] = None, group=None, *,
    potential=None, num_data: Optional[int] = None,
) -> ShardedMinibatches:  # fmt: skip
    """``estimator`` on the rank's own minibatches of the sharded ``plates`` (module docstring): a value with the
    same signature, not replayable. ``scale``, when given, is the model's :class:`ShardScale`, checked to have
    scaled an observed site at each evaluation. ``potential`` (default the estimator's) is the potential whose
    layout the positions follow, ``num_data`` (default the potential's) the ``N`` of the estimate. Needs a
    process group (``group``, default the default group)."""
    return ShardedMinibatches(estimator, plates, scale, group, potential=potential, num_data=num_data)


def rows_for(indices: torch.Tensor, rows: int) -> torch.Tensor:
    """This rank's minibatch indices ``(C, B)`` for a call on ``rows`` points: one row per chain, or, for the
    warmup's curvature probes (``kernels/curvature_probes.py``), ``2 C K`` rows laid out as ``K`` points of
    chain 0, ..., ``K`` of chain ``C - 1``, twice over, each point with its chain's minibatch."""
    chains = indices.shape[0]
    if rows == chains:
        return indices
    if rows % (2 * chains):
        raise ValueError(f"data_parallel: {rows} points for {chains} chains (expected C or a multiple of 2 C)")
    per_chain = indices.repeat_interleave(rows // (2 * chains), 0)
    return torch.cat([per_chain, per_chain])
