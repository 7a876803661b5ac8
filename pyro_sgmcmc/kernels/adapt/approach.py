"""The approach to the typical set: a vectorised sign-based descent (iRprop-) on each chain's minibatch potential.

No dynamics yet: every coordinate :math:`i` of every chain has its own step :math:`\\delta_{t,i}`,

.. math::
    \\delta_{t,i} = \\min\\big(\\eta_{t,i}\\, \\delta_{t-1,i},\\ \\max(|z_{t,i}|, 1)\\big), \\qquad
    \\eta_{t,i} = \\begin{cases} 1.2 & g_{t,i}\\, s_{t-1,i} > 0 \\\\ 0.5 & g_{t,i}\\, s_{t-1,i} < 0 \\\\
    1 & \\text{otherwise} \\end{cases}, \\qquad
    z_{t+1,i} = z_{t,i} - \\delta_{t,i}\\, s_{t,i},

with :math:`g_t` the minibatch gradient, :math:`s_t = \\mathrm{sign}(g_t)` except after a sign change, where
:math:`s_{t,i} = 0` (iRprop-: no move, and a zero remembered sign; Riedmiller and Braun 1993, Igel and Huesken 2000)
and :math:`\\delta_0 = 0.01 \\max(|z_0|, 1)`. A proposal that is not finite is refused: the chain stays and all its
steps are halved (:func:`approach_reject`). See :mod:`~pyro_sgmcmc.kernels.warmup` for why.

Examples
--------
>>> import torch
>>> state = approach_init(torch.tensor([[100.0]]))
>>> position, state = approach_update(state, torch.tensor([[100.0]]), torch.tensor([[3.0]]))
>>> position, approach_final(state)
(tensor([[99.]]), tensor([[1.]]))
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

import torch

from . import Adaptation

__all__ = [
    "INITIAL_RELATIVE_STEP",
    "GROWTH",
    "SHRINK",
    "ApproachState",
    "approach_init",
    "approach_update",
    "approach_reject",
    "approach_final",
    "typical_set_search",
]

#: The approach's first step of each coordinate, relative to ``max(|z|, 1)``.
INITIAL_RELATIVE_STEP = 0.01
#: iRprop-'s factors: a coordinate's step grows by GROWTH while its gradient keeps its sign, and shrinks by
#: SHRINK when the sign changes (Igel and Huesken, 2000; Riedmiller and Braun, 1993).
GROWTH, SHRINK = 1.2, 0.5


class ApproachState(NamedTuple):
    """The approach's state (module docstring).

    Attributes
    ----------
    steps : Tensor ``(C, D)``
        Each coordinate's step :math:`\\delta`.
    previous_sign : Tensor ``(C, D)``
        The remembered sign :math:`s` (0 after a sign change or a refusal).
    rejections : Tensor ``(C,)`` long
        Refused (non-finite) proposals per chain.
    """

    steps: torch.Tensor
    previous_sign: torch.Tensor
    rejections: torch.Tensor

    def replace(self, **changes) -> "ApproachState":
        """A copy with the named fields replaced (the others shared, not copied)."""
        return self._replace(**changes)

    def as_dict(self) -> dict:
        """``{field: value}`` in field order."""
        return dict(zip(self._fields, self))


def approach_init(position: torch.Tensor) -> ApproachState:
    """The state at the starting points ``position`` ``(C, D)``: :math:`\\delta_0 = 0.01 \\max(|z_0|, 1)`."""
    return ApproachState(
        INITIAL_RELATIVE_STEP * position.abs().clamp_min(1.0),
        torch.zeros_like(position),
        torch.zeros(position.shape[0], dtype=torch.long, device=position.device),
    )


def approach_update(
    state: ApproachState, position: torch.Tensor, grad: torch.Tensor
) -> Tuple[torch.Tensor, ApproachState]:
    """The next point of every chain from the minibatch ``grad`` :math:`= \\nabla \\hat U` at ``position``, and the
    new state (module docstring)."""
    sign = torch.sign(grad)
    agreement = sign * state.previous_sign
    growth = torch.where(agreement > 0, GROWTH, torch.where(agreement < 0, SHRINK, 1.0))
    limit = position.abs().clamp_min(1.0)  # at most a doubling of the coordinate per step
    steps = (state.steps * growth).minimum(limit)
    sign = torch.where(agreement < 0, torch.zeros_like(sign), sign)  # iRprop-: no move after a sign change
    return position - steps * sign, state.replace(steps=steps, previous_sign=sign)


def approach_reject(state: ApproachState, refused: torch.Tensor) -> ApproachState:
    """Chains ``refused`` ``(C,)`` (their proposal was not finite) stay, with all their steps halved and no
    remembered sign."""
    keep = refused.unsqueeze(-1)
    return ApproachState(
        torch.where(keep, SHRINK * state.steps, state.steps),
        torch.where(keep, torch.zeros_like(state.previous_sign), state.previous_sign),
        state.rejections + refused.long(),
    )


def approach_final(state: ApproachState) -> torch.Tensor:
    """``(C, 1)``: each chain's mean step (what the progress bar shows as the step size)."""
    return state.steps.mean(-1, keepdim=True)


#: The approach as ``(init, update, final)``.
typical_set_search = Adaptation(approach_init, approach_update, approach_final)
