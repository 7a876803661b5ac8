"""The public names a Pyro user reaches for, where a Pyro user looks for them."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

import pyro_sgmcmc
import pyro_sgmcmc.guides


def test_guides_are_importable_from_the_top_level():
    from pyro_sgmcmc import AutoDiagVI, AutoLaplace, LaplaceApproximation, ModuleLaplace, TemperedELBO

    assert AutoLaplace is pyro_sgmcmc.guides.AutoLaplace and AutoDiagVI is pyro_sgmcmc.guides.AutoDiagVI
    assert LaplaceApproximation is pyro_sgmcmc.guides.LaplaceApproximation
    assert TemperedELBO is pyro_sgmcmc.guides.TemperedELBO and ModuleLaplace is pyro_sgmcmc.guides.ModuleLaplace
    assert {"AutoLaplace", "AutoDiagVI", "LaplaceApproximation", "TemperedELBO"} <= set(pyro_sgmcmc.__all__)


def test_arviz_is_a_base_dependency():
    """to_inference_data is core: a base install must be able to run it."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert any(requirement.startswith("arviz") for requirement in project["dependencies"])


def test_run_room_names_keep_their_import_paths():
    """The rooms of issue #19: diagnostics, export and distributed are packages that re-export their names."""
    import pyro_sgmcmc.diagnostics as diagnostics
    import pyro_sgmcmc.distributed as distributed
    import pyro_sgmcmc.export as export

    assert pyro_sgmcmc.nested_rhat is diagnostics.nested_rhat and callable(diagnostics.nested_rhat)
    assert pyro_sgmcmc.decompose_uncertainty is diagnostics.decompose_uncertainty
    assert pyro_sgmcmc.to_inference_data is export.to_inference_data
    for name in distributed.__all__:  # every public name of the old module, from the package
        assert getattr(distributed, name).__module__.startswith("pyro_sgmcmc.distributed."), name
    assert set(distributed.__all__) == {
        "init_distributed", "rank_chain_ids", "shard", "DistributedMCMC", "data_parallel", "DataParallel",
        "ShardedMinibatches", "sharded", "launch", "free_port",
    }  # fmt: skip


@pytest.mark.parametrize(
    "old, new, names",
    [
        ("pyro_sgmcmc.inference_data", "pyro_sgmcmc.export", ["to_inference_data"]),
        ("pyro_sgmcmc.uncertainty", "pyro_sgmcmc.diagnostics", ["auroc", "decompose_uncertainty"]),
    ],
)
def test_old_module_paths_work_for_one_release_with_a_future_warning(old, new, names):
    import importlib
    import sys

    sys.modules.pop(old, None)  # the warning is given when the module is first imported
    with pytest.warns(FutureWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    replacement = importlib.import_module(new)
    for name in names:
        assert getattr(module, name) is getattr(replacement, name)
