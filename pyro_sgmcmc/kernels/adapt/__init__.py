"""The warmup's adaptations as pure functions over named tuples (NumPyro's ``warmup_adapter``, optax's shape).

Each adaptation is a triple of pure functions bundled in an :class:`Adaptation`: ``init(...) -> state`` makes its
state, a :class:`~typing.NamedTuple` of tensors and ints; ``update(state, ...) -> state`` (or ``(value, state)``)
advances it by one warmup step; ``final(state)`` reads what it adapts. None reads or writes a kernel; the warmup
driver (:class:`~pyro_sgmcmc.kernels.adaptation.WarmupDriver`) composes them and the kernel reads the result.

* :mod:`.approach`: the approach to the typical set (iRprop- on the minibatch potential), ``ApproachState``;
* :mod:`.jumps`: the jump thresholds of the divergence check, ``JumpState``;
* :mod:`.step_size`: the per-chain step size from the preconditioned curvature and the gradient noise,
  ``StepSizeState``;
* :mod:`.mass_matrix`: the metric (inverse mass matrix) from the curvature averaged over the chain's draws,
  ``MetricState``;
* :mod:`.windows`: Stan's windows composing the last two, ``WindowedState``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

__all__ = ["Adaptation"]


class Adaptation(NamedTuple):
    """An adaptation as three pure functions: ``init`` makes its state, ``update`` advances it by one warmup step,
    ``final`` reads what it adapts (their signatures are each adaptation's own)."""

    init: Callable
    update: Callable
    final: Callable
