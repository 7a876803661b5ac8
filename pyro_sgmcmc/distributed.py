"""Scale out on :mod:`torch.distributed`: chains across processes, data-parallel gradients.

Two ways to use several processes (launched with ``torchrun``, or :func:`launch` on one machine):

* **Chains across ranks** (:class:`DistributedMCMC`). The ``num_chains`` chains of a run are split
  into contiguous blocks of global chain ids (:func:`rank_chain_ids`); each rank runs its block
  vectorised, every chain with the random stream of ``(seed, global chain id)``, from starting
  points drawn once on rank 0 and broadcast. Rank 0 then gathers the draws and statistics in
  global chain order, so :func:`~pyro_sgmcmc.to_inference_data` and
  :func:`~pyro_sgmcmc.nested_rhat` see one run with global chain and superchain ids. With the same
  seed, the draws equal those of a one-process :class:`~pyro_sgmcmc.MCMC` run of the same chains.

* **Data-parallel gradients** (:func:`data_parallel`). Every rank holds one shard of the data plate
  (``N_r`` of the ``N = sum_r N_r`` data, e.g. from :func:`shard`) and runs the *same* chains. At
  each step rank ``r`` draws its own ``B_r`` minibatch of its shard and evaluates

  .. math:: U_r(z) = -\\log p(z) - \\log|\\det J(z)| - P \\, \\frac{N_r}{B_r} \\sum_{n \\in \\mathcal{B}_r}
            \\log p(y_n \\mid z),

  i.e. the model with the likelihood terms inside the sharded plate scaled by the number of ranks
  ``P``; one all-reduce averages ``(U_r, \\nabla U_r)`` over the ranks:

  .. math:: \\frac{1}{P} \\sum_r U_r(z) = -\\log p(z) - \\log|\\det J(z)|
            - \\sum_r \\frac{N_r}{B_r} \\sum_{n \\in \\mathcal{B}_r} \\log p(y_n \\mid z),

  the prior counted once and an unbiased estimate of the full-data potential from a combined
  minibatch of ``B = sum_r B_r`` data (stratified by shard). The injected noise comes from the
  chains' streams ``(seed, chain id)``, the same on every rank, so the replicas take identical
  steps; each rank's minibatches come from streams of its own (``(seed, chain id + (rank + 1)
  2^40)``), independent across ranks.

Everything here uses only :mod:`torch.distributed` collectives (gloo on CPU, NCCL on GPUs); the
default process group is used unless a ``group`` is given.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample

from .chains.minibatch import MinibatchSampler
from .chains.streams import ChainGenerators
from .mcmc import MCMC
from .model.potential import ModelError, ModelPotential

__all__ = [
    "init_distributed",
    "rank_chain_ids",
    "shard",
    "DistributedMCMC",
    "data_parallel",
    "DataParallelPotential",
    "launch",
    "free_port",
]

_MINIBATCH_STREAM_OFFSET = 2**40  # rank r's minibatch stream of chain c is (seed, c + (r + 1) * 2**40)


# ---------------------------------------------------------------------- process groups
def init_distributed(backend: Optional[str] = None, timeout: Optional[datetime.timedelta] = None) -> Tuple[int, int]:
    """Join the default process group from ``torchrun``'s environment; return ``(rank, world_size)``.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (and ``LOCAL_RANK`` for the
    GPU), which ``torchrun`` (and :func:`launch`) set. Does nothing but return the rank if the
    group is already initialised.

    Parameters
    ----------
    backend : str, optional
        ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors); default NCCL when CUDA is available,
        else gloo.
    timeout : datetime.timedelta, optional
        How long a collective waits for a silent peer before failing (torch's default otherwise).
    """
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_distributed: the environment variables {missing} are not set; launch the script with "
            "`torchrun --nproc_per_node=P script.py` (or pyro_sgmcmc.distributed.launch)"
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl'; got {backend!r}")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    options = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, **options)
    return dist.get_rank(), dist.get_world_size()


def _rank_and_size(group) -> Tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "no torch.distributed process group: call pyro_sgmcmc.distributed.init_distributed() first "
            "(in a script launched with torchrun)"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def rank_chain_ids(num_chains: int, world_size: int, rank: int) -> range:
    """The global chain ids run by ``rank``: contiguous blocks, sizes differing by at most one.

    The first ``num_chains % world_size`` ranks take one chain more.

    Examples
    --------
    >>> from pyro_sgmcmc.distributed import rank_chain_ids
    >>> [list(rank_chain_ids(7, 3, r)) for r in range(3)]
    [[0, 1, 2], [3, 4], [5, 6]]
    """
    for value, name in ((num_chains, "num_chains"), (world_size, "world_size")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}); got {rank!r}")
    if num_chains < world_size:
        raise ValueError(
            f"num_chains={num_chains} is smaller than the number of processes {world_size}: every rank needs a chain"
        )
    base, extra = divmod(num_chains, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def shard(data, rank: Optional[int] = None, world_size: Optional[int] = None, group=None):
    """This rank's contiguous block (along dim 0) of a tensor, or of each tensor in a tuple or list.

    Blocks follow :func:`rank_chain_ids`' rule (sizes differ by at most one). ``rank`` and
    ``world_size`` default to the process group's.
    """
    if rank is None or world_size is None:
        rank, world_size = _rank_and_size(group)
    if isinstance(data, (tuple, list)):
        return type(data)(shard(item, rank, world_size) for item in data)
    if not torch.is_tensor(data) or data.dim() == 0:
        raise TypeError(f"shard: data must be a tensor with a leading data axis (or a tuple of them); got {data!r}")
    block = rank_chain_ids(int(data.shape[0]), world_size, rank)
    return data[block.start : block.stop]


# ---------------------------------------------------------------------- chains across ranks
class DistributedMCMC(MCMC):
    """:class:`pyro_sgmcmc.MCMC` (vectorised chains) with the chains spread over the ranks.

    Rank ``r`` runs the global chains :func:`rank_chain_ids` ``(num_chains, P, r)`` vectorised; chain
    ``c`` uses the stream of ``(seed, c)`` whichever rank runs it. The ``num_superchains`` starting
    points (or the given ``initial_params``) are drawn on rank 0 exactly as a one-process run draws
    them and broadcast, so a superchain may straddle two ranks. After :meth:`run`:

    * on rank 0, ``get_samples``, ``sample_stats``, ``diagnostics``, ``superchain_ids`` and
      :func:`~pyro_sgmcmc.to_inference_data` cover all ``num_chains`` chains in global order;
    * on the other ranks they cover the rank's own chains (``chain_ids`` says which).

    Parameters
    ----------
    kernel, num_samples, warmup_steps, initial_params, num_chains, hook_fn, disable_progbar, \
disable_validation, transforms, save_params, num_superchains, thinning, keep_last, seed, \
checkpoint_path, checkpoint_every, resume :
        As for :class:`pyro_sgmcmc.MCMC` (``chain_method`` is always ``"vectorized"``; the
        arguments after ``num_chains`` are keyword-only), with
        ``num_chains`` and ``num_superchains`` counting the chains of *all* ranks.
        ``seed`` defaults to one drawn on rank 0 and broadcast. ``hook_fn`` sees the rank's own
        chains. ``checkpoint_path`` gets a ``.rank<r>`` suffix per rank.
    group : ProcessGroup, optional
        The process group (default: the default group).
    """

    def __init__(
        self,
        kernel,
        num_samples: int,
        warmup_steps: Optional[int] = None,
        initial_params: Optional[Dict[str, torch.Tensor]] = None,
        num_chains: int = 1,
        *,
        hook_fn: Optional[Callable] = None,
        disable_progbar: bool = False,
        disable_validation: bool = True,
        transforms=None,
        save_params=None,
        num_superchains: Optional[int] = None,
        thinning: int = 1,
        keep_last: Optional[int] = None,
        seed: Optional[int] = None,
        checkpoint_path=None,
        checkpoint_every: Optional[int] = None,
        resume: bool = True,
        group=None,
    ) -> None:
        rank, world_size = _rank_and_size(group)
        if isinstance(num_chains, bool) or not isinstance(num_chains, int) or num_chains < 1:
            raise ValueError(f"num_chains must be a positive integer; got {num_chains!r}")
        if num_superchains is not None:
            if isinstance(num_superchains, bool) or not isinstance(num_superchains, int) or num_superchains < 1:
                raise ValueError(f"num_superchains must be a positive integer; got {num_superchains!r}")
            if num_chains % num_superchains:
                raise ValueError(f"num_chains={num_chains} must be a multiple of num_superchains={num_superchains}")
        ids = rank_chain_ids(num_chains, world_size, rank)
        if checkpoint_path is not None:
            checkpoint_path = f"{os.fspath(checkpoint_path)}.rank{rank}"
        super().__init__(
            kernel, num_samples, warmup_steps, None, len(ids), hook_fn, None,
            disable_progbar or rank != 0, disable_validation, transforms, save_params,
            chain_method="vectorized", thinning=thinning, keep_last=keep_last, seed=seed,
            checkpoint_path=checkpoint_path, checkpoint_every=checkpoint_every, resume=resume, chain_ids=list(ids),
        )  # fmt: skip
        self.group = group
        self.rank, self.world_size = rank, world_size
        self.global_num_chains = num_chains
        self.global_num_superchains = num_chains if num_superchains is None else num_superchains
        self.global_initial_params = initial_params
        self._local_chain_ids = list(ids)

    def run(self, *args, **kwargs) -> None:
        """Run this rank's chains; rank 0 gathers every rank's draws (a collective: call it on every rank)."""
        kernel = self.kernel
        ids = self._local_chain_ids
        self.num_chains, self.chain_ids = len(ids), list(ids)
        self._diagnostics = [None] * len(ids)
        if self.seed is None:  # one seed for all ranks, drawn where a one-process run would draw it
            seed = torch.tensor([int(torch.randint(0, 2**62, ())) if self.rank == 0 else 0])
            dist.broadcast(seed, src=0, group=self.group)
            self.seed = int(seed)
        # Global starting points, drawn on rank 0 exactly as MCMC.run draws them (same model trace,
        # same calls to the init strategy), then broadcast.
        detached = tuple(arg.detach() if torch.is_tensor(arg) else arg for arg in args)
        potential = kernel.ensure_potential(detached, kwargs)
        positions = torch.zeros(self.global_num_chains, potential.dim, dtype=potential.dtype, device=potential.device)
        if self.rank == 0:
            positions = kernel.initial_positions(
                self.global_initial_params, self.global_num_chains, self.global_num_superchains, seed=self.seed
            )
        dist.broadcast(positions, src=0, group=self.group)
        self.initial_params = potential.unpack(positions[ids[0] : ids[-1] + 1])
        super().run(*args, **kwargs)
        global_superchains = torch.arange(self.global_num_chains) // (
            self.global_num_chains // self.global_num_superchains
        )
        self.superchain_ids = global_superchains[ids[0] : ids[-1] + 1]
        self._gather()
        if self.rank == 0:
            self.superchain_ids = global_superchains

    def _gather(self) -> None:
        """Rank 0 receives every rank's draws, statistics and diagnostics and concatenates them by chain."""
        payload = {
            "chain_ids": self.chain_ids,
            "samples": {k: v.detach().cpu() for k, v in self._samples.items()},
            "stats": {k: v.detach().cpu() for k, v in self.sample_stats.items()},
            "diagnostics": self._diagnostics,
        }
        received: Optional[List[Any]] = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(payload, received, dst=0, group=self.group)
        if self.rank != 0:
            return
        received.sort(key=lambda part: part["chain_ids"][0])
        device = self.kernel.state.position.device
        self._samples = {k: torch.cat([p["samples"][k] for p in received]).to(device) for k in self._samples}
        self.sample_stats = {k: torch.cat([p["stats"][k] for p in received]).to(device) for k in self.sample_stats}
        self._diagnostics = [d for p in received for d in p["diagnostics"]]
        self.chain_ids = [c for p in received for c in p["chain_ids"]]
        self.num_chains = len(self.chain_ids)


# ---------------------------------------------------------------------- data-parallel gradients
class _ShardScale(Messenger):
    """Multiply the log-probability of observed sites inside plate ``plate`` by ``factor``."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor
        self.plate: Optional[str] = None  # set once the sharded plate is known
        self.seen = False

    def _pyro_sample(self, msg) -> None:
        if self.plate is None or isinstance(msg["fn"], _Subsample):
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
      ``(U_r, grad U_r)`` over the ranks (one all-reduce of ``num_chains * (dim + 1)`` numbers);
    * :meth:`initial_position` returns rank 0's starting point on every rank;
    * ``num_data`` is the global ``N`` (the sum of the ranks' plate sizes unless the kernel was
      given ``num_data``), and the subsampled plates are flagged ``user_indices`` so the kernel's
      own minibatch sampler leaves them (and the shared noise streams) alone.

    The first evaluation of each run checks that all ranks use the same seed and the same
    positions (a clear ``ValueError`` otherwise, rather than replicas that silently drift apart).
    """

    def __init__(self, inner: ModelPotential, kernel, scale: _ShardScale, num_data: int, group) -> None:
        self.inner = inner
        self.kernel = kernel
        self.group = group
        self.rank, self.world_size = _rank_and_size(group)
        self._scale = scale
        self.num_data = num_data
        self._plates = [p for p in inner.subsample_plates if not p.user_indices]
        self.subsample_plates = [replace(p, user_indices=True) for p in inner.subsample_plates]
        self._sampler: Optional[MinibatchSampler] = None
        self._streams_of = None  # the kernel's ChainGenerators the minibatch streams were made for

    def __getattr__(self, name: str):
        if name == "inner":  # not yet set (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def initial_position(self, initial_params=None, max_tries: int = 100) -> torch.Tensor:
        """A starting point as :class:`~pyro_sgmcmc.ModelPotential` draws it: rank 0's, on every rank."""
        position = self.inner.initial_position(initial_params, max_tries)
        if initial_params is None:  # drawn: take rank 0's (given ones are compared at the first step)
            dist.broadcast(position, src=0, group=self.group)
        return position

    def potential_and_grad(self, position: torch.Tensor, indices=None):
        """``(U, dU/dz)`` of one chain, all-reduced (as :meth:`batched_potential_and_grad`)."""
        potential, grad = self.batched_potential_and_grad(position.unsqueeze(0), {})
        return potential[0], grad[0]

    def batched_potential_and_grad(self, positions: torch.Tensor, indices) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(U, dU/dz)`` averaged over the ranks, each from its own shard's minibatch."""
        if self._sampler is None or self._streams_of is not self.kernel.generators:
            self._start_run(positions)
        own = dict(indices)
        own.update({name: _rows_for(rows, positions.shape[0]) for name, rows in self._sampler.next().items()})
        potential, grad = self.inner.batched_potential_and_grad(positions, own)
        if not self._scale.seen:
            raise ValueError(
                f"data_parallel: no observed site lies inside the plate {self._scale.plate!r}; name the sharded "
                "data plate with data_parallel(kernel, plate=...)"
            )
        buffer = torch.cat([potential.unsqueeze(-1), grad], dim=-1)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
        buffer = buffer / self.world_size
        return buffer[:, 0], buffer[:, 1:]

    def _start_run(self, positions: torch.Tensor) -> None:
        """New chains (a new setup): per-rank minibatch streams, and a check that the replicas agree."""
        generators = self.kernel.generators
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
        self._sampler = MinibatchSampler(self._plates, own)
        self._streams_of = generators


class _DataParallelFactory:
    """``SGMCMCKernel.potential_factory`` for :func:`data_parallel`."""

    def __init__(self, kernel, plate: Optional[str], group) -> None:
        self.kernel = kernel
        self.plate = plate
        self.group = group

    def __call__(self, model, args, kwargs, *, init_strategy, num_data, jit_compile="auto") -> DataParallelPotential:
        rank, world_size = _rank_and_size(self.group)
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
        return DataParallelPotential(inner, self.kernel, scale, num_data, self.group)


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
    from .kernels.base import SGMCMCKernel

    if not isinstance(kernel, SGMCMCKernel):
        raise TypeError(f"data_parallel needs a pyro_sgmcmc kernel (SGLD, SGHMC, SGNHT); got {type(kernel).__name__}")
    if plate is not None and not isinstance(plate, str):
        raise TypeError(f"plate must be the name (str) of the sharded data plate; got {plate!r}")
    _rank_and_size(group)
    kernel.potential_factory = _DataParallelFactory(kernel, plate, group)
    kernel.potential = None  # the next setup builds the data-parallel potential
    return kernel


# ---------------------------------------------------------------------- local launcher
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(
    fn: Callable,
    nprocs: int = 2,
    args: Sequence = (),
    *,
    backend: str = "gloo",
    timeout: Optional[float] = None,
    num_threads: int = 1,
    collective_timeout: Optional[datetime.timedelta] = None,
) -> List[Any]:
    """Run ``fn(*args)`` on ``nprocs`` local processes in one process group; return each rank's result.

    What ``torchrun --nproc_per_node=nprocs`` does for a script, for a function: every process gets
    ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``,
    joins the group (:func:`init_distributed`) and calls ``fn``. ``fn`` must be importable (defined
    at the top level of a module) and its result picklable.

    If a rank raises, the other ranks are terminated and the rank's exception is raised here
    (:class:`torch.multiprocessing.ProcessRaisedException`, with its traceback); if the run takes
    longer than ``timeout`` seconds, all ranks are killed and :class:`TimeoutError` is raised.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive integer; got {nprocs!r}")
    if not callable(fn):
        raise TypeError(f"fn must be a callable; got {fn!r}")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="pyro_sgmcmc_launch_") as out:
        context = torch.multiprocessing.start_processes(
            _launched,
            args=(fn, tuple(args), nprocs, port, backend, num_threads, collective_timeout, out),
            nprocs=nprocs,
            join=False,
            start_method="spawn",
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not context.join(timeout=0.1):  # raises (after terminating the others) when a rank fails
                if deadline is not None and time.monotonic() > deadline:
                    for process in context.processes:
                        if process.is_alive():
                            process.kill()
                            process.join()
                    raise TimeoutError(f"launch: the {nprocs} processes did not finish in {timeout} s; killed them")
        except (torch.multiprocessing.ProcessRaisedException, torch.multiprocessing.ProcessExitedException) as raised:
            raise _first_failure(context, Path(out), raised) from None
        return [torch.load(Path(out) / f"rank{rank}.pt", weights_only=False) for rank in range(nprocs)]


def _first_failure(context, out: Path, raised: Exception) -> Exception:
    """The exception of the rank that failed first, not of the first rank the OS reports dead.

    When one rank raises, its peers waiting in a collective fail a moment later ("connection closed
    by peer"); both processes may be dead by the time the launcher looks, and which one the OS
    lists first is a race. Each rank stamps ``time.monotonic()`` (one clock for the whole machine)
    when its function raises, before its sockets close, so the earliest stamp is the root cause.
    """
    stamps = {}
    for rank in range(len(context.processes)):
        stamp = out / f"failed{rank}"
        if stamp.exists():
            stamps[rank] = float(stamp.read_text())
    if not stamps:
        return raised
    first = min(stamps, key=stamps.get)
    if first == getattr(raised, "error_index", None) or not os.access(context.error_files[first], os.R_OK):
        return raised
    with open(context.error_files[first], "rb") as handle:
        trace = pickle.load(handle)
    message = f"\n\n-- Process {first:d} terminated with the following error:\n{trace}"
    return torch.multiprocessing.ProcessRaisedException(message, first, context.processes[first].pid)


def _launched(rank, fn, args, world_size, port, backend, num_threads, collective_timeout, out) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS=str(num_threads),
    )
    torch.set_num_threads(num_threads)
    init_distributed(backend, collective_timeout)
    try:
        result = fn(*args)
    except BaseException:
        (Path(out) / f"failed{rank}").write_text(repr(time.monotonic()))  # see _first_failure
        raise
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.barrier()  # every rank is done before the group goes away
    dist.destroy_process_group()
    _exit_now()


def _exit_now() -> None:
    """Leave the process at once, skipping interpreter finalisation.

    With torch 2.13 and gloo, a process that used collectives sometimes aborts *while the
    interpreter shuts down* (``terminate called without an active exception``, SIGABRT, no Python
    frame), after its work is done and the group destroyed; the launcher would report a failed
    rank. Everything worth keeping is written and flushed before this call.
    """
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
