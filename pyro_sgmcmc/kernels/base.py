"""The shared :class:`~pyro.infer.mcmc.mcmc_kernel.MCMCKernel` shell of the SG-MCMC kernels.

A concrete kernel (SGLD, SGHMC, SGNHT) only says how to start its auxiliary state
(:meth:`SGMCMCKernel._init_auxiliary`) and how to take one step given the normalised drift
(:meth:`SGMCMCKernel._transition`, a call into :mod:`pyro_sgmcmc.kernels.diffusions`).
Everything else lives here: model set-up, the minibatch gradient, temperature, step-size
schedule, divergence handling, statistics and the Pyro ``MCMC`` protocol.

Step order. ``setup`` evaluates the potential :math:`U` and its gradient at the initial point.
Each ``sample`` call then (1) draws the injected noise, (2) moves with the gradient cached from
the previous evaluation, (3) re-runs the model at the new point, which draws a fresh minibatch,
and caches :math:`U` and :math:`\\nabla U` there. One model evaluation per step; the reported
``lp = -U`` belongs to the returned draw. If step (3) gives a non-finite potential or gradient
the step is a *divergence*: the chain stays at its previous point, its momentum is reset to
zero, and the step is recorded (or, with ``on_divergence="raise"``, an error names it).
"""

from __future__ import annotations

import math
import numbers
from collections import OrderedDict
from typing import Callable, Dict, List, NamedTuple, Optional, Union

import torch

from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ..potential import ModelPotential
from ..schedules import Schedule, as_schedule

__all__ = ["SGMCMCState", "SGMCMCKernel", "DivergenceError"]


class DivergenceError(RuntimeError):
    """Raised with ``on_divergence="raise"`` when a step gives a non-finite potential or gradient."""


class SGMCMCState(NamedTuple):
    """The complete state of one chain; every field is a tensor or an int, so it pickles.

    Attributes
    ----------
    position : Tensor ``(dim,)``
        Unconstrained position :math:`z`.
    momentum : Tensor ``(dim,)`` or None
        Momentum :math:`m` (SGHMC, SGNHT).
    thermostat : Tensor ``()`` or None
        Nose-Hoover thermostat :math:`\\xi` (SGNHT).
    potential : Tensor ``()``
        Minibatch estimate of :math:`U(z) = -\\log \\pi(z)` at ``position``.
    grad : Tensor ``(dim,)``
        Minibatch estimate of :math:`\\nabla U(z)` at ``position``.
    step : int
        Steps this chain has taken (warmup included); the step-size schedule reads it.
    """

    position: torch.Tensor
    momentum: Optional[torch.Tensor]
    thermostat: Optional[torch.Tensor]
    potential: torch.Tensor
    grad: torch.Tensor
    step: int


_INITIAL_MOMENTA = ("zero", "stationary")
_ON_DIVERGENCE = ("count", "raise")


class SGMCMCKernel(MCMCKernel):
    """Base class of the stochastic-gradient kernels; see :class:`~pyro_sgmcmc.SGLD` for the arguments."""

    has_momentum = False

    def __init__(
        self,
        model: Callable,
        step_size: Union[float, Schedule, Callable[[int], float]] = 1e-3,
        temperature: float = 1.0,
        num_data: Optional[int] = None,
        init_strategy: Callable = init_to_uniform,
        on_divergence: str = "count",
    ) -> None:
        if not callable(model):
            raise ValueError(f"model must be a callable Pyro model; got {type(model).__name__}")
        self.model = model
        self.step_size = as_schedule(step_size, "step_size")
        self.temperature = _non_negative(temperature, "temperature", "T = 1 is the posterior, 0 < T < 1 a cold posterior, T = 0 optimisation")
        if num_data is not None and (isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1):
            raise ValueError(f"num_data must be a positive integer (the number of data N) or None; got {num_data!r}")
        self.num_data = num_data
        if not callable(init_strategy):
            raise ValueError(f"init_strategy must be a Pyro init strategy (e.g. init_to_uniform); got {init_strategy!r}")
        self.init_strategy = init_strategy
        if on_divergence not in _ON_DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {_ON_DIVERGENCE}; got {on_divergence!r}")
        self.on_divergence = on_divergence

        self.transforms = None
        self.potential: Optional[ModelPotential] = None
        self.state: Optional[SGMCMCState] = None
        self._initial_params: Optional[Dict[str, torch.Tensor]] = None
        self._params: Optional[Dict[str, torch.Tensor]] = None
        self._warmup_steps = 0
        self._divergences: List[int] = []
        self._num_warmup_divergences = 0
        self._last_step_size = float("nan")
        self._last_diverging = False

    # ------------------------------------------------------------------ Pyro protocol
    @property
    def initial_params(self) -> Optional[Dict[str, torch.Tensor]]:
        """Unconstrained starting values ``{site: tensor}``; after ``setup``, the ones in use."""
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Optional[Dict[str, torch.Tensor]]) -> None:
        self._initial_params = params

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Trace the model once, find the start, and evaluate the potential there.

        Everything that does not depend on the draw (sites, transforms, plates, ``N``,
        the noise temperature :math:`T / N`) is computed here, once.
        """
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a non-negative integer; got {warmup_steps!r}")
        self._warmup_steps = warmup_steps
        self.potential = ModelPotential(
            self.model, args, kwargs, init_strategy=self.init_strategy, num_data=self.num_data
        )
        self.transforms = self.potential.transforms
        self.noise_temperature = self.temperature / self.potential.num_data
        self._inverse_num_data = 1.0 / self.potential.num_data
        position = self.potential.initial_position(self._initial_params)
        potential, grad = self.potential.potential_and_grad(position)
        momentum, thermostat = self._init_auxiliary(position)
        self.state = SGMCMCState(position, momentum, thermostat, potential, grad, 0)
        self._params = self.potential.unpack(position)
        self._initial_params = self._params
        self._divergences = []
        self._num_warmup_divergences = 0

    def cleanup(self) -> None:
        # The next chain of a sequential multi-chain run starts afresh (from its own
        # initial_params, set by pyro.infer.MCMC, or from init_strategy).
        self._initial_params = None

    def sample(self, params: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Take one step from ``params`` (unconstrained) and return the new unconstrained params."""
        state = self.state
        if params is not self._params:  # moved by the caller: re-evaluate at the given point
            position = self.potential.pack(params)
            potential, grad = self.potential.potential_and_grad(position)
            state = state._replace(position=position, potential=potential, grad=grad)
        step_size = self.step_size(state.step)
        noise = torch.randn_like(state.position) if self.noise_temperature > 0 else None
        drift = state.grad * (-self._inverse_num_data)
        position, momentum, thermostat = self._transition(state, drift, step_size, noise)
        potential, grad = self.potential.potential_and_grad(position)
        diverging = not bool(torch.isfinite(potential) & torch.isfinite(grad).all())
        if diverging:
            self._record_divergence(state.step, potential)
            zero = None if state.momentum is None else torch.zeros_like(state.momentum)
            state = state._replace(momentum=zero, step=state.step + 1)
        else:
            state = SGMCMCState(position, momentum, thermostat, potential, grad, state.step + 1)
        self.state = state
        self._last_step_size = step_size
        self._last_diverging = diverging
        self._params = self.potential.unpack(state.position)
        return self._params

    def logging(self) -> "OrderedDict[str, str]":
        """Shown in the progress bar: step size, minibatch log density, divergences."""
        return OrderedDict(
            [
                ("step size", f"{self._last_step_size:.2e}"),
                ("lp", f"{-float(self.state.potential):.4g}"),
                ("div", str(len(self._divergences) + self._num_warmup_divergences)),
            ]
        )

    def diagnostics(self) -> dict:
        """``divergences`` holds the indices of the divergent *draws* (sampling phase), as ArviZ reads them."""
        return {
            "divergences": list(self._divergences),
            "warmup divergences": self._num_warmup_divergences,
            "step size": self._last_step_size,
        }

    # ------------------------------------------------------------------ statistics
    @property
    def last_stats(self) -> Dict[str, float]:
        """Statistics of the last step, with ArviZ's names where they apply (``lp``, ``step_size``, ``diverging``)."""
        stats = {
            "lp": -float(self.state.potential),
            "step_size": self._last_step_size,
            "diverging": self._last_diverging,
            "temperature": self.temperature,
        }
        stats.update(self._auxiliary_stats(self.state))
        return stats

    # ------------------------------------------------------------------ for subclasses
    def _init_auxiliary(self, position: torch.Tensor):
        """Return ``(momentum, thermostat)`` at the start (``None`` where the kernel has none)."""
        return None, None

    def _initial_momentum(self, position: torch.Tensor, how: str, mass: float) -> torch.Tensor:
        if how == "zero":
            return torch.zeros_like(position)
        # The stationary momentum of the tempered dynamics: N(0, mass * T / N).
        return torch.randn_like(position) * math.sqrt(mass * self.noise_temperature)

    def _transition(self, state: SGMCMCState, drift: torch.Tensor, step_size: float, noise: Optional[torch.Tensor]):
        raise NotImplementedError

    def _auxiliary_stats(self, state: SGMCMCState) -> Dict[str, float]:
        return {}

    def _record_divergence(self, step: int, potential: torch.Tensor) -> None:
        if self.on_divergence == "raise":
            phase = "warmup" if step < self._warmup_steps else "sampling"
            what = "potential energy" if not torch.isfinite(potential) else "gradient"
            raise DivergenceError(
                f"{type(self).__name__}: non-finite {what} at step {step} ({phase}); "
                "reduce step_size, or pass on_divergence='count' to record it and continue"
            )
        if step >= self._warmup_steps:
            self._divergences.append(step - self._warmup_steps)
        else:
            self._num_warmup_divergences += 1


def _non_negative(value, name: str, meaning: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite float >= 0 ({meaning}); got {value!r}")
    return float(value)


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite float > 0; got {value!r}")
    return float(value)


def _choice(value, name: str, accepted) -> str:
    if value not in accepted:
        raise ValueError(f"{name} must be one of {accepted}; got {value!r}")
    return value
