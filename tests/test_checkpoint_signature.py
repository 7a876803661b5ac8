"""Keyed integrity (``CheckpointSettings(key=...)``): a checkpoint signed with HMAC-SHA256 resumes only with its key.

Without a key, someone who edits a checkpoint can recompute its SHA-256 checksums (tests/run/test_restore_checks.py
then checks each field against the run). With a key, such an edit is refused outright, and so is a file that is
unsigned or signed with another key. The run is the reliability script's, interrupted at step 57 (checkpoint at 50).
"""

import io

import pyro
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, CheckpointSettings
from pyro_sgmcmc.checkpoint import CheckpointMismatch, checksums, chunk_directory

from . import reliability_script as script

KEY, OTHER_KEY = b"k" * 32, b"o" * 32


class Interrupt(Exception):
    pass


def run(path, key=None, stop=None):
    def hook(kernel, params, stage, i):
        if kernel.state.step == stop:
            raise Interrupt

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(script.model, step_size=0.02), checkpoint=CheckpointSettings(path, every=10, key=key),
                hook_fn=hook, disable_progbar=True, **script.SETTINGS)  # fmt: skip
    mcmc.run(*script.data())
    return mcmc


@pytest.fixture(scope="module")
def signed_files(tmp_path_factory):
    """The files of the run signed with ``KEY``, interrupted at step 57."""
    path = tmp_path_factory.mktemp("signed") / "run.ckpt"
    with pytest.raises(Interrupt):
        run(path, KEY, stop=57)
    return {p.name: p.read_bytes() for p in [path, *chunk_directory(path).iterdir()]}


@pytest.fixture
def signed(signed_files, tmp_path):
    path = tmp_path / "run.ckpt"
    chunk_directory(path).mkdir()
    for name, data in signed_files.items():
        (path if name == path.name else chunk_directory(path) / name).write_bytes(data)
    return path


def test_a_signed_checkpoint_resumes_with_its_key_to_the_uninterrupted_draws(signed):
    reference = script.run()
    resumed = run(signed, KEY)
    for name, value in reference.get_samples(group_by_chain=True).items():
        assert torch.equal(value, resumed.get_samples(group_by_chain=True)[name]), name


def test_a_checkpoint_signed_with_another_key_is_refused(signed):
    with pytest.raises(CheckpointMismatch, match="signature does not match this run's key"):
        run(signed, OTHER_KEY)


def test_an_unsigned_checkpoint_is_refused_by_a_run_with_a_key(tmp_path):
    path = tmp_path / "run.ckpt"
    with pytest.raises(Interrupt):
        run(path, None, stop=57)
    with pytest.raises(CheckpointMismatch, match="is not signed"):
        run(path, KEY)


def test_an_edit_with_recomputed_checksums_is_refused_without_the_key(signed):
    """The attacker knows the format, not the key: the checksums agree, the signature does not."""
    index = torch.load(signed, weights_only=True)
    index["kernel"]["state"]["position"][0, 0] += 0.5  # a plausible edit: finite, in shape
    index["checksums"] = checksums({k: v for k, v in index.items() if k not in ("checksums", "signature")})
    buffer = io.BytesIO()
    torch.save(index, buffer)
    signed.write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointMismatch, match="signature does not match"):
        run(signed, KEY)


@pytest.mark.parametrize("key", ["a string key of 32 characters....", b"short", 12345])
def test_a_key_must_be_bytes_of_at_least_16(tmp_path, key):
    with pytest.raises(TypeError, match="CheckpointSettings: key must be None or a secret of at least 16 bytes"):
        CheckpointSettings(tmp_path / "run.ckpt", key=key)


def test_the_key_is_not_shown():
    assert "key" not in repr(CheckpointSettings("run.ckpt", key=KEY)) and "kkkk" not in repr(
        CheckpointSettings("run.ckpt", key=KEY)
    )
