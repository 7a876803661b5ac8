"""One vectorised evaluation recorded as the list of ATen operators it ran, and replayed without Python, Pyro or vmap.

Running the model under two nested :func:`torch.func.vmap` pays, at every call, for Pyro's handlers, the
model's Python and vmap's batching rules; on the logistic regression of ``benchmarks/loglik_export.py`` this
was more than half of the export's time. The operators that reach the kernels are the same at every call of
the same block shape: :func:`record` runs the call once under a dispatch mode
(:class:`torch.utils._python_dispatch.TorchDispatchMode`) that sits below vmap, so that it sees the plain
operators vmap's rules emit, and writes them down as a :class:`Program`: ``(operator, arguments)`` steps whose
tensor arguments are the call's inputs, earlier steps' outputs, or constants (the data, read where they lie,
never copied). :meth:`Program.compiled` records the replay once more with :func:`torch.jit.trace`, which runs
the steps from C++; measured on that regression (blocks of 64 draws x 2,000 data, float32, one thread,
2026-11-27): 5.4 ns a value against 10.2 for the Python replay and 10.1 for the model under vmap, and no page
fault per call against 72 for the Python replay, whose freed intermediates the C allocator hands back.

A recording is refused (``None``, with the reason) when a replay could differ from a new run of the model:

* an operator that draws random numbers (``nondeterministic_seeded``);
* an operator whose result's shape or a Python value depends on the call's inputs, directly or through a
  tensor an input was written into (``dynamic_output_shape``, ``data_dependent_output``: ``x[mask]``,
  ``nonzero``, ``.item()``; integer indexing, and reads of constants, are replayed as recorded);
* an operator that writes into a constant or a view of one (``inplace``, ``out``), or one from outside ATen (a
  custom operator, whose side effects are unknown);
* an output that no recorded operator made.

Python branches on the inputs' values are not seen by the recorder, but vmap refuses them (a batched tensor
cannot be read to the host), so the call being recorded could not have taken one. A model whose values change
between calls for another reason (a global it mutates) is what the last check is for: :class:`ReplayedCalls`
evaluates a second block both ways and trusts a replay only if the two agree bit for bit.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .._compat import EagerDispatchMode

__all__ = ["Program", "ReplayedCalls", "record"]

#: runs of a compiled replay compared with the model before it is trusted
COMPILED_CHECKS = 3

_REFUSED_TAGS = {
    torch.Tag.nondeterministic_seeded: "draws random numbers",
    torch.Tag.dynamic_output_shape: "has an output shape that depends on the values",
    torch.Tag.data_dependent_output: "reads a value to Python",
}


@dataclass(frozen=True)
class _Slot:
    """A tensor made during the call (or one of its inputs): ``index`` in the replay's list of values."""

    index: int


@dataclass(frozen=True)
class _Constant:
    """A tensor that existed before the call and is only read: ``index`` in :attr:`Program.constants`."""

    index: int


@dataclass(frozen=True)
class _Step:
    operator: Any  # a torch.ops OpOverload
    args: tuple
    kwargs: dict
    outputs: Tuple[Optional[int], ...]  # the slot of each returned tensor (None: not a tensor)
    frees: Tuple[int, ...]  # slots read for the last time by this step


class Program:
    """The recorded operators of one call: ``program(*inputs) -> outputs`` replays them on new inputs of the
    recorded shapes, dtypes and strides (the inputs must not be views with an offset: a recorded
    ``as_strided`` addresses its storage from the start)."""

    def __init__(self, steps: List[_Step], constants: List[torch.Tensor], num_inputs: int, outputs, num_slots: int):
        self.steps, self.constants, self.num_inputs = steps, constants, num_inputs
        self.outputs, self.num_slots = outputs, num_slots

    def __call__(self, *inputs: torch.Tensor):
        values: List[Optional[torch.Tensor]] = [None] * self.num_slots
        values[: self.num_inputs] = inputs
        constants = self.constants

        def read(a):
            if isinstance(a, _Slot):
                return values[a.index]
            if isinstance(a, _Constant):
                return constants[a.index]
            if isinstance(a, (list, tuple)):
                return type(a)(read(b) for b in a)
            return a

        for step in self.steps:
            result = step.operator(*read(step.args), **{k: read(v) for k, v in step.kwargs.items()})
            results = result if isinstance(result, (tuple, list)) else (result,)
            for slot, value in zip(step.outputs, results):
                if slot is not None:
                    values[slot] = value
            for slot in step.frees:  # the intermediates die as soon as they are no longer read
                values[slot] = None
        return _rebuild(self.outputs, lambda s: values[s.index] if isinstance(s, _Slot) else constants[s.index])

    def compiled(self, *example: torch.Tensor) -> Optional[Callable]:
        """The replay recorded by :func:`torch.jit.trace` at ``example`` inputs (``None`` if tracing fails)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                # torch (2.13 here) marks torch.jit.trace deprecated; if it is removed, the replay stays in Python
                warnings.filterwarnings("ignore", message=".*torch.jit.trace.*deprecated", category=DeprecationWarning)

                def replay(*inputs):
                    return self(*inputs)

                return torch.jit.trace(replay, example, check_trace=False, strict=False)
        except Exception:  # any tracing failure: the Python replay does the same work
            return None


def record(fn: Callable, *inputs: torch.Tensor) -> Tuple[Any, Optional[Program], Optional[str]]:
    """Run ``fn(*inputs)`` and record it: ``(its result, the Program or None, why not)``.

    ``fn`` returns a tensor or a dict/list/tuple of tensors; ``inputs`` are plain tensors."""
    recorder = _Recorder(inputs)
    with recorder:
        result = fn(*inputs)
    if recorder.refused is not None:
        return result, None, recorder.refused
    try:
        outputs = _rebuild(result, recorder.reference_output)
    except LookupError:
        return result, None, "an output was not made by a recorded operator"
    return result, recorder.program(outputs), None


class ReplayedCalls:
    """``evaluate(positions, rows)`` (a block of draws ``(D, dim)``, ``{plate: indices}``), recorded once per
    shape of block and replayed (:func:`record`).

    For each shape of block: the first call runs ``evaluate`` and records its operators; the second runs it
    again and the replay too, and keeps the replay only if the two agree bit for bit (they run the same
    operators on the same values); later calls replay. A block whose recording is refused, or whose replay
    disagrees, is evaluated by ``evaluate`` as before. The inputs are copied before a replay (a few kB): the
    recorded operators address their storage from offset 0."""

    def __init__(self, evaluate: Callable) -> None:
        self.evaluate = evaluate
        self.replays: Dict[tuple, Optional[Callable]] = {}  # block shape -> replay; None: evaluated as before
        self.why_not: Dict[tuple, str] = {}

    def __call__(self, positions: torch.Tensor, rows: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        names = list(rows)
        inputs = [positions.clone(memory_format=torch.contiguous_format)]
        inputs += [rows[name].clone(memory_format=torch.contiguous_format) for name in names]
        shape = tuple((t.shape, t.dtype, t.device) for t in inputs)

        def run(block, *indices):
            return self.evaluate(block, dict(zip(names, indices)))

        if shape not in self.replays:  # first block of this shape: recorded
            result, program, why = record(run, *inputs)
            self.replays[shape] = program
            if program is None:
                self.why_not[shape] = why
            return result
        replay = self.replays[shape]
        if replay is None:
            return run(*inputs)
        if isinstance(replay, Program):  # second block: checked against the model, then trusted
            expected = run(*inputs)
            self.replays[shape] = _trusted(replay, inputs, expected)
            if self.replays[shape] is None:
                self.why_not[shape] = "its replay disagreed with the model"
            return expected
        return replay(*inputs)


def _trusted(program: Program, inputs: List[torch.Tensor], expected: Dict[str, torch.Tensor]) -> Optional[Callable]:
    """The fastest replay of ``program`` that gives ``expected`` at ``inputs`` bit for bit: compiled by
    :func:`torch.jit.trace`, else in Python; ``None`` if neither does. The compiled one is run
    :data:`COMPILED_CHECKS` times (TorchScript optimises a graph after its first runs)."""
    compiled = program.compiled(*inputs)
    if compiled is not None and all(_equal(compiled(*inputs), expected) for _ in range(COMPILED_CHECKS)):
        return compiled
    return program if _equal(program(*inputs), expected) else None


def _equal(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> bool:
    return set(got) == set(expected) and all(
        got[k].shape == expected[k].shape and got[k].dtype == expected[k].dtype
        and bool(torch.eq(got[k], expected[k]).logical_or_(got[k].isnan() & expected[k].isnan()).all())
        for k in expected
    )  # fmt: skip


class _Recorder(EagerDispatchMode):
    def __init__(self, inputs: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.slots: Dict[int, int] = {}
        self.alive: List[torch.Tensor] = []  # held while recording, so that no id is reused
        self.constants: List[torch.Tensor] = []
        self.constant_ids: Dict[int, int] = {}
        self.steps: List[Tuple[Any, tuple, dict, tuple]] = []
        self.refused: Optional[str] = None
        self.constant_views: set = set()
        self.root: Dict[int, int] = {}  # slot -> the slot whose memory it aliases (itself if none)
        self.dependent: set = set()  # roots whose values depend on the call's inputs
        for tensor in inputs:
            self.dependent.add(self._new_slot(tensor))
        self.num_inputs = len(inputs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self.refused is None:
            try:
                self._write(func, args, kwargs, result)
            except _Refused as why:
                self.refused = f"{func.__name__} {why}"
        return result

    def _write(self, func, args, kwargs, result) -> None:
        if func.namespace not in ("aten", "prims"):
            raise _Refused("is not an ATen operator")
        args_ref, kwargs_ref = self._reference(args), {k: self._reference(v) for k, v in kwargs.items()}
        read = [r for r in _leaves((args_ref, kwargs_ref)) if isinstance(r, _Slot)]
        depends = any(self.root[r.index] in self.dependent for r in read)  # on the call's inputs
        for tag, what in _REFUSED_TAGS.items():
            if tag in func.tags and (tag is torch.Tag.nondeterministic_seeded or depends):
                if not (tag is torch.Tag.dynamic_output_shape and _integer_indexing(func, args)):
                    raise _Refused(what)
        written = ()
        if torch.Tag.out in func.tags:
            written = tuple(_leaves(kwargs_ref))
        elif torch.Tag.inplace in func.tags or torch.Tag.inplace_view in func.tags:
            written = args_ref[:1]
        if any(self._read_only(w) for w in written):
            raise _Refused("writes into a tensor that existed before the call")
        results = result if isinstance(result, (tuple, list)) else (result,)
        outputs = [self._slot_of(r) for r in results if isinstance(r, torch.Tensor)]
        base = args_ref[0] if args_ref else None
        for slot in outputs if func.is_view else ():
            if isinstance(base, _Slot):  # an alias shares its base's memory, hence its dependence on the inputs
                self.root[slot] = self.root[base.index]
            if self._read_only(base):  # a view of a constant: read only too
                self.constant_views.add(slot)
        if depends:  # what an operator writes or makes from the inputs depends on them, and so do its aliases
            self.dependent.update(self.root[w.index] for w in (*written, *map(_Slot, outputs)) if isinstance(w, _Slot))
        self.steps.append((func, args_ref, kwargs_ref, tuple(self._slot_of(r) if isinstance(r, torch.Tensor) else None
                                                             for r in results)))  # fmt: skip

    def _reference(self, a):
        """``a`` with each tensor replaced by its :class:`_Slot`, or a new or known :class:`_Constant`."""
        if isinstance(a, torch.Tensor):
            if id(a) in self.slots:
                return _Slot(self.slots[id(a)])
            if id(a) not in self.constant_ids:
                self.constant_ids[id(a)] = len(self.constants)
                self.constants.append(a)
            return _Constant(self.constant_ids[id(a)])
        if isinstance(a, (list, tuple)):
            return type(a)(self._reference(b) for b in a)
        return a

    def _read_only(self, reference) -> bool:
        if isinstance(reference, _Slot):
            return reference.index in self.constant_views
        return isinstance(reference, _Constant)

    def _slot_of(self, tensor: torch.Tensor) -> int:
        return self.slots[id(tensor)] if id(tensor) in self.slots else self._new_slot(tensor)

    def _new_slot(self, tensor: torch.Tensor) -> int:
        slot = self.slots[id(tensor)] = len(self.alive)
        self.root[slot] = slot
        self.alive.append(tensor)
        return slot

    def reference_output(self, tensor: torch.Tensor):
        if id(tensor) in self.slots:
            return _Slot(self.slots[id(tensor)])
        if id(tensor) in self.constant_ids:
            return _Constant(self.constant_ids[id(tensor)])
        raise LookupError("unrecorded output")

    def program(self, outputs) -> Program:
        kept = {s.index for s in _leaves(outputs) if isinstance(s, _Slot)}
        last_read: Dict[int, int] = {}
        for position, (_, args, kwargs, _) in enumerate(self.steps):
            for ref in _leaves((args, kwargs)):
                if isinstance(ref, _Slot):
                    last_read[ref.index] = position
        frees: Dict[int, List[int]] = {}
        for slot, position in last_read.items():
            if slot not in kept and slot >= self.num_inputs:
                frees.setdefault(position, []).append(slot)
        steps = [_Step(func, args, kwargs, outputs_, tuple(frees.get(position, ())))
                 for position, (func, args, kwargs, outputs_) in enumerate(self.steps)]  # fmt: skip
        return Program(steps, self.constants, self.num_inputs, outputs, len(self.alive))


class _Refused(Exception):
    pass


def _integer_indexing(func, args) -> bool:
    """``x[i]`` with integer index tensors: its output shape is the indices', whatever their values (only a
    boolean mask, ``x[mask]``, gives a shape that depends on the values)."""
    if func.__name__.split(".")[0] not in ("index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_"):
        return False
    indices = args[1] if len(args) > 1 else ()
    return all(i is None or not (i.dtype == torch.bool or i.dtype == torch.uint8) for i in indices)


def _leaves(tree):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _leaves(value)
    else:
        yield tree


def _rebuild(tree, leaf: Callable):
    """``tree`` (a tensor, or a dict/list/tuple of them) with each tensor or reference replaced by ``leaf(it)``."""
    if isinstance(tree, dict):
        return {key: _rebuild(value, leaf) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rebuild(value, leaf) for value in tree)
    return leaf(tree)
