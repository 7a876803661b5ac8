"""The dynamical state of a batch of chains, and the errors and warnings about it."""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Union

import torch

__all__ = ["SGMCMCState", "DivergenceError", "DivergenceWarning", "SlowMixingWarning"]


class DivergenceError(RuntimeError):
    """Raised with ``on_divergence="raise"`` when a step diverges (non-finite, or a jump of the potential)."""


class DivergenceWarning(RuntimeWarning):
    """Warned at the end of a run in which some step diverged."""


class SlowMixingWarning(RuntimeWarning):
    """Warned at the end of warmup when an adapted step size is too small for the chain to have mixed."""


class SGMCMCState(NamedTuple):
    """The dynamical state of a batch of chains; every field is a tensor or an int, so it pickles.

    Attributes
    ----------
    position : Tensor ``(num_chains, dim)``
        Unconstrained positions :math:`z`.
    momentum : Tensor ``(num_chains, dim)`` or None
        Momenta :math:`m` (SGHMC, SGNHT).
    thermostat : Tensor ``(num_chains,)`` or None
        Nose-Hoover thermostats :math:`\\xi` (SGNHT).
    potential : Tensor ``(num_chains,)``
        Minibatch estimates of :math:`U(z) = -\\log \\pi(z)` at ``position``.
    grad : Tensor ``(num_chains, dim)``
        Minibatch estimates of :math:`\\nabla U(z)` at ``position``.
    step : int
        Steps taken (warmup included); the step-size schedule reads it. The chains of one
        vectorised run move in lockstep, so they share it; each run (each chain of a sequential
        ``pyro.infer.MCMC`` run) starts its own at 0.
    frozen : Tensor ``(num_chains,)`` bool or None
        The chains stopped by ``on_divergence="freeze"`` (a mask in that mode once sampling starts; ``None``
        otherwise).

    Examples
    --------
    >>> import torch
    >>> state = SGMCMCState(torch.zeros(2, 3), None, None, torch.zeros(2), torch.ones(2, 3), 0)
    >>> state.replace(step=1).step, sorted(state.as_dict())[:2]
    (1, ['frozen', 'grad'])
    """

    position: torch.Tensor
    momentum: Optional[torch.Tensor]
    thermostat: Optional[torch.Tensor]
    potential: torch.Tensor
    grad: torch.Tensor
    step: int
    frozen: Optional[torch.Tensor] = None

    def replace(self, **changes: Union[torch.Tensor, int, None]) -> "SGMCMCState":
        """A copy with the named fields replaced (the others shared, not copied)."""
        return self._replace(**changes)

    def as_dict(self) -> Dict[str, Union[torch.Tensor, int, None]]:
        """``{field: value}`` in field order (what :meth:`SGMCMCKernel.state_dict` saves)."""
        return dict(zip(self._fields, self))
