"""Sphinx configuration for the pyro_sgmcmc documentation.

Build the pages with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``: this also
runs the ``exec-code`` blocks of the quickstart and the tutorials (``docs/_ext/exec_code.py``) and
puts their output in the pages. Run the doctest examples (the conventions, Laplace and VI pages
and the docstrings that the API page pulls in) with
``python -m sphinx -W --keep-going -b doctest -D exec_code_run=0 docs docs/_build/doctest``.
``tests/test_docs.py`` runs both.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The package is normally installed (``pip install -e .``); this also lets a plain checkout build.
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))  # local extensions (exec_code: run the quickstart at build time)

import pyro_sgmcmc  # noqa: E402

# -- Project -----------------------------------------------------------------------------------
project = "pyro_sgmcmc"
author = "The pyro_sgmcmc developers"
copyright = "2026, The pyro_sgmcmc developers"
release = pyro_sgmcmc.__version__
version = release

# -- General -----------------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.doctest",
    "exec_code",
]
exclude_patterns = ["_build", "_ext"]
default_role = "code"  # `x` renders as inline code, never as an unresolved reference

# -- autodoc and napoleon (NumPy-style docstrings) -----------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# -- doctest -------------------------------------------------------------------------------------
# Shared by every example, those of the docstrings included: the docstrings are written to run
# inside their own modules, where the names below are already defined.
doctest_global_setup = """
import torch
import pyro
import pyro.distributions as dist
from pyro_sgmcmc import *

torch.set_num_threads(1)  # tiny tensors: one thread is fastest, and no oversubscription under load
"""

# -- exec_code (docs/_ext/exec_code.py) ----------------------------------------------------------
# Run once, hidden, before the first ``exec-code`` block of each page.
exec_code_setup = """
import torch
torch.set_num_threads(1)
"""

# -- HTML ----------------------------------------------------------------------------------------
html_theme = "alabaster"
html_theme_options = {
    "description": "Stochastic-gradient MCMC for Pyro",
    "fixed_sidebar": True,
}


# -- Pages that may or may not exist yet -----------------------------------------------------------
# Another part of the project writes these pages. Each is listed in the index's toctree when its
# file exists, so the build is clean (no "nonexisting document" warning) with or without it.
OPTIONAL_PAGES = ["benchmarks"]
OPTIONAL_PAGES_MARKER = "__optional_pages__"


def _insert_optional_pages(app, docname: str, source: list[str]) -> None:
    if docname != "index":
        return
    if OPTIONAL_PAGES_MARKER not in source[0]:
        raise RuntimeError(f"docs/index.rst must keep the {OPTIONAL_PAGES_MARKER} line in its toctree")
    present = [name for name in OPTIONAL_PAGES if (DOCS / f"{name}.rst").exists()]
    source[0] = source[0].replace(OPTIONAL_PAGES_MARKER, "\n   ".join(present))


def _reread_index(app, env, added, changed, removed) -> list[str]:
    # An optional page that appears or disappears changes the index's toctree, so an incremental
    # build must read the index again.
    return ["index"]


def setup(app) -> dict:
    app.connect("source-read", _insert_optional_pages)
    app.connect("env-get-outdated", _reread_index)
    return {"parallel_read_safe": True}
