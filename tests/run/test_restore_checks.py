"""A checkpoint edited by someone who knows the format (its checksums recomputed as the writer makes them) is
refused with a :class:`CheckpointMismatch` naming the forged field, before anything is made from it.

The base checkpoint is the reliability script's run (6 chains, 4 dimensions, one plate of 300 rows and minibatches
of 20), interrupted at step 57 with its checkpoint of step 50. Each case edits one field, re-signs the index (the
SHA-256 of every record, as :func:`pyro_sgmcmc.checkpoint.save_checkpoint` computes them) and resumes: the error must
name the field, and :meth:`restore_chains` (the first place a saved value is used to size, index or fill anything)
must never be reached, so a forged size cannot allocate. Each case takes well under a second (no step is run).
"""

import io
import time
from pathlib import Path

import pytest
import torch

from pyro_sgmcmc.checkpoint import CheckpointMismatch, checksums, chunk_directory
from pyro_sgmcmc.kernels.base import SGMCMCKernel

from .. import reliability_script as script
from .interrupted import Interrupt, interrupted_checkpoint_files


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory):
    """The index and chunk files of the script's run interrupted at step 57 (checkpoint every 10)."""
    return interrupted_checkpoint_files(tmp_path_factory.mktemp("base"))


def forged(files: dict, directory: Path, edit) -> Path:
    """The checkpoint with ``edit(index)`` applied and every record's SHA-256 recomputed (as the writer does)."""
    path = directory / "run.ckpt"
    chunk_directory(path).mkdir(exist_ok=True)
    for name, data in files.items():
        if name != "run.ckpt":
            (chunk_directory(path) / name).write_bytes(data)
    index = torch.load(io.BytesIO(files["run.ckpt"]), weights_only=True)
    edit(index)
    index["checksums"] = checksums({k: v for k, v in index.items() if k != "checksums"})
    torch.save(index, path)
    return path


@pytest.fixture
def nothing_restored(monkeypatch):
    """Fail the test if a saved state reaches ``restore_chains`` (where saved values are first used)."""

    def forbidden(self, saved):
        raise AssertionError("restore_chains was called with a forged state")

    monkeypatch.setattr(SGMCMCKernel, "restore_chains", forbidden)


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def edit(index):
        record = index["kernel"]
        for key in keys[:-1]:
            record = record[key]
        record[keys[-1]] = value(record[keys[-1]]) if callable(value) else value

    return edit


def _divergence_at(draw):
    """Chain 0 diverged at sampling draw ``draw``: list, counts and log consistent, only the index forged."""

    def edit(index):
        kernel = index["kernel"]
        kernel["divergences"][0] = [draw]
        kernel["num_divergences"][0] += 1
        kernel["divergence_log"] = [(0, 45, "sampling", "a jump of the potential")]

    return edit


CASES = {
    # ranges of positions and counters (a huge cursor or position used to allocate gigabytes)
    "huge-cursor": (_set("minibatches", "cursors", "data", 10**9),
                    r"minibatches\['data'\]\.cursor: 1000000000 is outside \[0, 300\]"),
    "huge-position": (_set("minibatches", "positions", "data", lambda p: p + 10**9),
                      r"minibatches\['data'\]\.positions: .* are outside \[0, 512\]"),
    "negative-epoch": (_set("minibatches", "epochs", "data", -1), r"minibatches\['data'\]\.epoch: -1 is outside"),
    "other-plate": (_set("minibatches", "cursors", lambda c: {"other": 0}),
                    r"minibatches\.cursors: plates \['other'\]"),
    "negative-step": (_set("state", "step", -1), r"state\.step: -1 is not the checkpoint's steps_done, 50"),
    "negative-counter": (_set("adaptation", "count", -5), r"adaptation\.count: -5 is negative"),
    "negative-jump-count": (_set("jumps", "count", -1), r"jumps\.count: -1 is negative"),
    "other-chain-ids": (_set("chain_ids", [0, 1, 2, 3, 4, 9]), r"chain_ids: .* are not this run's chain ids"),
    "other-seed": (_set("seed", 6), r"seed: 6 is not this run's seed 5"),
    # dtypes and shapes of the state, the warmup's adapted metric and step sizes
    "position-dtype": (_set("state", "position", lambda p: p.double()),
                       r"state\.position: dtype torch\.float64, this run's is torch\.float32"),
    "momentum-shape": (_set("state", "momentum", torch.zeros(6, 5)), r"state\.momentum: shape \(6, 5\)"),
    "step-size-shape": (_set("adaptation", "step_size", torch.ones(6, 10**4)),
                        r"adaptation\.step_size: shape \(6, 10000\) is not a per-chain tensor"),
    "metric-dtype": (_set("adaptation", "factor", lambda f: f.half()), r"adaptation\.factor: dtype torch\.float16"),
    "step-size-dtype": (_set("last_step_size", lambda s: s.half()), r"last_step_size: dtype torch\.float16"),
    "keys-dtype": (_set("minibatches", "keys", "data", lambda k: k.int()), r"minibatches\['data'\]\.keys: dtype"),
    # the divergence record's structure
    "divergences-not-per-chain": (_set("divergences", [[]]), r"divergences: \[\[\]\] is not a list of 6 lists"),
    "divergence-draw-outside": (_divergence_at(10**9), r"divergences\[0\]\[0\]: 1000000000 is outside \[0, 9\]"),
    "divergence-count-inconsistent": (_set("num_divergences", lambda n: n + 3), r"divergences\[0\]: \[\] is not a "),
    "divergence-count-negative": (_set("num_warmup_divergences", lambda n: n - 1), r"num_divergences: counts"),
    "divergence-log-malformed": (_set("divergence_log", [("x",)]), r"divergence_log: \[\('x',\)\] is not a list of 0"),
    "last-diverging-shape": (_set("last_diverging", torch.zeros(7, dtype=torch.bool)), r"last_diverging: shape"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_forged_field_is_refused_naming_it_before_anything_is_made_from_it(
    checkpoint_files, tmp_path, nothing_restored, case
):
    edit, message = CASES[case]
    path = forged(checkpoint_files, tmp_path, edit)
    start = time.perf_counter()
    with pytest.raises(CheckpointMismatch, match=message):
        script.run(checkpoint=path, every=10)
    # fails fast: tracing the model and reading 2 files take ~0.1 s; allocating a forged size would take seconds
    assert time.perf_counter() - start < 5


def test_the_last_chunk_must_end_at_the_draws_of_the_saved_step(checkpoint_files, tmp_path, nothing_restored):
    """A chunk record claiming 10^9 draws is refused before any chunk is read."""
    path = forged(checkpoint_files, tmp_path, lambda index: index["last_chunk"].update(stop=10**9))
    with pytest.raises(CheckpointMismatch, match=r"last_chunk: draws 0 to 1000000000, but a run keeps 10 draws"):
        script.run(checkpoint=path, every=10)


def test_the_unedited_checkpoint_passes_every_check(checkpoint_files, tmp_path):
    """The checks refuse forged fields only: the same file re-signed unchanged resumes (its draws: 60 per chain)."""
    path = forged(checkpoint_files, tmp_path, lambda index: None)
    mcmc = script.run(checkpoint=path, every=10)
    assert mcmc.get_samples(group_by_chain=True)["w"].shape == (6, 60, 3)


def test_an_unreadable_index_does_not_advise_loading_it_unsafely(tmp_path):
    """A file holding a pickled object other than tensors and containers is refused without PyTorch's advice to
    retry with ``weights_only=False`` (which would run the code a crafted file holds)."""
    import fractions

    path = tmp_path / "run.ckpt"
    torch.save({"format_version": 4, "steps_done": fractions.Fraction(1, 3)}, path)  # a class weights_only refuses
    with pytest.raises(CheckpointMismatch) as raised:
        script.run(checkpoint=path, every=10)
    message = str(raised.value)
    for advice in ("weights_only", "can still be loaded", "trust the source"):
        assert advice not in message, message
    assert "refused unread" in message and str(path) in message


def test_a_kernel_of_other_settings_is_refused_naming_the_field_that_differs(checkpoint_files, tmp_path):
    """One line per differing field, by its full path: not the two whole kernel configurations."""
    path = forged(checkpoint_files, tmp_path, lambda index: None)
    with pytest.raises(CheckpointMismatch, match="different settings") as raised:
        script.run(checkpoint=path, every=10, step_size=0.03)
    lines = str(raised.value).splitlines()[1:-1]
    assert len(lines) == 1 and lines[0].startswith("  kernel.step_size: theirs"), lines
    assert "0.02" in lines[0] and "0.03" in lines[0]


def test_a_checkpoint_with_divergences_passes_every_check(tmp_path):
    """The checks refuse forged fields, not a run that diverged: SGNHT with too large a step diverges in warmup and
    while sampling, restarting the chains; its checkpoint, with both kinds of divergence recorded, resumes."""
    import warnings

    import pyro

    from pyro_sgmcmc import MCMC, SGNHT, CheckpointSettings

    def run(hook=None):
        pyro.set_rng_seed(0)
        kernel = SGNHT(script.model, step_size=0.3, adapt_step_size=False, on_divergence="restart")
        mcmc = MCMC(kernel, checkpoint=CheckpointSettings(tmp_path / "run.ckpt", every=10), hook_fn=hook,
                    disable_progbar=True, **script.SETTINGS)  # fmt: skip
        mcmc.run(*script.data())
        return mcmc

    def interrupt(kernel, params, stage, i):
        if kernel.state.step == 77:
            raise Interrupt

    warnings.simplefilter("ignore")  # the divergences' warnings (restored by pytest after the test)
    with pytest.raises(Interrupt):
        run(interrupt)
    saved = torch.load(tmp_path / "run.ckpt", weights_only=True)["kernel"]
    assert any(saved["divergences"]) and int(saved["num_warmup_divergences"].sum()) > 0  # both kinds recorded
    assert run().get_samples(group_by_chain=True)["w"].shape == (6, 60, 3)


@pytest.mark.parametrize(
    "field, value, message",
    [("centre", torch.zeros(7), r"control_variate\.centre: shape \(7,\), this run's is \(3,\)"),
     ("grad", torch.zeros(3, dtype=torch.float64), r"control_variate\.grad: dtype torch\.float64"),
     ("potential", torch.tensor(float("inf")), r"control_variate\.potential: not finite")],
)  # fmt: skip
def test_a_forged_control_variate_centre_is_refused_naming_it(tmp_path, nothing_restored, field, value, message):
    """A control variate's centre, its full-data gradient and potential (given centre: one full-data pass)."""
    from . import test_resume_setup as setup

    path = tmp_path / "run.ckpt"
    setup.interrupted(path, 25, centre="dict")
    index = torch.load(path, weights_only=True)
    index["kernel"]["control_variate"][field] = value
    index["checksums"] = checksums({k: v for k, v in index.items() if k != "checksums"})
    torch.save(index, path)
    setup.INIT_CALLS.clear()  # the init strategy reads INIT_CALLS: the same as in the interrupted run
    with pytest.raises(CheckpointMismatch, match=message):
        setup.run(path, centre="dict")
