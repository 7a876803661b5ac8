"""The reliability script's run stopped by an exception raised from its hook at a chosen step: the checkpoint files
it leaves (shared by the restore tests, which forge or interrupt a resume of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyro_sgmcmc.checkpoint import chunk_directory

from .. import reliability_script as script


class Interrupt(Exception):
    """Raised from a run's hook: the run stops as at an interrupt, its last checkpoint on disk."""


def interrupted_checkpoint_files(directory: Path, step: int = 57, every: int = 10) -> dict:
    """``{file name: bytes}`` of the index and chunk files of the script's run stopped at ``step`` (a checkpoint
    every ``every`` steps: at step 57 the index is step 50's)."""
    path = directory / "run.ckpt"

    def interrupt(kernel, params, stage, i):
        if kernel.state.step == step:
            raise Interrupt

    with pytest.raises(Interrupt):
        script.run(checkpoint=path, every=every, hook=interrupt)
    return {p.name: p.read_bytes() for p in [path, *chunk_directory(path).iterdir()]}
