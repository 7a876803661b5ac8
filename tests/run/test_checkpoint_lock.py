"""One writer per checkpoint path (issue 26 point 5): the run's lock on ``<path>.lock``.

The oracle for the checkpoint a refused run must not touch is an uninterrupted run with the same seed: the
run that holds the path, killed and resumed, must give its draws bit for bit. A second run, whatever its
seed or ``resume``, is refused with :class:`CheckpointInUse` naming the holder's process id and host before
any of its steps; the lock goes with its holder, however the holder ends (returned, raised, interrupted,
killed by ``SIGKILL``).
"""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyro
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, CheckpointSettings
from pyro_sgmcmc.checkpoint import CheckpointInUse, CheckpointMismatch
from pyro_sgmcmc.run.checkpoint_directory import backups
from pyro_sgmcmc.run.checkpoint_lock import CheckpointLock, lock_path

from .. import reliability_script as script

ROOT = Path(script.__file__).parents[1]


def _run(path, *, seed=script.SETTINGS["seed"], resume=True, hook=None, every=10, step_size=0.02):
    """The reliability script's run (its model, data and settings) with another seed or ``resume`` if asked."""
    pyro.set_rng_seed(0)
    settings = dict(script.SETTINGS, seed=seed)
    mcmc = MCMC(SGHMC(script.model, step_size=step_size), checkpoint=CheckpointSettings(path, every=every,
                resume=resume), hook_fn=hook, disable_progbar=True, **settings)  # fmt: skip
    mcmc.run(*script.data())
    return mcmc


def _equal_runs(a, b):
    for name, draws in a.get_samples(group_by_chain=True).items():
        assert torch.equal(draws, b.get_samples(group_by_chain=True)[name]), name
    for name, stat in a.sample_stats.items():
        assert torch.equal(stat, b.sample_stats[name]), name


def test_a_second_process_on_a_running_checkpoint_is_refused_naming_the_holder(tmp_path):
    """A run in another process holds the path: a run here with the same seed, another seed, or ``resume=False``
    is refused before any step with ``CheckpointInUse`` naming that process and host, and touches nothing; once
    the holder is killed (SIGKILL: its lock file stays, but no process holds it) the path is free, and the
    run resumes the holder's checkpoint to the uninterrupted run's draws, bit for bit."""
    path = tmp_path / "run.ckpt"
    holder = subprocess.Popen(
        [sys.executable, str(Path(script.__file__)), str(tmp_path / "out.pt"), "--checkpoint", str(path),
         "--every", "10", "--progress", "--slow", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert int(holder.stdout.readline()) == 1, holder.stderr.read()  # its first step: set up, lock held
        steps = []
        for change in ({}, {"seed": 6}, {"resume": False}):
            with pytest.raises(CheckpointInUse) as refused:
                _run(path, hook=lambda *a: steps.append(a), **change)
            message = str(refused.value)
            assert f"checkpoint {path} is in use by another run (process {holder.pid} on host" in message, message
            assert (refused.value.pid, refused.value.host) == (holder.pid, socket.gethostname())
        assert steps == [] and not backups(path)  # no step run, and resume=False moved nothing aside
        assert holder.poll() is None  # the holder was running all along
        while int(holder.stdout.readline() or 0) < 15:  # killed after its checkpoint of step 10
            assert holder.poll() is None, holder.stderr.read()
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert holder.returncode == -signal.SIGKILL and lock_path(path).exists()  # its file stays: no lock though
    assert 10 <= torch.load(path, weights_only=True)["steps_done"] < 100
    _equal_runs(script.run(), _run(path))
    assert not lock_path(path).exists()  # the run that finished removed it


def test_the_lock_is_held_for_the_whole_run_and_released_however_it_ends(tmp_path):
    """From its first step to its last the run holds the path (a writer in this process is refused too); after
    it is interrupted (``KeyboardInterrupt``, a ``BaseException``) or returns, the path is free and its lock
    file gone. (An ``Exception`` at set-up: ``test_a_run_refused_at_set_up_releases_the_lock``.)"""
    path = tmp_path / "run.ckpt"
    held = []

    def try_to_lock(kernel, params, stage, i):
        with pytest.raises(CheckpointInUse, match=f"process {os.getpid()} on host .* \\(this process\\)"):
            CheckpointLock(path)
        held.append(kernel.state.step)
        if len(held) == 57:
            raise KeyboardInterrupt("stopped by the test")

    with pytest.raises(KeyboardInterrupt):
        _run(path, hook=try_to_lock)
    assert held == list(range(1, 58)) and not lock_path(path).exists()
    CheckpointLock(path).release()  # free
    finished = _run(path, hook=try_to_lock)
    assert held[57:] == list(range(51, 101))  # resumed from its checkpoint of step 50: held at every step
    assert not lock_path(path).exists() and finished.partial is None


def test_a_run_refused_at_set_up_releases_the_lock(tmp_path):
    """A checkpoint of other settings is refused at set-up (``CheckpointMismatch``): the lock is released too."""
    path = tmp_path / "run.ckpt"
    _run(path, every=25)
    with pytest.raises(CheckpointMismatch, match="different settings"):
        _run(path, every=25, step_size=0.03)
    assert not lock_path(path).exists()
    CheckpointLock(path).release()


def test_the_holder_is_named_even_before_it_records_itself(tmp_path):
    """A lock whose file holds no line yet (the holder between its lock and its write): still refused, saying so."""
    path = tmp_path / "run.ckpt"
    with CheckpointLock(path) as lock:
        os.ftruncate(lock.descriptor, 0)
        with pytest.raises(CheckpointInUse, match="in use by another run \\(a process not yet recorded; lock file"):
            CheckpointLock(path)


def test_a_lock_file_replaced_while_waiting_is_not_shared(tmp_path, monkeypatch):
    """A run opens the lock file; the holder then removes it and lets go, and a third run creates and locks a new
    file at that name; our run's lock on the old file then succeeds, but it must not believe it holds the path:
    it sees that the file at the name is another and starts again, and is refused by the third run's lock."""
    import pyro_sgmcmc.run.checkpoint_lock as module

    path = tmp_path / "run.ckpt"
    holder, calls = CheckpointLock(path), []
    original = module._lock

    def lock_after_the_holder_left(descriptor):
        calls.append(descriptor)
        if len(calls) == 1:  # our run has the old file open: the holder leaves, a third run comes
            holder.release()
            calls.append(CheckpointLock(path))  # its own lock is the second call
        return original(descriptor)

    monkeypatch.setattr(module, "_lock", lock_after_the_holder_left)
    with pytest.raises(CheckpointInUse, match=f"process {os.getpid()}"):
        CheckpointLock(path)
    third = calls[2]
    assert len(calls) == 4 and third.held  # ours: the old file (locked, then let go), then the new one (refused)
    third.release()
    assert not lock_path(path).exists()
