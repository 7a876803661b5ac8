"""The checkpoint's directory before the first step (issue 26 points 5 and 6).

* A directory that cannot be written (removed, read-only, a file in its place) is a ``CheckpointWriteError``
  naming the path before any step: the oracle is the hook, which must never have been called, and the
  absence of any file or partial run to resume.
* ``resume=False`` where a checkpoint exists moves it aside whole (index and chunks, one atomic rename of the
  index first): the oracle is the old run itself, which its backup must resume to bit for bit; a fresh run
  stopped before its first write leaves no index at the path (before: an index whose chunks were gone).
* The temporary files of killed writes are removed by the next holder of the lock, and only those.

The tests run as root here, and root ignores a directory's mode: the read-only case takes the capability to
override it (``CAP_DAC_OVERRIDE``) out of this thread's effective set while the run is set up, so that the kernel
applies ``chmod 0o500`` to it as to any user; it is skipped, saying why, where that cannot be done.
"""

import contextlib
import ctypes
import errno
import os
import shutil
from pathlib import Path

import pyro
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, CheckpointSettings, RunNotFinished
from pyro_sgmcmc.checkpoint import CheckpointWriteError, chunk_directory
from pyro_sgmcmc.run.checkpoint_directory import backups, move_aside
from pyro_sgmcmc.run.checkpoint_lock import lock_path

from .. import reliability_script as script


class Interrupt(Exception):
    pass


def _mcmc(path, *, resume=True, hook=None, every=10, step_size=0.02):
    pyro.set_rng_seed(0)
    return MCMC(SGHMC(script.model, step_size=step_size), checkpoint=CheckpointSettings(path, every=every,
                resume=resume), hook_fn=hook, disable_progbar=True, **script.SETTINGS)  # fmt: skip


def _equal_runs(a, b):
    for name, draws in a.get_samples(group_by_chain=True).items():
        assert torch.equal(draws, b.get_samples(group_by_chain=True)[name]), name
    for name, stat in a.sample_stats.items():
        assert torch.equal(stat, b.sample_stats[name]), name


# ---------------------------------------------------------------------- root ignores a directory's mode
class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilitySets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


CAP_DAC_OVERRIDE = 1  # linux/capability.h: bypass the file's read, write and execute permission checks


@contextlib.contextmanager
def _directory_modes_apply_to_this_thread():
    """While inside, this thread's file operations obey the directories' modes even for root (``CAP_DAC_OVERRIDE``
    off in its effective set; back on after: it stays in the permitted set). Skips the test where it cannot."""
    if os.name != "posix" or os.geteuid() != 0:
        yield  # not root: the modes already apply
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header, sets = _CapabilityHeader(0x20080522, 0), (_CapabilitySets * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if not hasattr(libc, "capset") or libc.capget(ctypes.byref(header), sets) != 0:
        pytest.skip("running as root without capget/capset: a directory's mode cannot be made to apply")
    saved = sets[0].effective
    sets[0].effective &= ~(1 << CAP_DAC_OVERRIDE)
    if libc.capset(ctypes.byref(header), sets) != 0:
        pytest.skip(f"running as root and capset failed (errno {ctypes.get_errno()}): modes cannot be made to apply")
    try:
        yield
    finally:
        sets[0].effective = saved
        assert libc.capset(ctypes.byref(header), sets) == 0


# ---------------------------------------------------------------------- writable before the first step
def _read_only(directory: Path):
    directory.chmod(0o500)
    return _directory_modes_apply_to_this_thread()


def _removed(directory: Path):
    shutil.rmtree(directory)
    return contextlib.nullcontext()


def _a_file(directory: Path):
    shutil.rmtree(directory)
    directory.write_text("a file where the directory was")
    return contextlib.nullcontext()


@pytest.mark.parametrize(
    "make, why, code",
    [
        (_read_only, "is not writable", errno.EACCES),
        (_removed, "does not exist", errno.ENOENT),
        (_a_file, "is not a directory", errno.ENOTDIR),
    ],
    ids=["read-only", "removed", "a-file"],
)
def test_a_directory_that_cannot_be_written_is_refused_before_any_step(tmp_path, make, why, code):
    """Checked when the run starts, not at the first write (step 1000 by default, the warmup lost): the error
    names the checkpoint and the directory, keeps the cause's errno, and no step has run. The partial run says
    it stopped in set-up and names no checkpoint to resume from."""
    directory = tmp_path / "out"
    directory.mkdir()
    path = directory / "run.ckpt"
    steps = []
    mcmc = _mcmc(path, hook=lambda *a: steps.append(a))  # the directory exists when the run is made
    with make(directory), pytest.raises(CheckpointWriteError) as refused:
        mcmc.run(*script.data())
    message = str(refused.value)
    assert f"checkpoint {path}: the directory {directory} {why}" in message and "nothing was run" in message
    assert refused.value.errno == code and isinstance(refused.value, OSError) and refused.value.path == path
    assert steps == []
    assert (mcmc.partial.phase, mcmc.partial.steps_done, mcmc.partial.checkpoint_path) == ("set-up", 0, None)
    with pytest.raises(RunNotFinished, match="pass checkpoint= to be able to resume"):  # none to resume from
        mcmc.get_samples()
    if directory.is_dir():
        directory.chmod(0o700)
        assert os.listdir(directory) == []  # no probe, lock or other file left


# ---------------------------------------------------------------------- resume=False moves the old one aside
def test_a_fresh_start_moves_the_old_checkpoint_aside_whole(tmp_path):
    """``resume=False`` stopped before its first write: no index at the path (not one whose chunks are gone),
    and the old run, moved aside to ``<path>.replaced-<time>`` with its chunks, resumes from there to its own
    draws, bit for bit."""
    path = tmp_path / "run.ckpt"
    old = _mcmc(path, step_size=0.03)
    old.run(*script.data())

    def stop_before_the_first_write(kernel, params, stage, i):
        if kernel.state.step == 5:
            raise Interrupt

    fresh = _mcmc(path, resume=False, hook=stop_before_the_first_write)
    with pytest.raises(Interrupt):
        fresh.run(*script.data())
    assert not path.exists() and not chunk_directory(path).exists() and fresh.partial.checkpoint_path is None
    (backup,) = backups(path)
    assert backup.name.startswith("run.ckpt.replaced-") and chunk_directory(backup).is_dir()
    again = _mcmc(backup, step_size=0.03)  # a complete checkpoint at its new path, of the old run's settings
    again.run(*script.data())
    _equal_runs(old, again)


def test_backups_made_in_the_same_second_get_their_own_names(tmp_path):
    path = tmp_path / "run.ckpt"
    made = []
    for content in (b"first", b"second", b"third"):
        path.write_bytes(content)
        chunk_directory(path).mkdir()
        (chunk_directory(path) / "000000000000-000000000001.pt").write_bytes(content)
        made.append(move_aside(path))
    assert backups(path) == made and len(set(made)) == 3  # oldest first; "-2", "-3" within one second
    assert [b.read_bytes() for b in made] == [b"first", b"second", b"third"]
    assert [(chunk_directory(b) / "000000000000-000000000001.pt").read_bytes() for b in made] == [
        b"first", b"second", b"third"]  # fmt: skip
    assert not path.exists() and not chunk_directory(path).exists()


def test_a_move_aside_killed_between_its_two_renames_is_finished_by_the_next_fresh_start(tmp_path):
    """Killed after the index's rename and before the chunks': the next run that starts afresh at the path
    returns the chunks to the backup whose last chunk they hold, which then resumes to the old run's draws."""
    path = tmp_path / "run.ckpt"
    old = _mcmc(path, step_size=0.03)
    old.run(*script.data())
    half_done = path.with_name(path.name + ".replaced-20260101T000000Z")
    os.rename(path, half_done)  # the index moved; its chunks still at <path>.draws

    def stop(kernel, params, stage, i):
        if kernel.state.step == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        _mcmc(path, hook=stop).run(*script.data())  # no index at the path: a fresh start
    assert chunk_directory(half_done).is_dir() and not chunk_directory(path).exists()
    again = _mcmc(half_done, step_size=0.03)
    again.run(*script.data())
    _equal_runs(old, again)


# ---------------------------------------------------------------------- what killed runs left
def test_a_fresh_start_removes_unlisted_chunks_and_stale_temporary_files_and_nothing_else(tmp_path):
    """Chunks no index lists (a run killed between its first chunk and its first index, no backup holding them)
    and the temporary files of killed writes are removed by the next holder of the lock; other files stay."""
    path = tmp_path / "run.ckpt"
    chunk_directory(path).mkdir()
    (chunk_directory(path) / "000000000000-000000000010.pt").write_bytes(b"not listed by any index")
    stale = [
        tmp_path / "run.ckpt.tmp",  # the temporary name of earlier versions
        tmp_path / "run.ckpt.4321-0123abcd.tmp",
        chunk_directory(path) / "000000000000-000000000010.pt.4321-89abcdef.tmp",
        chunk_directory(path) / "probe.4321-00ff00ff.tmp",
    ]
    kept = [tmp_path / "run.ckpt.notes.tmp", tmp_path / "other.ckpt.4321-0123abcd.tmp", tmp_path / "run.ckpt.lock2"]
    for file in stale + kept:
        file.write_bytes(b"x")
    _mcmc(path, every=1000).run(*script.data())  # one write, at the end
    assert sorted(p.name for p in chunk_directory(path).iterdir()) == ["000000000000-000000000060.pt"]
    assert [file.exists() for file in stale] == [False] * len(stale)
    assert all(file.exists() for file in kept)
    assert not lock_path(path).exists()


# ---------------------------------------------------------------------- a finished run's archive, read-only
def _archive(directory: Path):
    """Make the checkpoint's directory and its chunk directory read-only (an archive)."""
    for folder in (directory / "run.ckpt.draws", directory):
        if folder.is_dir():  # no chunk directory before the first kept draw
            folder.chmod(0o500)
    return _directory_modes_apply_to_this_thread()


def test_a_finished_runs_checkpoint_is_read_from_a_read_only_directory(tmp_path):
    """Resuming a complete run writes nothing, so its checkpoint in a read-only directory loads: the draws and
    statistics are the run's own, bit for bit, no step runs, and no file is made or changed (no probe, no lock)."""
    directory = tmp_path / "archive"
    directory.mkdir()
    path = directory / "run.ckpt"
    finished = _mcmc(path)
    finished.run(*script.data())
    before = {p: p.stat().st_mtime_ns for p in directory.rglob("*")}
    steps = []
    reader = _mcmc(path, hook=lambda *a: steps.append(a))
    with _archive(directory):
        reader.run(*script.data())
    _equal_runs(finished, reader)
    assert steps == [] and reader.partial is None
    assert {p: p.stat().st_mtime_ns for p in directory.rglob("*")} == before  # nothing written, nothing left


def test_an_unfinished_checkpoint_in_a_read_only_directory_is_still_refused(tmp_path):
    """Resuming it would write: the probe's error, saying how far the checkpoint is, and no step run."""
    directory = tmp_path / "archive"
    directory.mkdir()
    path = directory / "run.ckpt"

    def stop(kernel, params, stage, i):
        if kernel.state.step == 25:
            raise Interrupt

    with pytest.raises(Interrupt):
        _mcmc(path, hook=stop).run(*script.data())
    steps = []
    resumed = _mcmc(path, hook=lambda *a: steps.append(a))
    with _archive(directory), pytest.raises(CheckpointWriteError) as refused:
        resumed.run(*script.data())
    total = script.SETTINGS["warmup_steps"] + script.SETTINGS["num_samples"]
    assert "is not writable" in str(refused.value) and f"is at step 20 of {total}" in str(refused.value)
    assert refused.value.errno == errno.EACCES and steps == []


def test_a_finished_checkpoint_in_a_writable_directory_is_still_locked(tmp_path):
    """Reading without the lock is for directories nobody can lock in; elsewhere a resume holds the path as any
    run does, so one-writer-per-path is unchanged."""
    from pyro_sgmcmc.checkpoint import CheckpointInUse
    from pyro_sgmcmc.run.checkpoint_lock import CheckpointLock

    path = tmp_path / "run.ckpt"
    _mcmc(path).run(*script.data())
    with CheckpointLock(path), pytest.raises(CheckpointInUse):
        _mcmc(path).run(*script.data())
