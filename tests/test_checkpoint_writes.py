"""A checkpoint write that fails, and two writes to one file at once (issue 26 points 5 and 6).

The oracle is the uninterrupted run with the same seed (``tests/reliability_script.py``): after a write fails
the draws kept in memory must be its first ones bit for bit, and the last complete checkpoint, untouched by the
failed write, must resume to its draws bit for bit.
"""

import errno
import os
import re
import warnings

import pyro
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, CheckpointSettings, PartialRunWarning
from pyro_sgmcmc.checkpoint import CheckpointWriteError, chunk_directory, commit_files

from . import reliability_script as script

WARMUP = script.SETTINGS["warmup_steps"]


@pytest.fixture(scope="module")
def reference():
    return script.run()


def _mcmc(path, every, hook=None):
    pyro.set_rng_seed(0)
    return MCMC(SGHMC(script.model, step_size=0.02), checkpoint=CheckpointSettings(path, every=every),
                hook_fn=hook, disable_progbar=True, **script.SETTINGS)  # fmt: skip


@pytest.mark.parametrize(
    "call, every, full_from, last_good",
    [("write", 10, 57, 50), ("fsync", 50, 1, None)],
    ids=["write-after-a-checkpoint", "fsync-at-the-first-write"],
)
def test_a_full_disk_names_the_path_keeps_the_last_checkpoint_and_the_draws(
    reference, tmp_path, monkeypatch, call, every, full_from, last_good
):
    """The disk fills at step ``full_from`` (``os.write`` or ``os.fsync`` raise ``ENOSPC`` from then on); the next
    write fails. The error names the checkpoint path and keeps the errno; the previous checkpoint's files are as
    they were (no temporary file left) and resume to the uninterrupted run's draws once there is space; the draws
    so far stay in memory, equal to that run's first ones; and neither the error nor ``partial`` advises resuming
    from a checkpoint that does not exist."""
    path = tmp_path / "run.ckpt"
    full = []
    original = getattr(os, call)

    def no_space_left(*args):
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(*args)

    def fill_the_disk(kernel, params, stage, i):
        if kernel.state.step == full_from:
            full.append(True)

    monkeypatch.setattr(os, call, no_space_left)
    mcmc = _mcmc(path, every, fill_the_disk)
    with pytest.raises(CheckpointWriteError) as failed:
        mcmc.run(*script.data())
    failed_at = (full_from // every + 1) * every  # the first write after the disk filled
    message = str(failed.value)
    assert failed.value.errno == errno.ENOSPC and failed.value.path == path and isinstance(failed.value, OSError)
    assert f"checkpoint {path}: writing the checkpoint of step {failed_at} failed (OSError: No space" in message
    monkeypatch.undo()  # space again
    kept = failed_at - WARMUP
    partial = mcmc.partial
    assert (partial.steps_done, partial.num_draws, partial.phase) == (failed_at, kept, "sampling")
    with pytest.warns(PartialRunWarning):
        draws = mcmc.get_samples(group_by_chain=True)
    for name, values in reference.get_samples(group_by_chain=True).items():
        assert torch.equal(draws[name], values[:, :kept]), name
    if last_good is None:
        assert "no checkpoint of this run had been written yet, so there is none to resume from" in message
        assert partial.checkpoint_path is None and "resume from its last checkpoint" not in partial.describe()
        assert os.listdir(tmp_path) == ["run.ckpt.draws"]  # no index, no temporary file, no lock
        assert os.listdir(chunk_directory(path)) == []  # and no chunk, nor its temporary file
        return
    assert f"the last complete checkpoint, of step {last_good}, is intact" in message
    assert partial.checkpoint_path == str(path) and "resume from its last checkpoint" in partial.describe()
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt", "run.ckpt.draws"]  # no temporary file, no lock
    assert os.listdir(chunk_directory(path)) == [f"000000000000-{last_good - WARMUP:012d}.pt"]
    assert torch.load(path, weights_only=True)["steps_done"] == last_good
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = _mcmc(path, every)
        resumed.run(*script.data())
    for name, values in reference.get_samples(group_by_chain=True).items():
        assert torch.equal(resumed.get_samples(group_by_chain=True)[name], values), name


def test_two_writes_of_one_file_at_once_do_not_collide(tmp_path, monkeypatch):
    """Another write of the same file completes between our write and our rename (two processes; before the lock,
    or a file system without locks): each uses a temporary file of its own, so both succeed, the file is whole,
    and no temporary file is left. With one shared ``<name>.tmp`` our rename found it gone (``FileNotFoundError``)."""
    target = tmp_path / "run.ckpt"
    original = os.replace
    renamed = []

    def another_write_first(source, destination):
        renamed.append(os.fspath(source))
        if len(renamed) == 1:
            commit_files([(b"theirs", target)])
        return original(source, destination)

    monkeypatch.setattr(os, "replace", another_write_first)
    commit_files([(b"ours", target)])
    assert target.read_bytes() == b"ours" and os.listdir(tmp_path) == ["run.ckpt"]
    assert len(set(renamed)) == 2
    for source in renamed:
        assert re.fullmatch(re.escape(str(target)) + rf"\.{os.getpid()}-[0-9a-f]{{8}}\.tmp", source), source


def test_a_failed_write_removes_its_temporary_files_and_renames_nothing(tmp_path, monkeypatch):
    """Of a chunk and an index written together, the index's write fails: neither is renamed (the chunk would be
    harmless, unlisted, but is not even there) and no temporary file is left."""
    chunk, index = tmp_path / "chunk.pt", tmp_path / "run.ckpt"
    index.write_bytes(b"previous")
    original = os.write

    def index_fails(descriptor, data):
        if bytes(data) == b"new index":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(descriptor, data)

    monkeypatch.setattr(os, "write", index_fails)
    with pytest.raises(OSError, match="No space left"):
        commit_files([(b"new chunk", chunk), (b"new index", index)])
    assert os.listdir(tmp_path) == ["run.ckpt"] and index.read_bytes() == b"previous"
