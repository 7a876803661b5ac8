"""The public names a Pyro user reaches for, where a Pyro user looks for them."""

from __future__ import annotations

from pathlib import Path

import tomllib

import pyro_sgmcmc
import pyro_sgmcmc.guides


def test_guides_are_importable_from_the_top_level():
    from pyro_sgmcmc import AutoDiagVI, AutoLaplace, LaplaceApproximation, TemperedELBO

    assert AutoLaplace is pyro_sgmcmc.guides.AutoLaplace and AutoDiagVI is pyro_sgmcmc.guides.AutoDiagVI
    assert LaplaceApproximation is pyro_sgmcmc.guides.LaplaceApproximation
    assert TemperedELBO is pyro_sgmcmc.guides.TemperedELBO
    assert {"AutoLaplace", "AutoDiagVI", "LaplaceApproximation", "TemperedELBO"} <= set(pyro_sgmcmc.__all__)


def test_arviz_is_a_base_dependency():
    """to_inference_data is core: a base install must be able to run it."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert any(requirement.startswith("arviz") for requirement in project["dependencies"])
