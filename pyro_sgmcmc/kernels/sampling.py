"""The sampling phase of a run: the pure step (:mod:`~pyro_sgmcmc.kernels.step`) and the divergences read later.

:class:`SamplingRun` holds what sampling needs and does not change (the kernel's :class:`~.step.Dynamics`, the
:class:`~.step.SamplingParameters` the warmup handed over) and advances the kernel's state with
:func:`~.step.propose` and :func:`~.step.settle`, which read nothing back to the host. The divergence masks
(``StepInfo.diverging``) stay on the device; the host-side record (per chain the divergent draws, the log naming
the sites and data at fault, the count the progress bar shows) is filled from them every :data:`FLUSH_EVERY`
steps, and whenever it is read (``diagnostics()``, ``state_dict()``, ``divergences``, ...): one read per
``FLUSH_EVERY`` steps instead of one per step. The per-step statistics (``last_stats``: ``diverging``,
``num_divergences``) are device tensors, exact at every step.

Naming a divergence needs the proposed point and the minibatch of its step. The last step's are at hand; for an
earlier step of the window the window is *replayed* from its first state with the same minibatches, noise (a
function of the step: :mod:`~pyro_sgmcmc.chains.philox`) and estimator: the pure step is deterministic, so the
replay finds the same points.
The replay runs only when some step of the window diverged. A gradient estimator that is not ``replayable`` (one
that draws its own minibatches, so that calling it again would change the run) and ``on_divergence="raise"``
read the masks after every step instead: ``"raise"`` therefore raises at the divergent step itself, before the
kernel's state moves, as it always did.
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional

import torch

from .capture import CapturedStep, CaptureFallback, agrees
from .divergences import DivergenceRecord, describe_divergence
from .state import SGMCMCState
from .step import Dynamics, Estimator, SamplingParameters, StepInfo, propose, settle

__all__ = ["FLUSH_EVERY", "NoiseDraw", "SamplingRun"]

#: The host reads the accumulated divergence masks every this many sampling steps.
FLUSH_EVERY = 25


#: The kernel's injected noise of a step, ``draw(step)`` (``None`` at ``T = 0``): a function of the step alone.
NoiseDraw = Callable[[int], Optional[torch.Tensor]]


class _Pending(NamedTuple):
    step: int  # the step of the state the step started from
    info: StepInfo
    indices: Mapping[str, torch.Tensor]
    parameters: SamplingParameters
    estimator: Estimator


class SamplingRun:
    """The sampling phase of one run (module docstring).

    Parameters
    ----------
    dynamics : Dynamics
    parameters : SamplingParameters
        With ``step_size=None`` the kernel's schedule gives each step's (``schedule(step)``).
    schedule : callable
        ``step -> step size``, used when ``parameters.step_size`` is None.
    warmup_steps : int
        Draw ``t`` is the step from state ``warmup_steps + t``.
    noise : NoiseDraw
    record : DivergenceRecord
    potential :
        The model's potential (names the sites of a non-finite point).
    start : SGMCMCState
        The state sampling starts from.
    capture : callable, optional
        ``capture(state, indices) -> CapturedStep``: replay the step as a recorded graph
        (:mod:`~pyro_sgmcmc.kernels.capture`, ``cuda_graph=True``), built at the first step and trusted once it
        equals that step taken eagerly; ``None``: every step eager.
    """

    def __init__(
        self,
        dynamics: Dynamics,
        parameters: SamplingParameters,
        schedule: Callable[[int], float],
        warmup_steps: int,
        noise: NoiseDraw,
        record: DivergenceRecord,
        potential,
        start: SGMCMCState,
        capture: Optional[Callable[[SGMCMCState, Mapping[str, torch.Tensor]], CapturedStep]] = None,
    ) -> None:
        self.dynamics, self.parameters, self.schedule = dynamics, parameters, schedule
        self.capture, self.captured = capture, None
        self.warmup_steps, self.noise, self.record, self.potential = warmup_steps, noise, record, potential
        self.pending: List[_Pending] = []
        self.step_size = parameters.step_size  # the last step's (float or (C, 1))
        self.last: Optional[tuple] = None  # (state, proposed) of the last step
        self.start = start  # the state the window of pending steps began from

    def step(self, state: SGMCMCState, indices: Mapping[str, torch.Tensor], estimator) -> SGMCMCState:
        """One step from ``state`` with the step's minibatch ``indices`` and gradient ``estimator`` (an object with
        ``potential_and_grad``); returns the new state (the kernel's)."""
        parameters = self.parameters
        if parameters.step_size is None:
            parameters = parameters.replace(step_size=self.schedule(state.step))
        evaluate = estimator.potential_and_grad
        replayable = getattr(estimator, "replayable", False)
        if self.capture is not None and self.captured is None:
            new, info = self._start_capture(state, indices, parameters, evaluate, replayable)
        elif self.captured is not None:  # the recorded step; the window's replay names its divergences
            new, info = self.captured(state, indices, parameters.step_size)
            self.last = None
        else:
            proposed = propose(self.dynamics, parameters, state, indices, self.noise(state.step), evaluate)
            new, info = settle(self.dynamics, parameters, state, proposed)
            self.last = (state, proposed)
        self.record.note(info.diverging)
        self.pending.append(_Pending(state.step, info, indices, parameters, evaluate))
        self.step_size = parameters.step_size
        replayable = parameters.on_divergence != "raise" and replayable
        if not replayable or len(self.pending) >= FLUSH_EVERY:
            self.flush(new)
        return new

    def _start_capture(self, state, indices, parameters, evaluate, replayable):
        """The first step with ``cuda_graph=True``: taken eagerly, and by the recorded step from the same state;
        the recording is kept if the two agree, else (or if it cannot be made) the run goes on eagerly, saying why."""
        proposed = propose(self.dynamics, parameters, state, indices, self.noise(state.step), evaluate)
        new, info = settle(self.dynamics, parameters, state, proposed)
        self.last = (state, proposed)
        capture, self.capture = self.capture, None
        try:
            if not replayable:
                raise RuntimeError("the gradient estimator draws its own minibatches (e.g. data-parallel)")
            captured = capture(state, indices)
            replayed, _ = captured(state, indices, parameters.step_size)
            if not agrees(new, replayed):
                raise RuntimeError(
                    "the recorded step differs from the eager one: the model must do the same operations at every "
                    "step (no random draws of its own, no Python branch on a value)"
                )
        except Exception as error:  # noqa: BLE001 - any failure to record means: run eagerly, and say why
            warnings.warn(
                f"cuda_graph=True: the sampling step runs eagerly, it could not be recorded: {error}",
                CaptureFallback, stacklevel=4,
            )  # fmt: skip
            return new, info
        self.captured = captured
        return new, info

    def flush(self, start: SGMCMCState) -> None:
        """Read the pending divergence masks into the record (raising for ``"raise"``), and begin a new window at
        ``start`` (the kernel's state)."""
        pending = self.pending
        if pending:
            masks = torch.stack([entry.info.diverging for entry in pending])
            flagged: Dict[int, List[int]] = {}
            for row, chain in masks.nonzero().tolist():  # the one read of the window
                flagged.setdefault(row, []).append(chain)
            if flagged:
                named = self._name(flagged)
                for row in sorted(flagged):
                    entry = pending[row]
                    self.record.add_sampling(entry.step, entry.step - self.warmup_steps, named[row])
            self.record.frozen = start.frozen
        self.pending, self.last = [], None
        self.start = start

    def _name(self, flagged: Dict[int, List[int]]) -> Dict[int, List[tuple]]:
        """Per flagged row of the window, ``[(chain, what), ...]`` (replaying the window for earlier rows)."""
        pending, last_row = self.pending, len(self.pending) - 1
        named = {}
        replay_last = self.last is None  # a recorded step keeps no proposal: replayed like the others
        earlier = [row for row in flagged if row != last_row or replay_last]
        if earlier:
            state = self.start
            for row, entry in enumerate(pending[: max(earlier) + 1]):
                noise = self.noise(entry.step)
                proposed = propose(self.dynamics, entry.parameters, state, entry.indices, noise, entry.estimator)
                if row in flagged:
                    named[row] = self._describe(state, proposed, flagged[row], entry)
                state = settle(self.dynamics, entry.parameters, state, proposed)[0]
        if last_row in flagged and not replay_last:
            named[last_row] = self._describe(*self.last, flagged[last_row], pending[last_row])
        return named

    def _describe(self, state: SGMCMCState, proposed: SGMCMCState, chains: List[int], entry: _Pending) -> List[tuple]:
        threshold = entry.parameters.jump_threshold
        return [
            (chain, describe_divergence(self.potential, state, proposed, chain, entry.indices, threshold))
            for chain in chains
        ]
