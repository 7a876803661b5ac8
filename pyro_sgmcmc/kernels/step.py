"""The sampling step as one pure function: ``sampling_step(dynamics, parameters, state, indices, noise, estimator)
-> (state, info)``.

After warmup nothing about a kernel changes but its state, so a step is a function of values only:

* ``dynamics`` (:class:`Dynamics`): the kernel's pure update (SGLD, SGHMC, SGNHT: a rule of
  :mod:`~pyro_sgmcmc.kernels.diffusions`) and its stability rule (which quantities of a proposed point must be
  finite); a new kernel family declares both, and touches no warmup module;
* ``parameters`` (:class:`SamplingParameters`): what the warmup hands to sampling, frozen: the per-chain step
  size, the metric's factor :math:`L` and the jump threshold, with the constants of the update;
* ``state`` (:class:`~pyro_sgmcmc.kernels.state.SGMCMCState`), the step's minibatch ``indices``
  (``{plate: (C, B)}``), the standard normal ``noise`` (``(C, D)``, or ``None`` at ``T = 0``) and the gradient
  ``estimator`` (``estimator(positions, indices) -> (U (C,), grad U (C, D))``, :mod:`~pyro_sgmcmc.kernels.gradients`).

The step (1) moves every chain with its cached gradient (under the metric :math:`z = z_0 + L w`: the update runs
in :math:`w` from :math:`w = 0` with drift :math:`L^\\top \\nabla \\log \\pi`, and its displacement is mapped
back by :math:`L`), (2) evaluates :math:`(U, \\nabla U)` at the new points (:func:`propose`), then (3) applies
the divergence rule on the device (:func:`settle`): a chain whose new point breaks the stability rule, or whose
potential rises past its jump threshold, :math:`U' - U > \\tau_c`, *diverges* and is put back with
``torch.where`` (``"restart"`` and ``"raise"``: its previous point, at rest; ``"freeze"``: its previous state,
for the rest of the run, ``state.frozen`` marking it). No Python branch reads a tensor's value, no value is read
back to the host, the shapes do not depend on the data, and no object is written: the step can be replayed
(``torch.cuda.CUDAGraph``) and has the same operator calls for any number of chains. The host-side record of the
divergences (:class:`~pyro_sgmcmc.kernels.divergences.DivergenceRecord`) is filled from the returned
:class:`StepInfo` by the kernel, a few steps later.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Optional, Tuple, Union

import torch

from .state import SGMCMCState

__all__ = ["Dynamics", "SamplingParameters", "StepInfo", "nonfinite_point", "propose", "settle", "sampling_step"]

#: ``estimator(positions (C, D), indices) -> (U (C,), grad U (C, D))``
Estimator = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], Tuple[torch.Tensor, torch.Tensor]]


def nonfinite_point(proposed: SGMCMCState) -> torch.Tensor:
    """The default stability rule: ``(C,)`` bool, the chains whose new potential or gradient is not finite.

    Computed as :math:`s \\ne s` for :math:`s = \\sum_i 0 \\cdot \\partial_i U + 0 \\cdot U` (``torch.add`` with
    ``alpha=0``): every term is zero where it is finite and NaN where it is not (:math:`0 \\cdot \\pm\\infty` is
    NaN), so the test is exact (a finite gradient whose plain sum would overflow passes) in four operations, two
    of them over the gradient. (A non-finite position or momentum makes the next evaluation non-finite.)"""
    total = torch.add(proposed.grad.mul(0).sum(-1), proposed.potential, alpha=0)
    return total != total


class Dynamics(NamedTuple):
    """A kernel family's pure step rule.

    Attributes
    ----------
    update : callable
        ``update(state, drift, step_size, noise, drift_scale) -> (position, momentum, thermostat)``: one step
        of the discretised diffusion with normalised drift ``drift_scale * drift`` (``kernels/diffusions.py``).
    unstable : callable
        ``unstable(proposed) -> (C,) bool``: the chains whose proposed state must not be kept (default
        :func:`nonfinite_point`).
    """

    update: Callable
    unstable: Callable[[SGMCMCState], torch.Tensor] = nonfinite_point


class SamplingParameters(NamedTuple):
    """What warmup hands to sampling, frozen for the rest of the run.

    Attributes
    ----------
    step_size : float or Tensor ``(C, 1)``
        :math:`\\epsilon`, per chain when adapted (kept a tensor for one chain too: the same operators whatever
        the number of chains).
    factor : Tensor ``(C, D)`` or ``(C, D, D)`` or None
        The metric's factor :math:`L` (diagonal, or dense lower triangular), :math:`P = L L^\\top`; ``None``: the
        identity.
    jump_threshold : Tensor ``(C,)`` or None
        :math:`\\tau_c`: a rise of the minibatch potential past it is a divergence; ``None``: no such rule.
    inverse_num_data : float
        :math:`1 / N`: the drift is :math:`-\\nabla U / N` (the noise temperature :math:`T / N` is the dynamics').
    on_divergence : {"restart", "freeze", "raise"}
        What the rule does to a diverging chain (``"raise"`` puts it back as ``"restart"`` does; the kernel
        raises when it reads the step's :class:`StepInfo`).
    """

    step_size: Union[float, torch.Tensor]
    factor: Optional[torch.Tensor] = None
    jump_threshold: Optional[torch.Tensor] = None
    inverse_num_data: float = 1.0
    on_divergence: str = "restart"

    def replace(self, **changes) -> "SamplingParameters":
        """A copy with the named fields replaced (the others shared)."""
        return self._replace(**changes)


class StepInfo(NamedTuple):
    """Per-step statistics, on the device (the reported ``lp`` is ``-state.potential``).

    Attributes
    ----------
    diverging : Tensor ``(C,)`` bool
        The chains that diverged at this step (a frozen chain only once).
    potential_change : Tensor ``(C,)`` or None
        :math:`U' - U` of the proposal, when a jump threshold is in force (the record names a jump with it).
    """

    diverging: torch.Tensor
    potential_change: Optional[torch.Tensor] = None


def propose(
    dynamics: Dynamics,
    parameters: SamplingParameters,
    state: SGMCMCState,
    indices: Mapping[str, torch.Tensor],
    noise: Optional[torch.Tensor],
    estimator: Estimator,
) -> SGMCMCState:
    """The proposed state: the update from ``state`` and the estimator's ``(U, grad U)`` at the new points."""
    drift_scale = -parameters.inverse_num_data
    factor = parameters.factor
    if factor is None:
        position, momentum, thermostat = dynamics.update(state, state.grad, parameters.step_size, noise, drift_scale)
    else:  # the same update in w = L^-1 (z - z0), from w = 0 (kernels/preconditioning.py)
        dense = factor.dim() == 3
        drift = torch.einsum("cji,cj->ci", factor, state.grad) if dense else state.grad * factor
        origin = state.replace(position=torch.zeros_like(state.position))
        displacement, momentum, thermostat = dynamics.update(origin, drift, parameters.step_size, noise, drift_scale)
        displacement = torch.einsum("cij,cj->ci", factor, displacement) if dense else displacement * factor
        position = state.position + displacement
    potential, grad = estimator(position, indices)
    return SGMCMCState(position, momentum, thermostat, potential, grad, state.step + 1, state.frozen)


def settle(
    dynamics: Dynamics, parameters: SamplingParameters, state: SGMCMCState, proposed: SGMCMCState
) -> Tuple[SGMCMCState, StepInfo]:
    """The divergence rule (module docstring): ``proposed`` where kept, ``state`` elsewhere, and the step's info."""
    bad = dynamics.unstable(proposed)
    change = None
    if parameters.jump_threshold is not None:
        change = proposed.potential - state.potential
        bad = bad | (change > parameters.jump_threshold)
    frozen = state.frozen
    diverging = bad if frozen is None else bad & ~frozen  # a frozen chain diverges once
    if parameters.on_divergence == "freeze":
        frozen = diverging if frozen is None else frozen | diverging
        bad = bad | frozen
    back = bad.unsqueeze(-1)  # the chains put back
    momentum = proposed.momentum
    if momentum is not None:  # a restarted chain restarts at rest; a frozen one keeps its (unused) momentum
        if parameters.on_divergence == "freeze":
            momentum = torch.where(back, state.momentum, momentum)
        else:  # torch.where, not masked_fill: the same bits (+0.0 where put back), 1.6x faster on the CPU
            momentum = torch.where(back, 0.0, momentum)
    thermostat = proposed.thermostat
    if thermostat is not None:
        thermostat = torch.where(bad, state.thermostat, thermostat)
    new = SGMCMCState(
        torch.where(back, state.position, proposed.position),
        momentum,
        thermostat,
        torch.where(bad, state.potential, proposed.potential),
        torch.where(back, state.grad, proposed.grad),
        proposed.step,
        frozen,
    )
    return new, StepInfo(diverging, change)


def sampling_step(
    dynamics: Dynamics,
    parameters: SamplingParameters,
    state: SGMCMCState,
    indices: Mapping[str, torch.Tensor],
    noise: Optional[torch.Tensor],
    estimator: Estimator,
) -> Tuple[SGMCMCState, StepInfo]:
    """One sampling step of every chain, pure (module docstring): :func:`settle` of :func:`propose`.

    Examples
    --------
    >>> import torch
    >>> from pyro_sgmcmc.kernels.diffusions import langevin_step
    >>> def update(state, drift, step_size, noise, drift_scale):  # SGLD at T = 0: gradient descent
    ...     return langevin_step(state.position, drift, step_size, 0.0, noise, drift_scale), None, None
    >>> def estimator(z, indices):  # U = |z|^2 / 2, and a wall at z > 1
    ...     return torch.where(z[:, 0] > 1, float("inf"), 0.5 * (z * z).sum(-1)), z.clone()
    >>> z = torch.tensor([[0.5], [-3.0]])
    >>> state = SGMCMCState(z, None, None, *estimator(z, {}), 0)
    >>> new, info = sampling_step(Dynamics(update), SamplingParameters(3.0), state, {}, None, estimator)
    >>> new.position.flatten().tolist(), info.diverging.tolist()  # z' = -2 z: chain 1 hits the wall, put back
    ([-1.0, -3.0], [False, True])
    """
    return settle(dynamics, parameters, state, propose(dynamics, parameters, state, indices, noise, estimator))
