"""The shape of the package, as docs/architecture.rst promises it.

* every module has one job and at most 400 lines;
* a module reads another object's private member (``obj._name`` with ``obj`` not ``self``, ``cls`` or
  ``super()``), or imports a private name from another package, only inside :mod:`pyro_sgmcmc._compat`, and
  there at most nine times;
* a class reaches a private member that a base class from another package defines (``self._name``,
  ``cls._name`` or ``super()._name``, read or written, where a torch or Pyro base class of it defines or
  assigns ``_name``) only inside :mod:`pyro_sgmcmc._compat`: a subclass of ``pyro.infer.MCMC`` filling its
  ``_samples``, or a guide writing ``AutoContinuous``'s ``_unconstrained_shapes``, is the same coupling as a
  read through another object;
* every module :doc:`docs/architecture.rst <../docs/architecture>` names exists;
* nothing assigns to an attribute of an imported module (a process-wide patch) and nothing sets the C
  allocator (``mallopt``);
* ``ruff check`` is clean.

The checks read the source with :mod:`ast`, so docstrings and comments that name a private member do not
count; each failure names the file and line.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import shutil
import subprocess
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyro_sgmcmc"
COMPAT = PACKAGE / "_compat.py"
MAX_LINES = 400
MAX_COMPAT_PRIVATE_READS = 9
ARCHITECTURE_PAGE = ROOT / "docs" / "architecture.rst"


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


def _is_own(cls) -> bool:
    return (getattr(cls, "__module__", "") or "").split(".")[0] in ("pyro_sgmcmc", "builtins", "tests", "__main__")


@functools.lru_cache(maxsize=None)
def _privates_defined_by(base) -> frozenset:
    """The private names ``base`` itself defines: its attributes and methods, and what its source reads or assigns
    through ``self`` (``self._x``, ``super().__setattr__("_x", ...)``, ``setattr(self, "_x", ...)``)."""
    names = {name for name in vars(base) if _is_private(name)}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
    except (OSError, TypeError, SyntaxError):  # a class without Python source (C extension)
        return frozenset(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if called in ("__setattr__", "setattr"):
                names.update(
                    arg.value for arg in node.args[:2]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _is_private(arg.value)
                )  # fmt: skip
    return frozenset(names)


def _foreign_privates(cls) -> dict:
    """``{name: base}``: the private names that a base class of ``cls`` from another package defines."""
    found = {}
    for base in reversed(cls.__mro__):
        if not _is_own(base):
            found.update(dict.fromkeys(_privates_defined_by(base), base))
    return found


def _base_private_reaches(source: str, label: str, namespace: dict) -> list[str]:
    """``label:line self._name (Base)`` for every reach through ``self``/``cls``/``super()`` into a private
    member defined by another package's base class of the enclosing class (looked up by name in ``namespace``,
    the module's globals)."""
    found = []
    for class_node in ast.walk(ast.parse(source)):
        cls = namespace.get(class_node.name) if isinstance(class_node, ast.ClassDef) else None
        if not inspect.isclass(cls):
            continue
        foreign = _foreign_privates(cls)
        for node in ast.walk(class_node):
            if not (isinstance(node, ast.Attribute) and node.attr in foreign):
                continue
            owner = node.value
            through_self = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
            through_super = (
                isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super"
            )
            if through_self or through_super:
                base = foreign[node.attr]
                found.append(f"{label}:{node.lineno} {ast.unparse(node)} ({base.__module__}.{base.__qualname__})")
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def test_private_members_of_foreign_base_classes_are_reached_only_in_compat():
    found = []
    for path in _modules():
        if path != COMPAT:
            with warnings.catch_warnings():  # the deprecated aliases (pyro_sgmcmc.inference_data, ...) warn
                warnings.simplefilter("ignore", FutureWarning)
                namespace = vars(importlib.import_module(_module_name(path)))
            found += _base_private_reaches(path.read_text(), _label(path), namespace)
    assert not found, f"reaches into private members of torch/Pyro base classes outside pyro_sgmcmc/_compat.py: {found}"


def _named_modules(text: str) -> list[str]:
    """The ``pyro_sgmcmc.xxx`` names and ``pyro_sgmcmc/xxx.py`` paths of a page, as dotted names."""
    dotted = re.findall(r"\bpyro_sgmcmc(?:\.[A-Za-z_][A-Za-z0-9_]*)+", text)
    paths = re.findall(r"\bpyro_sgmcmc(?:/[A-Za-z_][A-Za-z0-9_]*)+\.py\b", text)
    return sorted(set(dotted) | {path[: -len(".py")].replace("/", ".") for path in paths})


def _exists(dotted: str) -> bool:
    """Is ``dotted`` a module of the package, or an attribute (class, function) of one?"""
    parts = dotted.split(".")
    for stop in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:stop]))
        except ModuleNotFoundError:
            continue
        for name in parts[stop:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_architecture_page_names_existing_modules():
    named = _named_modules(ARCHITECTURE_PAGE.read_text())
    assert len(named) >= 10, f"the page names too few modules to check ({named}): did the pattern break?"
    missing = [name for name in named if not _exists(name)]
    assert not missing, f"docs/architecture.rst names modules that do not exist: {missing}"


def test_nothing_patches_another_module_or_the_allocator():
    found = [patch for p in _modules() for patch in _patches(p.read_text(), _label(p))]
    assert not found, f"process-wide patches: {found}"


def test_the_checks_find_what_they_should():
    """The checkers themselves, on samples: reads through another object count, ``self``/``super()`` and
    dunders do not; patches of an imported module count, local attributes do not; reaches into a foreign base
    class's private members count; the architecture page's module names are found and resolved."""
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
    # Reaches through self/super() into a torch/Pyro base class's private members count, read or written
    # (_samples is assigned in pyro.infer.MCMC.__init__, _set_transforms is a method of its base that it calls,
    # _unconstrained_shapes is assigned in AutoContinuous._setup_prototype, _buffers through
    # super().__setattr__ in torch.nn.Module.__init__); the class's own private members, public members, and
    # the same names in a class without such a base do not.
    snippet = textwrap.dedent('''
        import pyro.infer
        from pyro.infer.autoguide import AutoContinuous

        class Run(pyro.infer.MCMC):
            def __init__(self):
                self._samples = None
                self._mine = 1

            def read(self):
                return self._diagnostics, super()._set_transforms, self._mine, self.kernel

        class Guide(AutoContinuous):
            def layout(self):
                return self._unconstrained_shapes, "precision" in self._buffers

        class Plain:
            def __init__(self):
                self._samples = None
    ''')
    namespace = {}
    exec(compile(snippet, "snippet", "exec"), namespace)
    found = sorted(entry.split(" ", 1)[1] for entry in _base_private_reaches(snippet, "s", namespace))
    assert found == [
        "self._buffers (torch.nn.modules.module.Module)",
        "self._diagnostics (pyro.infer.mcmc.api.MCMC)",
        "self._samples (pyro.infer.mcmc.api.MCMC)",
        "self._unconstrained_shapes (pyro.infer.autoguide.guides.AutoContinuous)",
        "super()._set_transforms (pyro.infer.mcmc.api.MCMC)",
    ], found
    named = _named_modules("see :mod:`~pyro_sgmcmc.model.trace`, pyro_sgmcmc/draws.py and pyro_sgmcmc.MCMC.run")
    assert named == ["pyro_sgmcmc.MCMC.run", "pyro_sgmcmc.draws", "pyro_sgmcmc.model.trace"]
    assert _exists("pyro_sgmcmc.MCMC.get_samples") and _exists("pyro_sgmcmc.run.readers")
    assert not _exists("pyro_sgmcmc.no_such_module") and not _exists("pyro_sgmcmc.MCMC.no_such_method")


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the [test] extra")
def test_ruff_check_is_clean():
    result = subprocess.run(
        [shutil.which("ruff") or "ruff", "check", "pyro_sgmcmc", "tests", "benchmarks", "examples", "docs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
