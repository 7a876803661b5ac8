"""A run's checkpoint: what it writes at each checkpoint, how it resumes, and the fingerprint it checks.

The files and their guarantees (atomic writes, hash chain, verified reads) are those of
:mod:`pyro_sgmcmc.checkpoint`; this module decides what goes in them: a draw chunk with the draws
kept since the previous write, the kernel's state in the index (its minibatch streams are keyed
permutations: a few integers per chain and plate, no table), and the run's *fingerprint*, the
settings that change the draws (:mod:`.fingerprint`), which a resuming run must share.

One run writes a checkpoint at a time, and the directory is checked before the first step
(:func:`open_checkpoint`): the run holds the path's lock (:mod:`~pyro_sgmcmc.run.checkpoint_lock`) until
:meth:`RunCheckpoint.close`, its directory is probed (:mod:`~pyro_sgmcmc.run.checkpoint_directory`), and a
write that fails later (a full disk) is a :class:`~pyro_sgmcmc.checkpoint.CheckpointWriteError` naming the
path that leaves the last complete checkpoint as it was.

A finished run's checkpoint can be read where it cannot be written (an archive: a read-only directory, or one
not the user's): resuming it writes nothing, so when the directory refuses the probe with a permission or
read-only error and the checkpoint there is complete, it is opened read-only (:func:`open_checkpoint`) and
its draws loaded. A checkpoint that is not complete still needs the directory, and the lock, to be resumed.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Dict, Optional

import torch

from ..checkpoint import (
    CheckpointMismatch,
    CheckpointWriteError,
    check_serialisable,
    commit_files,
    iter_chunks,
    load_checkpoint,
    save_checkpoint,
    write_chunk,
)
from ..draws import DrawStore
from ..kernels.base import SGMCMCKernel
from .checkpoint_directory import check_writable, prepare_fresh_start, remove_stale_temporaries
from .checkpoint_lock import CheckpointLock
from .length import RunLength
from .restore_checks import RunLayout, check_kernel_state, check_last_chunk
from .schedule_state import restore_schedule_state, state_with_schedule

__all__ = ["RunCheckpoint", "open_checkpoint"]


def open_checkpoint(
    path: Path, fingerprint: dict, length: RunLength, *, resume: bool, sync: bool, key: Optional[bytes] = None
) -> "RunCheckpoint":
    """The run's checkpoint at ``path``, held by this run until :meth:`RunCheckpoint.close`.

    Its directory is probed (:func:`~pyro_sgmcmc.run.checkpoint_directory.check_writable`: a
    :class:`~pyro_sgmcmc.checkpoint.CheckpointWriteError` naming the path if it cannot be written), its lock
    taken (:class:`~pyro_sgmcmc.run.checkpoint_lock.CheckpointLock`: a
    :class:`~pyro_sgmcmc.checkpoint.CheckpointInUse` naming the holder if another run has it), the temporary
    files of killed writes removed. With ``resume`` and a file there its index is read and verified now
    (:meth:`RunCheckpoint.load`): a checkpoint of other settings is refused before the chains' set-up, and a
    matching one then restores them (:meth:`RunCheckpoint.restore`) instead of it (:meth:`RunCheckpoint.start`).

    With ``resume``, a directory that refuses writes (``EACCES``, ``EPERM``, ``EROFS``) holding a *complete*
    checkpoint of this run is opened read-only instead: no probe, no lock (no file can be made there), the index
    read and verified, the draws then restored; resuming it runs no step and writes nothing. A run that would write
    (an incomplete checkpoint, or none) is refused with the probe's error, as before.
    """
    try:
        check_writable(path, sync)
    except CheckpointWriteError as error:
        if not (resume and path.is_file() and error.errno in READ_ONLY):
            raise
        return _open_finished(path, fingerprint, length, key, error)
    checkpoint = RunCheckpoint(path, fingerprint, sync, key)
    checkpoint.lock = CheckpointLock(path)
    try:
        remove_stale_temporaries(path)
        if resume and path.exists():
            checkpoint.load(length)
    except BaseException:
        checkpoint.close()
        raise
    return checkpoint


#: The errors of a directory that can be read but not written.
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def _open_finished(
    path: Path, fingerprint: dict, length: RunLength, key: Optional[bytes], refused: CheckpointWriteError
) -> "RunCheckpoint":
    """A complete checkpoint in a directory that cannot be written, opened to be read (see :func:`open_checkpoint`).

    Without the lock: a reader writes nothing, and every record and chunk it reads is verified against the index's
    checksums and the hash chain, so a run that replaces the checkpoint meanwhile (``resume=False``, by a user who
    may write there) makes the read fail with a named error, never return a mixture."""
    checkpoint = RunCheckpoint(path, fingerprint, sync=False, key=key)
    checkpoint.read_only = True
    checkpoint.load(length)
    if checkpoint.on_disk != length.total_steps:
        raise CheckpointWriteError(
            refused.errno,
            f"{refused.strerror or refused} The checkpoint there is at step {checkpoint.on_disk} of "
            f"{length.total_steps}: resuming it writes to the directory (a complete run's checkpoint can be read "
            "where it cannot be written)",
            path,
        ) from refused
    return checkpoint


class RunCheckpoint:
    """A run's checkpoint: the draw chunks written so far and the index that lists them (see the module)."""

    def __init__(self, path: Path, fingerprint: dict, sync: bool = True, key: Optional[bytes] = None) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.sync = sync
        self.key = key  # signs the index (HMAC-SHA256) and is required of the one resumed: CheckpointSettings.key
        self.last_chunk: Optional[dict] = None  # the entry of the last chunk written (the hash chain's end)
        self.written = 0  # draws already in chunk files
        self.steps_done = 0
        self.saved: Optional[dict] = None  # the verified index of the checkpoint being resumed, until restored
        self.lock: Optional[CheckpointLock] = None  # held from open_checkpoint to close
        self.on_disk: Optional[int] = None  # the step of this run's last complete checkpoint at path (None: none)
        self.moved_to: Optional[Path] = None  # where a fresh start moved the checkpoint it found (move_aside)
        self.read_only = False  # a complete checkpoint opened where it cannot be written: nothing may be written

    def write(self, steps_done: int, phase: str, kernel: SGMCMCKernel, store: DrawStore) -> None:
        """One chunk with the draws since the last write (O(k)), then the index: written together (their
        fsyncs concurrent), renamed in that order.

        A write that fails (``OSError``: a full disk, a directory removed) renames nothing and raises
        :class:`~pyro_sgmcmc.checkpoint.CheckpointWriteError` naming the path and the last complete
        checkpoint, which stays as it was (the run's draws stay in memory: see :mod:`~pyro_sgmcmc.run.loop`).
        """
        if self.read_only:
            raise RuntimeError(f"checkpoint {self.path} was opened read-only (a complete run): nothing is written")
        pending: list = []
        last_chunk = self.last_chunk
        try:
            if store.count > self.written:
                positions, stats = store.filled(self.written)
                last_chunk = write_chunk(self.path, self.written, positions, stats, last_chunk, pending=pending)
            state = state_with_schedule(kernel)
            payload = {
                "fingerprint": self.fingerprint,
                "steps_done": steps_done,
                "phase": phase,
                "kernel": state,
                "last_chunk": last_chunk,
            }
            save_checkpoint(payload, self.path, pending=pending, key=self.key)
            commit_files(pending, self.sync)
        except OSError as error:
            raise self._write_error(error, steps_done) from error
        self.last_chunk, self.written, self.steps_done = last_chunk, store.count, steps_done
        self.on_disk = steps_done

    def _write_error(self, error: OSError, steps_done: int) -> CheckpointWriteError:
        """The error of a failed write at ``steps_done``: the path, the cause, what is left and where."""
        cause = f"{type(error).__name__}: {error.strerror or error}" + (f": {error.filename}" if error.filename else "")
        if self.on_disk is not None:
            left = (
                f"the last complete checkpoint, of step {self.on_disk}, is intact: once the cause is fixed, run() "
                "with the same settings resumes from it"
            )
        else:
            left = "no checkpoint of this run had been written yet, so there is none to resume from"
        return CheckpointWriteError(
            error.errno,
            f"checkpoint {self.path}: writing the checkpoint of step {steps_done} failed ({cause}); {left}. "
            "The draws so far are kept in memory (mcmc.partial, mcmc.get_samples())",
            self.path,
        )

    def close(self) -> None:
        """Release the path's lock (nothing if not held): at the end of the run, however it ends."""
        if self.lock is not None:
            self.lock.release()

    @property
    def resuming(self) -> bool:
        """Whether the run continues this checkpoint (its index was loaded) rather than starting it afresh."""
        return self.saved is not None

    def start(self, kernel: SGMCMCKernel) -> None:
        """A fresh run (its chains set up): check that their state can be saved; move a checkpoint found at the
        path aside (``resume=False``: :func:`~pyro_sgmcmc.run.checkpoint_directory.prepare_fresh_start`, which
        also removes chunks no index lists)."""
        # before any step: a state that cannot be saved and read back safely is an error now, not at the first write
        check_serialisable(state_with_schedule(kernel), f"{type(kernel).__name__}'s state")
        try:
            self.moved_to = prepare_fresh_start(self.path)
        except OSError as error:
            raise CheckpointWriteError(
                error.errno,
                f"checkpoint {self.path}: the checkpoint there could not be moved aside for a fresh start "
                f"({type(error).__name__}: {error}): nothing was run",
                self.path,
            ) from error

    def load(self, length: RunLength) -> None:
        """Read and verify the index (records, fingerprint, step counter): before the chains' set-up."""
        saved = load_checkpoint(self.path, self.fingerprint, self.key)
        steps_done = saved.get("steps_done")
        total = length.total_steps
        if isinstance(steps_done, bool) or not isinstance(steps_done, int) or not 0 <= steps_done <= total:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: steps_done={steps_done!r} is not a step of this run (0 to {total})"
            )
        state = saved.get("kernel")
        if not isinstance(state, dict) or not isinstance(state.get("minibatches"), dict):
            raise CheckpointMismatch(f"checkpoint {self.path}: the record 'kernel' does not hold a kernel's state")
        self.saved, self.on_disk = saved, steps_done

    def restore(self, kernel: SGMCMCKernel, store: DrawStore, length: RunLength, layout: RunLayout) -> None:
        """The loaded checkpoint's draws into ``store`` and its chains into ``kernel`` (prepared with
        :meth:`~SGMCMCKernel.prepare_chains`: :meth:`~SGMCMCKernel.restore_chains` does the rest of the set-up).

        Every field is checked against the run (``layout``: :mod:`~pyro_sgmcmc.run.restore_checks`) before
        anything is made from it, and the draws are streamed: one chunk at a time is read, verified and copied
        into ``store`` (preallocated), so a resume holds the draws once plus one chunk."""
        saved, steps_done = self.saved, self.saved["steps_done"]
        expected = length.draws_after(steps_done)
        check_last_chunk(self.path, saved.get("last_chunk"), expected, steps_done)
        check_kernel_state(self.path, saved["kernel"], steps_done, layout)
        for entry, positions, stats in iter_chunks(self.path, saved.get("last_chunk")):
            self._place(store, entry, positions, stats)
            del positions, stats  # one chunk at a time
        try:
            kernel.restore_chains(saved["kernel"])
            restore_schedule_state(kernel, saved["kernel"])
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as error:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: the kernel's state cannot be restored ({type(error).__name__}: {error})"
            ) from error
        _validate_state(self.path, kernel, steps_done)
        check_serialisable(state_with_schedule(kernel), f"{type(kernel).__name__}'s state")
        self.last_chunk, self.written, self.steps_done = saved.get("last_chunk"), store.count, steps_done
        self.saved = None  # the run continues: the index is not kept

    def _place(self, store: DrawStore, entry: dict, positions: torch.Tensor, stats: Dict[str, torch.Tensor]) -> None:
        """Check one chunk's draws against this run (shapes, dtype, finite) and copy them to their place in
        ``store``."""
        expected = (store.num_chains, entry["stop"] - entry["start"], store.positions.shape[-1])
        if tuple(positions.shape) != expected or positions.dtype != store.positions.dtype:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: draw chunk {entry['file']} holds positions of shape {tuple(positions.shape)} "
                f"({positions.dtype}); this run's are {expected} ({store.positions.dtype})"
            )
        if not _all_finite(positions):
            raise CheckpointMismatch(f"checkpoint {self.path}: draw chunk {entry['file']} holds non-finite positions")
        try:
            store.place(entry["start"], positions, stats)
        except (ValueError, RuntimeError) as error:
            raise CheckpointMismatch(f"checkpoint {self.path}: draw chunk {entry['file']}: {error}") from error


def _all_finite(tensor: torch.Tensor, block: int = 1 << 16) -> bool:
    """Whether every element is finite, checked ``block`` elements at a time (``torch.isfinite`` of a whole chunk
    would make temporaries larger than the chunk itself)."""
    flat = tensor.reshape(-1)
    return all(bool(torch.isfinite(flat[i : i + block]).all()) for i in range(0, flat.numel(), block))


def _validate_state(path: Path, kernel: SGMCMCKernel, steps_done: int) -> None:
    """The restored chains: at the saved step, finite, of the model's shapes."""
    state = kernel.state
    if state.step != steps_done:
        raise CheckpointMismatch(f"checkpoint {path}: the kernel's state is at step {state.step}, not {steps_done}")
    for name in ("position", "momentum", "potential", "grad", "thermostat"):
        value = getattr(state, name)
        if value is not None and not bool(torch.isfinite(value).all()):
            raise CheckpointMismatch(f"checkpoint {path}: the chains' saved {name} is not finite")
