"""A checkpoint's directory before a run's first step: writable, no stale temporary file, an old checkpoint aside.

* :func:`check_writable`, when the run starts: a probe file is created, written, ``fsync``-ed and removed in
  the checkpoint's directory (and in its draw-chunk directory, if there is one), so that a directory that is
  missing, read-only, not the user's or full is an error naming the path before any step, not at the first
  write, thousands of steps later.
* :func:`remove_stale_temporaries`, under the run's lock (:mod:`~pyro_sgmcmc.run.checkpoint_lock`): the
  temporary files of writes that were killed (``<name>.<pid>-<hex>.tmp``, and the ``<name>.tmp`` of earlier
  versions); only the lock's holder writes, so any such file left is no live write's.
* :func:`move_aside`, for a run that starts afresh (``resume=False``) where a checkpoint exists: the index
  ``<path>`` is renamed to ``<path>.replaced-<UTC time>`` (one atomic rename: from then on there is no
  checkpoint at ``path`` to resume), then its chunks ``<path>.draws`` to ``<path>.replaced-<UTC time>.draws``,
  so the old run stays a complete checkpoint at that path, which ``checkpoint=<that path>`` resumes.
  :func:`prepare_fresh_start` also finishes a move that a killed process left half done (the index moved, its
  chunks not) and removes chunks that no index lists.
"""

from __future__ import annotations

import glob
import os
import re
import time
from pathlib import Path
from typing import List, Optional

import torch

from ..checkpoint import chunk_directory, clear_chunks, temporary_name
from ..checkpoint_errors import CheckpointWriteError

__all__ = ["check_writable", "remove_stale_temporaries", "move_aside", "prepare_fresh_start", "backups"]

#: How many bytes the probe writes: enough for a full file system to refuse it.
PROBE_BYTES = 4096


def check_writable(path: Path, sync: bool = True) -> None:
    """Create, write (``fsync`` with ``sync``) and remove a probe file beside ``path`` and in its chunk directory.

    Raises
    ------
    CheckpointWriteError
        Naming ``path``, the directory and the cause (``errno`` kept): the directory does not exist, is
        not a directory, cannot be written (permission, a read-only file system) or is full.
    """
    for directory in (path.parent, chunk_directory(path)):
        if directory != path.parent and not directory.is_dir():
            continue  # made by the first write of a chunk, in a directory just probed
        probe = temporary_name(directory / path.name if directory == path.parent else directory / "probe")
        try:
            descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                os.write(descriptor, b"\0" * PROBE_BYTES)
                if sync:
                    os.fsync(descriptor)
            finally:
                os.close(descriptor)
                probe.unlink(missing_ok=True)
        except OSError as error:
            raise CheckpointWriteError(
                error.errno,
                f"checkpoint {path}: the directory {directory} {_why(error)}, so the checkpoint could not be "
                f"written: nothing was run. Give a checkpoint path in a writable directory",
                path,
            ) from error


def _why(error: OSError) -> str:
    """What an ``OSError`` of the probe means for its directory, in words."""
    if isinstance(error, FileNotFoundError):
        return "does not exist"
    if isinstance(error, NotADirectoryError):
        return "is not a directory"
    if isinstance(error, PermissionError):
        return f"is not writable ({error.strerror})"
    return f"cannot be written ({type(error).__name__}: {error.strerror or error})"


#: A temporary file of a write (:func:`~pyro_sgmcmc.checkpoint.temporary_name`), after the name it is written for.
_TEMPORARY = r"(\.\d+-[0-9a-f]{8})?\.tmp"  # ``<name>.tmp`` alone: the temporary name of earlier versions
#: The names a directory of chunks holds for a while only: a chunk's temporary file, a probe.
_CHUNK_TEMPORARY = re.compile(r"(\d{12}-\d{12}\.pt|probe)" + _TEMPORARY)


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files that killed writes left beside ``path`` and in its chunk directory.

    Only the holder of the checkpoint's lock may call it: no other process writes there then.
    """
    index = re.compile(re.escape(path.name) + _TEMPORARY)
    stale = [p for p in path.parent.glob(glob.escape(path.name) + "*.tmp") if index.fullmatch(p.name)]
    chunks = chunk_directory(path)
    if chunks.is_dir():
        stale += [p for p in chunks.glob("*.tmp") if _CHUNK_TEMPORARY.fullmatch(p.name)]
    for file in stale:
        file.unlink(missing_ok=True)


def backups(path: Path) -> List[Path]:
    """The checkpoints :func:`move_aside` made of ``path``, oldest first: ``<path>.replaced-<UTC time>[-n]``."""
    pattern = re.compile(re.escape(path.name) + r"\.replaced-\d{8}T\d{6}Z(-\d+)?")
    found = [p for p in path.parent.glob(glob.escape(path.name) + ".replaced-*") if pattern.fullmatch(p.name)]
    return sorted(found, key=lambda p: (p.name.split(".replaced-")[-1][:16], _copy_number(p)))


def _copy_number(backup: Path) -> int:
    tail = backup.name.rsplit("Z", 1)[-1]
    return int(tail[1:]) if tail else 1


def move_aside(path: Path) -> Path:
    """Rename the checkpoint ``path`` (index, then chunk directory) to a new ``<path>.replaced-<UTC time>``.

    The index's rename is atomic: before it the old checkpoint is whole at ``path``, after it there is
    none there. Returns the new path, a complete checkpoint that ``checkpoint=<it>`` resumes.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    backup, copy = path.with_name(f"{path.name}.replaced-{stamp}"), 1
    while backup.exists() or chunk_directory(backup).exists():
        copy += 1
        backup = path.with_name(f"{path.name}.replaced-{stamp}-{copy}")
    os.rename(path, backup)
    if chunk_directory(path).is_dir():
        os.rename(chunk_directory(path), chunk_directory(backup))
    return backup


def prepare_fresh_start(path: Path) -> Optional[Path]:
    """Make room for a run that starts afresh at ``path``: the old checkpoint aside (:func:`move_aside`, whose path
    is returned; ``None`` if there was none), and the chunks no index lists either returned to the backup whose
    move was killed between its two renames (the one whose last chunk they hold) or removed."""
    backup = move_aside(path) if path.exists() else None
    orphans = chunk_directory(path)
    if orphans.is_dir():
        owner = _unfinished_move(path, orphans)
        if owner is not None:
            os.rename(orphans, chunk_directory(owner))
        else:
            clear_chunks(path)
    return backup


def _unfinished_move(path: Path, orphans: Path) -> Optional[Path]:
    """The newest backup of ``path`` without its chunk directory whose last chunk is in ``orphans``."""
    for backup in reversed(backups(path)):
        if chunk_directory(backup).exists():
            continue
        try:
            last = torch.load(backup, weights_only=True, map_location="cpu").get("last_chunk")
        except Exception:  # not a readable checkpoint: not the owner
            continue
        if isinstance(last, dict) and (orphans / Path(str(last.get("file"))).name).is_file():
            return backup
    return None
