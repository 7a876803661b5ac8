"""What the warmup reads from a kernel, as values, and what a warmup step gives back.

The warmup (:class:`~pyro_sgmcmc.kernels.adaptation.WarmupDriver`) holds no reference to the kernel: the kernel
gives it a :class:`WarmupContext` at set-up (and at a restore), made by :func:`warmup_context` from the kernel's
public members, and assigns what the warmup returns (a state, a :class:`WarmupUpdate`).
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch

from .adapt.stability import StabilityRule
from .control_variates import ControlVariate
from .gradients import control_variate_potential
from .state import SGMCMCState

__all__ = ["WarmupContext", "WarmupUpdate", "NextIndices", "warmup_context"]


class WarmupContext(NamedTuple):
    """What the warmup needs from a kernel, as values: given to :meth:`WarmupDriver.setup` (and to
    :meth:`WarmupDriver.load_state_dict`), read by nothing else.

    Attributes
    ----------
    evaluate : callable
        ``evaluate(positions, indices) -> (U, dU/dz)``: the gradient estimate in force, ``(C,)`` and ``(C, D)`` at
        ``(C, D)`` positions.
    next_indices : callable
        ``next_indices() -> {plate: (C, B) indices}``: each chain's next minibatch.
    transition : callable
        The kernel's pure update ``transition(state, drift, step_size, noise, drift_scale) -> (position, momentum,
        thermostat)`` (:mod:`~pyro_sgmcmc.kernels.diffusions`).
    potential : ModelPotential
        The potential the automatic control variate is built on: the model's, or the estimator's
        ``control_variate_potential`` (data parallelism's global one, ``kernels/gradients.py``).
    plates : sequence
        The subsampled plates the minibatches are drawn for.
    num_data : int
        :math:`N`, the normaliser of the drift.
    temperature : float
        :math:`T`.
    stability : StabilityRule
        The kernel family's stability rule (:mod:`~pyro_sgmcmc.kernels.adapt.stability`): its step-size rule, damping
        and relaxation time.
    adapt_step_size, adapt_mass_matrix : bool
        The adaptation flags.
    full_mass : bool or None
        Dense metric; ``None``: dense up to ``DENSE_MAX_DIM``.
    automatic_control_variate : bool
        ``control_variate="auto"``: decide in warmup.
    uses_control_variate : bool
        The gradient estimate in force is a control variate.
    initial_step_size : float
        The step size at step 0 (kept by a chain whose curvature cannot be measured).
    kernel_name : str
        The kernel's class name, for the warnings.
    """

    evaluate: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], Tuple[torch.Tensor, torch.Tensor]]
    next_indices: Callable[[], Mapping[str, torch.Tensor]]
    transition: Callable
    potential: object
    plates: Sequence
    num_data: int
    temperature: float
    stability: StabilityRule
    adapt_step_size: bool
    adapt_mass_matrix: bool
    full_mass: Optional[bool]
    automatic_control_variate: bool
    uses_control_variate: bool
    initial_step_size: float
    kernel_name: str

    def evaluating_with(self, estimator) -> "WarmupContext":
        """The same context with the gradient estimate of ``estimator`` (a control variate) in force."""
        return self._replace(evaluate=estimator.potential_and_grad, uses_control_variate=True)


def warmup_context(kernel) -> WarmupContext:
    """The :class:`WarmupContext` of a kernel whose chains are set up, read from its public members once."""
    estimator = kernel.gradient_estimator
    return WarmupContext(
        evaluate=estimator.potential_and_grad,
        next_indices=kernel.minibatches.next,
        transition=kernel.transition,
        # a control variate's potential: the estimator's if it has one (data parallelism's global potential)
        potential=control_variate_potential(estimator, kernel.potential),
        plates=kernel.minibatches.plates,
        num_data=kernel.run_num_data,
        temperature=kernel.temperature,
        stability=kernel.warmup_stability_rule(),
        adapt_step_size=kernel.adapt_step_size,
        adapt_mass_matrix=kernel.adapt_mass_matrix,
        full_mass=kernel.full_mass,
        automatic_control_variate=kernel.control_variate == "auto",
        uses_control_variate=isinstance(estimator, ControlVariate),
        initial_step_size=kernel.step_size(0),
        kernel_name=type(kernel).__name__,
    )


class WarmupUpdate(NamedTuple):
    """What a warmup step changes: the chains' ``state``, and the ``gradient_estimator`` chosen by
    ``control_variate="auto"`` at this step (``None``: unchanged)."""

    state: SGMCMCState
    gradient_estimator: Optional[ControlVariate]


class NextIndices:
    """The ``next()`` of a minibatch source given as a callable (what the automatic control variate reads)."""

    def __init__(self, next_indices: Callable[[], Mapping[str, torch.Tensor]]) -> None:
        self.next = next_indices
