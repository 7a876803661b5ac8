"""What a new user meets first says what holds (issue 29, points 2 and 5): the README, the installation page
and the quickstart, read as text and checked against the package.

* no placeholder is left for the user to guess (``<repository-url>`` was);
* the install commands pin the same torch release everywhere, and where the README says how to get the CPU
  build it gives PyTorch's CPU index, as the installation page does (the pin alone takes PyPI's CUDA build);
* "there is no ``device=`` argument": no public sampler, run or guide constructor takes one;
* the advice to run torch on one thread stands where users start (README, installation, quickstart), and
  long runs show progress by default, as Pyro's ``MCMC`` does.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pyro.infer
import pytest

import pyro_sgmcmc

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
INSTALLATION = (ROOT / "docs" / "installation.rst").read_text(encoding="utf-8")
QUICKSTART = (ROOT / "docs" / "quickstart.rst").read_text(encoding="utf-8")
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def test_no_placeholder_is_left_for_the_user():
    placeholder = re.compile(r"<[a-z][a-z_-]*(?:url|path|name|dir|folder|version)>", re.IGNORECASE)
    for name, text in (("README.md", README), ("installation.rst", INSTALLATION), ("quickstart.rst", QUICKSTART)):
        assert not placeholder.findall(text), (name, placeholder.findall(text))


def test_every_install_command_pins_one_torch_release_and_the_cpu_build_comes_from_its_index():
    pins = set(re.findall(r'"torch==([\d.]+)"', README + INSTALLATION))
    assert len(pins) == 1, pins
    assert CPU_INDEX in INSTALLATION and CPU_INDEX in README
    # the README's sentence about the pin says what the pin alone does on Linux: PyPI's CUDA build
    assert re.search(r"plain PyPI serves that release as a\s+multi-GB CUDA build", README)


def test_there_is_no_device_argument_as_the_readme_says():
    assert "There is no `device=` argument: the chains follow the data." in README
    public = [pyro_sgmcmc.SGLD, pyro_sgmcmc.SGHMC, pyro_sgmcmc.SGNHT, pyro_sgmcmc.MCMC, pyro_sgmcmc.AutoLaplace,
              pyro_sgmcmc.AutoDiagVI]  # fmt: skip
    for cls in public:
        assert "device" not in inspect.signature(cls).parameters, cls.__name__


@pytest.mark.parametrize("text", [README, INSTALLATION, QUICKSTART], ids=["README", "installation", "quickstart"])
def test_one_thread_advice_where_users_start(text):
    assert "torch.set_num_threads(1)" in text and "OMP_NUM_THREADS=1" in text
    assert "benchmarks/threads.py" in text  # with the measurement behind it


def test_runs_show_progress_by_default_as_pyros_mcmc_does():
    ours = inspect.signature(pyro_sgmcmc.MCMC).parameters["disable_progbar"].default
    assert ours is False and inspect.signature(pyro.infer.MCMC).parameters["disable_progbar"].default is False
    assert inspect.signature(pyro_sgmcmc.AutoLaplace).parameters["disable_progbar"].default is False
