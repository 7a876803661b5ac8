"""``MCMC(checkpoint=...)``: a path or a :class:`CheckpointSettings`, and the previous release's four keywords.

The new spelling writes and resumes a run (bit-identically to an uninterrupted one); a path is short
for ``CheckpointSettings(path)``; each old keyword (``checkpoint_path``, ``checkpoint_every``,
``resume``, ``checkpoint_sync``) still works, with a :class:`FutureWarning` naming ``checkpoint=``;
old and new together are an error naming both; a bad field is an error naming it.
"""

import inspect
import os
import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, SGLD, CheckpointSettings
from pyro_sgmcmc.distributed import DistributedMCMC

Y = torch.arange(8.0)
SETTINGS = dict(num_samples=6, warmup_steps=4, num_chains=2, chain_method="vectorized", seed=3, disable_progbar=True)


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(y), subsample_size=2) as idx:
        pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


class _Stop(Exception):
    pass


def _stop_at(step):
    def hook(kernel, params, stage, i):
        if kernel.state.step - 1 == step:
            raise _Stop

    return hook


def _run(hook=None, **checkpoint):
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(model, step_size=0.05), hook_fn=hook, **SETTINGS, **checkpoint)
    mcmc.run(Y)
    return mcmc


def _same_draws(a, b):
    for name, draws in a.get_samples(group_by_chain=True).items():
        assert torch.equal(draws, b.get_samples(group_by_chain=True)[name]), name
    for name, stat in a.sample_stats.items():
        assert torch.equal(stat, b.sample_stats[name]), name


@pytest.fixture(scope="module")
def reference():
    return _run()


# ---------------------------------------------------------------------- the new spelling
def test_signature_has_one_checkpoint_keyword():
    parameters = inspect.signature(MCMC).parameters
    assert len(parameters) == 18
    assert parameters["checkpoint"].kind is inspect.Parameter.KEYWORD_ONLY
    assert not {"checkpoint_path", "checkpoint_every", "resume", "checkpoint_sync"} & set(parameters)


def test_new_spelling_writes_and_resumes_bit_identically(tmp_path, reference):
    path = tmp_path / "run.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the new spelling is not deprecated
        with pytest.raises(_Stop):
            _run(_stop_at(7), checkpoint=CheckpointSettings(path, every=3))
        assert path.exists() and path.with_name(path.name + ".draws").is_dir()
        steps = []
        resumed = _run(lambda *a: steps.append(a[-1]), checkpoint=CheckpointSettings(path, every=3))
    assert len(steps) == 10 - 6  # from the checkpoint after step 6
    _same_draws(reference, resumed)


def test_a_path_writes_at_the_end_and_resumes(tmp_path, reference):
    path = tmp_path / "run.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        first = _run(checkpoint=str(path))  # 10 steps < 1000: only the final checkpoint
        assert path.exists()
        steps = []
        again = _run(lambda *a: steps.append(a[-1]), checkpoint=path)
    assert steps == []  # resumed from the final checkpoint: nothing left to run
    _same_draws(reference, first)
    _same_draws(reference, again)


def test_resume_false_starts_afresh(tmp_path, reference):
    path = tmp_path / "run.ckpt"
    with pytest.raises(_Stop):
        _run(_stop_at(7), checkpoint=CheckpointSettings(path, every=2))
    steps = []
    _run(lambda *a: steps.append(a[-1]), checkpoint=CheckpointSettings(path, every=2, resume=False))
    assert len(steps) == 4 + 6  # every step ran again
    _same_draws(reference, _run(checkpoint=path))  # and the file it left is that of a complete run


@pytest.mark.parametrize("path", ["run.ckpt", Path("run.ckpt")], ids=["str", "Path"])
def test_a_path_is_short_for_checkpoint_settings_of_it(tmp_path, path):
    path = tmp_path / path if isinstance(path, Path) else str(tmp_path / path)
    mcmc = MCMC(SGLD(model), 3, chain_method="vectorized", checkpoint=path)
    assert mcmc.checkpoint == CheckpointSettings(path) == CheckpointSettings(Path(path), 1000, True, True)
    assert isinstance(mcmc.checkpoint.path, Path)
    assert MCMC(SGLD(model), 3, chain_method="vectorized").checkpoint is None


def test_checkpoint_settings_is_public_and_frozen():
    import pyro_sgmcmc
    from pyro_sgmcmc.run import CheckpointSettings as from_run
    from pyro_sgmcmc.run.loop import CheckpointSettings as from_loop

    assert "CheckpointSettings" in pyro_sgmcmc.__all__
    assert from_run is from_loop is CheckpointSettings
    assert CheckpointSettings.__module__ == "pyro_sgmcmc.run.checkpoint_settings"
    settings = CheckpointSettings("run.ckpt")
    assert (settings.every, settings.resume, settings.sync) == (1000, True, True)
    with pytest.raises(AttributeError):
        settings.every = 5


# ---------------------------------------------------------------------- bad values
@pytest.mark.parametrize(
    "field,value,error",
    [
        ("path", 123, TypeError),
        ("path", "", TypeError),
        ("path", None, TypeError),
        ("path", b"run.ckpt", TypeError),
        ("every", 0, ValueError),
        ("every", -5, ValueError),
        ("every", 2.0, ValueError),
        ("every", True, ValueError),
        ("every", None, ValueError),
        ("resume", 1, TypeError),
        ("resume", "yes", TypeError),
        ("sync", None, TypeError),
        ("sync", 0, TypeError),
    ],
)
def test_bad_field_is_an_error_naming_it(field, value, error):
    fields = dict(path="run.ckpt", every=10, resume=True, sync=True)
    fields[field] = value
    with pytest.raises(error, match=rf"CheckpointSettings: {field} must be"):
        CheckpointSettings(**fields)


@pytest.mark.parametrize("value", [123, 1.5, ["run.ckpt"], b"run.ckpt"], ids=repr)
def test_checkpoint_of_another_type_is_an_error_naming_it(value):
    with pytest.raises(TypeError, match=r"checkpoint must be None, a file path .* or a CheckpointSettings"):
        MCMC(SGLD(model), 3, chain_method="vectorized", checkpoint=value)


@pytest.mark.parametrize("which", ["directory", "missing-directory"])
@pytest.mark.parametrize("form", ["path", "CheckpointSettings"])
def test_bad_checkpoint_path_is_refused_in_the_constructor(tmp_path, which, form):
    path = {"directory": tmp_path, "missing-directory": tmp_path / "nope" / "run.ckpt"}[which]
    checkpoint = CheckpointSettings(path) if form == "CheckpointSettings" else path
    name = "checkpoint.path" if form == "CheckpointSettings" else "checkpoint"
    with pytest.raises(ValueError, match=rf"^{name}\W.*(is a directory|does not exist)"):
        MCMC(SGLD(model), 3, chain_method="vectorized", checkpoint=checkpoint)


@pytest.mark.parametrize("chain_method", ["parallel", "sequential"])
def test_checkpoint_needs_vectorized_chains(tmp_path, chain_method):
    with pytest.raises(ValueError, match=r"checkpoint (and chain_ids )?needs? chain_method='vectorized'"):
        MCMC(SGLD(model), 3, chain_method=chain_method, checkpoint=tmp_path / "run.ckpt")


# ---------------------------------------------------------------------- the previous release's keywords
OLD = {
    "checkpoint_path": ("path", None),
    "checkpoint_every": ("every", 7),
    "resume": ("resume", False),
    "checkpoint_sync": ("sync", False),
}


@pytest.mark.parametrize("old", list(OLD))
def test_each_old_keyword_warns_naming_the_new_spelling_and_still_works(tmp_path, old):
    path = tmp_path / "run.ckpt"
    field, value = OLD[old]
    keywords = {"checkpoint_path": path}
    if value is not None:
        keywords[old] = value
    with pytest.warns(FutureWarning, match=rf"{old}= .*deprecated.*checkpoint=") as record:
        mcmc = MCMC(SGLD(model), 3, chain_method="vectorized", **keywords)
    assert len(record) == 1 and record[0].filename == __file__  # one warning, at the caller's line
    expected = CheckpointSettings(path, **({} if value is None else {field: value}))
    assert mcmc.checkpoint == expected
    with pytest.warns(FutureWarning, match=rf"{old} is deprecated: read checkpoint\.{field}"):
        assert getattr(mcmc, old) == getattr(expected, field)


def test_old_keywords_write_and_resume_as_before(tmp_path, reference):
    path = tmp_path / "run.ckpt"
    old = dict(checkpoint_path=path, checkpoint_every=3, resume=True, checkpoint_sync=False)
    with pytest.warns(FutureWarning, match=r"checkpoint=CheckpointSettings\(.*every=3, sync=False\)"):
        with pytest.raises(_Stop):
            _run(_stop_at(7), **old)
    with pytest.warns(FutureWarning):
        resumed = _run(**old)
    _same_draws(reference, resumed)
    # the new spelling resumes the old spelling's file: it is the same run
    with pytest.raises(_Stop):
        _run(_stop_at(8), checkpoint=CheckpointSettings(path, every=3, resume=False))
    _same_draws(reference, _run(checkpoint=CheckpointSettings(path, every=3, sync=False)))


def test_without_a_checkpoint_the_old_attributes_read_the_old_defaults():
    mcmc = MCMC(SGLD(model), 3, chain_method="vectorized")
    with pytest.warns(FutureWarning):
        assert (mcmc.checkpoint_path, mcmc.checkpoint_every, mcmc.resume, mcmc.checkpoint_sync) == (
            None,
            None,
            True,
            True,
        )


def test_old_keywords_keep_their_errors_and_names(tmp_path):
    def call(**keywords):
        with pytest.warns(FutureWarning):
            MCMC(SGLD(model), 3, **keywords)

    with pytest.raises(ValueError, match="checkpoint_every must be a positive integer"):
        call(chain_method="vectorized", checkpoint_path=tmp_path / "run.ckpt", checkpoint_every=0)
    with pytest.raises(ValueError, match="checkpoint_every needs checkpoint_path"):
        call(chain_method="vectorized", checkpoint_every=5)
    with pytest.raises(TypeError, match="checkpoint_sync must be True or False"):
        call(chain_method="vectorized", checkpoint_path=tmp_path / "run.ckpt", checkpoint_sync=1)
    with pytest.raises(TypeError, match="checkpoint_path must be a file path"):
        call(chain_method="vectorized", checkpoint_path=123)
    with pytest.raises(ValueError, match="checkpoint_path needs chain_method='vectorized'"):
        call(chain_method="sequential", checkpoint_path=tmp_path / "run.ckpt")
    with pytest.raises(ValueError, match="checkpoint_path and chain_ids need chain_method='vectorized'"):
        call(checkpoint_path=tmp_path / "run.ckpt")


@pytest.mark.parametrize("old", list(OLD))
def test_old_and_new_together_is_an_error_naming_both(tmp_path, old):
    value = {"checkpoint_path": tmp_path / "old.ckpt", "checkpoint_every": 5, "resume": False}.get(old, False)
    with pytest.raises(TypeError, match=rf"both checkpoint= and the deprecated {old}="):
        MCMC(SGLD(model), 3, chain_method="vectorized", checkpoint=tmp_path / "run.ckpt", **{old: value})


def test_an_unknown_keyword_is_still_pythons_type_error():
    with pytest.raises(TypeError, match="checkpoint_pth"):
        MCMC(SGLD(model), 3, chain_method="vectorized", checkpoint_pth="run.ckpt")


# ---------------------------------------------------------------------- DistributedMCMC
@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group (torch.distributed), destroyed afterwards."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def test_distributed_mcmc_takes_checkpoint_and_the_old_keywords(tmp_path, one_rank):
    path = tmp_path / "chains.ckpt"
    ranked = CheckpointSettings(Path(f"{os.fspath(path)}.rank0"), every=4)
    new = DistributedMCMC(SGLD(model), 3, num_chains=2, disable_progbar=True, checkpoint=CheckpointSettings(path, 4))
    assert new.checkpoint == ranked
    assert DistributedMCMC(SGLD(model), 3, num_chains=2, checkpoint=path).checkpoint == CheckpointSettings(ranked.path)
    with pytest.warns(FutureWarning, match=r"DistributedMCMC: checkpoint_path=, checkpoint_every= are deprecated"):
        old = DistributedMCMC(SGLD(model), 3, num_chains=2, checkpoint_path=path, checkpoint_every=4)
    assert old.checkpoint == ranked
    with pytest.raises(TypeError, match="both checkpoint= and the deprecated checkpoint_path="):
        DistributedMCMC(SGLD(model), 3, num_chains=2, checkpoint=path, checkpoint_path=path)
    pyro.set_rng_seed(0)
    new.run(Y)
    assert ranked.path.exists()
