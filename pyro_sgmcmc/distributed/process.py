"""Process groups: join one (:func:`init_distributed`), and split chains and data over its ranks.

Chains and data are split alike: ``n`` items over ``P`` ranks in contiguous blocks whose sizes
differ by at most one, the first ``n mod P`` ranks taking one more (:func:`rank_chain_ids`).
"""

from __future__ import annotations

import datetime
import os
from typing import Optional, Tuple

import torch
import torch.distributed as dist

__all__ = ["init_distributed", "rank_and_size", "rank_chain_ids", "shard"]


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


def rank_and_size(group) -> Tuple[int, int]:
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
        rank, world_size = rank_and_size(group)
    if isinstance(data, (tuple, list)):
        return type(data)(shard(item, rank, world_size) for item in data)
    if not torch.is_tensor(data) or data.dim() == 0:
        raise TypeError(f"shard: data must be a tensor with a leading data axis (or a tuple of them); got {data!r}")
    block = rank_chain_ids(int(data.shape[0]), world_size, rank)
    return data[block.start : block.stop]


