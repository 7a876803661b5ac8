"""The Sphinx documentation builds without a warning, and every code example in it runs.

Three Sphinx runs, in subprocesses started together (each imports torch, Pyro and the package
afresh, as a user's build does; running them side by side keeps the wall time near that of the
slowest, about 20 s):

* ``-b html -W --keep-going`` on ``docs/``: any warning (bad reST in a page or in a docstring, a
  napoleon problem, a broken cross-document link, a page missing from the toctree) fails it;
* ``-b doctest -W --keep-going`` on ``docs/``: runs the quickstart, the examples of the
  conventions page and the docstring examples that the API page includes, and compares their
  printed output with the expected output;
* ``-b html -W --keep-going`` on a copy of ``docs/`` in which the optional ``benchmarks`` page
  (written elsewhere in the project) is toggled: present if ``docs/`` lacks it, absent if ``docs/``
  has it. Together with the first run this covers both states.

The content checks look for each public name's anchor on the API page and for MathJax math.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pyro_sgmcmc

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TIMEOUT = 600  # seconds per build; a normal run takes well under a minute


def _sphinx(builder: str, source: Path, out: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", builder,
           "-d", str(out / "doctrees"), str(source), str(out / builder)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"sphinx did not finish in {TIMEOUT} s:\n{output}")
    return process.returncode, output


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Run the three builds concurrently; return ``{name: (returncode, output, output_dir)}``."""
    base = tmp_path_factory.mktemp("docs")

    toggled = base / "toggled-src"
    shutil.copytree(DOCS, toggled, ignore=shutil.ignore_patterns("_build"))
    benchmarks = toggled / "benchmarks.rst"
    if benchmarks.exists():
        benchmarks.unlink()
    else:
        benchmarks.write_text("Benchmarks\n==========\n\nA stand-in page for the toggled build.\n")

    runs = {
        "html": (_sphinx("html", DOCS, base / "main"), base / "main" / "html"),
        "doctest": (_sphinx("doctest", DOCS, base / "main-doctest"), base / "main-doctest" / "doctest"),
        "toggled": (_sphinx("html", toggled, base / "toggled"), base / "toggled" / "html"),
    }
    return {name: (*_finish(process), out) for name, (process, out) in runs.items()}


def test_html_builds_without_warnings(builds):
    returncode, output, out = builds["html"]
    assert returncode == 0, output
    assert "WARNING" not in output and "ERROR" not in output, output
    for page in ["index", "installation", "quickstart", "conventions", "api"]:
        assert (out / f"{page}.html").exists(), page
    index = (out / "index.html").read_text(encoding="utf-8")
    assert ("benchmarks.html" in index) == (DOCS / "benchmarks.rst").exists()


def test_doctest_examples_pass(builds):
    returncode, output, _ = builds["doctest"]
    assert returncode == 0, output
    assert "0 failures in tests" in output, output
    # The examples really ran: each page with code reports its own tests.
    for page in ["quickstart", "conventions", "api"]:
        assert f"Document: {page}" in output, output
    total = int(re.search(r"^\s*(\d+) tests$", output, flags=re.MULTILINE).group(1))
    assert total >= 50, output


def test_api_page_documents_the_public_api_with_math(builds):
    _, _, out = builds["html"]
    api = (out / "api.html").read_text(encoding="utf-8")
    for name in pyro_sgmcmc.__all__:
        assert f'id="pyro_sgmcmc.{name}"' in api, name
    for name in ["langevin_step", "underdamped_step", "nose_hoover_step"]:
        assert f'id="pyro_sgmcmc.kernels.diffusions.{name}"' in api, name
    # The update equations are rendered by MathJax, both inline and as display math.
    assert 'class="math notranslate nohighlight"' in api
    assert r"\epsilon" in api and r"\sigma^2" in api and "SGHMC" in api
    conventions = (out / "conventions.html").read_text(encoding="utf-8")
    assert r"(D + Q)" in conventions and r"\mathcal{T} = \frac{T}{N}" in conventions


def test_optional_benchmarks_page_toggled(builds):
    returncode, output, out = builds["toggled"]
    assert returncode == 0, output
    index = (out / "index.html").read_text(encoding="utf-8")
    assert ("benchmarks.html" in index) != (DOCS / "benchmarks.rst").exists()
