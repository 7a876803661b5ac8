"""An interrupt (``KeyboardInterrupt``) or an error (``OSError``, ``MemoryError``) at any moment of a run's set-up or
of a resume's restore surfaces as itself, and ``mcmc.partial`` says what exists.

The exception is injected by replacing, for one call, a function the set-up or the restore calls (each point below
is a distinct moment: before the checkpoint is opened, while it is read, while its draws are copied, while the
chains are rebuilt, after they are). The oracle: ``pytest.raises`` of the injected type (not an ``AttributeError``
about ``None``); ``partial`` in the phase where it stopped, with no draws in memory (none are the run's before its
chains exist), and, when a verified checkpoint was being restored, its step and path, from which the same run then
resumes bit-identically.
"""

import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, CheckpointSettings, RunNotFinished
from pyro_sgmcmc.checkpoint import chunk_directory
from pyro_sgmcmc.kernels.base import SGMCMCKernel

from .. import reliability_script as script
from .interrupted import interrupted_checkpoint_files


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory):
    """The files of the script's run interrupted at step 57 (index of step 50, checkpoint every 10)."""
    return interrupted_checkpoint_files(tmp_path_factory.mktemp("base"))


def _copy(files, directory):
    path = directory / "run.ckpt"
    chunk_directory(path).mkdir(exist_ok=True)
    for name, data in files.items():
        (path if name == "run.ckpt" else chunk_directory(path) / name).write_bytes(data)
    return path


def _inject(monkeypatch, target, error):
    """Replace ``target`` (``"module.attribute"`` or ``(class, name)``) by a function raising ``error`` once."""
    if isinstance(target, tuple):
        owner, name = target
        original = getattr(owner, name)
    else:
        module, name = target.rsplit(".", 1)
        owner = __import__(module, fromlist=[name])
        original = getattr(owner, name)

    def failing(*args, **kwargs):
        monkeypatch.setattr(owner, name, original)  # once: a later run goes through
        raise error("injected by the test")

    monkeypatch.setattr(owner, name, failing)


def _mcmc(path=None):
    import pyro

    pyro.set_rng_seed(0)
    kernel = SGHMC(script.model, step_size=0.02)
    checkpoint = None if path is None else CheckpointSettings(path, every=10)
    return MCMC(kernel, checkpoint=checkpoint, disable_progbar=True, **script.SETTINGS)


#: moments of a resume's restore: after the index is verified, the draw chunks and the chains are read
RESTORE_POINTS = {
    "reading-a-chunk": "pyro_sgmcmc.checkpoint.read_chunk",
    "rebuilding-the-chains": (SGMCMCKernel, "restore_chains"),
    "loading-the-state": (SGMCMCKernel, "load_state_dict"),
    "checking-the-restored-state": "pyro_sgmcmc.run.checkpoint.check_serialisable",
}


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError, MemoryError])
@pytest.mark.parametrize("point", list(RESTORE_POINTS))
def test_an_interrupt_or_error_while_restoring_surfaces_as_itself(
    checkpoint_files, tmp_path, monkeypatch, point, error
):
    path = _copy(checkpoint_files, tmp_path)
    _inject(monkeypatch, RESTORE_POINTS[point], error)
    mcmc = _mcmc(path)
    with pytest.raises(error, match="injected by the test"):
        mcmc.run(*script.data())
    partial = mcmc.partial
    assert partial is not None and partial.phase == "restore", partial
    assert (partial.steps_done, partial.num_draws, partial.checkpoint_path) == (50, 0, str(path))
    assert error.__name__ in partial.error
    with pytest.raises(RunNotFinished, match="injected by the test"):
        mcmc.get_samples()


def test_the_checkpoint_left_by_an_interrupted_restore_resumes_as_if_untouched(checkpoint_files, tmp_path, monkeypatch):
    """The interrupted restore changed nothing on disk: resuming then gives the draws of a resume of the intact
    copy, bit for bit (that one equals an uninterrupted run: tests/test_checkpoint.py)."""
    (tmp_path / "interrupted").mkdir()
    path = _copy(checkpoint_files, tmp_path / "interrupted")
    _inject(monkeypatch, (SGMCMCKernel, "restore_chains"), KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        script.run(checkpoint=path, every=10)
    resumed = script.run(checkpoint=path, every=10).get_samples(group_by_chain=True)
    (tmp_path / "intact").mkdir()
    intact = script.run(checkpoint=_copy(checkpoint_files, tmp_path / "intact"), every=10).get_samples(
        group_by_chain=True
    )
    for name, value in intact.items():
        assert torch.equal(value, resumed[name]), name


#: moments of a run's set-up (with a checkpoint path, fresh): tracing, the directory probe, the chains' start
SETUP_POINTS = {
    "tracing-the-model": (SGMCMCKernel, "prepare_chains"),
    "probing-the-directory": "pyro_sgmcmc.run.checkpoint.check_writable",
    "drawing-the-starting-points": (SGMCMCKernel, "start_chains"),
    "checking-the-state-can-be-saved": "pyro_sgmcmc.run.checkpoint.check_serialisable",
}


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError, MemoryError])
@pytest.mark.parametrize("point", list(SETUP_POINTS))
def test_an_interrupt_or_error_during_set_up_surfaces_as_itself(tmp_path, monkeypatch, point, error):
    _inject(monkeypatch, SETUP_POINTS[point], error)
    mcmc = _mcmc(tmp_path / "run.ckpt")
    with pytest.raises(error, match="injected by the test"):
        mcmc.run(*script.data())
    partial = mcmc.partial
    assert partial is not None and partial.phase == "set-up", partial
    assert (partial.steps_done, partial.num_draws, partial.checkpoint_path) == (0, 0, None)
    with pytest.raises(RunNotFinished, match="injected by the test"):
        mcmc.get_samples()
