"""Files written atomically: a temporary file of one's own, flushed, ``fsync``-ed, renamed over the name.

:func:`commit_files` writes several files so that a process killed at any moment, or a write that fails
(a full disk), leaves each name with its previous content or its new one, never a torn file; the renames
follow the order given (:mod:`pyro_sgmcmc.checkpoint` renames a draw chunk before the index that lists it).
Each file's temporary name is its own (:func:`temporary_name`: the process id and random digits, created
exclusively), so two writers of one name never write into, or rename, each other's temporary file.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
from pathlib import Path
from typing import List, Tuple

__all__ = ["commit_files", "temporary_name"]


def commit_files(files: List[Tuple[bytes, Path]], sync: bool = True) -> None:
    """Write several files atomically, renamed in the order given (a checkpoint: chunk, then index).

    Every file is written to a temporary file of its own first (:func:`temporary_name`); with ``sync``
    all are ``fsync``-ed *concurrently* (the file system commits them together: one disk flush's latency
    instead of one per file), and only then renamed, one after the other, so that the index never names
    a file that is not complete. An error (a full disk: ``OSError`` with ``errno.ENOSPC``), or an
    interrupt, before the renames removes the temporary files and renames nothing, so the files named
    keep their previous content; the error is re-raised as it came.
    """
    temporaries: List[Path] = []
    descriptors: List[int] = []
    try:
        for data, path in files:
            temporaries.append(temporary_name(path))
            descriptors.append(os.open(temporaries[-1], _EXCLUSIVE_WRITE, 0o666))
            _write_all(descriptors[-1], data)
        if sync:
            _fsync_all(descriptors)
        while descriptors:
            os.close(descriptors.pop())  # a network file system may report a failed write only here
        for (_, path), temporary in zip(files, temporaries):
            os.replace(temporary, path)
    except BaseException:
        for descriptor in descriptors:
            with contextlib.suppress(OSError):
                os.close(descriptor)
        for temporary in temporaries:
            temporary.unlink(missing_ok=True)  # those renamed are gone already
        raise


def _fsync_all(descriptors: List[int]) -> None:
    """``fsync`` every descriptor concurrently; when one fails, wait for all (none is closed under another's
    ``fsync``), then raise the first error."""
    futures = [_fsync_pool().submit(os.fsync, descriptor) for descriptor in descriptors]
    errors = [error for error in (future.exception() for future in futures) if error is not None]
    if errors:
        raise errors[0]


#: A new file, for writing only, that must not exist (a temporary name is never another process's file).
_EXCLUSIVE_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)


def temporary_name(path: Path) -> Path:
    """``<name>.<pid>-<8 random hex digits>.tmp`` beside ``path``: unique to this process and this write."""
    return path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def _write_all(descriptor: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may take fewer bytes than given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


@functools.lru_cache(maxsize=None)
def _fsync_pool():
    """Threads for concurrent ``fsync`` (they wait on the disk, not the CPU), made once."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="pyro_sgmcmc-fsync")
