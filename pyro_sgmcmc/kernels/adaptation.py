"""The warmup driver: approach, adaptation and the jump thresholds, through the kernel's public calls.

:class:`WarmupDriver` runs the three phases of :mod:`~pyro_sgmcmc.kernels.warmup` for a kernel: the approach
(:class:`~pyro_sgmcmc.kernels.warmup.TypicalSetSearch`), the adaptation of the metric and of the per-chain step
sizes (:class:`~pyro_sgmcmc.kernels.preconditioning.MassMatrixAdaptation`, probing the curvature through
:class:`~pyro_sgmcmc.kernels.curvature_probes.CurvatureProbes`), ``control_variate="auto"``
(:class:`~pyro_sgmcmc.kernels.auto_control_variate.AutoControlVariate`) and the jump thresholds
(:class:`~pyro_sgmcmc.kernels.warmup.JumpMonitor`). It holds no reference to the kernel: what it needs is given to
:meth:`WarmupDriver.setup` as values (:class:`WarmupContext`, made by :func:`warmup_context` from the kernel's
public members), and what it changes it returns (a state, a :class:`WarmupUpdate`), which the kernel assigns.
"""

from __future__ import annotations

import warnings
from typing import Optional, Tuple, Union

import torch

from .auto_control_variate import AutoControlVariate
from .control_variates import ControlVariate
from .creep import describe as describe_drift
from .creep import drift_offsets
from .curvature_probes import CurvatureProbes
from .preconditioning import DENSE_MAX_DIM, MassMatrixAdaptation
from .state import SGMCMCState, SlowMixingWarning
from .warmup import MIN_ADAPTATION_WARMUP, SLOW_MIXING_FRACTION, JumpMonitor, TypicalSetSearch, approach_length
from .warmup_context import NextIndices, WarmupContext, WarmupUpdate, warmup_context

__all__ = ["WarmupDriver", "WarmupContext", "WarmupUpdate", "warmup_context"]


class WarmupDriver:
    """The warmup of one kernel (module docstring); :meth:`setup` starts it afresh for each run.

    It holds no reference to the kernel: :meth:`setup` is given a :class:`WarmupContext`, and the calls that change
    the chains return their new state (:meth:`approach_step`, :meth:`after_step`), which the kernel assigns.

    Attributes
    ----------
    chain_step_size : Tensor ``(C, 1)``, float or None
        The adapted step sizes (a float once one chain's is frozen after warmup); ``None``: the schedule's.
    jump_threshold : Tensor ``(C,)`` or None
        The jump past which a step is a divergence (adaptation: running; sampling: frozen at the end of warmup).
    approach, adaptation : or None
        The phases' machinery, when the warmup adapts.
    adapting : bool
        In the adaptation phase.
    """

    def __init__(self) -> None:
        self.context: Optional[WarmupContext] = None
        self.auto = AutoControlVariate()
        self.warmup_steps = 0
        self.chain_step_size: Optional[Union[torch.Tensor, float]] = None
        self.jump_threshold: Optional[torch.Tensor] = None
        self.jumps: Optional[JumpMonitor] = None
        self.approach: Optional[TypicalSetSearch] = None
        self.adaptation: Optional[MassMatrixAdaptation] = None
        self.adapting = False

    @property
    def preconditioned(self) -> bool:
        """Whether the update runs under an adapted metric (:meth:`transition`)."""
        return self.adaptation is not None and self.adaptation.preconditioned

    def setup(self, warmup_steps: int, state: SGMCMCState, context: WarmupContext) -> SGMCMCState:
        """Start the warmup of a run whose chains start from ``state``; returns the state the chains start from
        (``state``, at rest if the adaptation starts at once)."""
        self.context = context
        position = state.position
        self.warmup_steps = warmup_steps
        self.jumps = JumpMonitor(warmup_steps, position.shape[0], position.device)
        self.auto.reset()
        self.jump_threshold, self.approach, self.chain_step_size = None, None, None
        adapts = (context.adapt_step_size or context.adapt_mass_matrix) and context.temperature > 0
        if not (adapts and warmup_steps >= MIN_ADAPTATION_WARMUP):
            self.adaptation, self.adapting = None, False
            return state
        full_mass = context.full_mass
        dense = full_mass if full_mass is not None else position.shape[-1] <= DENSE_MAX_DIM
        approach = approach_length(warmup_steps)
        self.adaptation = MassMatrixAdaptation(
            warmup_steps - approach,
            dense and context.adapt_mass_matrix,
            context.adapt_step_size,
            state.momentum is not None,
            context.temperature,
            thermostat=state.thermostat is not None,
            adapt_mass_matrix=context.adapt_mass_matrix,
            offset=approach,
            probes=self._probes(context),
            damping=context.damping,
            initial_step_size=context.initial_step_size,
        )
        self.adapting = True
        if approach > 0:
            self.approach = TypicalSetSearch(approach, position)
            return state
        return self._start_adaptation(state)

    @staticmethod
    def _probes(context: WarmupContext) -> CurvatureProbes:
        return CurvatureProbes(context.evaluate, context.next_indices, context.plates, context.num_data)

    def in_approach(self, step: int) -> bool:
        return self.approach is not None and step < self.approach.num_steps

    def transition(self, state: SGMCMCState, drift: torch.Tensor, step_size, noise, drift_scale: float):
        """The kernel's update under the adapted metric (``w = L^-1 z``, ``kernels/preconditioning.py``)."""
        return self.adaptation.transition(self.context.transition, state, drift, step_size, noise, drift_scale)

    def approach_step(self, state: SGMCMCState) -> SGMCMCState:
        """One step of the approach phase (:mod:`~pyro_sgmcmc.kernels.warmup`): sign-based descent, no noise.
        Returns the chains' new state."""
        approach, evaluate = self.approach, self.context.evaluate
        position = approach.propose(state.position, state.grad)
        energy, grad = evaluate(position, self.context.next_indices())
        finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1) & torch.isfinite(position).all(-1)
        if not bool(finite.all()):
            approach.reject(~finite)
            keep = finite.unsqueeze(-1)
            position = torch.where(keep, position, state.position)
            energy = torch.where(finite, energy, state.potential)
            grad = torch.where(keep, grad, state.grad)
        state = state.replace(position=position, potential=energy, grad=grad, step=state.step + 1)
        if state.step == approach.num_steps:
            state = self._start_adaptation(state)
        return state

    def _start_adaptation(self, state: SGMCMCState) -> SGMCMCState:
        """End of the approach: the chains start moving, at rest, under the first metric and step size."""
        context = self.context
        if state.momentum is not None:
            state = state.replace(momentum=torch.zeros_like(state.momentum))
        if context.automatic_control_variate:
            self.auto.propose(context.potential, context.plates, state)
        self.adaptation.setup(state.position)
        self.chain_step_size = self.adaptation.step_size
        return state

    def after_step(self, previous: SGMCMCState, state: SGMCMCState, diverging: torch.Tensor) -> WarmupUpdate:
        """Warmup bookkeeping after a step into ``state``: measure the potential's step-to-step change, adapt, halve
        the step size of the chains ``diverging`` in adaptation, and freeze the thresholds at the end of warmup.
        Returns the chains' state (moved by a control variate's choice, at rest after a change of metric) and the
        gradient estimator chosen at this step, if any."""
        diverged = bool(diverging.any())
        if not diverged:
            self.jumps.record(state.step, state.potential - previous.potential)
        chosen = None
        if self.adapting:
            adaptation = self.adaptation
            if diverged and adaptation.adapt_step_size:
                adaptation.shrink_step_size(diverging)
                self.chain_step_size = adaptation.step_size
            state, chosen = self._adapt(state)
            # in adaptation a jump past the running threshold is a divergence too: the chain is put back
            # and its step halved, so a step that is unstable under the current metric cannot throw it away
            self.jump_threshold = self.jumps.running_threshold()
        if state.step == self.warmup_steps:
            self.jump_threshold = self.jumps.threshold()
            if self.adaptation is not None:
                self._warn_slow_mixing(state)
            self._freeze_step_size()
        return WarmupUpdate(state, chosen)

    def _adapt(self, state: SGMCMCState) -> Tuple[SGMCMCState, Optional[ControlVariate]]:
        adaptation, context = self.adaptation, self.context
        chosen = None
        if self.auto.candidate is not None and state.step - adaptation.offset >= adaptation.slow_start:
            chosen = self.auto.decide(
                context.potential,
                state.position,
                NextIndices(context.next_indices),
                context.temperature,
                adaptation.probes.hessian,
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
        if adaptation.update(state.step, state.position, state.grad) and state.momentum is not None:
            state = state.replace(momentum=torch.zeros_like(state.momentum))  # in old-metric units
        self.chain_step_size = adaptation.step_size
        if state.step == self.warmup_steps:
            self.adapting = False
        return state, chosen

    def _use(self, estimator: ControlVariate) -> None:
        """From now on the warmup (its probes included) evaluates with ``estimator``, as the kernel does."""
        self.context = self.context.evaluating_with(estimator)
        self.adaptation.probes.evaluate = self.context.evaluate

    def _freeze_step_size(self) -> None:
        """After warmup one chain's adapted step size becomes a number: the update's scalar (fused) path."""
        step_size = self.chain_step_size
        if torch.is_tensor(step_size) and step_size.numel() == 1:
            self.chain_step_size = float(step_size)

    def _warn_slow_mixing(self, state: SGMCMCState) -> None:
        """Warn when an adapted step is so small that a chain needs more steps to forget its state than the
        adaptation phase had: it has probably not reached the posterior, and will mix slowly while sampling.

        One relaxation time of the preconditioned dynamics (normalised curvature about 1) is about
        :math:`2 / (\\epsilon \\alpha)` steps for SGHMC and SGNHT (friction / diffusion :math:`\\alpha`) and
        :math:`1 / \\epsilon` for SGLD; the warning is given when it exceeds ``SLOW_MIXING_FRACTION`` of the
        adaptation phase. The usual cause is gradient noise (a small minibatch of many data): a larger
        ``subsample_size`` helps, or a control variate where the posterior is concentrated (the advice says
        whether the automatic one was measured and rejected)."""
        step_size = self.chain_step_size
        if step_size is None:
            return
        context = self.context
        damping = context.damping if state.momentum is not None else None
        per_chain = torch.as_tensor(step_size).reshape(-1).double()
        relaxation = 2.0 / (per_chain * damping) if damping else 1.0 / per_chain
        limit = SLOW_MIXING_FRACTION * self.adaptation.warmup_steps
        slow = (relaxation > limit).nonzero().flatten().tolist()
        drift = drift_offsets(self.adaptation, relaxation.expand(state.position.shape[0]))
        drifting = drift is not None and bool(drift[1].any())
        if slow or drifting:
            worst = float(relaxation.max())
            found = (
                f"the adapted step size of chain(s) {slow[:8]} is at most {float(per_chain.min()):.3g}, so a chain "
                f"needs about {worst:.3g} steps to forget its state, more than {SLOW_MIXING_FRACTION:g} of the "
                f"{self.adaptation.warmup_steps} adaptation steps"
                if slow
                else describe_drift(*drift)
            )
            warnings.warn(
                f"{context.kernel_name}: {found}: it has probably not reached the posterior and will mix slowly. "
                f"Usually the minibatch gradient noise limits the step: {self._slow_mixing_advice()}",
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
        if not self.preconditioned or self.adaptation.factor is None:
            return None
        factor = self.adaptation.factor
        return factor @ factor.transpose(-1, -2) if self.adaptation.full_mass else factor * factor

    def diagnostics(self, chain: int) -> dict:
        """The warmup's statistics of chain ``chain`` (see ``SGMCMCKernel.chain_diagnostics``)."""
        out = {}
        if self.adaptation is not None:
            approach = self.approach
            out["approach steps"] = 0 if approach is None else approach.num_steps
            out["approach rejections"] = 0 if approach is None else int(approach.rejections[chain])
            out["adaptation steps"] = self.adaptation.warmup_steps
            halvings = self.adaptation.total_halvings
            out["step size halvings"] = 0 if halvings is None else int(halvings[chain])
            inverse_mass = self.inverse_mass_matrix
            if inverse_mass is not None:
                diagonal = inverse_mass[chain].diagonal() if inverse_mass.dim() == 3 else inverse_mass[chain]
                out["inverse mass matrix diagonal"] = diagonal.detach().cpu()
        return out

    def state_dict(self) -> dict:
        out = {"jumps": self.jumps.state_dict(), "jump_threshold": self.jump_threshold, "adapting": self.adapting}
        if self.approach is not None:
            out["approach"] = self.approach.state_dict()
        if self.adaptation is not None:
            out["adaptation"] = self.adaptation.state_dict()
        out.update(self.auto.state_dict())
        return out

    def load_state_dict(self, saved: dict, state: SGMCMCState, context: WarmupContext) -> None:
        """Restore :meth:`state_dict` into a warmup set up (:meth:`setup`) for chains now at ``state``, whose kernel
        has restored its gradient estimate (``context``)."""
        self.context = context
        if self.adaptation is not None:
            self.adaptation.probes = self._probes(context)
        device = state.position.device
        self.jumps.load_state_dict(saved["jumps"], device)
        threshold = saved["jump_threshold"]
        self.jump_threshold = None if threshold is None else threshold.to(device)
        self.adapting = saved["adapting"]
        if "approach" in saved:
            self.approach.load_state_dict(saved["approach"], device)
        if "adaptation" in saved:
            self.adaptation.load_state_dict(saved["adaptation"], device)
            self.chain_step_size = self.adaptation.step_size
            if state.step >= self.warmup_steps:
                self._freeze_step_size()
        self.auto.load_state_dict(saved, context.potential, device)
