"""The errors of a run's checkpoint (:mod:`pyro_sgmcmc.checkpoint`), one class per way it can fail.

Each derives from :class:`CheckpointError` and from the built-in error it is a case of, so that code
catching ``ValueError``, ``RuntimeError`` or ``OSError`` still catches it:

* :class:`CheckpointMismatch` (``ValueError``): the file cannot be resumed by this run;
* :class:`CheckpointInUse` (``RuntimeError``): another run writes to the same path;
* :class:`CheckpointWriteError` (``OSError``, with the cause's ``errno``): the checkpoint cannot be written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

__all__ = ["CheckpointError", "CheckpointMismatch", "CheckpointInUse", "CheckpointWriteError"]


class CheckpointError(Exception):
    """Base class of the errors of a run's checkpoint (each also derives from the built-in error it is a case of)."""


class CheckpointMismatch(CheckpointError, ValueError):
    """The checkpoint cannot be resumed: other settings, a damaged or altered record, or not a checkpoint."""


class CheckpointInUse(CheckpointError, RuntimeError):
    """Another run holds the checkpoint's path (its lock, ``<path>.lock``): two writers would damage it.

    Attributes ``path`` (the checkpoint), ``pid`` and ``host`` (the holder's, ``None`` if it has not
    recorded them yet).
    """

    def __init__(
        self, message: str, path: Optional[Path] = None, pid: Optional[int] = None, host: Optional[str] = None
    ) -> None:
        super().__init__(message)
        self.path, self.pid, self.host = path, pid, host


class CheckpointWriteError(CheckpointError, OSError):
    """The checkpoint's directory cannot be written (a full disk, no permission, no directory).

    Built as ``CheckpointWriteError(errno, message, path)``: an :class:`OSError` with the cause's
    ``errno`` (``None`` if it had none), whose message names the checkpoint ``path`` (also the
    attribute ``path``).
    """

    def __init__(self, errno: Optional[int], message: str, path: Optional[Path] = None) -> None:
        super().__init__(*((message,) if errno is None else (errno, message)))
        self.path = path
