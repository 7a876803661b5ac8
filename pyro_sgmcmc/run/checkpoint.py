"""A run's checkpoint: what it writes at each checkpoint, how it resumes, and the fingerprint it checks.

The files and their guarantees (atomic writes, hash chain, verified reads) are those of
:mod:`pyro_sgmcmc.checkpoint`; this module decides what goes in them: a draw chunk with the draws
kept since the previous write, the kernel's state in the index (its minibatch streams are keyed
permutations: a few integers per chain and plate, no table), and the run's *fingerprint*, the
settings that change the draws (:mod:`.fingerprint`), which a resuming run must share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import torch

from ..checkpoint import (
    CheckpointMismatch,
    check_serialisable,
    clear_chunks,
    commit_files,
    load_checkpoint,
    read_chunks,
    save_checkpoint,
    write_chunk,
)
from ..draws import DrawStore
from ..kernels.base import SGMCMCKernel
from .length import RunLength
from .schedule_state import restore_schedule_state, state_with_schedule

__all__ = ["RunCheckpoint", "open_checkpoint"]


def open_checkpoint(path: Path, fingerprint: dict, length: RunLength, *, resume: bool, sync: bool) -> "RunCheckpoint":
    """The run's checkpoint at ``path``. With ``resume`` and a file there its index is read and verified now
    (:meth:`RunCheckpoint.load`): a checkpoint of other settings is refused before the chains' set-up, and a
    matching one then restores them (:meth:`RunCheckpoint.restore`) instead of it (:meth:`RunCheckpoint.start`)."""
    checkpoint = RunCheckpoint(path, fingerprint, sync)
    if resume and path.exists():
        checkpoint.load(length)
    return checkpoint


class RunCheckpoint:
    """A run's checkpoint: the draw chunks written so far and the index that lists them (see the module)."""

    def __init__(self, path: Path, fingerprint: dict, sync: bool = True) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.sync = sync
        self.last_chunk: Optional[dict] = None  # the entry of the last chunk written (the hash chain's end)
        self.written = 0  # draws already in chunk files
        self.steps_done = 0
        self.saved: Optional[dict] = None  # the verified index of the checkpoint being resumed, until restored

    def write(self, steps_done: int, phase: str, kernel: SGMCMCKernel, store: DrawStore) -> None:
        """One chunk with the draws since the last write (O(k)), then the index: written together (their
        fsyncs concurrent), renamed in that order."""
        pending: list = []
        last_chunk = self.last_chunk
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
        save_checkpoint(payload, self.path, pending=pending)
        commit_files(pending, self.sync)
        self.last_chunk, self.written, self.steps_done = last_chunk, store.count, steps_done

    @property
    def resuming(self) -> bool:
        """Whether the run continues this checkpoint (its index was loaded) rather than starting it afresh."""
        return self.saved is not None

    def start(self, kernel: SGMCMCKernel) -> None:
        """A fresh run (its chains set up): check that their state can be saved, remove earlier draw chunks."""
        # before any step: a state that cannot be saved and read back safely is an error now, not at the first write
        check_serialisable(state_with_schedule(kernel), f"{type(kernel).__name__}'s state")
        clear_chunks(self.path)

    def load(self, length: RunLength) -> None:
        """Read and verify the index (records, fingerprint, step counter): before the chains' set-up."""
        saved = load_checkpoint(self.path, self.fingerprint)
        steps_done = saved.get("steps_done")
        total = length.total_steps
        if isinstance(steps_done, bool) or not isinstance(steps_done, int) or not 0 <= steps_done <= total:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: steps_done={steps_done!r} is not a step of this run (0 to {total})"
            )
        state = saved.get("kernel")
        if not isinstance(state, dict) or not isinstance(state.get("minibatches"), dict):
            raise CheckpointMismatch(f"checkpoint {self.path}: the record 'kernel' does not hold a kernel's state")
        self.saved = saved

    def restore(self, kernel: SGMCMCKernel, store: DrawStore, length: RunLength) -> None:
        """The loaded checkpoint's draws into ``store`` and its chains into ``kernel`` (prepared with
        :meth:`~SGMCMCKernel.prepare_chains`: :meth:`~SGMCMCKernel.restore_chains` does the rest of the set-up)."""
        saved, steps_done = self.saved, self.saved["steps_done"]
        expected = length.draws_after(steps_done)
        for entry, positions, stats in read_chunks(self.path, saved.get("last_chunk")):
            self._extend(store, entry, positions, stats)
        if store.count != expected:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: {store.count} draws saved, but a run stopped after {steps_done} steps keeps "
                f"{expected}"
            )
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

    def _extend(self, store: DrawStore, entry: dict, positions: torch.Tensor, stats: Dict[str, torch.Tensor]) -> None:
        """Check one chunk's draws against this run (shapes, dtype, finite) and append them to ``store``."""
        expected = (store.num_chains, entry["stop"] - entry["start"], store.positions.shape[-1])
        if tuple(positions.shape) != expected or positions.dtype != store.positions.dtype:
            raise CheckpointMismatch(
                f"checkpoint {self.path}: draw chunk {entry['file']} holds positions of shape {tuple(positions.shape)} "
                f"({positions.dtype}); this run's are {expected} ({store.positions.dtype})"
            )
        if not bool(torch.isfinite(positions).all()):
            raise CheckpointMismatch(f"checkpoint {self.path}: draw chunk {entry['file']} holds non-finite positions")
        try:
            store.extend(
                positions.to(store.positions.device), {k: v.to(store.positions.device) for k, v in stats.items()}
            )
        except (ValueError, RuntimeError) as error:
            raise CheckpointMismatch(f"checkpoint {self.path}: draw chunk {entry['file']}: {error}") from error


def _validate_state(path: Path, kernel: SGMCMCKernel, steps_done: int) -> None:
    """The restored chains: at the saved step, finite, of the model's shapes."""
    state = kernel.state
    if state.step != steps_done:
        raise CheckpointMismatch(f"checkpoint {path}: the kernel's state is at step {state.step}, not {steps_done}")
    for name in ("position", "momentum", "potential", "grad", "thermostat"):
        value = getattr(state, name)
        if value is not None and not bool(torch.isfinite(value).all()):
            raise CheckpointMismatch(f"checkpoint {path}: the chains' saved {name} is not finite")
