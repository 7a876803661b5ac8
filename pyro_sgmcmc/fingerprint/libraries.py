"""Which code is the user's and which a library's, by the location of its file.

A run's fingerprint follows the user's code (the model, the functions and classes it calls) into
its bytecode and constants, and stops at library code, which it names: a library changes with its
installed version, not with the run. Library code is code whose file lies under the standard
library, a ``site-packages`` or ``dist-packages`` directory (of any environment), or this package;
frozen modules (``<frozen ...>``) and modules without a file (built into the interpreter) are
libraries too. Code compiled from a string, typed at the prompt or run in a notebook cell
(``<stdin>``, ``<string>``, a notebook's temporary file) is the user's.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Optional, Tuple

__all__ = ["is_library_file", "is_library_module"]

_PACKAGE_DIRECTORIES = frozenset({"site-packages", "dist-packages"})


@functools.lru_cache(maxsize=None)
def _library_roots() -> Tuple[str, ...]:
    """The directories whose files are library code (each ending with a separator)."""
    paths = {sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(getattr(site, "getsitepackages", lambda: [])())
    paths.add(getattr(site, "getusersitepackages", lambda: None)())
    paths.add(str(Path(__file__).resolve().parents[1]))  # pyro_sgmcmc itself
    return tuple(sorted(os.path.join(os.path.realpath(p), "") for p in paths if p))


@functools.lru_cache(maxsize=4096)
def is_library_file(filename: str) -> bool:
    """Whether the code of ``filename`` (a code object's ``co_filename``) is a library's (module docstring)."""
    if filename.startswith("<"):
        return filename.startswith("<frozen")
    real = os.path.realpath(filename)
    return real.startswith(_library_roots()) or not _PACKAGE_DIRECTORIES.isdisjoint(Path(real).parts)


def is_library_module(module: Optional[ModuleType]) -> bool:
    """Whether ``module`` is a library's: one without a file (built in) is, except ``__main__`` (a notebook)."""
    if module is None:
        return True
    filename = getattr(module, "__file__", None)
    if not isinstance(filename, str):
        return module.__name__ != "__main__"
    return is_library_file(filename)


def module_of(name: Optional[str]) -> Optional[ModuleType]:
    """The imported module called ``name`` (``None`` if there is none)."""
    return sys.modules.get(name) if isinstance(name, str) else None
