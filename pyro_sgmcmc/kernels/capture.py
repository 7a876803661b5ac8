"""The sampling step recorded once and replayed: ``cuda_graph=True``.

After warmup a step is the pure function :func:`~pyro_sgmcmc.kernels.step.sampling_step` of the state, the
step's minibatch indices and its noise, with static shapes and no value read back to the host. On a GPU its
cost is then mostly the host's: Python, Pyro's handlers and one kernel launch per operator (a few
microseconds each, some hundred per step), while the device works for a fraction of that. A CUDA graph
(:class:`torch.cuda.CUDAGraph`) records the step's kernels once and replays them with one launch.

What is recorded. The step reads its inputs from *static* tensors (the state's fields, the step counter, the
minibatch indices of each subsampled plate and, for a schedule, the step size) and writes the new state back
into them at its end, so a replay advances the chain in place. Before a replay the host copies in only what
the graph cannot know: the step's indices (drawn by the kernel's
:class:`~pyro_sgmcmc.chains.minibatch.MinibatchSampler`, as without capture) and the scheduled step size; the
noise is the keyed Philox draw of the step counter on the device (:mod:`~pyro_sgmcmc.chains.philox`), so
chain ``c``'s noise is the same function of ``(seed, c, step)`` as without capture. After the replay the new
state is copied out (a state a caller keeps is never overwritten by the next replay).

What must hold of the model. A replay repeats the kernels that one evaluation of the model launched: the model
must do the same operations at every step (no Python branch on a value, no random draw of its own, no value
read to the host), as for ``jit_compile``. Pyro's validation (which reads values to the host) is off while the
step is recorded; it was on for the warmup's steps. Whether a model qualifies is checked, not assumed: the
first recorded step is compared with the same step taken eagerly, and a model that cannot be recorded or whose
replay differs runs eagerly, with a warning that says why (:class:`CaptureFallback`).

Without a CUDA device the same static-buffer step runs eagerly (``replay`` is a call), so the logic is tested on
the CPU; the speed-up needs a GPU.
"""

from __future__ import annotations

import contextlib
import numbers
import warnings
from typing import Callable, Dict, Mapping, Optional, Tuple

import pyro
import torch
from torch.overrides import TorchFunctionMode

from .._compat import EagerDispatchMode
from ..model.priors import trusted_prior_constants
from .state import SGMCMCState
from .step import Dynamics, SamplingParameters, StepInfo, propose, settle

__all__ = ["CaptureFallback", "CapturedStep"]

#: Run the static-buffer step eagerly when the chains are not on a CUDA device (for tests of its logic on the CPU;
#: otherwise ``cuda_graph=True`` warns there and steps as usual).
STATIC_STEP_ON_CPU = False
#: Eager steps on a side stream before recording (autograd's and cuBLAS's lazy set-up must not be recorded).
WARMUP_REPLAYS = 3
_FIELDS = ("position", "momentum", "thermostat", "potential", "grad", "frozen")


class CaptureFallback(UserWarning):
    """``cuda_graph=True`` could not record or trust the sampling step; the run goes on eagerly (the message says
    why)."""


class CapturedStep:
    """One sampling step on static tensors, recorded as a CUDA graph (module docstring).

    Parameters
    ----------
    dynamics, parameters :
        As for :func:`~pyro_sgmcmc.kernels.step.sampling_step`; ``parameters.step_size`` ``None`` means a schedule:
        each call passes its step size, copied into a static ``(C, 1)`` tensor.
    estimator : callable
        ``(positions, indices) -> (U, grad U)``.
    fill_noise : callable or None
        ``fill_noise(step)`` with ``step`` a 0-d int64 device tensor: the step's standard normal noise, drawn on
        the device (``None`` at ``T = 0``).
    state : SGMCMCState
        The state sampling starts from (gives the shapes).
    indices : dict
        An example of a step's minibatch indices, ``{plate: (C, B)}``.
    graph : bool
        Record a CUDA graph (a CUDA device); ``False`` runs the same static-buffer step eagerly.
    """

    def __init__(
        self,
        dynamics: Dynamics,
        parameters: SamplingParameters,
        estimator: Callable,
        fill_noise: Optional[Callable[[torch.Tensor], torch.Tensor]],
        state: SGMCMCState,
        indices: Mapping[str, torch.Tensor],
        graph: bool,
    ) -> None:
        self.dynamics, self.estimator, self.fill_noise = dynamics, estimator, fill_noise
        position = state.position
        self.scheduled = parameters.step_size is None
        self.step_size = torch.empty((position.shape[0], 1), dtype=position.dtype, device=position.device)
        self.parameters = parameters.replace(step_size=self.step_size) if self.scheduled else parameters
        self.inputs: Dict[str, Optional[torch.Tensor]] = {
            name: (None if getattr(state, name) is None else getattr(state, name).clone()) for name in _FIELDS
        }
        self.step = torch.tensor(state.step, dtype=torch.long, device=position.device)
        self.indices = {plate: value.clone() for plate, value in indices.items()}
        self.info: Optional[StepInfo] = None
        self._last: Optional[SGMCMCState] = None  # the state the static tensors hold (the last call's result)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        if graph:
            self._record()

    # ------------------------------------------------------------------ the recorded function
    def _step(self) -> Tuple[SGMCMCState, StepInfo]:
        """The pure step from the static tensors (read only)."""
        state = SGMCMCState(step=0, **self.inputs)
        noise = None if self.fill_noise is None else self.fill_noise(self.step)
        proposed = propose(self.dynamics, self.parameters, state, self.indices, noise, self.estimator)
        return settle(self.dynamics, self.parameters, state, proposed)

    def _advance(self) -> None:
        """:meth:`_step`, then its result written into the static tensors and the counter advanced."""
        new, info = self._step()
        for name, tensor in self.inputs.items():
            if tensor is not None:
                tensor.copy_(getattr(new, name))
        self.step.add_(1)
        self.info = info  # recorded: the graph's own tensors, overwritten by each replay (copied out in __call__)

    def _record(self) -> None:
        self.constants = DeviceConstants()  # kept: the graph reads them at every replay
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with recording_context(), self.constants, torch.cuda.stream(side):
            for _ in range(WARMUP_REPLAYS - 1):
                self._step()
            check_no_host_reads(self._step)  # before recording: a failed recording can leave CUDA's state broken
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        saved = {name: None if t is None else t.clone() for name, t in self.inputs.items()}
        step = self.step.clone()
        with recording_context(), self.constants, torch.cuda.graph(graph):
            self._advance()
        for name, tensor in self.inputs.items():  # recording ran the kernels once: put the inputs back
            if tensor is not None:
                tensor.copy_(saved[name])
        self.step.copy_(step)
        self.graph = graph

    # ------------------------------------------------------------------ a step
    def __call__(
        self, state: SGMCMCState, indices: Mapping[str, torch.Tensor], step_size=None
    ) -> Tuple[SGMCMCState, StepInfo]:
        """The step from ``state`` with ``indices`` (and the scheduled ``step_size``): the new state (new tensors)
        and the step's info."""
        if state is not self._last:  # not the last result (the first call, or a state set from outside)
            for name, tensor in self.inputs.items():
                if tensor is not None:
                    tensor.copy_(getattr(state, name))
            self.step.fill_(state.step)
        for plate, value in indices.items():
            self.indices[plate].copy_(value)
        if self.scheduled:
            self.step_size.fill_(float(step_size))
        if self.graph is not None:
            self.graph.replay()
        else:
            with recording_context():
                self._advance()
        fields = {name: None if t is None else t.clone() for name, t in self.inputs.items()}
        self._last = SGMCMCState(step=state.step + 1, **fields)
        return self._last, StepInfo(*(None if t is None else t.clone() for t in self.info))


@contextlib.contextmanager
def recording_context():
    """What holds while the step is recorded: Pyro's validation off (it reads values to the host) and the standard
    priors' constants trusted (:func:`~pyro_sgmcmc.model.priors.trusted_prior_constants`: checked eagerly first)."""
    with pyro.validation_enabled(False), trusted_prior_constants(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # e.g. torch's notes on graph capture
        yield


#: ATen operators that read a tensor's values to the host (a synchronisation, which a CUDA graph cannot record).
HOST_READS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "item"})


class _HostReads(EagerDispatchMode):
    """Records the operators of :data:`HOST_READS` applied to tensors off the CPU (a read there is no sync)."""

    def __init__(self, on_cpu: bool = False) -> None:
        super().__init__()
        self.on_cpu, self.seen = on_cpu, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in HOST_READS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if self.on_cpu or any(t.device.type != "cpu" for t in tensors):
                self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def check_no_host_reads(step: Callable[[], object], on_cpu: bool = False) -> None:
    """Run ``step`` once, eagerly; a RuntimeError naming the operators if it read values to the host (counted even
    where the model catches the error a recording would raise)."""
    with _HostReads(on_cpu) as reads:
        step()
    if reads.seen:
        names = ", ".join(sorted(set(reads.seen)))
        raise RuntimeError(
            f"the step reads values to the host ({names}: .item(), bool(), a Python branch on a tensor, or a "
            "comparison of values); a recorded step cannot"
        )


class DeviceConstants(TorchFunctionMode):
    """Tensors the model makes on the device from host values, made once and reused.

    A model builds constants from Python numbers at every call (``Normal(mu, 0.3)`` makes ``torch.tensor(0.3,
    device=...)``; so do ``x.new_tensor(...)`` and ``cpu_tensor.to(device)``): each is a copy from the host's
    pageable memory, which a CUDA graph cannot record. Under this mode the first such call with a given value,
    dtype and device (in the eager steps before recording) makes the tensor, and later calls with the same get the
    same tensor, so the recorded step reads it from the device. The values are keys, so a changed constant is a
    new tensor (and, inside the recording, the failure that makes the run fall back to eager steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: Dict[tuple, torch.Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = _constant_key(func, args, kwargs)
        if key is None:
            return func(*args, **kwargs)
        made = self.cache.get(key)
        if made is None:
            made = self.cache[key] = func(*args, **kwargs)
        return made


def _host_value(data) -> Optional[tuple]:
    """A hashable form of a Python number or a nested list/tuple of numbers (their types too), else None."""
    if isinstance(data, (bool, numbers.Number)):
        return (type(data).__name__, data)
    if isinstance(data, (list, tuple)):
        items = tuple(_host_value(item) for item in data)
        return None if any(item is None for item in items) else items
    return None


def _constant_key(func, args, kwargs) -> Optional[tuple]:
    """The cache key of a call that copies a host value to a device, or None for any other call."""
    if kwargs.get("requires_grad") or kwargs.get("out") is not None:
        return None
    if func in (torch.tensor, torch.as_tensor, torch.scalar_tensor) and args:
        device, value = kwargs.get("device"), _host_value(args[0])
    elif func is torch.Tensor.new_tensor and len(args) > 1:
        device, value = kwargs.get("device", args[0].device), _host_value(args[1])
    elif func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu":
        source, targets = args[0], list(args[1:]) + [kwargs.get("device")]
        device = next((t.device if torch.is_tensor(t) else t for t in targets if isinstance(t, (str, torch.device))
                       or torch.is_tensor(t)), None)  # fmt: skip
        value = None if source.requires_grad else (str(source.dtype), tuple(source.shape), source.numpy().tobytes())
    else:
        return None
    if value is None or device is None or torch.device(device).type == "cpu":
        return None
    rest = tuple((k, str(v)) for k, v in sorted(kwargs.items()) if k != "device")
    extra = tuple(str(a) for a in args[2:]) if func is torch.Tensor.new_tensor else ()
    return (func.__name__, value, str(torch.device(device)), rest, extra)


def agrees(eager: SGMCMCState, replayed: SGMCMCState) -> bool:
    """Whether a replayed step equals the eager one: every field within float rounding (the same kernels, but a
    recorded reduction may be ordered otherwise)."""
    for name in _FIELDS:
        a, b = getattr(eager, name), getattr(replayed, name)
        if (a is None) != (b is None):
            return False
        if a is not None and not torch.allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True):
            return False
    return True
