"""Checkpoint and resume (bit-identical), SIGKILL mid-run, and reproducibility across processes."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyro_sgmcmc.checkpoint import CheckpointMismatch

from . import reliability_script as script

SCRIPT = Path(script.__file__)
ROOT = SCRIPT.parents[1]


class Interrupt(Exception):
    pass


def _equal_runs(a_samples, a_stats, b_samples, b_stats):
    assert a_samples.keys() == b_samples.keys()
    for name in a_samples:
        assert torch.equal(a_samples[name], b_samples[name]), name
    for name in a_stats:
        assert torch.equal(a_stats[name], b_stats[name]), name


def test_resume_after_interruption_is_bit_identical(tmp_path):
    reference = script.run()
    path = tmp_path / "run.ckpt"

    def interrupt_at_step_57(kernel, params, stage, t):
        if t == 56:  # in the sampling phase (warmup is 40 steps), between checkpoints
            raise Interrupt

    with pytest.raises(Interrupt):
        script.run(checkpoint=path, every=10, hook=interrupt_at_step_57)
    saved = torch.load(path, weights_only=False)
    assert saved["steps_done"] == 50 and saved["phase"] == "sampling" and saved["positions"].shape[1] == 10
    assert not path.with_name(path.name + ".tmp").exists()  # written then renamed
    resumed = script.run(checkpoint=path, every=10)  # same settings: continues from step 50
    _equal_runs(reference.get_samples(group_by_chain=True), reference.sample_stats,
                resumed.get_samples(group_by_chain=True), resumed.sample_stats)  # fmt: skip
    assert reference.diagnostics()["divergences"] == resumed.diagnostics()["divergences"]


@pytest.mark.parametrize("every, stop, phase", [(4, 7, "approach"), (10, 25, "adaptation")])
def test_resume_inside_the_warmup_is_bit_identical(tmp_path, every, stop, phase):
    """Interrupted inside the default warmup (40 steps: 10 of approach, then adaptation), the run resumes
    from its last checkpoint with the approach's Adam moments, the adaptation's metric, step sizes, probe
    sums and jump statistics as they were: the draws equal an uninterrupted run's bit for bit."""
    reference = script.run()
    path = tmp_path / "run.ckpt"

    def interrupt(kernel, params, stage, t):
        if t == stop - 1:
            assert kernel.phase == phase
            raise Interrupt

    with pytest.raises(Interrupt):
        script.run(checkpoint=path, every=every, hook=interrupt)
    resumed = script.run(checkpoint=path, every=every)
    _equal_runs(reference.get_samples(group_by_chain=True), reference.sample_stats,
                resumed.get_samples(group_by_chain=True), resumed.sample_stats)  # fmt: skip


def test_resume_with_computed_permutations_is_bit_identical(tmp_path, monkeypatch):
    """The same with the minibatch permutations computed on the fly (as for data too large for a table):
    their keys and cursors are checkpointed, so the resumed run draws the same minibatches."""
    monkeypatch.setattr("pyro_sgmcmc.minibatch.TABLE_LIMIT", 0)
    reference = script.run()
    path = tmp_path / "run.ckpt"

    def interrupt_at_step_57(kernel, params, stage, t):
        assert kernel.minibatches.keys and not kernel.minibatches.permutations  # the computed path
        if t == 56:
            raise Interrupt

    with pytest.raises(Interrupt):
        script.run(checkpoint=path, every=10, hook=interrupt_at_step_57)
    resumed = script.run(checkpoint=path, every=10)
    _equal_runs(reference.get_samples(group_by_chain=True), reference.sample_stats,
                resumed.get_samples(group_by_chain=True), resumed.sample_stats)  # fmt: skip


def test_checkpoint_from_other_settings_is_refused(tmp_path):
    path = tmp_path / "run.ckpt"
    script.run(checkpoint=path, every=25)
    with pytest.raises(CheckpointMismatch, match="different settings"):
        script.run(checkpoint=path, every=25, step_size=0.03)


def _start(out, *extra):
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_sigkill_loses_at_most_k_steps_and_resumes_bit_identically(tmp_path):
    path, every = tmp_path / "run.ckpt", 7
    process = _start(
        tmp_path / "unused.pt", "--checkpoint", str(path), "--every", str(every), "--progress", "--slow", "0.01"
    )
    last = 0
    try:
        for line in process.stdout:  # the child prints each finished step
            last = int(line)
            if last >= 64:
                os.kill(process.pid, signal.SIGKILL)
                break
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, process.stderr.read()
    saved = torch.load(path, weights_only=False)
    # it printed step `last` and was killed after at most a few more: the checkpoint is at most k behind
    assert last - every < saved["steps_done"] <= script.SETTINGS["warmup_steps"] + script.SETTINGS["num_samples"]
    resumed = script.run(checkpoint=path, every=every)
    reference = script.run()
    _equal_runs(reference.get_samples(group_by_chain=True), reference.sample_stats,
                resumed.get_samples(group_by_chain=True), resumed.sample_stats)  # fmt: skip


def test_same_seed_same_draws_in_one_process_and_in_fresh_processes(tmp_path):
    first, second = script.run(), script.run()
    _equal_runs(first.get_samples(group_by_chain=True), first.sample_stats,
                second.get_samples(group_by_chain=True), second.sample_stats)  # fmt: skip
    outputs = [tmp_path / "a.pt", tmp_path / "b.pt"]
    processes = [_start(out) for out in outputs]
    for process in processes:
        assert process.wait(timeout=300) == 0, process.stderr.read()
    for out in outputs:
        child = torch.load(out, weights_only=False)
        _equal_runs(first.get_samples(group_by_chain=True), first.sample_stats, child["samples"], child["stats"])


def test_single_chain_pyro_mcmc_is_reproducible_under_pyro_set_rng_seed():
    import pyro
    from pyro.infer import MCMC as PyroMCMC

    from pyro_sgmcmc import SGLD

    draws = []
    for _ in range(2):
        pyro.set_rng_seed(11)
        mcmc = PyroMCMC(SGLD(script.model, step_size=0.01), num_samples=30, warmup_steps=10, disable_progbar=True)
        mcmc.run(*script.data())
        draws.append(mcmc.get_samples()["w"])
    assert torch.equal(draws[0], draws[1])
