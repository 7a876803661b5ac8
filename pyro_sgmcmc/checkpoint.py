"""Atomic checkpoint files for long runs.

A checkpoint is a ``torch.save`` dictionary written to ``<path>.tmp``, flushed to disk, then
renamed over ``<path>`` (``os.replace`` is atomic on POSIX and Windows), so a process killed at any
moment leaves either the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

import torch

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointMismatch"]

FORMAT_VERSION = 1


class CheckpointMismatch(ValueError):
    """The checkpoint was written by a run with different settings than the one resuming it."""


def save_checkpoint(payload: dict, path: Union[str, os.PathLike]) -> None:
    """Write ``payload`` to ``path`` atomically (write to a temporary file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save({"format_version": FORMAT_VERSION, **payload}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Union[str, os.PathLike], fingerprint: Any) -> dict:
    """Read a checkpoint and check that it belongs to a run with the same ``fingerprint``."""
    try:
        payload = torch.load(Path(path), weights_only=False, map_location="cpu")
    except Exception as error:  # truncated, not a torch file, ...
        raise CheckpointMismatch(
            f"{path} is not a readable pyro_sgmcmc checkpoint ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(payload, dict):
        raise CheckpointMismatch(f"{path} is not a pyro_sgmcmc checkpoint (it holds a {type(payload).__name__})")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointMismatch(
            f"checkpoint {path} has format {payload.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    if payload.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            f"checkpoint {path} was written by a run with different settings:\n  theirs {payload.get('fingerprint')}\n"
            f"  ours   {fingerprint}\nuse another checkpoint path, delete the file, or pass resume=False"
        )
    return payload
