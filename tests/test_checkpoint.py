"""Checkpoint and resume (bit-identical), SIGKILL mid-run, and reproducibility across processes."""

import hashlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyro
import pyro.distributions as dist
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

    def interrupt_at_step_57(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn)
        if kernel.state.step == 57:  # in the sampling phase (warmup is 40 steps), between checkpoints
            raise Interrupt

    with pytest.raises(Interrupt):
        script.run(checkpoint=path, every=10, hook=interrupt_at_step_57)
    saved = torch.load(path, weights_only=False)
    assert saved["steps_done"] == 50 and saved["phase"] == "sampling" and saved["last_chunk"]["stop"] == 10
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

    def interrupt(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn); state.step is the run's
        if kernel.state.step == stop:
            assert kernel.phase == phase
            raise Interrupt

    with pytest.raises(Interrupt):
        script.run(checkpoint=path, every=every, hook=interrupt)
    resumed = script.run(checkpoint=path, every=every)
    _equal_runs(reference.get_samples(group_by_chain=True), reference.sample_stats,
                resumed.get_samples(group_by_chain=True), resumed.sample_stats)  # fmt: skip


def test_resume_inside_a_block_drawn_ahead_is_bit_identical(tmp_path, monkeypatch):
    """The same with the minibatch indices drawn ahead in blocks of part of an epoch (as for large data):
    the checkpoint holds each chain's keys, position and cursor, not the block, so the resumed run draws
    the same minibatches."""
    monkeypatch.setattr("pyro_sgmcmc.chains.minibatch.DRAW_AHEAD", 64)  # 6 chains x span 512 > 64: part of one
    reference = script.run()
    path = tmp_path / "run.ckpt"

    def interrupt_at_step_57(kernel, params, stage, i):
        assert kernel.minibatches.keys and kernel.minibatches.draw_ahead == 64
        if kernel.state.step == 57:
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


# ====================================================================== integrity (#20 point 3)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pyro_sgmcmc.checkpoint import FORMAT_VERSION, checksums, chunk_directory  # noqa: E402

_DATA = script.data
FULL = script.SETTINGS["warmup_steps"] + script.SETTINGS["num_samples"]


@pytest.fixture(scope="module")
def reference_run():
    return script.run()


@pytest.fixture(scope="module")
def interrupted_files(tmp_path_factory):
    """The files of a run interrupted at step 57 (checkpoint every 10: index at step 50, one chunk of 10 draws)."""
    path = tmp_path_factory.mktemp("interrupted") / "run.ckpt"

    def interrupt_at_step_57(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn)
        if kernel.state.step == 57:
            raise Interrupt

    with pytest.raises(Interrupt):
        script.run(checkpoint=path, every=10, hook=interrupt_at_step_57)
    files = {p.name: p.read_bytes() for p in [path, *chunk_directory(path).iterdir()]}
    return files


def _restore(files, directory):
    path = directory / "run.ckpt"
    chunk_directory(path).mkdir(exist_ok=True)
    for name, data in files.items():
        (path if name == "run.ckpt" else chunk_directory(path) / name).write_bytes(data)
    return path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    which=st.sampled_from(["index", "chunk"]),
    where=st.floats(0, 1, exclude_max=True),
    flip=st.integers(1, 255),
)
def test_a_flipped_byte_is_refused_or_harmless(reference_run, interrupted_files, tmp_path, which, where, flip):
    """Any byte of the index or of a chunk, flipped: a CheckpointMismatch, or (a byte that carries nothing,
    such as the zip padding) a resumed run equal to the uninterrupted one. Never a silent change of draws."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        files = dict(interrupted_files)
        prefix = {"index": "run.ckpt", "chunk": "0"}[which]
        name = next(n for n in files if n.startswith(prefix))
        data = bytearray(files[name])
        offset = int(where * len(data))
        data[offset] ^= flip
        files[name] = bytes(data)
        path = _restore(files, Path(tmp))
        try:
            resumed = script.run(checkpoint=path, every=10)
        except CheckpointMismatch as error:
            assert str(path) in str(error) or name in str(error)
            return
        _equal_runs(reference_run.get_samples(group_by_chain=True), reference_run.sample_stats,
                    resumed.get_samples(group_by_chain=True), resumed.sample_stats)  # fmt: skip


def test_a_flipped_byte_inside_a_tensor_names_the_record(interrupted_files, tmp_path):
    """The issue's case: bytes inside the position tensor's data, changed: the record is named."""
    saved = torch.load(io.BytesIO(interrupted_files["run.ckpt"]), weights_only=True)
    position = saved["kernel"]["state"]["position"]
    position.view(torch.uint8)[:4] ^= 0xFF  # the 4 flipped bytes of the issue, in place (the same length)
    path = _restore(interrupted_files, tmp_path)
    torch.save(saved, path)  # the checksums are the originals
    with pytest.raises(CheckpointMismatch, match="record 'kernel/state/position' does not match its checksum"):
        script.run(checkpoint=path, every=10)


def _edit(files, tmp_path, change, recompute=False):
    saved = torch.load(io.BytesIO(files["run.ckpt"]), weights_only=True)
    change(saved)
    if recompute:  # an edit by someone who knows the format: the checksums agree, the validation must refuse
        saved["checksums"] = checksums({k: v for k, v in saved.items() if k != "checksums"})
    path = _restore(files, tmp_path)
    torch.save(saved, path)
    return path


@pytest.mark.parametrize("recompute", [False, True], ids=["checksums-kept", "checksums-recomputed"])
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(steps_done=60), "steps_done|draws saved|not 60"),
        (lambda s: s.update(steps_done=10**6), "steps_done"),
        (lambda s: s.update(steps_done=-1), "steps_done"),
        (lambda s: s["kernel"]["state"]["position"].__setitem__((0, 0), float("nan")), "position"),
        (lambda s: s["kernel"]["state"].update(position=torch.zeros(6, 2)), "position"),
        (lambda s: s.update(last_chunk=None), "last_chunk|draws saved"),
        (lambda s: s["last_chunk"].update(sha256="0" * 64), "last_chunk|chunk .* does not match"),
        (lambda s: s["last_chunk"].update(file="../../etc/passwd"), "last_chunk|chunk .* missing"),
    ],
    ids=["steps_done+10", "steps_done-huge", "steps_done-negative", "nan-position", "position-shape",
         "chunks-dropped", "chunk-checksum", "chunk-path"],
)  # fmt: skip
def test_an_edited_checkpoint_is_refused(interrupted_files, tmp_path, change, message, recompute):
    path = _edit(interrupted_files, tmp_path, change, recompute)
    with pytest.raises(CheckpointMismatch, match=message):
        script.run(checkpoint=path, every=10)


def test_a_checkpoint_of_the_table_format_is_refused_naming_its_version(interrupted_files, tmp_path):
    """A format-2 checkpoint (its minibatch permutation tables in files ``blob-<sha256>.pt`` named by the
    index) is refused with its version and the reason, not read as far as the kernel's state."""

    def format_2(saved):
        saved["format_version"] = 2
        saved["kernel"]["minibatches"]["permutation_files"] = {"data": {"file": "blob-" + "0" * 64 + ".pt",
                                                                        "sha256": "0" * 64}}  # fmt: skip

    path = _edit(interrupted_files, tmp_path, format_2, recompute=True)
    message = rf"has format 2, expected {FORMAT_VERSION} \(written by an earlier pyro_sgmcmc, with minibatch"
    with pytest.raises(CheckpointMismatch, match=message):
        script.run(checkpoint=path, every=10)
    assert FORMAT_VERSION == 4


def test_a_checkpoint_of_the_generator_format_is_refused_naming_its_version(interrupted_files, tmp_path):
    """A format-3 checkpoint (a ``torch.Generator`` state per chain under ``kernel/generators``) is refused with
    its version and the reason: the noise is keyed Philox now, and those states cannot continue it."""

    def format_3(saved):
        saved["format_version"] = 3
        saved["kernel"]["generators"] = [torch.Generator().get_state()]

    path = _edit(interrupted_files, tmp_path, format_3, recompute=True)
    message = rf"has format 3, expected {FORMAT_VERSION} \(written by an earlier pyro_sgmcmc, with a torch.Generator"
    with pytest.raises(CheckpointMismatch, match=message):
        script.run(checkpoint=path, every=10)


class _RunsCode:
    """Unpickling this calls Path.touch(marker): what a crafted checkpoint would do with os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_crafted_checkpoint_runs_no_code(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "run.ckpt"
    torch.save({"format_version": FORMAT_VERSION, "steps_done": 50, "payload": _RunsCode(marker)}, path)
    with pytest.raises(CheckpointMismatch, match="not a readable"):
        script.run(checkpoint=path, every=10)
    assert not marker.exists()


def test_the_chunks_are_loaded_without_running_code(interrupted_files, tmp_path):
    marker = tmp_path / "code-ran"
    path = _restore(interrupted_files, tmp_path)
    saved = torch.load(path, weights_only=True)
    entry = saved["last_chunk"]
    chunk = chunk_directory(path) / entry["file"]
    torch.save({"positions": torch.zeros(1), "stats": _RunsCode(marker)}, chunk)
    entry["sha256"] = hashlib.sha256(chunk.read_bytes()).hexdigest()  # even with a matching checksum
    saved["checksums"] = checksums({k: v for k, v in saved.items() if k != "checksums"})
    torch.save(saved, path)
    with pytest.raises(CheckpointMismatch, match="not a readable"):
        script.run(checkpoint=path, every=10)
    assert not marker.exists()


def test_other_initial_params_are_a_mismatch(tmp_path):
    """The starting points change the draws, so a checkpoint written from other ``initial_params`` (or from none)
    is refused, naming them; the same ones resume."""
    from pyro_sgmcmc import MCMC, SGHMC, CheckpointSettings

    path = tmp_path / "run.ckpt"

    def run(initial_params):
        settings = dict(script.SETTINGS, checkpoint=CheckpointSettings(path, every=25), disable_progbar=True)
        mcmc = MCMC(SGHMC(script.model, step_size=0.02), initial_params=initial_params, **settings)
        mcmc.run(*script.data())
        return mcmc

    start = {"w": torch.zeros(6, 3), "sigma": torch.ones(6)}
    first = run(start)
    with pytest.raises(CheckpointMismatch, match="different settings:(.|\n)*initial_params"):
        run({"w": torch.zeros(6, 3), "sigma": torch.full((6,), 2.0)})
    with pytest.raises(CheckpointMismatch, match="different settings:(.|\n)*initial_params"):
        run(None)
    again = run({name: value.clone() for name, value in start.items()})  # resumes the finished run: same draws
    assert torch.equal(again.get_samples()["w"], first.get_samples()["w"])


def _other_subsample_size(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=30) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


@pytest.mark.parametrize(
    "change, record",
    [
        (lambda m: m.__setattr__("model", _other_subsample_size), "plates"),
        (lambda m: m.__setattr__("data", lambda: tuple(v * 1.001 for v in _DATA())), "argument 'x'"),
        (lambda m: m.__setattr__("data", lambda: tuple(v[:290] for v in _DATA())), "plates"),
    ],
    ids=["subsample_size", "data-values", "data-rows"],
)
def test_another_subsample_size_or_data_is_a_mismatch(tmp_path, monkeypatch, change, record):
    path = tmp_path / "run.ckpt"
    script.run(checkpoint=path, every=25)
    change(_Patch(monkeypatch))
    with pytest.raises(CheckpointMismatch, match=f"different settings:(.|\n)*\n  {record}: theirs"):
        script.run(checkpoint=path, every=25)


class _Patch:
    """``setattr`` on the reliability script's module, through monkeypatch (undone after the test)."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch

    def __setattr__(self, name, value):
        if name == "monkeypatch":
            return object.__setattr__(self, name, value)
        self.monkeypatch.setattr(script, name, value)


def test_a_state_that_cannot_be_saved_is_an_error_before_any_step(tmp_path, monkeypatch):
    from pyro_sgmcmc.kernels.base import SGMCMCKernel

    original = SGMCMCKernel.state_dict
    monkeypatch.setattr(SGMCMCKernel, "state_dict", lambda self: {**original(self), "schedule": lambda t: 0.1})
    steps = []
    with pytest.raises(TypeError, match="record 'schedule' is a function"):
        script.run(checkpoint=tmp_path / "run.ckpt", every=10, hook=lambda *a: steps.append(a[-1]))
    assert steps == []


def test_a_callable_step_size_resumes_in_a_fresh_process(tmp_path):
    """The fingerprint of a callable schedule is its qualified name, not its address: a new process resumes."""
    path = tmp_path / "run.ckpt"
    first = _start(tmp_path / "a.pt", "--checkpoint", str(path), "--every", "10", "--callable-step", "--stop", "57")
    assert first.wait(timeout=300) == 3, first.stderr.read()
    assert torch.load(path, weights_only=True)["steps_done"] == 50
    second = _start(tmp_path / "b.pt", "--checkpoint", str(path), "--every", "10", "--callable-step")
    assert second.wait(timeout=300) == 0, second.stderr.read()
    reference = _start(tmp_path / "c.pt", "--callable-step")
    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    a, b = torch.load(tmp_path / "b.pt", weights_only=True), torch.load(tmp_path / "c.pt", weights_only=True)
    _equal_runs(a["samples"], a["stats"], b["samples"], b["stats"])


# ====================================================================== incremental writes (#20 point 2)
def test_each_write_adds_one_chunk_of_the_new_draws_and_rewrites_nothing(tmp_path, monkeypatch):
    """O(k) per write: every write is one new chunk (the draws since the previous write) and the index, whose
    size does not grow with the draws; a chunk file, once written, is never written again."""
    import pyro_sgmcmc.run.checkpoint as run_checkpoint

    writes, batches = [], []
    original = run_checkpoint.commit_files

    def commit(files, *rest):
        writes.extend((p.name, len(data)) for data, p in files)
        batches.append([p.name for _, p in files])
        return original(files, *rest)

    monkeypatch.setattr(run_checkpoint, "commit_files", commit)
    path = tmp_path / "run.ckpt"
    mcmc = script.run(checkpoint=path, every=10)
    chunks = [(name, size) for name, size in writes if name != "run.ckpt"]
    indexes = [size for name, size in writes if name == "run.ckpt"]
    assert len(indexes) == FULL // 10
    assert len(chunks) == script.SETTINGS["num_samples"] // 10  # one per write in the sampling phase
    assert len({name for name, _ in chunks}) == len(chunks)  # never the same file twice
    # no other file: the minibatch streams are keyed permutations, whose state (keys, positions, cursors,
    # epochs) is in the index, although the run began several epochs (an epoch is 15 minibatches of 20)
    assert all(name == "run.ckpt" or name[0].isdigit() for name, _ in writes), writes
    assert mcmc.kernel.minibatches.epochs["data"] > 1
    # one batch per write, the index renamed last (after the files it names)
    assert len(batches) == len(indexes) and all(batch[-1] == "run.ckpt" for batch in batches)
    # each holds 10 draws; all but the first also the previous chunk's entry (name, range, SHA-256)
    sizes = [size for _, size in chunks]
    assert max(sizes[1:]) - min(sizes[1:]) < 64 and sizes[0] <= min(sizes[1:]), sizes
    # and only those draws: 10 x 6 chains x (4 coordinates float32 + 6 statistics of 8 bytes at most) plus the
    # file's own overhead (zip records, pickled keys: under 8 kB), not the preallocated buffer behind the view
    assert max(sizes) < 10 * 6 * (4 * 4 + 6 * 8) + 8192, sizes
    # the index holds the kernel's state and the last chunk's entry (a hash chain): its size does not grow
    sampling = indexes[FULL // 10 - len(chunks) :]
    assert max(sampling) - min(sampling) < 64, indexes


def test_a_fresh_start_moves_the_old_chunks_aside(tmp_path):
    """``resume=False``: the new run's chunks alone at the path; the old ones, with their index, in the backup."""
    from pyro_sgmcmc.run.checkpoint_directory import backups

    path = tmp_path / "run.ckpt"
    script.run(checkpoint=path, every=7)
    before = sorted(p.name for p in chunk_directory(path).iterdir())
    pyro.set_rng_seed(0)
    from pyro_sgmcmc import MCMC, SGHMC

    MCMC(SGHMC(script.model, step_size=0.02), checkpoint_path=path, checkpoint_every=10, resume=False,
         disable_progbar=True, **script.SETTINGS).run(*script.data())  # fmt: skip
    after = sorted(p.name for p in chunk_directory(path).iterdir())
    assert before != after
    assert after == [f"{s:012d}-{s + 10:012d}.pt" for s in range(0, script.SETTINGS["num_samples"], 10)]
    (backup,) = backups(path)
    assert sorted(p.name for p in chunk_directory(backup).iterdir()) == before
    assert torch.load(backup, weights_only=True)["steps_done"] == FULL


@pytest.mark.parametrize("sync", [True, False])
def test_checkpoint_sync_decides_the_fsyncs_and_both_resume_bit_identically(reference_run, tmp_path, monkeypatch, sync):
    calls = []
    original = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or original(fd))
    path = tmp_path / "run.ckpt"

    def interrupt_at_step_57(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn)
        if kernel.state.step == 57:
            raise Interrupt

    pyro.set_rng_seed(0)
    from pyro_sgmcmc import MCMC, SGHMC

    def run(hook=None):
        pyro.set_rng_seed(0)
        mcmc = MCMC(SGHMC(script.model, step_size=0.02), checkpoint_path=path, checkpoint_every=10, hook_fn=hook,
                    checkpoint_sync=sync, disable_progbar=True, **script.SETTINGS)  # fmt: skip
        mcmc.run(*script.data())
        return mcmc

    with pytest.raises(Interrupt):
        run(interrupt_at_step_57)
    # 5 writes by step 50 (every 10 steps): 5 indexes and 1 chunk (the draws of steps 41-50, the only sampling
    # steps written), each fsync-ed with sync; no other file (the minibatch state is in the index, no tables);
    # and before the first step the probe of the directory's writability, written as a checkpoint is
    assert len(calls) == (1 + 6 if sync else 0)
    resumed = run()
    _equal_runs(reference_run.get_samples(group_by_chain=True), reference_run.sample_stats,
                resumed.get_samples(group_by_chain=True), resumed.sample_stats)  # fmt: skip


@pytest.mark.parametrize("value", [1, "yes", None, 0.0], ids=repr)
def test_checkpoint_sync_must_be_a_bool(value):
    from pyro_sgmcmc import MCMC, SGHMC

    with pytest.raises(TypeError, match="checkpoint_sync must be True or False"):
        MCMC(SGHMC(script.model), 5, 5, chain_method="vectorized", checkpoint_path="x.ckpt", checkpoint_sync=value)


def test_a_refused_checkpoint_leaves_no_draws_to_read(interrupted_files, tmp_path):
    """The chunks are read before the kernel's state is validated: when the state is refused, the draws
    read from the chunks are not offered as a partial run."""
    from pyro_sgmcmc import MCMC, SGHMC, RunNotFinished

    def nan_position(saved):
        saved["kernel"]["state"]["position"][0, 0] = float("nan")

    path = _edit(interrupted_files, tmp_path, nan_position, recompute=True)
    mcmc = MCMC(SGHMC(script.model, step_size=0.02), checkpoint_path=path, checkpoint_every=10,
                disable_progbar=True, **script.SETTINGS)  # fmt: skip
    with pytest.raises(CheckpointMismatch, match=r"state\.position: not finite"):
        mcmc.run(*script.data())
    with pytest.raises(RunNotFinished, match="CheckpointMismatch"):
        mcmc.get_samples()


@pytest.mark.parametrize("every, kills", [(1, (23, 61)), (3, (47, 88))], ids=["every-1", "every-3"])
def test_repeated_sigkills_at_any_moment_of_a_write_resume_bit_identically(tmp_path, every, kills):
    """Killed twice (with a write at every step or every 3, the kill often lands inside a write of the chunk,
    and index files), resumed each time in a fresh process: the final draws equal an uninterrupted
    run's, and each kill loses at most k steps."""
    path, out = tmp_path / "run.ckpt", tmp_path / "out.pt"
    for kill_at in kills:
        # the hook sleeps 10 ms then prints; the write follows the print at once, so the kill lands near it
        process = _start(out, "--checkpoint", str(path), "--every", str(every), "--progress", "--slow", "0.01")
        last = 0
        try:
            for line in process.stdout:
                last = int(line)
                if last >= kill_at:
                    os.kill(process.pid, signal.SIGKILL)
                    break
        finally:
            process.wait(timeout=120)
        assert process.returncode == -signal.SIGKILL, process.stderr.read()
        saved = torch.load(path, weights_only=True)
        # step `last` had run its hook; its own write may not have happened: at most k steps behind it
        assert last - every <= saved["steps_done"] <= FULL, (last, saved["steps_done"])
    final = _start(out, "--checkpoint", str(path), "--every", str(every))
    assert final.wait(timeout=300) == 0, final.stderr.read()
    reference = script.run()
    child = torch.load(out, weights_only=True)
    _equal_runs(reference.get_samples(group_by_chain=True), reference.sample_stats, child["samples"], child["stats"])


def test_the_fingerprint_holds_a_dict_control_variate_and_no_run_state(tmp_path):
    """A dict control variate changes the draws, so a checkpoint of one centre does not resume another's run;
    the kernel's run state (streams, minibatch cursors) is no setting."""
    from pyro_sgmcmc import MCMC, SGHMC
    from pyro_sgmcmc.run.fingerprint import fingerprint
    from pyro_sgmcmc.run.length import RunLength

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", len(y), subsample_size=10) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    y = torch.randn(100, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "run.ckpt"

    def run(centre):
        kernel = SGHMC(model, step_size=0.01, control_variate={"mu": torch.tensor(centre)})
        mcmc = MCMC(kernel, 4, 4, num_chains=2, chain_method="vectorized", seed=0, checkpoint_path=path,
                    checkpoint_every=2, disable_progbar=True)  # fmt: skip
        mcmc.run(y)
        return kernel

    kernel = run(0.0)
    settings = fingerprint(kernel, RunLength(4, 4), num_chains=2, num_superchains=2, seed=0, chain_ids=None)["kernel"]
    assert "sha256" in settings["control_variate"]
    assert not {"generators", "minibatches", "state"} & set(settings)
    assert settings["step_size"] == 0.01  # as given, not an adapted value
    with pytest.raises(CheckpointMismatch, match="control_variate"):
        run(1.0)
