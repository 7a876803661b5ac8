"""The shape of the package, as docs/architecture.rst promises it.

* every module has one job and at most 400 lines;
* a module reads another object's private member (``obj._name`` with ``obj`` not ``self``, ``cls`` or
  ``super()``), or imports a private name from another package, only inside :mod:`pyro_sgmcmc._compat`, and
  there at most six times;
* nothing assigns to an attribute of an imported module (a process-wide patch) and nothing sets the C
  allocator (``mallopt``);
* ``ruff check`` is clean.

The checks read the source with :mod:`ast`, so docstrings and comments that name a private member do not
count; each failure names the file and line.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyro_sgmcmc"
COMPAT = PACKAGE / "_compat.py"
MAX_LINES = 400
MAX_COMPAT_PRIVATE_READS = 6


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _label(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reads(source: str, label: str) -> list[str]:
    """``label:line obj._name`` for every read of another object's private member in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0:  # from torch.x import _private
            found += [f"{label}:{node.lineno} {node.module}.{a.name}" for a in node.names if _is_private(a.name)]
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        found.append(f"{label}:{node.lineno} {ast.unparse(node)}")
    return found


def _patches(source: str, label: str) -> list[str]:
    """Assignments to (or ``setattr`` on) an attribute of an imported module, and ``mallopt``."""
    tree = ast.parse(source)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    found = [
        f"{label}:{node.lineno} mallopt"
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id == "mallopt")
        or (isinstance(node, ast.Attribute) and node.attr == "mallopt")
        or (isinstance(node, ast.Constant) and node.value == "mallopt")  # getattr(libc, "mallopt")
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            targets = node.args[:1]
            if targets and isinstance(targets[0], ast.Name) and targets[0].id in modules:
                found.append(f"{label}:{node.lineno} setattr({targets[0].id}, ...)")
                continue
        else:
            continue
        for target in targets:
            base = target
            while isinstance(base, ast.Attribute):
                base = base.value
            if base is not target and isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{label}:{node.lineno} {ast.unparse(target)}")
    return found


def test_no_module_is_over_400_lines():
    long = [f"{_label(p)}: {n}" for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_private_members_of_other_objects_are_read_only_in_compat():
    outside = [read for p in _modules() if p != COMPAT for read in _private_reads(p.read_text(), _label(p))]
    assert not outside, f"private reads outside pyro_sgmcmc/_compat.py: {outside}"
    inside = _private_reads(COMPAT.read_text(), _label(COMPAT))
    assert len(inside) <= MAX_COMPAT_PRIVATE_READS, f"{len(inside)} private reads in _compat.py: {inside}"


def test_nothing_patches_another_module_or_the_allocator():
    found = [patch for p in _modules() for patch in _patches(p.read_text(), _label(p))]
    assert not found, f"process-wide patches: {found}"


def test_the_checks_find_what_they_should():
    """The checkers themselves, on a sample: reads through another object count, ``self``/``super()`` and
    dunders do not; patches of an imported module count, local attributes do not."""
    reads = (
        "from pyro.poutine.subsample_messenger import _Subsample, SubsampleMessenger\nfrom ._own import _mine\n"
        "class A(B):\n    def f(self, o):\n        return self._x + o._y + super()._z + o.p._q + o.__len__()\n"
    )
    found = sorted(r.split(" ", 1)[1] for r in _private_reads(reads, "s"))
    assert found == ["o._y", "o.p._q", "pyro.poutine.subsample_messenger._Subsample"]
    patches = (
        "import pyro.ops.stats\nimport torch as t\nimport ctypes\nsetattr(t, 'x', 1)\n"
        "pyro.ops.stats._cummin = None\nclass C:\n    pass\nc = C()\nc.attr = 1\n"
        "libc = ctypes.CDLL(None)\nlibc.mallopt(-3, 1)\n'a comment string may name mallopt'\n"
    )
    found = sorted(p.split(" ", 1)[1] for p in _patches(patches, "s"))
    assert found == ["mallopt", "pyro.ops.stats._cummin", "setattr(t, ...)"]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the [test] extra")
def test_ruff_check_is_clean():
    result = subprocess.run(
        [shutil.which("ruff") or "ruff", "check", "pyro_sgmcmc", "tests", "benchmarks", "examples", "docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
