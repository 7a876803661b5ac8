"""The Sphinx documentation builds without a warning, and every code example in it runs.

Four Sphinx runs, in subprocesses started together (each imports torch, Pyro and the package
afresh, as a user's build does; running them side by side keeps the wall time near that of the
slowest, the HTML build, about 40 s on an idle 2-core machine):

* ``-b html -W --keep-going`` on ``docs/``: any warning (bad reST in a page or in a docstring, a
  napoleon problem, a broken cross-document link, a page missing from the toctree) fails it. This
  build also runs the ``exec-code`` blocks (``docs/_ext/exec_code.py``) of the quickstart and the
  tutorials and puts their output in the pages; an exception in one is a warning, so it fails;
* ``-b doctest -W --keep-going`` on ``docs/``: runs the doctest examples of the pages (conventions,
  Laplace, VI) and of the docstrings that the API page includes, and compares their printed output
  with the expected output (``exec_code_run=0``: the ``exec-code`` blocks ran in the HTML build);
* ``-b html -W --keep-going`` on a copy of ``docs/`` in which the optional ``benchmarks`` page
  (written elsewhere in the project) is toggled: present if ``docs/`` lacks it, absent if ``docs/``
  has it. Together with the first run this covers both states (``exec_code_run=0``);
* ``-b html`` on a two-page project that uses only the ``exec_code`` extension: a block that
  prints shows its output, a block that raises is reported as a warning naming its page and line.

The content checks look for each public name's anchor on the API page, for MathJax math, for the
quickstart's executed output and for every gallery figure.
"""

from __future__ import annotations

import html
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


def _sphinx(builder: str, source: Path, out: Path, *, run_code: bool = True, strict: bool = True) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "sphinx", *(["-W", "--keep-going"] if strict else []), "-b", builder,
           "-d", str(out / "doctrees"), str(source), str(out / builder)]  # fmt: skip
    if not run_code:
        cmd[3:3] = ["-D", "exec_code_run=0"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


EXEC_CODE_CONF = f"""
import sys
sys.path.insert(0, {str(DOCS / "_ext")!r})
extensions = ["exec_code"]
exec_code_setup = "offset = 40"
"""
EXEC_CODE_GOOD = """Good
====

.. exec-code::

    answer = offset + 2
    print("the answer is", answer)

.. exec-code::
   :hide-code:

    print("still", answer)
"""
EXEC_CODE_BAD = """Bad
===

.. exec-code::

    print("before the error")
    raise RuntimeError("planted failure")
"""


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

    tiny = base / "exec-code-src"
    tiny.mkdir()
    (tiny / "conf.py").write_text(EXEC_CODE_CONF)
    (tiny / "index.rst").write_text("Index\n=====\n\n.. toctree::\n\n   good\n   bad\n")
    (tiny / "good.rst").write_text(EXEC_CODE_GOOD)
    (tiny / "bad.rst").write_text(EXEC_CODE_BAD)

    runs = {
        "html": (_sphinx("html", DOCS, base / "main"), base / "main" / "html"),
        "doctest": (
            _sphinx("doctest", DOCS, base / "main-doctest", run_code=False),
            base / "main-doctest" / "doctest",
        ),
        "toggled": (_sphinx("html", toggled, base / "toggled", run_code=False), base / "toggled" / "html"),
        "exec_code": (_sphinx("html", tiny, base / "exec-code", strict=False), base / "exec-code" / "html"),
    }
    return {name: (*_finish(process), out) for name, (process, out) in runs.items()}


def test_html_builds_without_warnings(builds):
    returncode, output, out = builds["html"]
    assert returncode == 0, output
    assert "WARNING" not in output and "ERROR" not in output, output
    pages = ["index", "installation", "quickstart", "concepts", "conventions", "api", "reliability",
             "benchmarks_vectorized", "tutorials/index", "tutorials/sgmcmc", "tutorials/chains", "laplace", "vi",
             "tutorials/uncertainty", "gallery/index", "gallery/cold_posterior", "gallery/continual_learning",
             "gallery/ood_detection", "gallery/double_well", "gallery/cyclical_mixture",
             "gallery/cyclical_digits", "gallery/lora_sentiment"]  # fmt: skip
    for page in pages:
        assert (out / f"{page}.html").exists(), page
    index = (out / "index.html").read_text(encoding="utf-8")
    assert ("benchmarks.html" in index) == (DOCS / "benchmarks.rst").exists()


def test_doctest_examples_pass(builds):
    returncode, output, _ = builds["doctest"]
    assert returncode == 0, output
    assert "0 failures in tests" in output, output
    # The examples really ran: each page with code reports its own tests.
    for page in ["conventions", "laplace", "vi", "api"]:
        assert f"Document: {page}" in output, output
    total = int(re.search(r"^\s*(\d+) tests$", output, flags=re.MULTILINE).group(1))
    assert total >= 50, output


def test_api_page_documents_the_public_api_with_math(builds):
    _, _, out = builds["html"]
    api = (out / "api.html").read_text(encoding="utf-8")
    guides = "".join(
        (out / page).read_text(encoding="utf-8") for page in ("laplace.html", "vi.html", "module_laplace.html")
    )
    for name in pyro_sgmcmc.__all__:
        if getattr(pyro_sgmcmc, name).__module__.startswith("pyro_sgmcmc.guides"):
            # re-exported guides: documented once, on their own pages, and linked from the API page
            documented = re.search(rf'id="pyro_sgmcmc\.guides\.(\w+\.)?{name}"', guides)
            assert documented and re.search(rf"pyro_sgmcmc\.guides\.(\w+\.)?{name}", api), name
        else:
            assert f'id="pyro_sgmcmc.{name}"' in api, name
    for name in ["langevin_step", "underdamped_step", "nose_hoover_step"]:
        assert f'id="pyro_sgmcmc.kernels.diffusions.{name}"' in api, name
    # The update equations are rendered by MathJax, both inline and as display math.
    assert 'class="math notranslate nohighlight"' in api
    assert r"\epsilon" in api and r"\sigma^2" in api and "SGHMC" in api
    conventions = (out / "conventions.html").read_text(encoding="utf-8")
    assert r"(D + Q)" in conventions and r"\mathcal{T} = \frac{T}{N}" in conventions


def test_every_method_a_page_names_has_an_entry(builds):
    """A page that recommends a method or attribute of the package (``:meth:`` or ``:attr:``) links to
    its entry: the target's anchor is on some built page. Sphinx (not nitpicky here) renders a target
    without an entry as plain code, silently; ``AutoLaplace.fit_map`` was recommended that way."""
    _, _, out = builds["html"]
    anchors = set()
    for page in out.rglob("*.html"):
        anchors.update(re.findall(r'id="(pyro_sgmcmc\.[\w.]+)"', page.read_text(encoding="utf-8")))
    role = re.compile(r":(?:meth|attr):`(?:[^`<]*<)?[~!]?(pyro_sgmcmc\.[\w.]+?)(?:\(\))?>?`")
    named = {}
    for source in DOCS.rglob("*.rst"):
        for target in role.findall(source.read_text(encoding="utf-8")):
            named.setdefault(target, source.relative_to(DOCS).as_posix())
    assert "pyro_sgmcmc.guides.AutoLaplace.fit_map" in named  # the pattern reads the roles the pages use
    missing = {target: page for target, page in named.items() if target not in anchors}
    assert not missing, f"named on these pages without an API entry: {missing}"


def test_optional_benchmarks_page_toggled(builds):
    returncode, output, out = builds["toggled"]
    assert returncode == 0, output
    index = (out / "index.html").read_text(encoding="utf-8")
    assert ("benchmarks.html" in index) != (DOCS / "benchmarks.rst").exists()


def test_quickstart_and_tutorials_are_executed_at_build_time(builds):
    """The exec-code blocks ran in the HTML build: their printed output is in the pages."""
    _, _, out = builds["html"]
    quickstart = (out / "quickstart.html").read_text(encoding="utf-8")
    assert quickstart.count("exec-code-output") >= 4, "the quickstart's blocks printed nothing"
    # numbers that only a run produces: the sample and exact posterior lines and nested R-hat
    assert re.search(r"exact\s+1\.\d{4}\s+0\.04\d\d", quickstart), "no exact-posterior line"
    assert re.search(r"SGHMC\s+1\.\d{4}\s+0\.0\d{3}", quickstart), "no SGHMC line"
    assert re.search(r"nested R-hat 1\.\d{4}", quickstart), "no nested R-hat line"
    for page, blocks in [("tutorials/sgmcmc", 5), ("tutorials/chains", 5), ("tutorials/uncertainty", 2)]:
        html = (out / f"{page}.html").read_text(encoding="utf-8")
        assert html.count("exec-code-output") == blocks, page  # every block printed something
        assert "Traceback" not in html, page


def test_gallery_shows_every_example_figure(builds):
    _, _, out = builds["html"]
    gallery = (out / "gallery" / "index.html").read_text(encoding="utf-8")
    for name in ["cold_posterior", "continual_learning", "ood_detection", "double_well", "lora_sentiment"]:
        assert (ROOT / "examples" / f"{name}.py").exists(), name
        assert f"{name}.png" in gallery, name
        assert f'href="{name}.html"' in gallery, name
        page = (out / "gallery" / f"{name}.html").read_text(encoding="utf-8")
        assert f"{name}.png" in page, name
        assert (out / "_images" / f"{name}.png").exists(), name


def test_exec_code_directive(builds):
    """Output of a good block is shown, the setup snippet and the page namespace are shared, and a
    failing block is a warning that names its page and line (so ``-W`` fails the build)."""
    returncode, output, out = builds["exec_code"]
    assert returncode == 0, output  # no -W here: the failure must be reported, not fatal
    good = (out / "good.html").read_text(encoding="utf-8")
    assert "the answer is 42" in good and "still 42" in good, good
    # the page's text, tags stripped and entities decoded: Pygments 2.20 writes the code's quotes as
    # &quot;, 2.21 as plain quotes
    text = html.unescape(re.sub(r"<[^>]+>", "", good))
    assert '"the answer is"' in text  # the first block's code is shown (highlighted)
    assert good.count("exec-code-output") == 2
    assert '"still"' not in text  # :hide-code: the second block's code is not shown
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "bad.rst:4" in warnings[0] and "exec-code block failed" in warnings[0], output
    assert "planted failure" in output
    bad = (out / "bad.html").read_text(encoding="utf-8")
    assert "before the error" in bad and "RuntimeError: planted failure" in bad
