"""One writer per checkpoint path: an advisory lock that a run holds from its set-up to its end.

Two runs writing one checkpoint would each rename their files over the other's: the draws of one and
the state of the other, or a chunk that the index does not name. So a run with a checkpoint takes an
exclusive lock on ``<path>.lock`` before it reads or writes anything of the checkpoint, and keeps it
until it ends (finished, failed or interrupted: :meth:`CheckpointLock.release`). A second run on the
same path, in this process or another, on this machine or (on a file system that shares locks, such
as NFS) another, is refused at once with :class:`~pyro_sgmcmc.checkpoint.CheckpointInUse`, which names
the holder's process id and host from the lock file.

The lock is ``flock`` (``fcntl.flock``, a BSD lock on the open file; ``msvcrt.locking`` on Windows):
the operating system releases it when the holder's file is closed, which happens when the process
ends however it ends, so a run killed by ``SIGKILL`` or a power cut leaves no lock behind that would
block the next one (its lock file may stay: a file nobody holds is no lock). The holder removes the
file before it lets go of the lock; a run that opened the old file meanwhile then finds that the
file it locked is no longer the one at ``<path>.lock`` and starts again with the new one, so two runs
never both believe they hold it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Optional, Tuple

from ..checkpoint_errors import CheckpointInUse

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
    import msvcrt

__all__ = ["CheckpointLock", "lock_path"]


def lock_path(path: Path) -> Path:
    """The lock file of checkpoint ``path``: ``<path>.lock``."""
    return path.with_name(path.name + ".lock")


class CheckpointLock:
    """The exclusive lock of checkpoint ``path``, held by this process until :meth:`release`.

    Parameters
    ----------
    path : Path
        The checkpoint (the lock file is ``<path>.lock``).

    Raises
    ------
    CheckpointInUse
        Another run (another process, or another run in this one) holds it; the message names its
        process id and host.
    OSError
        The lock file cannot be created (the directory is not writable).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> directory = tempfile.TemporaryDirectory()
    >>> path = pathlib.Path(directory.name) / "run.ckpt"
    >>> lock = CheckpointLock(path)
    >>> CheckpointLock(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pyro_sgmcmc.checkpoint_errors.CheckpointInUse: checkpoint .../run.ckpt is in use by another run (process ...
    >>> lock.release()
    >>> with CheckpointLock(path):  # free again: a run that ends releases it
    ...     pass
    >>> directory.cleanup()
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = lock_path(path)
        self.descriptor: Optional[int] = _acquire(path, self.file)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:  # who holds it, for the message of a run refused
            os.ftruncate(self.descriptor, 0)
            os.lseek(self.descriptor, 0, os.SEEK_SET)
            os.write(self.descriptor, f"pid={os.getpid()} host={socket.gethostname()} since={since}\n".encode())
        except BaseException:
            self.release()
            raise

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self.descriptor is not None

    def release(self) -> None:
        """Remove the lock file and let go of the lock (nothing if already released)."""
        descriptor, self.descriptor = self.descriptor, None
        if descriptor is None:
            return
        if fcntl is not None:  # while still held: whoever locks the old file next sees that it is gone
            with contextlib.suppress(OSError):
                self.file.unlink()
        os.close(descriptor)  # releases the lock (POSIX and Windows)

    def __enter__(self) -> "CheckpointLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _acquire(path: Path, file: Path) -> int:
    """An open descriptor of ``file`` (the one now at that name) locked exclusively by this process."""
    while True:
        descriptor = os.open(file, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _lock(descriptor)
        except OSError:  # held by another (BlockingIOError on POSIX, PermissionError on Windows)
            holder = _read(descriptor)
            os.close(descriptor)
            raise _in_use(path, file, holder) from None
        try:
            current = os.stat(file)
        except FileNotFoundError:
            current = None
        opened = os.fstat(descriptor)
        if current is not None and (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino):
            return descriptor
        os.close(descriptor)  # the holder removed it as we opened it: lock the file now at that name


def _lock(descriptor: int) -> None:
    if fcntl is not None:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:  # pragma: no cover - Windows: one byte far beyond the holder's line, which stays readable
        os.lseek(descriptor, 1 << 20, os.SEEK_SET)
        msvcrt.locking(descriptor, msvcrt.LK_NBLCK, 1)


def _read(descriptor: int) -> str:
    """The holder's line (empty if it has not written it yet, or cannot be read)."""
    try:
        os.lseek(descriptor, 0, os.SEEK_SET)
        return os.read(descriptor, 4096).decode(errors="replace").strip()
    except OSError:
        return ""


def _holder(line: str) -> Tuple[Optional[int], Optional[str], Optional[str]]:
    """``(pid, host, since)`` from the holder's line ``pid=... host=... since=...``."""
    fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
    pid = fields.get("pid", "")
    return (int(pid) if pid.isdigit() else None), fields.get("host"), fields.get("since")


def _in_use(path: Path, file: Path, line: str) -> CheckpointInUse:
    pid, host, since = _holder(line)
    same = " (this process)" if (pid, host) == (os.getpid(), socket.gethostname()) else ""
    who = f"process {pid} on host {host}{same}, since {since}" if pid is not None else "a process not yet recorded"
    return CheckpointInUse(
        f"checkpoint {path} is in use by another run ({who}; lock file {file}): "
        "two runs writing one checkpoint would damage it. Wait for that run to end or stop it, or give this run "
        "another checkpoint path",
        path,
        pid,
        host,
    )
