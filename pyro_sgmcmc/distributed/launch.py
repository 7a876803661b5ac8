"""Run a function on ``P`` local processes in one process group, as ``torchrun`` runs a script."""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from .._compat import exit_without_finalisation
from .process import init_distributed

__all__ = ["launch", "free_port"]


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
    exit_without_finalisation(0)  # a clean exit may abort in finalisation with gloo (see _compat)
