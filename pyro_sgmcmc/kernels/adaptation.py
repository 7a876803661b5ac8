"""The warmup driver: composes the pure adaptations of :mod:`~pyro_sgmcmc.kernels.adapt` for one kernel.

:class:`WarmupDriver` runs the three phases of :mod:`~pyro_sgmcmc.kernels.warmup`: the approach
(:mod:`~pyro_sgmcmc.kernels.adapt.approach`, ``ApproachState``), the adaptation of the metric and of the per-chain
step sizes (:mod:`~pyro_sgmcmc.kernels.adapt.windows`, ``WindowedState``, probing the curvature through
:class:`~pyro_sgmcmc.kernels.curvature_probes.CurvatureProbes`), ``control_variate="auto"``
(:mod:`~pyro_sgmcmc.kernels.auto_control_variate`, ``AutoControlVariateState``) and the jump thresholds
(:mod:`~pyro_sgmcmc.kernels.adapt.jumps`, ``JumpState``). Each adaptation is ``(init, update, final)`` over its own
named tuple; the driver holds their states and nothing else of the run's. It holds no reference to the kernel: what
it needs is given to :meth:`WarmupDriver.setup` as values (:class:`WarmupContext`, made by :func:`warmup_context`
from the kernel's public members), and what it changes it returns (a state, a :class:`WarmupUpdate`), which the
kernel assigns; the kernel reads the adapted step size and metric.
"""

from __future__ import annotations

import warnings
from typing import Optional, Tuple, Union

import torch

from .adapt.approach import ApproachState, approach_final, approach_init, approach_reject, approach_update
from .adapt.jumps import JumpState, jumps_final, jumps_init, jumps_update, running_threshold
from .adapt.mass_matrix import metric_init
from .adapt.saved import adaptation_fields, fields_of, restore, restore_adaptation
from .adapt.step_size import StepSizeSettings, step_size_init
from .adapt.windows import WindowedSettings, WindowedState, windowed_init, windowed_shrink, windowed_update
from .auto_control_variate import (
    AutoControlVariateState,
    auto_decide,
    auto_fields,
    auto_init,
    auto_propose,
    auto_restore,
)
from .control_variates import ControlVariate
from .creep import describe as describe_drift
from .creep import drift_offsets
from .curvature_probes import CurvatureProbes
from .preconditioning import DENSE_MAX_DIM, adaptation_schedule, preconditioned_transition
from .state import SGMCMCState, SlowMixingWarning
from .step import SamplingParameters
from .warmup import MIN_ADAPTATION_WARMUP, SLOW_MIXING_FRACTION, approach_length
from .warmup_context import NextIndices, WarmupContext, WarmupUpdate, warmup_context

__all__ = ["WarmupDriver", "WarmupContext", "WarmupUpdate", "warmup_context"]


class WarmupDriver:
    """The warmup of one kernel (module docstring); :meth:`setup` starts it afresh for each run.

    Attributes
    ----------
    chain_step_size : Tensor ``(C, 1)``, float or None
        The adapted step sizes (a float once one chain's is frozen after warmup); ``None``: the schedule's.
    jump_threshold : Tensor ``(C,)`` or None
        The jump past which a step is a divergence (adaptation: running; sampling: frozen at the end of warmup).
    jumps : JumpState
        The jump thresholds' state.
    approach : ApproachState or None
        The approach's state (kept after it ends, for the diagnostics), ``approach_steps`` long.
    settings, adaptation : WindowedSettings, WindowedState, or None
        The adaptation phase's rules and state, when the warmup adapts.
    adapting : bool
        In the adaptation phase.
    auto : AutoControlVariateState
        ``control_variate="auto"``'s decision (a value, replaced by each of its functions).
    """

    def __init__(self) -> None:
        self.context: Optional[WarmupContext] = None
        self.probes: Optional[CurvatureProbes] = None
        self.auto: AutoControlVariateState = auto_init()
        self.warmup_steps = 0
        self.chain_step_size: Optional[Union[torch.Tensor, float]] = None
        self.jump_threshold: Optional[torch.Tensor] = None
        self.jumps: Optional[JumpState] = None
        self.approach: Optional[ApproachState] = None
        self.approach_steps = 0
        self.settings: Optional[WindowedSettings] = None
        self.adaptation: Optional[WindowedState] = None
        self.adapting = False

    @property
    def preconditioned(self) -> bool:
        """Whether the update runs under an adapted metric (:meth:`transition`)."""
        return self.settings is not None and self.settings.preconditioned

    def setup(self, warmup_steps: int, state: SGMCMCState, context: WarmupContext) -> SGMCMCState:
        """Start the warmup of a run whose chains start from ``state``; returns the state the chains start from
        (``state``, at rest if the adaptation starts at once)."""
        self.context, self.probes = context, _probes(context)
        position = state.position
        self.warmup_steps = warmup_steps
        approach = approach_length(warmup_steps)
        # the running threshold from the approach's second half: its first steps are the descent (jumps.py)
        self.jumps = jumps_init(warmup_steps, position.shape[0], position.device, running_start=approach // 2)
        self.auto = auto_init(self.auto)  # a refined control variate is kept for the same data
        self.jump_threshold, self.approach, self.approach_steps, self.chain_step_size = None, None, 0, None
        # an adaptation flag on and T > 0 (at T = 0 there is no posterior to adapt to: the kernel is an optimiser)
        adapts = (context.adapt_step_size or context.adapt_mass_matrix) and context.temperature > 0
        if not (adapts and warmup_steps >= MIN_ADAPTATION_WARMUP):
            self.settings, self.adaptation, self.adapting = None, None, False
            return state
        self.settings = _windowed_settings(context, state, warmup_steps - approach, approach)
        self.adaptation = WindowedState(metric_init(position, self.settings.preconditioned), step_size_init(), 0)
        self.adapting = True
        if approach > 0:
            self.approach, self.approach_steps = approach_init(position), approach
            return state
        return self._start_adaptation(state)

    def in_approach(self, step: int) -> bool:
        """Whether step ``step`` (0-based) is one of the approach's."""
        return self.approach is not None and step < self.approach_steps

    def typical_step(self) -> torch.Tensor:
        """``(C, 1)``: each chain's mean approach step (what the progress bar shows as the step size)."""
        return approach_final(self.approach)

    def transition(self, state: SGMCMCState, drift: torch.Tensor, step_size, noise, drift_scale: float):
        """The kernel's update under the adapted metric (``w = L^-1 z``, ``kernels/preconditioning.py``)."""
        factor, full_mass = self.adaptation.metric.factor, self.settings.full_mass
        update = self.context.transition
        return preconditioned_transition(update, factor, full_mass, state, drift, step_size, noise, drift_scale)

    def approach_step(self, state: SGMCMCState) -> SGMCMCState:
        """One step of the approach phase (:mod:`~pyro_sgmcmc.kernels.warmup`): sign-based descent, no noise.
        Returns the chains' new state."""
        position, approach = approach_update(self.approach, state.position, state.grad)
        energy, grad = self.context.evaluate(position, self.context.next_indices())
        finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1) & torch.isfinite(position).all(-1)
        if not bool(finite.all()):
            approach = approach_reject(approach, ~finite)
            keep = finite.unsqueeze(-1)
            position = torch.where(keep, position, state.position)
            energy = torch.where(finite, energy, state.potential)
            grad = torch.where(keep, grad, state.grad)
        self.approach = approach
        # the step-to-step changes count for the running jump threshold from the approach's second half on
        self.jumps = jumps_update(self.jumps, state.step + 1, energy - state.potential)
        state = state.replace(position=position, potential=energy, grad=grad, step=state.step + 1)
        if state.step == self.approach_steps:
            state = self._start_adaptation(state)
        return state

    def _start_adaptation(self, state: SGMCMCState) -> SGMCMCState:
        """End of the approach: the chains start moving, at rest, under the first metric and step size."""
        context = self.context
        if state.momentum is not None:
            state = state.replace(momentum=torch.zeros_like(state.momentum))
        if context.automatic_control_variate:
            self.auto = auto_propose(self.auto, context.potential, context.plates, state)
        self.adaptation = windowed_init(self.settings, state.position, self.probes)
        self.chain_step_size = self.adaptation.step_size
        # the adaptation's first steps are guarded by the noise measured at rest in the approach's second half
        self.jump_threshold = running_threshold(self.jumps)
        return state

    def after_step(self, previous: SGMCMCState, state: SGMCMCState, diverging: torch.Tensor) -> WarmupUpdate:
        """Warmup bookkeeping after a step into ``state``: measure the potential's step-to-step change, adapt, halve
        the step size of the chains ``diverging`` in adaptation, and freeze the thresholds at the end of warmup.
        Returns the chains' state (moved by a control variate's choice, at rest after a change of metric) and the
        gradient estimator chosen at this step, if any."""
        diverged = bool(diverging.any())
        if not diverged:
            self.jumps = jumps_update(self.jumps, state.step, state.potential - previous.potential)
        chosen = None
        if self.adapting:
            if diverged and self.settings.step_size.adapt:
                self.adaptation = windowed_shrink(self.adaptation, diverging)
                self.chain_step_size = self.adaptation.step_size
            state, chosen = self._adapt(state)
            # in adaptation a jump past the running threshold is a divergence too: the chain is put back
            # and its step halved, so a step that is unstable under the current metric cannot throw it away
            self.jump_threshold = running_threshold(self.jumps)
        if state.step == self.warmup_steps:
            self.jump_threshold = jumps_final(self.jumps)
            if self.adaptation is not None:
                self._warn_slow_mixing(state)
            self._freeze_step_size()
        return WarmupUpdate(state, chosen)

    def _adapt(self, state: SGMCMCState) -> Tuple[SGMCMCState, Optional[ControlVariate]]:
        settings, context = self.settings, self.context
        chosen = None
        if self.auto.candidate is not None and state.step - settings.offset >= settings.slow_start:
            indices = NextIndices(context.next_indices)
            chosen, self.auto = auto_decide(
                self.auto, context.potential, state.position, indices, context.temperature, self._hessian
            )
            if chosen is not None:
                self._use(chosen)
                evaluate, next_indices = self.context.evaluate, self.context.next_indices
                position = state.position if self.auto.arrival is None else self.auto.arrival
                energy, grad = evaluate(position, next_indices())
                if position is not state.position:  # chains the approach left far out go where they would arrive
                    arrived = torch.isfinite(energy) & torch.isfinite(grad).all(-1)
                    if not bool(arrived.all()):
                        position = torch.where(arrived.unsqueeze(-1), position, state.position)
                        energy, grad = evaluate(position, next_indices())
                state = state.replace(position=position, potential=energy, grad=grad)
        self.adaptation, replaced = windowed_update(
            settings, self.adaptation, state.step, state.position, state.grad, self.probes
        )
        if replaced and state.momentum is not None:
            state = state.replace(momentum=torch.zeros_like(state.momentum))  # in old-metric units
        self.chain_step_size = self.adaptation.step_size
        if state.step == self.warmup_steps:
            self.adapting = False
        return state, chosen

    def _hessian(self, position: torch.Tensor) -> torch.Tensor:
        """The probed Hessian at ``position`` (for the automatic control variate), its evaluations counted."""
        hessian, evaluations = self.probes.hessian(position)
        spent = self.adaptation.num_extra_evaluations + evaluations
        self.adaptation = self.adaptation.replace(num_extra_evaluations=spent)
        return hessian

    def _use(self, estimator: ControlVariate) -> None:
        """From now on the warmup (its probes included) evaluates with ``estimator``, as the kernel does."""
        self.context = self.context.evaluating_with(estimator)
        self.probes = _probes(self.context)

    def _freeze_step_size(self) -> None:
        """After warmup one chain's adapted step size becomes a number: the update's scalar (fused) path."""
        step_size = self.chain_step_size
        if torch.is_tensor(step_size) and step_size.numel() == 1:
            self.chain_step_size = float(step_size)

    def _warn_slow_mixing(self, state: SGMCMCState) -> None:
        """Warn when an adapted step is so small that a chain needs more steps to forget its state than the
        adaptation phase had: it has probably not reached the posterior, and will mix slowly while sampling.

        One relaxation time of the preconditioned dynamics (normalised curvature about 1) is the kernel family's
        (:meth:`~pyro_sgmcmc.kernels.adapt.stability.StabilityRule.relaxation_time`: about
        :math:`2 / (\\epsilon \\alpha)` steps for SGHMC and SGNHT, friction / diffusion :math:`\\alpha`, and
        :math:`1 / \\epsilon` for SGLD); the warning is given when it exceeds ``SLOW_MIXING_FRACTION`` of the
        adaptation phase. The usual cause is gradient noise (a small minibatch of many data): a larger
        ``subsample_size`` helps, or a control variate where the posterior is concentrated (the advice says
        whether the automatic one was measured and rejected)."""
        step_size = self.chain_step_size
        if step_size is None:
            return
        context = self.context
        per_chain = torch.as_tensor(step_size).reshape(-1).double()
        relaxation = context.stability.relaxation_time(per_chain)
        settings = self.settings
        limit = SLOW_MIXING_FRACTION * settings.warmup_steps
        slow = (relaxation > limit).nonzero().flatten().tolist()
        num_data, temperature = settings.step_size.num_data, settings.temperature
        drift = drift_offsets(self.adaptation, num_data, temperature, relaxation.expand(state.position.shape[0]))
        drifting = drift is not None and bool(drift[1].any())
        if slow or drifting:
            worst = float(relaxation.max())
            found = (
                f"the adapted step size of chain(s) {slow[:8]} is at most {float(per_chain.min()):.3g}, so a chain "
                f"needs about {worst:.3g} steps to forget its state, more than {SLOW_MIXING_FRACTION:g} of the "
                f"{settings.warmup_steps} adaptation steps"
                if slow
                else describe_drift(*drift)
            )
            warnings.warn(
                f"{context.kernel_name}: {found}: it has probably not reached the posterior and will mix slowly. "
                f"Usually the minibatch gradient noise limits the step: {self._slow_mixing_advice()} Otherwise the "
                "posterior's shape does: a funnel or curved ridge (e.g. a hierarchical model written non-centred "
                "whose groups have much data) fits no constant metric; write that model centred.",
                SlowMixingWarning,
                stacklevel=4,
            )

    def _slow_mixing_advice(self) -> str:
        if self.context.uses_control_variate:
            return "a larger subsample_size or a longer warmup will help."
        if self.auto.rejected:
            return (
                "a larger subsample_size or a longer warmup will help (the automatic control variate was measured "
                "and did not lower the noise: the posterior is not concentrated around one mode)."
            )
        return "a larger subsample_size, control_variate='map', or a longer warmup will help."

    def phase(self, step: int) -> str:
        """``"approach"``, ``"adaptation"`` (the rest of warmup), ``"warmup"`` (no adaptation) or ``"sampling"``."""
        if step >= self.warmup_steps:
            return "sampling"
        if self.in_approach(step):
            return "approach"
        return "adaptation" if self.adaptation is not None else "warmup"

    @property
    def inverse_mass_matrix(self) -> Optional[torch.Tensor]:
        """:math:`P = L L^\\top` per chain, ``(C, D)`` or ``(C, D, D)``; ``None`` without an adapted metric."""
        if not self.preconditioned or self.adaptation.metric.factor is None:
            return None
        factor = self.adaptation.metric.factor
        return factor @ factor.transpose(-1, -2) if self.settings.full_mass else factor * factor

    def diagnostics(self, chain: int) -> dict:
        """The warmup's statistics of chain ``chain`` (see ``SGMCMCKernel.chain_diagnostics``)."""
        out = {}
        if self.adaptation is not None:
            approach = self.approach
            out["approach steps"] = self.approach_steps
            out["approach rejections"] = 0 if approach is None else int(approach.rejections[chain])
            out["adaptation steps"] = self.settings.warmup_steps
            halvings = self.adaptation.step.total_halvings
            out["step size halvings"] = 0 if halvings is None else int(halvings[chain])
            inverse_mass = self.inverse_mass_matrix
            if inverse_mass is not None:
                diagonal = inverse_mass[chain].diagonal() if inverse_mass.dim() == 3 else inverse_mass[chain]
                out["inverse mass matrix diagonal"] = diagonal.detach().cpu()
        return out

    def state_dict(self) -> dict:
        """The adaptations' states, each named tuple's fields under their names (:mod:`~pyro_sgmcmc.kernels.adapt.
        saved`), the thresholds in force and the automatic control variate's candidate; tensors on the CPU."""
        jumps = fields_of(self.jumps, skip=("start", "end", "running_start"))
        out = {"jumps": jumps, "jump_threshold": self.jump_threshold, "adapting": self.adapting}
        if self.approach is not None:
            out["approach"] = fields_of(self.approach)
        if self.adaptation is not None:
            out["adaptation"] = adaptation_fields(self.adaptation)
        out.update(auto_fields(self.auto))
        return out

    def load_state_dict(self, saved: dict, state: SGMCMCState, context: WarmupContext) -> None:
        """Restore :meth:`state_dict` into a warmup set up (:meth:`setup`) for chains now at ``state``, whose kernel
        has restored its gradient estimate (``context``)."""
        self.context, self.probes = context, _probes(context)
        device = state.position.device
        self.jumps = restore(self.jumps, saved["jumps"], device)
        threshold = saved["jump_threshold"]
        self.jump_threshold = None if threshold is None else threshold.to(device)
        self.adapting = saved["adapting"]
        if "approach" in saved:
            self.approach = restore(self.approach, saved["approach"], device)
        if "adaptation" in saved:
            self.adaptation = restore_adaptation(self.adaptation, saved["adaptation"], device)
            self.chain_step_size = self.adaptation.step_size
            if state.step >= self.warmup_steps:
                self._freeze_step_size()
        self.auto = auto_restore(self.auto, saved, context.potential, device)

    def sampling_parameters(self) -> SamplingParameters:
        """What sampling reads of the warmup, frozen (:class:`~pyro_sgmcmc.kernels.step.SamplingParameters`): the
        adapted per-chain step sizes (``None``: the kernel's schedule), the metric's factor :math:`L` (``None``
        without an adapted metric) and the jump thresholds. One chain's step size stays a ``(1, 1)`` tensor, so
        that a step has the same operators for any number of chains."""
        step_size = self.chain_step_size
        if step_size is not None and not torch.is_tensor(step_size):  # frozen to a number: the tensor it came from
            adapted = self.adaptation.step_size if self.adaptation is not None else None
            step_size = adapted if torch.is_tensor(adapted) else step_size
        factor = self.adaptation.factor if self.preconditioned else None
        return SamplingParameters(step_size, factor, self.jump_threshold)


def _probes(context: WarmupContext) -> CurvatureProbes:
    """The curvature probes on the context's gradient estimate and minibatches."""
    return CurvatureProbes(context.evaluate, context.next_indices, context.plates, context.num_data)


def _windowed_settings(context: WarmupContext, state: SGMCMCState, steps: int, offset: int) -> WindowedSettings:
    """The adaptation phase's rules for ``steps`` steps after ``offset`` of approach: Stan's schedule, a dense
    metric up to ``DENSE_MAX_DIM`` unless ``full_mass`` says otherwise, and the stability rule the kernel's family
    declares (:mod:`~pyro_sgmcmc.kernels.adapt.stability`)."""
    full_mass = context.full_mass
    dense = full_mass if full_mass is not None else state.position.shape[-1] <= DENSE_MAX_DIM
    full_mass = bool(dense and context.adapt_mass_matrix)
    step_size = StepSizeSettings(
        adapt=bool(context.adapt_step_size),
        preconditioned=bool(context.adapt_mass_matrix),
        full_mass=full_mass,
        rule=context.stability,
        temperature=float(context.temperature),
        num_data=context.num_data,
        initial_step_size=float(context.initial_step_size),
    )
    initial, slow = adaptation_schedule(steps)
    preconditioned = bool(context.adapt_mass_matrix)
    return WindowedSettings(
        steps, offset, tuple(initial), tuple(slow), full_mass, preconditioned, step_size.temperature, step_size
    )
