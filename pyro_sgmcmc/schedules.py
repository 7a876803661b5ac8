"""Step-size schedules.

A schedule maps the chain's step counter ``t = 0, 1, 2, ...`` (warmup steps included)
to the step size :math:`\\epsilon_t` that multiplies the normalised drift
:math:`N^{-1} \\nabla \\log \\pi`. Schedules are small, picklable objects so that a
kernel, its state and its checkpoint can be serialised.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Dict, Union

import torch

__all__ = ["Schedule", "Constant", "RobbinsMonro", "Cyclical", "make_schedule", "as_schedule"]


class Schedule:
    """Base class: a callable ``t -> step size`` with ``t`` the chain's step counter.

    A schedule may also split the sampling steps into *stages* (:class:`Cyclical`): ``staged`` is then True,
    :meth:`explores` says at which steps the injected noise is off, and only the draws of the other steps
    are returned. The kernel calls :meth:`starting_at` once it knows where sampling begins.
    """

    #: Whether the schedule has exploration stages (steps with the injected noise off, whose draws are dropped).
    staged = False

    def __call__(self, t: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def starting_at(self, first_sampling_step: int) -> "Schedule":
        """The schedule of a run whose sampling begins at step ``first_sampling_step`` (the warmup's length):
        itself, for a schedule of the step counter alone."""
        return self

    def explores(self, t: int) -> bool:
        """Whether the step from counter ``t`` is an exploration step (no injected noise): never, by default."""
        return False

    def stage_stats(self, t: int, num_chains: int, device=None) -> Dict[str, torch.Tensor]:
        """The per-draw statistics of the stage of the step from counter ``t`` (``(num_chains,)`` tensors): none,
        for a schedule without stages."""
        return {}

    def validate(self, argument: str = "step_size") -> None:
        """Check that the first step size is positive and finite (callable schedules check every step)."""
        value = self(0)
        if not _is_positive_finite(value):
            raise ValueError(f"{argument} schedule gives step size {value!r} at t = 0; it must be positive and finite")


class Constant(Schedule):
    """Constant step size :math:`\\epsilon_t = \\epsilon`.

    With a constant step size the stationary distribution of an SG-MCMC chain is biased
    by :math:`O(\\epsilon)` (discretisation and gradient noise).

    Parameters
    ----------
    value : float
        The step size; positive and finite.
    """

    def __init__(self, value: float) -> None:
        if not _is_positive_finite(value):
            raise ValueError(f"step_size must be a positive, finite float; got {value!r}")
        self.value = float(value)

    def __call__(self, t: int) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class RobbinsMonro(Schedule):
    """Decaying step size :math:`\\epsilon_t = a (b + t)^{-\\gamma}`.

    For :math:`\\gamma \\in (0.5, 1]` the step sizes satisfy the Robbins-Monro conditions
    :math:`\\sum_t \\epsilon_t = \\infty`, :math:`\\sum_t \\epsilon_t^2 < \\infty`, under which
    the SGLD bias vanishes as :math:`t \\to \\infty` (Welling and Teh, 2011).

    Parameters
    ----------
    a : float
        Scale, positive.
    b : float
        Offset, positive (so that :math:`b + t > 0` from ``t = 0``).
    gamma : float
        Decay exponent in ``(0.5, 1]``.
    """

    def __init__(self, a: float, b: float = 1.0, gamma: float = 0.55) -> None:
        if not _is_positive_finite(a):
            raise ValueError(f"RobbinsMonro: a must be positive and finite; got {a!r}")
        if not _is_positive_finite(b):
            raise ValueError(f"RobbinsMonro: b must be positive and finite; got {b!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0.5 < gamma <= 1.0:
            raise ValueError(f"RobbinsMonro: gamma must be in (0.5, 1]; got {gamma!r}")
        self.a, self.b, self.gamma = float(a), float(b), float(gamma)

    def __call__(self, t: int) -> float:
        return self.a * (self.b + t) ** (-self.gamma)

    def __repr__(self) -> str:
        return f"RobbinsMonro(a={self.a!r}, b={self.b!r}, gamma={self.gamma!r})"


class Cyclical(Schedule):
    """Cyclical step size (Zhang et al., 2020): ``num_cycles`` cosine cycles over the sampling steps, each an
    exploration stage (no injected noise) then a sampling stage.

    Sampling step :math:`k = t - t_0` (:math:`t_0` the first sampling step, the warmup's length, which the
    kernel sets) of :math:`K` sampling steps in :math:`M` cycles of :math:`L = \\lceil K / M \\rceil` steps has

    .. math:: \\epsilon_k = \\frac{\\epsilon_0}{2} \\left( \\cos \\frac{\\pi\\, \\mathrm{mod}(k, L)}{L} + 1 \\right),
              \\qquad r_k = \\frac{\\mathrm{mod}(k, L)}{L} \\in [0, 1),

    from the peak :math:`\\epsilon_0` at the start of a cycle down to :math:`\\epsilon_0 \\pi^2 / (4 L^2)` at its
    end. Step :math:`k` is an *exploration* step when :math:`r_k < \\beta` (``exploration``), a *sampling* step
    otherwise. An exploration step injects no noise: SGLD and SGHMC then run at temperature 0, i.e. gradient
    descent and SGD with momentum with learning rate :math:`\\epsilon_k`, so the large steps of the cycle's
    start move the chain fast, without the noise that would make it wander, to (a new basin of) a mode;
    SGNHT keeps its thermostat's target :math:`T / N` (it has no optimiser limit). The sampling stage then
    samples that basin with small, decreasing steps. The draws of exploration steps are not samples (their
    dynamics has no noise) and are not returned (:class:`pyro_sgmcmc.MCMC` drops them and says so in its
    ``sample_stats``, ``sampling_stage``). See :ref:`cyclical` for the bias this leaves.

    The peak is :math:`\\epsilon_0 = F \\epsilon_b`: ``peak_factor`` :math:`F` (default 1) times the *base step*
    :math:`\\epsilon_b`, each chain's adapted step size where the warmup adapts it, ``peak`` otherwise. Before
    :math:`t_0` (warmup) the step size is the base step :math:`\\epsilon_b` = ``peak`` (where an adapting warmup
    starts). After :math:`K` sampling steps the cycles go on.

    Parameters
    ----------
    num_cycles : int
        :math:`M \\ge 1`.
    num_steps : int
        :math:`K \\ge M`, the run's sampling steps: ``num_samples * thinning`` of :class:`pyro_sgmcmc.MCMC`.
    exploration : float
        :math:`\\beta \\in [0, 1)`, the share of each cycle without noise (Zhang et al. use 0.8 to 0.95 for
        networks; 0: noise throughout, a cosine step-size schedule only). Default 0.5.
    peak : float
        The base step :math:`\\epsilon_b > 0`, as a float ``step_size`` is: with ``adapt_step_size=True`` (the
        kernels' default) only where the warmup starts, and the base of each chain's cycle is then *exactly its
        adapted step size* (the largest step the warmup judges stable and accurate for that chain), so that
        nothing needs tuning; with ``adapt_step_size=False`` (or no adaptation: ``temperature=0``, a short
        warmup) ``peak`` itself. Default 1e-3, the kernels' default step size.
    peak_factor : float
        :math:`F > 0`: the cycle's peak is :math:`F` times the base step. Default 1 (the peak is the adapted
        step). A stable peak does not throw a chain out of a mode's basin: to hop between separated modes the
        peak must exceed the stable step, i.e. :math:`F > 1` on defaults. On the mixture of 25 Gaussians
        (:doc:`/gallery/cyclical_mixture`), where the adapted step is a stable one, :math:`F = 1` never
        leaves the first mode, and only peaks near or beyond the stability limit of gradient descent in a
        mode cross to others (:math:`F = 20` there: 9.5 of the 25 modes per chain in 20 cycles); the same
        large steps widen the draws of each sampling stage's start (37 % more spread within a mode than the
        target's at :math:`F = 20`): larger peaks buy mode coverage with accuracy.
    start : int
        :math:`t_0`, the first sampling step; the kernel sets it to its ``warmup_steps``
        (:meth:`starting_at`). Default 0.

    Examples
    --------
    >>> schedule = Cyclical(num_cycles=2, num_steps=8, exploration=0.5, peak=1.0)
    >>> [round(schedule(t), 3) for t in range(8)]
    [1.0, 0.854, 0.5, 0.146, 1.0, 0.854, 0.5, 0.146]
    >>> [schedule.explores(t) for t in range(4)]
    [True, True, False, False]
    >>> [round(Cyclical(2, 8, 0.5, peak=1.0, peak_factor=3.0)(t), 3) for t in range(4)]
    [3.0, 2.561, 1.5, 0.439]

    With the default warmup the peak is each chain's adapted step size:
    ``SGHMC(model, step_size=Cyclical(num_cycles=4, num_steps=1000))`` with
    ``MCMC(kernel, num_samples=1000, ...)``.

    References
    ----------
    R. Zhang, C. Li, J. Zhang, C. Chen, A. G. Wilson. Cyclical stochastic gradient MCMC for Bayesian deep
    learning. ICLR 2020.
    """

    staged = True

    def __init__(
        self,
        num_cycles: int,
        num_steps: int,
        exploration: float = 0.5,
        peak: float = 1e-3,
        start: int = 0,
        peak_factor: float = 1.0,
    ) -> None:
        if isinstance(num_cycles, bool) or not isinstance(num_cycles, numbers.Integral) or num_cycles < 1:
            raise ValueError(f"Cyclical: num_cycles must be a positive integer; got {num_cycles!r}")
        if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < num_cycles:
            raise ValueError(
                f"Cyclical: num_steps (the sampling steps) must be an integer >= num_cycles ({num_cycles}); "
                f"got {num_steps!r}"
            )
        if isinstance(exploration, bool) or not isinstance(exploration, numbers.Real) or not 0 <= exploration < 1:
            raise ValueError(
                f"Cyclical: exploration must be in [0, 1) (the share of a cycle without noise); got {exploration!r}"
            )
        if not _is_positive_finite(peak):
            raise ValueError(f"Cyclical: peak must be positive and finite; got {peak!r}")
        if isinstance(start, bool) or not isinstance(start, numbers.Integral) or start < 0:
            raise ValueError(f"Cyclical: start must be a non-negative integer; got {start!r}")
        if not _is_positive_finite(peak_factor):
            raise ValueError(f"Cyclical: peak_factor must be positive and finite; got {peak_factor!r}")
        self.num_cycles, self.num_steps, self.exploration = int(num_cycles), int(num_steps), float(exploration)
        self.peak, self.start, self.peak_factor = float(peak), int(start), float(peak_factor)

    @property
    def cycle_length(self) -> int:
        """:math:`L = \\lceil K / M \\rceil` steps."""
        return -(-self.num_steps // self.num_cycles)

    def __call__(self, t: int):
        k = t - self.start
        if k < 0:
            return self.peak
        length = self.cycle_length
        return self.peak * (self.peak_factor * 0.5 * (math.cos(math.pi * (k % length) / length) + 1.0))

    def explores(self, t: int) -> bool:
        """Whether the step from counter ``t`` is an exploration step: :math:`r_k < \\beta` (never in warmup)."""
        k = t - self.start
        return k >= 0 and (k % self.cycle_length) < self.exploration * self.cycle_length

    def sampling_stage(self, t: int) -> bool:
        """Whether the step from counter ``t`` is a sampling step (after warmup, not exploring): its draw is kept."""
        return t >= self.start and not self.explores(t)

    def cycle(self, t: int) -> int:
        """The cycle (from 0) of the step from counter ``t``; -1 in warmup."""
        k = t - self.start
        return -1 if k < 0 else k // self.cycle_length

    def stage_stats(self, t: int, num_chains: int, device=None) -> Dict[str, torch.Tensor]:
        """``sampling_stage`` (bool: the draw is kept) and ``cycle`` (int64, -1 in warmup) of the step from ``t``."""
        return {
            "sampling_stage": torch.full((num_chains,), self.sampling_stage(t), device=device),
            "cycle": torch.full((num_chains,), self.cycle(t), dtype=torch.int64, device=device),
        }

    def starting_at(self, first_sampling_step: int) -> "Cyclical":
        """A copy whose cycles count from step ``first_sampling_step``."""
        return Cyclical(
            self.num_cycles, self.num_steps, self.exploration, self.peak, first_sampling_step, self.peak_factor
        )

    def with_peak(self, peak) -> "Cyclical":
        """A copy with base step ``peak`` (the cycle's peak is ``peak_factor`` times it): a number or the warmup's
        per-chain step sizes, a tensor ``(C, 1)`` (the schedule then gives a tensor of that shape)."""
        copy = self.starting_at(self.start)
        copy.peak = peak
        return copy

    def __repr__(self) -> str:
        return (
            f"Cyclical(num_cycles={self.num_cycles!r}, num_steps={self.num_steps!r}, "
            f"exploration={self.exploration!r}, peak={self.peak!r}, start={self.start!r}, "
            f"peak_factor={self.peak_factor!r})"
        )


class _CallableSchedule(Schedule):
    def __init__(self, fn: Callable[[int], float]) -> None:
        self.fn = fn

    def __call__(self, t: int) -> float:
        value = self.fn(t)
        try:
            real = float(value)
        except (TypeError, ValueError, OverflowError):
            real = math.nan
        if isinstance(value, bool) or not (math.isfinite(real) and real > 0):
            raise ValueError(f"step_size schedule gives step size {value!r} at t = {t}; it must be positive and finite")
        return real

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"CallableSchedule({getattr(self.fn, '__module__', '')}.{name})"


_NAMED = {"constant": Constant, "robbins_monro": RobbinsMonro, "cyclical": Cyclical}


def make_schedule(name: str, **kwargs) -> Schedule:
    """Build a schedule by name: ``"constant"`` (``value=``), ``"robbins_monro"`` (``a=, b=, gamma=``) or
    ``"cyclical"`` (``num_cycles=, num_steps=, exploration=, peak=, peak_factor=``)."""
    if not isinstance(name, str) or name not in _NAMED:
        raise ValueError(f"unknown step-size schedule {name!r}; accepted: {sorted(_NAMED)}")
    return _NAMED[name](**kwargs)


def as_schedule(step_size: Union[float, Schedule, Callable[[int], float]], argument: str = "step_size") -> Schedule:
    """Turn a float, a :class:`Schedule` or a callable ``t -> float`` into a validated schedule."""
    if isinstance(step_size, Schedule):
        schedule = step_size
    elif isinstance(step_size, bool) or isinstance(step_size, str):
        raise ValueError(
            f"{argument} must be a positive float, a Schedule (Constant, RobbinsMonro) or a callable t -> float; "
            f"got {step_size!r}"
            + (" (use make_schedule(name, ...) for named schedules)" if isinstance(step_size, str) else "")
        )
    elif isinstance(step_size, numbers.Real):
        if not _is_positive_finite(step_size):
            raise ValueError(f"{argument} must be positive and finite; got {step_size!r}")
        return Constant(step_size)
    elif callable(step_size):
        schedule = _CallableSchedule(step_size)
    else:
        raise ValueError(
            f"{argument} must be a positive float, a Schedule (Constant, RobbinsMonro) or a callable t -> float; "
            f"got {type(step_size).__name__}"
        )
    schedule.validate(argument)
    return schedule


def _is_positive_finite(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        real = float(value)
    except OverflowError:  # an int beyond the float range
        return False
    return math.isfinite(real) and real > 0
