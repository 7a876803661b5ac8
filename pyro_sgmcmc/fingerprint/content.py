"""Content digests: SHA-256 of what a value holds and of the user code it runs, never of where it lives.

A checkpoint may only be resumed by the run that wrote it, so its fingerprint must change whenever
something the draws depend on changes, and must not change between two processes that build the
same run. :class:`ContentHasher` walks a value and feeds SHA-256 a tagged, length-prefixed stream
of its content:

* ``None``, booleans, numbers, strings and bytes: their type and value (``repr``, exact for floats);
* tensors, NumPy arrays and NumPy scalars: dtype, shape and bytes (an object array: its elements);
* dicts (entries in sorted key order), lists, tuples, sets (sorted) and ``functools.partial``;
* library code (see :mod:`.libraries`): its qualified name;
* a user function: its *unit*, referred to by its ``__qualname__``. A unit's own digest (in
  :attr:`ContentHasher.units`) covers its code object (bytecode, constants, names, recursively
  through the nested code of lambdas and comprehensions; not its file or line numbers), its
  defaults, attributes and closure values, and the globals its code loads (and the attributes it
  reads of a user module), each by content; so a change is named by the function it is in;
* a user class: its bases and the entries of its ``__dict__`` (methods included);
* any other object: its class and its instance attributes (``__dict__`` and ``__slots__``). An
  object whose attributes cannot be read (none, or one of them cannot) is its ``repr`` when that
  holds no memory address; otherwise it cannot be fingerprinted: :class:`Unfingerprintable`, a
  ``TypeError`` naming where it was found.

A container or object met again in one walk (a cycle, or a shared reference) is a back reference
to its first visit, numbered in the walk's deterministic order.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import logging
from collections.abc import Mapping
from types import (
    BuiltinFunctionType,
    ClassMethodDescriptorType,
    CodeType,
    FunctionType,
    GetSetDescriptorType,
    MemberDescriptorType,
    MethodDescriptorType,
    MethodType,
    MethodWrapperType,
    ModuleType,
    WrapperDescriptorType,
)
from typing import Any, Dict, FrozenSet, List, Tuple

import numpy as np
import torch

from .libraries import is_library_file, is_library_module, module_of
from .objects import (
    global_names,
    instance_attributes,
    qualified_name,
    referenced_names,
    short_repr,
    stable_repr,
    tensor_bytes,
)

__all__ = ["MAX_DEPTH", "ContentHasher", "Unfingerprintable", "content_digest"]

_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})
_SCALAR_BASES = (int, float, complex, str, bytes)
_ATOMS = frozenset({type(None), bool, int, float})
_NAMED = (
    BuiltinFunctionType,
    MethodDescriptorType,
    WrapperDescriptorType,
    MethodWrapperType,
    ClassMethodDescriptorType,
    GetSetDescriptorType,
    MemberDescriptorType,
)
#: Entries of a class's ``__dict__`` that say where it was written, not what it does, or hold C state or a cache
#: (``copy`` and ``pickle`` add ``__slotnames__``).
_CLASS_HOUSEKEEPING = frozenset(
    {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "__firstlineno__", "__static_attributes__",
     "__annotations__", "_abc_impl", "__slotnames__"}
)  # fmt: skip
_ADVICE = (
    "a checkpointed run fingerprints everything its draws depend on, so that a resume with other inputs is "
    "refused: pass data as tensors, arrays, numbers, strings or containers of them (objects made of these are "
    "read through their attributes), or run without a checkpoint"
)

#: How deep containers and objects may nest (a deeper one is its repr, if that holds no address).
MAX_DEPTH = 64

Path = Tuple  # a linked path: () at the root, else (parent path, step)


class Unfingerprintable(TypeError):
    """A value whose content cannot be read, so that a checkpoint could not tell whether it changed."""


def content_digest(value: Any, where: str) -> str:
    """One SHA-256 of ``value`` and of every user function it reaches (their units' digests included)."""
    hasher = ContentHasher()
    digest = hashlib.sha256(hasher.digest(value, where).encode())
    for name, unit in sorted(hasher.units.items()):
        digest.update(f"|{name}={unit}".encode())
    return digest.hexdigest()


class ContentHasher:
    """Content digests of values, and of the user functions they reach (the module docstring says how).

    :meth:`digest` gives a value's SHA-256, in which each user function is referred to by its name;
    the digest of each function's own content accumulates in :attr:`units` (``{name: sha256}``), so
    that a fingerprint can store them one by one and a mismatch can name the function that changed.
    """

    def __init__(self) -> None:
        #: ``{qualified name: SHA-256 of the function's own content}`` of the user functions reached so far.
        self.units: Dict[str, str] = {}
        self._names: Dict[int, str] = {}  # id of a function -> its unit name
        self._named: List[FunctionType] = []  # the functions named, in order (alive, so their ids stay theirs)
        self._pending: List[Tuple[str, FunctionType]] = []

    def digest(self, value: Any, where: str) -> str:
        """SHA-256 of ``value``'s content; ``where`` names it in an :class:`Unfingerprintable` error."""
        walk = _Walk(self, where)
        try:
            walk.feed(value, ())
            self._digest_pending()
        except RecursionError:
            raise Unfingerprintable(f"{where} is nested too deeply to fingerprint; {_ADVICE}") from None
        return walk.sha.hexdigest()

    def unit(self, function: FunctionType) -> str:
        """The unit name of a user function: its ``__qualname__``, numbered if another function has it (not its
        module's name, which differs between a script run as ``__main__`` and the same file imported)."""
        name = self._names.get(id(function))
        if name is None:
            base, taken, number = function.__qualname__, set(self._names.values()), 2
            name = base
            while name in taken:
                name, number = f"{base} ({number})", number + 1
            self._names[id(function)] = name
            self._named.append(function)
            self._pending.append((name, function))
        return name

    def mark(self) -> int:
        """How many functions are named: :meth:`forget` undoes the naming of those after it."""
        return len(self._named)

    def forget(self, mark: int) -> None:
        """Forget the functions named since ``mark`` (their walk was abandoned)."""
        for function in self._named[mark:]:
            name = self._names.pop(id(function))
            self._pending = [(n, f) for n, f in self._pending if n != name]
        del self._named[mark:]

    def _digest_pending(self) -> None:
        while self._pending:
            name, function = self._pending.pop(0)
            walk = _Walk(self, f"the function {name}")
            walk.function(function, ())
            self.units[name] = walk.sha.hexdigest()


class _Walk:
    """One walk over a value: its SHA-256 and its back references."""

    def __init__(self, hasher: ContentHasher, root: str) -> None:
        self.hasher, self.root = hasher, root
        self.sha = hashlib.sha256()
        self.memo: Dict[int, int] = {}  # id -> visit number, of the containers and objects walked
        self.order: List[int] = []
        self.alive: List[Any] = []  # what the memo's ids belong to, kept alive for the walk
        self.depth = 0  # containers and objects entered

    def token(self, tag: str, payload: Any = b"") -> None:
        data = payload if isinstance(payload, (bytes, bytearray)) else str(payload).encode("utf-8", "surrogatepass")
        self.sha.update(b"%s:%d:" % (tag.encode(), len(data)))
        self.sha.update(data)

    def where(self, path: Path) -> str:
        steps = []
        while path:
            path, step = path
            steps.append(step)
        return self.root + "".join(reversed(steps))

    # ------------------------------------------------------------------ dispatch
    def feed(self, value: Any, path: Path, names: FrozenSet[str] = frozenset()) -> None:
        kind = type(value)
        if kind in _PLAIN:
            self.token(kind.__name__, value if kind in (str, bytes, bytearray) else repr(value))
        elif isinstance(value, torch.Tensor):
            self.tensor(value)
        elif isinstance(value, (np.ndarray, np.generic)):
            self.array(value, path)
        elif isinstance(value, logging.Logger):  # not its manager, which lists every logger of the process
            self.token("logger", value.name)
        elif isinstance(value, enum.Enum):
            self.token("enum", f"{qualified_name(kind)}.{value.name}")
        elif isinstance(value, _SCALAR_BASES):  # a subclass of a number or a string: its value
            base = next(b for b in _SCALAR_BASES if isinstance(value, b))
            self.token(f"{qualified_name(kind)}", base.__repr__(value))
        elif isinstance(value, FunctionType):
            if is_library_file(value.__code__.co_filename):
                self.token("library function", qualified_name(value))
            else:
                self.token("function", self.hasher.unit(value))
        elif isinstance(value, _NAMED):
            self.token("builtin", qualified_name(value))
            owner = getattr(value, "__self__", None)
            if owner is not None and not isinstance(owner, (ModuleType, type)):
                self.feed(owner, (path, ".__self__"))
        elif isinstance(value, tuple):
            self.sequence("tuple", value, path)
        elif isinstance(value, CodeType):
            self.code(value, path)
        elif isinstance(value, type) and is_library_module(module_of(value.__module__)):
            self.token("library class", qualified_name(value))
        elif isinstance(value, ModuleType) and (is_library_module(value) or not names):
            self.token("module", value.__name__)
        elif not self.seen(value):
            self.walk_container(value, path, names)

    def seen(self, value: Any) -> bool:
        """Whether ``value`` was walked already (then a back reference is fed); else remember it."""
        number = self.memo.get(id(value))
        if number is not None:
            self.token("ref", number)
            return True
        self.memo[id(value)] = len(self.order)
        self.order.append(id(value))
        self.alive.append(value)
        return False

    def walk_container(self, value: Any, path: Path, names: FrozenSet[str]) -> None:
        if self.depth >= MAX_DEPTH:
            raise Unfingerprintable(f"{self.where(path)} is nested more than {MAX_DEPTH} deep; {_ADVICE}")
        self.depth += 1
        try:
            self.enter(value, path, names)
        finally:
            self.depth -= 1

    def enter(self, value: Any, path: Path, names: FrozenSet[str]) -> None:
        if isinstance(value, Mapping):
            self.mapping(list(value.items()), path)
        elif isinstance(value, list):
            self.sequence("list", value, path)
        elif isinstance(value, (set, frozenset)):
            self.token("set", len(value))
            for _, item in sorted(((self.alone(v), v) for v in value), key=lambda entry: entry[0]):
                self.feed(item, (path, "{...}"))
        elif isinstance(value, functools.partial):
            self.token("partial")
            self.feed(value.func, (path, ".func"))
            self.feed(value.args, (path, ".args"))
            self.feed(value.keywords, (path, ".keywords"))
        elif isinstance(value, MethodType):
            self.token("method")
            self.feed(value.__func__, (path, ".__func__"))
            self.feed(value.__self__, (path, ".__self__"))
        elif isinstance(value, (staticmethod, classmethod)):
            self.token(type(value).__name__)
            self.feed(value.__func__, (path, ".__func__"))
        elif isinstance(value, property):
            self.token("property")
            for part in ("fget", "fset", "fdel"):
                self.feed(getattr(value, part), (path, f".{part}"))
        elif isinstance(value, ModuleType):  # a user module, reached from code that reads ``names`` of it
            self.token("user module", value.__name__)
            for name in sorted(names):
                if name in vars(value):
                    self.token("attribute", name)
                    self.feed(vars(value)[name], (path, f".{name}"), names)
        elif isinstance(value, type):
            self.user_class(value, path)
        else:
            self.instance(value, path)

    # ------------------------------------------------------------------ leaves
    def tensor(self, value: torch.Tensor) -> None:
        self.token("tensor", f"{value.dtype} {tuple(value.shape)}")
        if value.numel():
            self.sha.update(tensor_bytes(value))

    def array(self, value: Any, path: Path) -> None:
        array = np.asarray(value)
        header = f"{'scalar' if isinstance(value, np.generic) else 'array'} {array.dtype.str} {array.dtype.descr} "
        if array.dtype.hasobject:
            self.token("object array", f"{header}{array.shape}")
            for i, item in enumerate(array.reshape(-1)):
                self.feed(item, (path, f".flat[{i}]"))
            return
        array = np.ascontiguousarray(array)
        self.token("numpy", f"{header}{array.shape}")
        if array.size:
            self.sha.update(array.reshape(-1).view(np.uint8))

    def sequence(self, kind: str, items: Any, path: Path) -> None:
        self.token(kind, len(items))
        if all(type(item) in _ATOMS for item in items):  # numbers in bulk: one token (about 3x faster)
            self.token("atoms", "\x1f".join([f"{type(item).__name__} {item!r}" for item in items]))
            return
        for i, item in enumerate(items):
            self.feed(item, (path, f"[{i}]"))

    def alone(self, value: Any) -> str:
        """The digest of ``value`` in a walk of its own (an order for sets and keys, the same in every process)."""
        walk = _Walk(self.hasher, self.root)
        walk.feed(value, ())
        return walk.sha.hexdigest()

    def mapping(self, items: list, path: Path) -> None:
        self.token("mapping", len(items))
        if all(type(key) is str for key, _ in items):
            ordered = sorted(items, key=lambda item: item[0])
        else:
            ordered = [item for _, item in sorted(((self.alone(k), (k, v)) for k, v in items), key=lambda e: e[0])]
        for key, value in ordered:
            step = f"[{json.dumps(key)}]" if isinstance(key, str) else f"[{key!r}]"
            self.feed(key, (path, f"{step} (key)"))
            self.feed(value, (path, step))

    # ------------------------------------------------------------------ code
    def code(self, code: CodeType, path: Path) -> None:
        self.token("code", f"{code.co_argcount} {code.co_posonlyargcount} {code.co_kwonlyargcount} {code.co_flags}")
        self.token("bytecode", code.co_code)
        for field in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
            self.token(field, "\0".join(getattr(code, field)))
        self.token("constants", len(code.co_consts))
        for constant in code.co_consts:
            self.feed(constant, (path, " (a constant)"))

    def function(self, function: FunctionType, path: Path) -> None:
        """A user function's own content (its unit): code, defaults, attributes, closure values, globals read."""
        code = function.__code__
        self.code(code, path)
        self.feed(function.__defaults__, (path, " (its defaults)"))
        self.feed(function.__kwdefaults__, (path, " (its keyword defaults)"))
        self.feed(dict(vars(function)), (path, " (its attributes)"))
        for name, cell in zip(code.co_freevars, function.__closure__ or ()):
            self.token("closure", name)
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                self.token("empty cell")
                continue
            self.feed(contents, (path, f" (closure variable {name!r})"))
        names, namespace = referenced_names(code), function.__globals__
        for name in sorted(global_names(code) & namespace.keys()):  # a user module: the attributes named in code
            self.token("global", name)
            self.feed(namespace[name], (path, f" (global {name!r})"), names)

    def user_class(self, cls: type, path: Path) -> None:
        self.token("class", cls.__qualname__)  # not its module's name (``__main__`` when run as a script)
        self.feed(type(cls), (path, ".__class__"))
        self.feed(cls.__bases__, (path, ".__bases__"))
        namespace = vars(cls)
        for name in sorted(n for n in namespace if n not in _CLASS_HOUSEKEEPING):
            self.token("entry", name)
            self.feed(namespace[name], (path, f".{name}"))

    # ------------------------------------------------------------------ other objects
    def instance(self, value: Any, path: Path) -> None:
        attributes = instance_attributes(value)
        if attributes is not None:
            sha, mark, named = self.sha.copy(), len(self.order), self.hasher.mark()
            try:
                self.token("object")
                self.feed(type(value), (path, ".__class__"))
                for name in sorted(attributes):
                    self.token("attribute", name)
                    self.feed(attributes[name], (path, f".{name}"))
                return
            except Unfingerprintable:
                if stable_repr(value) is None:
                    raise
                self.sha = sha  # forget the attempt: the object is its repr
                for key in self.order[mark:]:
                    del self.memo[key]
                del self.order[mark:]
                self.hasher.forget(named)
        text = stable_repr(value)
        if text is None:
            raise Unfingerprintable(
                f"{self.where(path)} is a {qualified_name(type(value))} whose content cannot be read: it has no "
                f"attributes (__dict__ or __slots__) and its repr holds a memory address ({short_repr(value)}); "
                f"{_ADVICE}"
            )
        self.token("repr", f"{qualified_name(type(value))} {text}")
