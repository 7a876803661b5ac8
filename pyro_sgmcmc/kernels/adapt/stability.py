"""What a kernel family declares for the warmup: its stability rule (the step size it can take, how fast it mixes).

The warmup adapts one step size per chain from the largest preconditioned curvature :math:`\\lambda_{max}` at the
chain's point (:mod:`~pyro_sgmcmc.kernels.adapt.step_size`); how large a step stays stable, and how many steps a
chain needs to forget its state, depend on the dynamics, so each kernel family declares them
(:meth:`~pyro_sgmcmc.kernels.base.SGMCMCKernel.warmup_stability_rule`) and the warmup reads the declaration: a
new family touches no warmup module. (Which proposed states a step refuses is another rule, the step's:
``kernels/step.py``.)

* First order (Langevin, SGLD): the Euler step is stable for :math:`\\epsilon \\lambda < 2` and its variance bias
  along the stiffest direction is :math:`\\epsilon \\lambda / 2`: :math:`\\epsilon = c / \\lambda_{max}`
  (:math:`c = 0.1`: a bias of at most 5 %). A chain forgets its state in about :math:`1 / \\epsilon` steps.
* Second order (with momentum, SGHMC, SGNHT): the symplectic-Euler step is stable for
  :math:`\\epsilon \\sqrt{\\lambda} < 2` and its variance bias is about :math:`\\epsilon^2 \\lambda / 4`:
  :math:`\\epsilon = c / \\sqrt{\\lambda_{max}}` (SGHMC :math:`c = 0.4`, about 4 %; SGNHT :math:`c = 0.1`, its
  thermostat fluctuates). With damping :math:`\\alpha > 0` a chain forgets its state in about
  :math:`2 / (\\epsilon \\alpha)` steps (else :math:`1 / \\epsilon`).

The damping :math:`\\alpha` (the coefficient of the injected noise: SGLD 1, SGHMC the friction, SGNHT the
diffusion) also sets the gradient-noise cap :math:`\\epsilon \\le 2 \\alpha T\\, \\mathtt{NOISE\\_INFLATION} / (N V)`.

Examples
--------
>>> import torch
>>> rule = StabilityRule(step_constant=0.4, second_order=True, damping=2.0)
>>> rule.stable_step_size(torch.tensor([16.0])), rule.relaxation_time(torch.tensor([0.1]))
(tensor([0.1000]), tensor([10.]))
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["StabilityRule", "FIRST_ORDER_CONSTANT", "SECOND_ORDER_CONSTANT", "THERMOSTAT_CONSTANT"]

#: ``c`` of the first-order rule ``c / lambda_max`` (SGLD).
FIRST_ORDER_CONSTANT = 0.1
#: ``c`` of the second-order rule ``c / sqrt(lambda_max)`` (SGHMC).
SECOND_ORDER_CONSTANT = 0.4
#: ``c`` of the second-order rule with a thermostat (SGNHT: ``eps * xi`` must stay well below 2).
THERMOSTAT_CONSTANT = 0.1


class StabilityRule(NamedTuple):
    """A kernel family's stability rule (module docstring).

    Attributes
    ----------
    step_constant : float
        :math:`c`.
    second_order : bool
        :math:`\\epsilon = c / \\sqrt{\\lambda_{max}}` (dynamics with momentum); else :math:`c / \\lambda_{max}`.
    damping : float
        :math:`\\alpha \\ge 0`, the coefficient of the injected noise: the gradient-noise cap and the relaxation time
        read it.
    """

    step_constant: float
    second_order: bool
    damping: float

    def stable_step_size(self, largest_curvature: torch.Tensor) -> torch.Tensor:
        """The step size for a largest (normalised, preconditioned) curvature :math:`\\lambda_{max}`."""
        if self.second_order:
            return self.step_constant / largest_curvature.sqrt()
        return self.step_constant / largest_curvature

    def relaxation_time(self, step_size: torch.Tensor) -> torch.Tensor:
        """Steps a chain needs to forget its state at normalised curvature about 1, for its ``step_size``."""
        if self.second_order and self.damping:
            return 2.0 / (step_size * self.damping)
        return 1.0 / step_size
