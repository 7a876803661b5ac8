"""The shared :class:`~pyro.infer.mcmc.mcmc_kernel.MCMCKernel` shell of the SG-MCMC kernels.

A concrete kernel (SGLD, SGHMC, SGNHT) only says how to start its auxiliary state
(:meth:`SGMCMCKernel._init_auxiliary`) and how to take one step given the normalised drift
(:meth:`SGMCMCKernel._transition`, a call into :mod:`pyro_sgmcmc.kernels.diffusions`; the step passes
the potential's gradient with ``drift_scale = -1/N``, and for large chains ``out`` buffers the update
may write into).
Everything else lives here: model set-up, per-chain random streams and minibatches, temperature,
step-size schedule, divergence handling, statistics, and the Pyro ``MCMC`` protocol.

Chains. The state always carries a leading chain axis: ``position`` is ``(num_chains, dim)``.
Under :class:`pyro.infer.MCMC` a kernel runs one chain at a time (``num_chains = 1``, Pyro's
``setup``/``sample`` protocol); :class:`pyro_sgmcmc.MCMC` with ``chain_method="vectorized"`` calls
:meth:`SGMCMCKernel.setup_chains` and :meth:`SGMCMCKernel.step` to advance all chains together,
each with its own noise and minibatches (:class:`~pyro_sgmcmc.chains.streams.ChainGenerators`,
:class:`~pyro_sgmcmc.chains.minibatch.MinibatchSampler`).

Step order. Set-up evaluates the potential :math:`U` and its gradient at the initial point. Each
step then (1) draws the injected noise, (2) moves with the gradient cached from the previous
evaluation, (3) draws the next minibatch and evaluates :math:`U` and :math:`\\nabla U` at the new
point, caching them. One model evaluation per step; the reported ``lp = -U`` belongs to the
returned draw. If step (3) gives a non-finite potential or gradient, the step is a *divergence*
for that chain and is recorded (``divergences``, ``divergence_log`` with the sites at fault, and the
``num_divergences`` statistic); then, by ``on_divergence``: ``"restart"`` (default) puts the chain
back at its last finite state with zero momentum and lets it go on; ``"freeze"`` stops that chain
for the rest of the run (its draws repeat its last finite state); ``"raise"`` raises
:class:`DivergenceError` naming the step, the chains and the sites. Other chains are unaffected.
"""

from __future__ import annotations

import math
import numbers
import warnings
import weakref
from collections import OrderedDict
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ..chains.minibatch import MinibatchSampler
from ..chains.streams import ChainGenerators
from ..model.potential import JitMode, ModelPotential, check_jit_compile
from ..schedules import Constant, Schedule, as_schedule
from .control_variates import ControlVariate
from .preconditioning import DENSE_MAX_DIM, MassMatrixAdaptation
from .warmup import (
    AUTO_CONTROL_VARIATE_EPOCH,
    AUTO_MAP_ITERATIONS,
    CENTRE_TOLERANCE,
    CONTROL_VARIATE_GAIN,
    MIN_ADAPTATION_WARMUP,
    PRELIMINARY_MAP_ITERATIONS,
    SLOW_MIXING_FRACTION,
    JumpMonitor,
    TypicalSetSearch,
    approach_length,
    gradient_variance,
)

__all__ = ["SGMCMCState", "SGMCMCKernel", "DivergenceError", "DivergenceWarning", "SlowMixingWarning"]


class DivergenceError(RuntimeError):
    """Raised with ``on_divergence="raise"`` when a step diverges (non-finite, or a jump of the potential)."""


class DivergenceWarning(RuntimeWarning):
    """Warned at the end of a run in which some step diverged."""


class SlowMixingWarning(RuntimeWarning):
    """Warned at the end of warmup when an adapted step size is too small for the chain to have mixed."""


# torch's count of references to a storage (tensors, views, storage objects); private, so optional
_STORAGE_USE_COUNT: Optional[Callable[[int], int]] = getattr(torch._C, "_storage_Use_Count", None)


class _Spare:
    """A state tensor of the previous step, held so that its memory can take the next step's values.

    Holds a weak reference to the tensor and a reference to its storage. :meth:`take` gives the memory
    back as a tensor of the same shape only if the tensor is gone (no one keeps it, nor a view of it:
    a view refers to its base) and the storage has no other user than this object; otherwise ``None``,
    and the step allocates as usual. So nothing anyone can still read is ever written.
    """

    __slots__ = ("ref", "storage", "shape", "dtype", "device")

    def __init__(self, tensor: torch.Tensor, storage) -> None:
        self.ref = weakref.ref(tensor)
        self.storage = storage
        self.shape, self.dtype, self.device = tensor.shape, tensor.dtype, tensor.device

    @classmethod
    def of(cls, tensor: Optional[torch.Tensor]) -> "Optional[_Spare]":
        """A spare for a plain tensor that owns its whole storage (not a view, contiguous, no autograd)."""
        if tensor is None or tensor._base is not None or tensor.requires_grad or not tensor.is_contiguous():
            return None
        storage = tensor.untyped_storage()
        if tensor.storage_offset() != 0 or storage.nbytes() != tensor.numel() * tensor.element_size():
            return None
        return cls(tensor, storage)

    def take(self) -> Optional[torch.Tensor]:
        if self.ref() is not None or _STORAGE_USE_COUNT(self.storage._cdata) != 1:
            return None
        return torch.empty(0, dtype=self.dtype, device=self.device).set_(self.storage, 0, self.shape)


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
    """

    position: torch.Tensor
    momentum: Optional[torch.Tensor]
    thermostat: Optional[torch.Tensor]
    potential: torch.Tensor
    grad: torch.Tensor
    step: int


_INITIAL_MOMENTA = ("zero", "stationary")
_ON_DIVERGENCE = ("restart", "freeze", "raise")


_NUTS_ONLY_ARGUMENTS = {
    "target_accept_prob": (
        "there is no Metropolis acceptance step. With adapt_step_size=True (the default) the warmup sets each "
        "chain's step from the curvature and the minibatch gradient noise (docs/preconditioning.rst); pass "
        "step_size= with adapt_step_size=False for a fixed step."
    ),
    "max_tree_depth": "there are no trajectories to build: every step is one gradient evaluation.",
    "trajectory_length": "there are no trajectories to build: every step is one gradient evaluation.",
    "num_steps": "there are no trajectories to build: every step is one gradient evaluation.",
}


class SGMCMCKernel(MCMCKernel):
    """Base class of the stochastic-gradient kernels; see :class:`~pyro_sgmcmc.SGLD` for the arguments."""

    #: Builds the potential as ``potential_factory(model, args, kwargs, init_strategy=..., num_data=...,
    #: jit_compile=...)``:
    #: a hook (:func:`pyro_sgmcmc.distributed.data_parallel` puts an all-reduced potential here).
    potential_factory: Callable = ModelPotential
    #: Chains whose positions take at least this many bytes reuse the memory of the state of two steps
    #: back for the new position and momentum, once nothing else refers to it (see :meth:`step`). Below
    #: it the allocator's own reuse is as cheap as the check (a few microseconds per step); from 256 KiB
    #: on, glibc serves blocks from fresh pages often enough for the reuse to pay.
    RECYCLE_MIN_BYTES: int = 2**18

    def __new__(cls, *args, **kwargs):
        # Arguments of Pyro's HMC/NUTS that have no meaning here: a clear error instead of Python's bare
        # "unexpected keyword argument" (checked before __init__, so every kernel's signature stays explicit).
        for name, reason in _NUTS_ONLY_ARGUMENTS.items():
            if name in kwargs:
                raise TypeError(f"{cls.__name__}: {name} is an argument of Pyro's HMC/NUTS, not of SG-MCMC: {reason}")
        return super().__new__(cls)

    def __init__(
        self,
        model: Callable,
        step_size: Union[None, float, Schedule, Callable[[int], float]] = None,
        temperature: float = 1.0,
        num_data: Optional[int] = None,
        init_strategy: Callable = init_to_uniform,
        on_divergence: str = "restart",
        *,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        full_mass: Optional[bool] = None,
        control_variate="auto",
        start_at_centre: bool = False,
        jit_compile: JitMode = "auto",
    ) -> None:
        if not callable(model):
            raise ValueError(f"model must be a callable Pyro model; got {type(model).__name__}")
        self.model = model
        self.step_size = as_schedule(1e-3 if step_size is None else step_size, "step_size")  # checks the value first
        self._init_preconditioning(step_size, adapt_step_size, adapt_mass_matrix, full_mass, control_variate)
        self.start_at_centre = _start_at_centre(start_at_centre, control_variate)
        self._chain_step_size: Optional[torch.Tensor] = None  # (C, 1) once the warmup has adapted them
        self.temperature = _non_negative(
            temperature, "temperature", "T = 1 is the posterior, 0 < T < 1 a cold posterior, T = 0 optimisation"
        )
        if num_data is not None and (isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1):
            raise ValueError(f"num_data must be a positive integer (the number of data N) or None; got {num_data!r}")
        self.num_data = num_data
        if not callable(init_strategy):
            raise ValueError(
                f"init_strategy must be a Pyro init strategy (e.g. init_to_uniform); got {init_strategy!r}"
            )
        self.init_strategy = init_strategy
        self.on_divergence = _choice(on_divergence, "on_divergence", _ON_DIVERGENCE)
        self.jit_compile = check_jit_compile(jit_compile)

        self.transforms = None
        self.potential: Optional[ModelPotential] = None
        self.state: Optional[SGMCMCState] = None
        self.generators: Optional[ChainGenerators] = None
        self.minibatches: Optional[MinibatchSampler] = None
        self._model_key = None
        self._initial_params: Optional[Dict[str, torch.Tensor]] = None
        self._params: Optional[Dict[str, torch.Tensor]] = None
        self._warmup_steps = 0
        self._divergences: List[List[int]] = []
        self._num_warmup_divergences: Optional[torch.Tensor] = None
        self._last_step_size = float("nan")
        self._last_diverging: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ Pyro protocol (one chain)
    @property
    def initial_params(self) -> Optional[Dict[str, torch.Tensor]]:
        """Unconstrained starting values ``{site: tensor}``; after ``setup``, the ones in use."""
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Optional[Dict[str, torch.Tensor]]) -> None:
        self._initial_params = params

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Pyro's protocol: set up one chain for ``model(*args, **kwargs)``.

        The chain's random stream is seeded from torch's global generator, so
        ``pyro.set_rng_seed`` makes runs reproducible (and Pyro's multiprocess workers, which
        seed themselves differently, get different streams).
        """
        initial = None
        if self._initial_params is not None:  # validated without the chain axis, so errors show the site's shape
            potential = self._ensure_potential(args, kwargs)
            initial = potential.unpack(potential.pack(self._initial_params).unsqueeze(0))
        self.setup_chains(warmup_steps, args, kwargs, num_chains=1, initial_params=initial)
        self._initial_params = self._params = self.potential.unpack(self.state.position[0])

    def cleanup(self) -> None:
        """Pyro's protocol: forget the initial parameters so the next chain of a sequential run starts afresh."""
        # The next chain of a sequential multi-chain run starts afresh (from its own
        # initial_params, set by pyro.infer.MCMC, or from init_strategy).
        self._initial_params = None
        self.warn_divergences()

    def warn_divergences(self) -> None:
        """Warn, naming the counts, if any step of the run diverged (``pyro.infer.MCMC`` and
        :class:`~pyro_sgmcmc.MCMC` call it at the end of each run)."""
        if self.state is None or self._divergence_count == 0:
            return
        sampling = sum(len(d) for d in self._divergences)
        warmup = int(self._num_warmup_divergences.sum())
        kinds = sorted(
            {record[3].split(" (")[0].split(" of site")[0].split(" by ")[0] for record in self.divergence_log}
        )
        if sampling:
            consequence = "the draws may not represent the posterior; a longer warmup or a smaller step_size may help"
        else:  # warmup only: the adaptation halved the step of the chains concerned, sampling was clean
            consequence = "none while sampling" + (
                " (each halved that chain's adapted step size)" if self._adaptation is not None else ""
            )
        chain, step, _, first = self.divergence_log[0]
        warnings.warn(
            f"{type(self).__name__}: {sampling} divergent step(s) while sampling and {warmup} in warmup "
            f"({'; '.join(kinds[:3])}; the first, chain {chain} at step {step}: {first}): {consequence}. "
            "See diagnostics() and divergence_log.",
            DivergenceWarning,
            stacklevel=2,
        )

    def sample(self, params: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Pyro's protocol: one step of the single chain from ``params`` (unconstrained)."""
        if params is not self._params:  # moved by the caller: re-evaluate at the given point
            position = self.potential.pack(params).unsqueeze(0)
            potential, grad = self._evaluate(position, self.minibatches.next())
            self.state = self.state._replace(position=position, potential=potential, grad=grad)
        self.step()
        self._params = self.potential.unpack(self.state.position[0])
        return self._params

    def logging(self) -> "OrderedDict[str, str]":
        """Shown in the progress bar: step size, mean minibatch log density, divergences so far."""
        return OrderedDict(
            [
                ("phase", self.phase),
                ("step size", f"{_mean(self._last_step_size):.2e}"),
                ("lp", f"{-_mean(self.state.potential):.4g}"),
                ("div", str(self.num_divergences)),
            ]
        )

    def diagnostics(self) -> dict:
        """Pyro's protocol (first chain): ``divergences`` holds the indices of the divergent *draws*."""
        return self.chain_diagnostics(0)

    def chain_diagnostics(self, chain: int) -> dict:
        """Chain ``chain``'s divergences (indices of the divergent *draws*), warmup divergences, final step
        size, and the warmup's statistics: its phases' lengths, the approach's refused steps, the adapted
        inverse mass matrix's diagonal and the sampling phase's jump threshold (``kernels/warmup.py``)."""
        out = {
            "divergences": list(self._divergences[chain]),
            "warmup divergences": int(self._num_warmup_divergences[chain]),
            "step size": _chain_value(self._last_step_size, chain),
        }
        if self._adaptation is not None:
            approach = self._approach
            out["approach steps"] = 0 if approach is None else approach.num_steps
            out["approach rejections"] = 0 if approach is None else int(approach.rejections[chain])
            out["adaptation steps"] = self._adaptation.warmup_steps
            halvings = self._adaptation.total_halvings
            out["step size halvings"] = 0 if halvings is None else int(halvings[chain])
            inverse_mass = self.inverse_mass_matrix
            if inverse_mass is not None:
                diagonal = inverse_mass[chain].diagonal() if inverse_mass.dim() == 3 else inverse_mass[chain]
                out["inverse mass matrix diagonal"] = diagonal.detach().cpu()
        out["control variate"] = self._control_variate is not None
        if self._jump_threshold is not None:
            out["jump threshold"] = float(self._jump_threshold[chain])
        return out

    # ------------------------------------------------------------------ many chains
    def setup_chains(
        self,
        warmup_steps: int,
        args: tuple = (),
        kwargs: Optional[dict] = None,
        *,
        num_chains: int = 1,
        initial_params: Optional[Dict[str, torch.Tensor]] = None,
        num_superchains: Optional[int] = None,
        seed: Optional[int] = None,
        chain_ids: Optional[Sequence[int]] = None,
    ) -> None:
        """Set up ``num_chains`` chains that advance together.

        Everything that does not depend on the draw (sites, transforms, plates, ``N``, the noise
        temperature :math:`T / N`, the vectorised gradient function) is computed here, once.

        Parameters
        ----------
        warmup_steps : int
            Burn-in steps (divergences there are counted apart).
        args, kwargs :
            The model's arguments.
        num_chains : int
            Number of chains.
        initial_params : dict, optional
            Unconstrained starting values with a leading axis of size ``num_chains`` (one per
            chain) or ``num_superchains`` (one per superchain).
        num_superchains : int, optional
            ``K`` distinct starting points, each shared by ``num_chains / K`` consecutive chains
            (which then differ only by their noise and minibatches). Default: every chain starts
            from its own point.
        seed : int, optional
            Seed of the per-chain random streams; by default drawn from torch's global generator.
        chain_ids : sequence of int, optional
            Global ids of these chains (stream ``c`` depends only on ``(seed, c)``); default
            ``range(num_chains)``.
        """
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a non-negative integer; got {warmup_steps!r}")
        if isinstance(num_chains, bool) or not isinstance(num_chains, int) or num_chains < 1:
            raise ValueError(f"num_chains must be a positive integer; got {num_chains!r}")
        num_superchains = num_chains if num_superchains is None else num_superchains
        if isinstance(num_superchains, bool) or not isinstance(num_superchains, int) or num_superchains < 1:
            raise ValueError(f"num_superchains must be a positive integer; got {num_superchains!r}")
        if num_chains % num_superchains:
            raise ValueError(f"num_chains={num_chains} must be a multiple of num_superchains={num_superchains}")
        self._warmup_steps = warmup_steps
        potential = self._ensure_potential(args, kwargs)
        self.transforms = potential.transforms
        self.noise_temperature = self.temperature / potential.num_data
        self._inverse_num_data = 1.0 / potential.num_data

        self.generators = ChainGenerators(seed, range(num_chains) if chain_ids is None else chain_ids, potential.device)
        if len(self.generators) != num_chains:
            raise ValueError(f"chain_ids has {len(self.generators)} entries for num_chains={num_chains}")
        self.minibatches = MinibatchSampler(potential.subsample_plates, self.generators)
        self.superchain_ids = torch.arange(num_chains) // (num_chains // num_superchains)

        positions = self._initial_positions(initial_params, num_chains, num_superchains)
        self._setup_control_variate(positions)
        if self.start_at_centre:  # Baker et al. (2019) start SGLD-CV at the MAP: burn-in then only spreads the chains
            positions = self._control_variate.centre.expand(num_chains, -1).clone()
        energy, grad = self._evaluate(positions, self.minibatches.next())
        momentum, thermostat = self._init_auxiliary(positions)
        self.state = SGMCMCState(positions, momentum, thermostat, energy, grad, 0)
        # the step's noise buffer (no step keeps its noise): T = 0 draws none
        self._noise = torch.empty_like(positions) if self.noise_temperature > 0 else None
        self._spares: Optional[tuple] = None
        self._setup_adaptation(warmup_steps)
        # large chains reuse the memory of the state of two steps back once no one refers to it (see step);
        # the preconditioned update (adaptation) makes its own tensors
        self._recycle = (
            _STORAGE_USE_COUNT is not None
            and (self._adaptation is None or not self._adaptation.preconditioned)
            and positions.numel() * positions.element_size() >= self.RECYCLE_MIN_BYTES
        )
        self._divergences = [[] for _ in range(num_chains)]
        self._num_warmup_divergences = torch.zeros(num_chains, dtype=torch.long, device=positions.device)
        self._num_divergences = torch.zeros(num_chains, dtype=torch.long, device=positions.device)
        self._frozen: Optional[torch.Tensor] = None  # chains stopped by on_divergence="freeze"
        self.divergence_log: List[tuple] = []
        # no chain diverged (never modified in place: a step without divergence shares it, allocating nothing)
        self._no_divergence = torch.zeros(num_chains, dtype=torch.bool, device=positions.device)
        self._last_diverging = self._no_divergence
        self._divergence_count = 0  # num_divergences, kept as a Python int (read at every step by logging())
        self._last_step_size = self.step_size(0)

    def step(self) -> SGMCMCState:
        """Advance every chain by one step (the hot path: no set-up work here).

        The new state is made of new tensors, except that for large chains (positions of at least
        :attr:`RECYCLE_MIN_BYTES`, no adapted mass matrix) the position and momentum are written into
        the memory of those of two steps back *when nothing outside the kernel refers to them any more*
        (no tensor, view or state kept by anyone: see ``_Spare``). A state, tensor or view you keep is
        never overwritten. Large tensors freed and allocated again at every step cost a page fault per
        4 KiB page.
        """
        state = previous = self.state
        if self._approach is not None and state.step < self._approach.num_steps:
            return self._approach_step(state)
        step_size = self.step_size(state.step) if self._chain_step_size is None else self._chain_step_size
        # the noise is drawn into the kernel's own buffer (no step keeps it), and the drift -grad U / N is
        # scaled inside the update's pass (drift_scale): no new tensor of the chains' size for either
        noise = self.generators.fill_normal(self._noise) if self._noise is not None else None
        if self._adaptation is None or not self._adaptation.preconditioned:
            out = self._take_spares() if self._spares is not None else None
            position, momentum, thermostat = self._transition(
                state, state.grad, step_size, noise, -self._inverse_num_data, out
            )
        else:  # preconditioned: the same update in w = L^-1 z (see kernels/preconditioning.py)
            position, momentum, thermostat = self._adaptation.transition(
                self, state, state.grad, step_size, noise, -self._inverse_num_data
            )
        indices = self.minibatches.next()
        energy, grad = self._evaluate(position, indices)
        # A sum is finite only if every term is: one reduction (no temporary) and one read settle the usual
        # case. A sum that overflows, or a non-finite term, takes the exact check. In sampling, a jump of
        # the potential past the chain's threshold (kernels/warmup.py) is a divergence too: one more read.
        threshold = self._jump_threshold
        if (
            self._frozen is None
            and math.isfinite(float(grad.sum() + (energy if energy.numel() == 1 else energy.sum())))
            and (threshold is None or not float((energy - state.potential - threshold).max()) > 0)
        ):
            finite = None
        else:
            finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1)
            if threshold is not None:
                finite = finite & ~(energy - state.potential > threshold)
        if finite is None or (self._frozen is None and bool(finite.all())):
            state = SGMCMCState(position, momentum, thermostat, energy, grad, state.step + 1)
            self._last_diverging = self._no_divergence
        else:  # sets _last_diverging: the chains that diverged at this step (a frozen chain only once)
            state = self._reject_divergent(state, finite, position, momentum, thermostat, energy, grad, indices)
        self.state = state
        self._last_step_size = step_size
        if self._recycle:
            self._spares = (_Spare.of(previous.position), _Spare.of(previous.momentum))
        if state.step <= self._warmup_steps:  # warmup only: nothing of this runs while sampling
            self._warmup_bookkeeping(previous, state)
        return state

    def _warmup_bookkeeping(self, previous: SGMCMCState, state: SGMCMCState) -> None:
        """Measure the potential's step-to-step changes, adapt, halve the step size after a divergence
        in adaptation, and freeze the jump threshold at the end of warmup."""
        jumps = self._jumps
        diverged = bool(self._last_diverging.any())
        if not diverged:
            jumps.record(state.step, state.potential - previous.potential)
        if self._adapting:
            if diverged and self._adaptation.adapt_step_size:
                self._adaptation.shrink_step_size(self._last_diverging)
                self._sync_step_size()
            self._adapt(state)
            # in adaptation a jump past the running threshold is a divergence too: the chain is put back
            # and its step halved, so a step that is unstable under the current metric cannot throw it away
            self._jump_threshold = jumps.running_threshold()
        if state.step == self._warmup_steps:
            self._jump_threshold = jumps.threshold()
            if self._adaptation is not None:
                self._warn_slow_mixing()
            self._freeze_step_size()

    def _warn_slow_mixing(self) -> None:
        """Warn when an adapted step is so small that a chain needs more steps to forget its state than the
        adaptation phase had: it has probably not reached the posterior, and will mix slowly while sampling.

        One relaxation time of the preconditioned dynamics (normalised curvature about 1) is about
        :math:`2 / (\\epsilon \\alpha)` steps for SGHMC and SGNHT (friction / diffusion :math:`\\alpha`) and
        :math:`1 / \\epsilon` for SGLD; the warning is given when it exceeds ``SLOW_MIXING_FRACTION`` of the
        adaptation phase. The usual cause is gradient noise (a small minibatch of many data): a larger
        ``subsample_size`` helps, or a control variate where the posterior is concentrated (the advice says
        whether the automatic one was measured and rejected)."""
        step_size = self._chain_step_size
        if step_size is None:
            return
        damping = (
            getattr(self, "friction", getattr(self, "diffusion", None)) if self.state.momentum is not None else None
        )
        per_chain = torch.as_tensor(step_size).reshape(-1).double()
        relaxation = 2.0 / (per_chain * damping) if damping else 1.0 / per_chain
        limit = SLOW_MIXING_FRACTION * self._adaptation.warmup_steps
        slow = (relaxation > limit).nonzero().flatten().tolist()
        if slow:
            worst = float(relaxation.max())
            warnings.warn(
                f"{type(self).__name__}: the adapted step size of chain(s) {slow[:8]} is at most "
                f"{float(per_chain.min()):.3g}, so a chain needs about {worst:.3g} steps to forget its state, more "
                f"than {SLOW_MIXING_FRACTION:g} of the {self._adaptation.warmup_steps} adaptation steps: it has "
                f"probably not reached the posterior and will mix slowly. Usually the minibatch gradient noise "
                f"limits the step: {self._slow_mixing_advice()}",
                SlowMixingWarning,
                stacklevel=3,
            )

    def _slow_mixing_advice(self) -> str:
        if self._control_variate is not None:
            return "a larger subsample_size or a longer warmup will help."
        if self._control_variate_rejected:
            return (
                "a larger subsample_size or a longer warmup will help (the automatic control variate was measured "
                "and did not lower the noise: the posterior is not concentrated around one mode)."
            )
        return "a larger subsample_size, control_variate='map', or a longer warmup will help."

    def _freeze_step_size(self) -> None:
        """After warmup one chain's adapted step size becomes a number: the update's scalar (fused) path."""
        step_size = self._chain_step_size
        if torch.is_tensor(step_size) and step_size.numel() == 1:
            self._chain_step_size = float(step_size)

    def _take_spares(self) -> Optional[tuple]:
        """``(position buffer, momentum buffer)`` from two steps back, each ``None`` unless no one else
        refers to it; ``None`` if neither is free."""
        position, momentum = self._spares
        self._spares = None
        buffers = (position.take() if position is not None else None, momentum.take() if momentum is not None else None)
        return None if buffers == (None, None) else buffers

    def state_dict(self) -> dict:
        """Everything needed to continue these chains exactly: state, random streams, minibatch
        cursors, divergence records. Tensors are moved to the CPU (load puts them back)."""
        state = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in self.state._asdict().items()}
        return {
            "state": state,
            "generators": [g.cpu() for g in self.generators.get_state()],
            "seed": self.generators.seed,
            "chain_ids": list(self.generators.chain_ids),
            "minibatches": self.minibatches.state_dict(),
            "divergences": [list(d) for d in self._divergences],
            "num_warmup_divergences": self._num_warmup_divergences.clone(),
            "num_divergences": self._num_divergences.clone(),
            "frozen": None if self._frozen is None else self._frozen.clone(),
            "divergence_log": list(self.divergence_log),
            "last_step_size": self._last_step_size,
            "last_diverging": self._last_diverging.clone(),
            **self._preconditioning_state_dict(),
        }

    def load_state_dict(self, saved: dict) -> None:
        """Restore :meth:`state_dict` into chains set up with :meth:`setup_chains` on the same model."""
        device = self.state.position.device
        fields = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in saved["state"].items()}
        if fields["position"].shape != self.state.position.shape:
            raise ValueError(
                f"saved chains have positions of shape {tuple(fields['position'].shape)}, these have "
                f"{tuple(self.state.position.shape)}"
            )
        self.state = SGMCMCState(**fields)
        self._spares = None
        self.generators = ChainGenerators(saved["seed"], saved["chain_ids"], device)
        self.generators.set_state(saved["generators"])
        self.minibatches = MinibatchSampler(self.potential.subsample_plates, self.generators)
        self.minibatches.load_state_dict(saved["minibatches"])
        self._divergences = [list(d) for d in saved["divergences"]]
        self._num_warmup_divergences = saved["num_warmup_divergences"].to(device)
        self._num_divergences = saved["num_divergences"].to(device)
        self._divergence_count = int(self._num_divergences.sum())
        self._frozen = None if saved["frozen"] is None else saved["frozen"].to(device)
        self.divergence_log = list(saved["divergence_log"])
        self._last_step_size = saved["last_step_size"]
        self._last_diverging = saved["last_diverging"].to(device)
        self._load_preconditioning_state_dict(saved, device)

    @property
    def num_divergences(self) -> int:
        """Divergences so far, over all chains, warmup included."""
        # each diverging chain-step is counted once, in _divergences (sampling) or the warmup count
        return self._divergence_count

    @property
    def divergences(self) -> List[List[int]]:
        """Per chain, the indices of the divergent draws (sampling phase)."""
        return self._divergences

    # ------------------------------------------------------------------ preconditioning, control variates
    # (the machinery is in preconditioning.py and control_variates.py; these are the hooks)
    def _init_preconditioning(self, step_size, adapt_step_size, adapt_mass_matrix, full_mass, control_variate) -> None:
        if not isinstance(adapt_step_size, bool):
            raise TypeError(f"adapt_step_size must be True or False; got {adapt_step_size!r}")
        if not isinstance(adapt_mass_matrix, bool):
            raise TypeError(f"adapt_mass_matrix must be True or False; got {adapt_mass_matrix!r}")
        if full_mass is not None and not isinstance(full_mass, bool):
            raise TypeError(f"full_mass must be None (dense for dim <= 64), True or False; got {full_mass!r}")
        if full_mass and not adapt_mass_matrix:
            raise ValueError("full_mass=True needs adapt_mass_matrix=True (the dense mass matrix is adapted in warmup)")
        if adapt_step_size and step_size is not None and not isinstance(step_size, (numbers.Real, Constant)):
            raise ValueError(
                "a step-size schedule cannot be adapted: pass adapt_step_size=False with a schedule or callable "
                f"step_size, or a float (the initial step size) with adapt_step_size=True; got {step_size!r}"
            )
        if control_variate is not None and not isinstance(control_variate, (str, Mapping)):
            raise TypeError(
                "control_variate must be 'auto', None, 'map' or a dict {site: constrained value}; "
                f"got {type(control_variate).__name__}"
            )
        if isinstance(control_variate, str) and control_variate not in ("auto", "map"):
            raise ValueError(f"control_variate must be 'auto', None, 'map' or a dict; got {control_variate!r}")
        self.adapt_step_size = adapt_step_size
        self.adapt_mass_matrix = adapt_mass_matrix
        self.full_mass = full_mass
        self.control_variate = control_variate
        self._adaptation: Optional[MassMatrixAdaptation] = None
        self._approach: Optional[TypicalSetSearch] = None
        self._jumps: Optional[JumpMonitor] = None
        self._jump_threshold: Optional[torch.Tensor] = None
        self._adapting = False
        self._control_variate: Optional[ControlVariate] = None
        self._auto_control_variate_cache: Optional[ControlVariate] = None
        self._control_variate_candidate: Optional[ControlVariate] = None
        self._control_variate_rejected = False  # "auto" measured its candidate and did not keep it

    def _evaluate(self, positions: torch.Tensor, indices):
        """Minibatch potential and gradient at ``positions``: plain, or control-variate centred."""
        if self._control_variate is None:
            return self.potential.batched_potential_and_grad(positions, indices)
        return self._control_variate(positions, indices)

    def _setup_control_variate(self, positions: torch.Tensor) -> None:
        if self.control_variate is None or self.control_variate == "auto":  # "auto": decided after the approach
            self._control_variate = None
        else:  # computed once per data set (sequential chains on the same data reuse it)
            cached = self._control_variate
            if cached is None or cached.potential is not self.potential:
                self._control_variate = ControlVariate(self.potential, self.control_variate, positions[0])

    @property
    def adapts(self) -> bool:
        """Whether set-up runs the three-phase warmup (``kernels/warmup.py``): an adaptation flag is on and
        ``temperature > 0`` (at ``T = 0`` there is no posterior to adapt to: the kernel is an optimiser
        with the given step size)."""
        return (self.adapt_step_size or self.adapt_mass_matrix) and self.temperature > 0

    def _setup_adaptation(self, warmup_steps: int) -> None:
        position = self.state.position
        self._jumps = JumpMonitor(warmup_steps, position.shape[0], position.device)
        self._control_variate_candidate = None
        self._control_variate_rejected = False
        self._jump_threshold = None
        self._approach = None
        if not (self.adapts and warmup_steps >= MIN_ADAPTATION_WARMUP):
            self._adaptation, self._adapting = None, False
            self._chain_step_size = None
            return
        self._chain_step_size = None  # a new run starts from the user's step size
        dense = self.full_mass if self.full_mass is not None else position.shape[-1] <= DENSE_MAX_DIM
        approach = approach_length(warmup_steps)
        self._adaptation = MassMatrixAdaptation(
            warmup_steps - approach,
            dense and self.adapt_mass_matrix,
            self.adapt_step_size,
            self.state.momentum is not None,
            self.temperature,
            thermostat=self.state.thermostat is not None,
            adapt_mass_matrix=self.adapt_mass_matrix,
            offset=approach,
        )
        self._adapting = True
        if approach > 0:
            self._approach = TypicalSetSearch(approach, position)
        else:
            self._start_adaptation()

    def _start_adaptation(self) -> None:
        """End of the approach: the chains start moving, at rest, under the first metric and step size."""
        if self.state.momentum is not None:
            self.state = self.state._replace(momentum=torch.zeros_like(self.state.momentum))
        if self.control_variate == "auto":
            self._auto_control_variate()
        self._adaptation.setup(self, self.state.position)
        self._sync_step_size()

    def _auto_control_variate(self) -> None:
        """``control_variate="auto"`` (``kernels/warmup.py``), at the end of the approach: with one subsampled
        plate whose epoch is at least ``AUTO_CONTROL_VARIATE_EPOCH`` minibatches, a *candidate* control variate
        centred where ``PRELIMINARY_MAP_ITERATIONS`` L-BFGS iterations on the full data take the approach's best
        point (a few full-data passes); :meth:`_decide_control_variate` measures it at the end of the initial
        buffer. A refined candidate (at the MAP) from an earlier run on the same data is reused as it is."""
        plates = self.minibatches.plates
        if len(plates) != 1 or plates[0].size < AUTO_CONTROL_VARIATE_EPOCH * plates[0].subsample_size:
            return
        cached = self._auto_control_variate_cache
        if cached is not None and cached.potential is self.potential:
            self._control_variate_candidate = cached
            return
        state = self.state
        finite = torch.isfinite(state.potential)
        best = int(torch.where(finite, state.potential, torch.full_like(state.potential, math.inf)).argmin())
        try:
            self._control_variate_candidate = ControlVariate(
                self.potential, "map", state.position[best], max_iter=PRELIMINARY_MAP_ITERATIONS, rounds=1
            )
        except ValueError:  # the full-data potential is not finite there: plain minibatches
            pass

    def _decide_control_variate(self) -> None:
        """Keep the candidate control variate if, at the chains' points after the initial buffer (spread out
        from the mode by then), it divides the largest per-coordinate gradient variance by more than
        ``1 / CONTROL_VARIATE_GAIN`` for the median chain: the noise-limited step grows in proportion, and
        a step with it costs two minibatch evaluations. (Far from its centre, in a posterior that is not
        concentrated, such as a small network's, it is *noisier* than plain minibatches.)

        A preliminary candidate (a few L-BFGS iterations from the approach) is measured first. If its ratio is
        between ``CONTROL_VARIATE_GAIN`` and 1, its centre moves on towards the full-data MAP in stages of twice
        as many iterations (10, 20, 40, 80), each measured again, while each lowers the ratio by more than 10 %.
        For a concentrated posterior the variance at a chain's point ``z`` grows as ``|z - c|^2``, which on
        average over the chains is smallest at the mode, so the stages lower it; for a posterior that is not
        concentrated (a network's), the mode can be far from where the chains are and moving towards it makes
        the control variate worse: the search stops there instead of spending hundreds of full-data passes.
        A candidate below ``CONTROL_VARIATE_GAIN`` is then centred at the mode (L-BFGS to within
        ``CENTRE_TOLERANCE`` of the chains' ``T d / 2`` nats) and measured again: kept if still below (and
        reused by later sequential chains on the same data); a mode far from where the chains are (a
        network's) is rejected there."""
        candidate, self._control_variate_candidate = self._control_variate_candidate, None
        position = self.state.position
        self._control_variate = None
        plain = gradient_variance(self._evaluate, position, self.minibatches).amax(-1)
        plain = plain.clamp_min(torch.finfo(plain.dtype).tiny)

        def ratio(control_variate: ControlVariate) -> float:
            self._control_variate = control_variate
            centred = gradient_variance(self._evaluate, position, self.minibatches).amax(-1)
            self._control_variate = None
            return float((centred / plain).median())

        best = ratio(candidate)
        if candidate is not self._auto_control_variate_cache:  # preliminary: does a centre nearer the MAP help?
            tolerance = CENTRE_TOLERANCE * self.temperature * position.shape[-1] / 2  # of the chains' T d / 2
            iterations = PRELIMINARY_MAP_ITERATIONS
            while CONTROL_VARIATE_GAIN <= best < 1.0 and 2 * iterations <= AUTO_MAP_ITERATIONS:
                iterations *= 2
                try:
                    moved = ControlVariate(
                        self.potential, "map", candidate.centre, max_iter=iterations, rounds=1,
                        potential_tolerance=tolerance,
                    )  # fmt: skip
                except ValueError:
                    break
                measured = ratio(moved)
                improved = measured < 0.9 * best
                if measured < best:
                    candidate, best = moved, measured
                if not improved:
                    break
            if best < CONTROL_VARIATE_GAIN:  # centred at the mode (up to the tolerance), and measured there
                try:
                    candidate = ControlVariate(self.potential, "map", candidate.centre, potential_tolerance=tolerance)
                except ValueError:
                    best = math.inf
                else:
                    best = ratio(candidate)  # a mode far from where the chains are is rejected here
        if not best < CONTROL_VARIATE_GAIN:
            self._control_variate_rejected = True
            return
        self._auto_control_variate_cache = candidate  # sequential chains on the same data reuse it
        self._control_variate = candidate
        energy, grad = self._evaluate(position, self.minibatches.next())
        self.state = self.state._replace(potential=energy, grad=grad)

    def _sync_step_size(self) -> None:
        self._chain_step_size = self._adaptation.step_size

    def _adapt(self, state: SGMCMCState) -> None:
        adaptation = self._adaptation
        if self._control_variate_candidate is not None and state.step - adaptation.offset >= adaptation.slow_start:
            self._decide_control_variate()
            state = self.state
        adaptation.update(self, state.step, state.position)
        self._sync_step_size()
        if state.step == self._warmup_steps:
            self._adapting = False

    def _approach_step(self, state: SGMCMCState) -> SGMCMCState:
        """One step of the approach phase (``kernels/warmup.py``): sign-based descent, no noise."""
        approach = self._approach
        position = approach.propose(state.position, state.grad)
        energy, grad = self._evaluate(position, self.minibatches.next())
        finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1) & torch.isfinite(position).all(-1)
        if not bool(finite.all()):
            approach.reject(~finite)
            keep = finite.unsqueeze(-1)
            position = torch.where(keep, position, state.position)
            energy = torch.where(finite, energy, state.potential)
            grad = torch.where(keep, grad, state.grad)
        self._last_diverging = self._no_divergence
        self._last_step_size = approach.typical_step()
        self.state = state._replace(position=position, potential=energy, grad=grad, step=state.step + 1)
        if self.state.step == approach.num_steps:
            self._start_adaptation()
        return self.state

    @property
    def phase(self) -> str:
        """``"approach"``, ``"adaptation"`` (the rest of warmup), ``"warmup"`` (no adaptation) or ``"sampling"``."""
        step = self.state.step if self.state is not None else 0
        if step >= self._warmup_steps:
            return "sampling"
        if self._approach is not None and step < self._approach.num_steps:
            return "approach"
        return "adaptation" if self._adaptation is not None else "warmup"

    @property
    def inverse_mass_matrix(self) -> Optional[torch.Tensor]:
        """The preconditioner :math:`P = L L^\\top` per chain in normalised units, ``(C, D)`` (diagonal)
        or ``(C, D, D)`` (``full_mass``); ``None`` without ``adapt_mass_matrix``. Frozen after warmup."""
        if self._adaptation is None or not self._adaptation.preconditioned or self._adaptation.factor is None:
            return None
        factor = self._adaptation.factor
        return factor @ factor.transpose(-1, -2) if self._adaptation.full_mass else factor * factor

    def _preconditioning_state_dict(self) -> dict:
        out = {"jumps": self._jumps.state_dict(), "jump_threshold": self._jump_threshold, "adapting": self._adapting}
        if self._approach is not None:
            out["approach"] = self._approach.state_dict()
        if self._adaptation is not None:
            out["adaptation"] = self._adaptation.state_dict()
        if self._control_variate is not None:
            out["control_variate"] = self._control_variate.state_dict()
        out["control_variate_rejected"] = self._control_variate_rejected
        candidate = self._control_variate_candidate
        if candidate is not None:  # "auto", between the approach and the decision
            out["control_variate_candidate"] = candidate.state_dict()
            out["control_variate_candidate_refined"] = candidate is self._auto_control_variate_cache
        return out

    def _load_preconditioning_state_dict(self, saved: dict, device) -> None:
        self._jumps.load_state_dict(saved["jumps"], device)
        threshold = saved["jump_threshold"]
        self._jump_threshold = None if threshold is None else threshold.to(device)
        self._adapting = saved["adapting"]
        if "approach" in saved:
            self._approach.load_state_dict(saved["approach"], device)
        if "adaptation" in saved:
            self._adaptation.load_state_dict(saved["adaptation"], device)
            self._sync_step_size()
            if self.state.step >= self._warmup_steps:
                self._freeze_step_size()
        self._control_variate_rejected = saved.get("control_variate_rejected", False)
        if "control_variate_candidate" in saved:
            candidate = ControlVariate.from_state_dict(self.potential, saved["control_variate_candidate"], device)
            if saved["control_variate_candidate_refined"]:
                self._auto_control_variate_cache = candidate
            self._control_variate_candidate = candidate
        if "control_variate" in saved:
            if self._control_variate is None:  # "auto": chosen after the approach
                self._control_variate = ControlVariate.from_state_dict(self.potential, saved["control_variate"], device)
            else:
                self._control_variate.load_state_dict(saved["control_variate"], device)

    # ------------------------------------------------------------------ statistics
    @property
    def last_stats(self) -> Dict[str, torch.Tensor]:
        """Statistics of the last step, per chain (tensors of shape ``(num_chains,)``).

        ArviZ's names where they apply (``lp``, ``step_size``, ``diverging``), plain names for the
        rest (``temperature``; ``kinetic_energy`` and ``thermostat`` where the kernel has them).
        ``lp`` is the minibatch estimate of the log density in unconstrained space.
        """
        position = self.state.position
        num_chains = position.shape[0]
        options = {"dtype": torch.float64, "device": position.device}  # float64: a huge T or step still fits
        stats = {
            "lp": -self.state.potential,
            "step_size": (
                self._last_step_size.reshape(num_chains).to(**options)
                if torch.is_tensor(self._last_step_size)
                else torch.full((num_chains,), self._last_step_size, **options)
            ),
            "diverging": self._last_diverging.clone(),
            "temperature": torch.full((num_chains,), self.temperature, **options),
            "num_divergences": self._num_divergences.clone(),
        }
        stats.update(self._auxiliary_stats(self.state))
        return stats

    # ------------------------------------------------------------------ for subclasses
    def _init_auxiliary(self, position: torch.Tensor):
        """Return ``(momentum, thermostat)`` at the start (``None`` where the kernel has none)."""
        return None, None

    def _initial_momentum(self, position: torch.Tensor, how: str, mass: float) -> torch.Tensor:
        if how == "zero" or self.noise_temperature == 0:
            return torch.zeros_like(position)
        # The stationary momentum of the tempered dynamics: N(0, mass * T / N), from each chain's stream.
        return self.generators.normal(position.shape[1:], position.dtype) * math.sqrt(mass * self.noise_temperature)

    def _transition(
        self,
        state: SGMCMCState,
        drift: torch.Tensor,
        step_size: float,
        noise: Optional[torch.Tensor],
        drift_scale: float = 1.0,
        out: Optional[tuple] = None,
    ):
        """New ``(position, momentum, thermostat)`` from ``state`` with normalised drift
        ``drift_scale * drift`` (see :mod:`~pyro_sgmcmc.kernels.diffusions`). ``out``, when given, is
        ``(position buffer, momentum buffer)`` (either may be ``None``): memory no one else refers to,
        which the update may write its results into instead of allocating."""
        raise NotImplementedError

    def _auxiliary_stats(self, state: SGMCMCState) -> Dict[str, torch.Tensor]:
        return {}

    # ------------------------------------------------------------------ internals
    def _ensure_potential(self, args: tuple, kwargs: Optional[dict]) -> ModelPotential:
        """Trace the model once per data set (sequential chains on the same data reuse it)."""
        kwargs = dict(kwargs or {})
        # the potential holds the arguments, so their ids identify them while it lives
        key = (tuple(map(id, args)), tuple(sorted((k, id(v)) for k, v in kwargs.items())))
        if self.potential is None or key != self._model_key:
            self.potential = self.potential_factory(
                self.model,
                args,
                kwargs,
                init_strategy=self.init_strategy,
                num_data=self.num_data,
                jit_compile=self.jit_compile,
            )
            self._model_key = key
        else:  # the same model and arguments: reused, but traced afresh (the model's globals may have changed)
            self.potential.forget_compiled()
        return self.potential

    def _initial_positions(self, initial_params, num_chains: int, num_superchains: int) -> torch.Tensor:
        potential = self.potential
        repeats = num_chains // num_superchains
        if initial_params is not None:
            if not isinstance(initial_params, Mapping):
                raise TypeError(
                    "initial_params must be a dict {site name: unconstrained tensor}; "
                    f"got {type(initial_params).__name__}"
                )
            leading = set()
            for name, value in initial_params.items():
                try:
                    value = torch.as_tensor(value)
                except (TypeError, ValueError, RuntimeError) as error:
                    raise TypeError(
                        f"initial_params[{name!r}] must be a tensor or array of numbers; got {value!r}"
                    ) from error
                leading.add(int(value.shape[0]) if value.dim() else 0)
            if leading == {num_chains}:
                positions = potential.pack(initial_params, (num_chains,))
            elif leading == {num_superchains}:
                positions = potential.pack(initial_params, (num_superchains,)).repeat_interleave(repeats, 0)
            else:
                raise ValueError(
                    f"initial_params must have a leading axis of num_chains={num_chains} or "
                    f"num_superchains={num_superchains} on every site; got leading sizes {sorted(leading)}"
                )
            for position in positions.unique(dim=0):
                potential.initial_position(potential.unpack(position))  # checks finiteness, names the problem
            return positions
        starts = torch.stack([potential.initial_position() for _ in range(num_superchains)])
        return starts.repeat_interleave(repeats, 0)

    def _reject_divergent(
        self, state, finite, position, momentum, thermostat, energy, grad, indices=None
    ) -> SGMCMCState:
        """Handle the chains whose new point has a non-finite potential or gradient (and frozen chains).
        ``indices`` (the step's minibatch) lets the record name the sites whose log-density is not finite."""
        diverging = ~finite
        if self._frozen is not None:
            diverging = diverging & ~self._frozen  # a frozen chain does not diverge again
        self._last_diverging = diverging
        chains = diverging.nonzero().flatten().tolist()
        phase = "warmup" if state.step < self._warmup_steps else "sampling"
        for chain in chains:
            chain_indices = None if indices is None else {k: v[chain] for k, v in indices.items()}
            what = self._nonfinite_sites(energy[chain], grad[chain], position[chain], chain_indices)
            if what is None:  # finite: the potential jumped past the chain's threshold (kernels/warmup.py)
                jump = float(energy[chain] - state.potential[chain])
                what = f"a jump of the potential by {jump:.4g} (threshold {float(self._jump_threshold[chain]):.4g})"
            else:
                what = "non-finite " + what
            self.divergence_log.append((chain, state.step, phase, what))
        if chains and self.on_divergence == "raise":
            chain, step, phase, what = self.divergence_log[-len(chains)]
            data = (
                "the data at these indices may be outside the distribution's support or not finite (check them); "
                "if they are valid, "
                if "data indices" in what
                else ""
            )
            raise DivergenceError(
                f"{type(self).__name__}: {what} at step {step} ({phase}) in chain(s) {chains}; {data}reduce "
                "step_size (or leave adapt_step_size=True), or pass on_divergence='restart' or 'freeze' to record "
                "it and continue"
            )
        if state.step >= self._warmup_steps:
            for chain in chains:
                self._divergences[chain].append(state.step - self._warmup_steps)
        else:
            self._num_warmup_divergences += diverging.long()
        self._num_divergences += diverging.long()
        self._divergence_count += len(chains)
        if self.on_divergence == "freeze" and chains:
            self._frozen = diverging if self._frozen is None else self._frozen | diverging
        # chains that keep the new point: finite, not frozen
        keep = finite if self._frozen is None else finite & ~self._frozen
        keep_row = keep.unsqueeze(-1)
        if momentum is None:
            new_momentum = None
        else:  # a restarted chain restarts at rest; a frozen one keeps its (unused) momentum
            reset = torch.zeros_like(momentum) if self.on_divergence == "restart" else state.momentum
            new_momentum = torch.where(keep_row, momentum, reset)
        new_thermostat = None if thermostat is None else torch.where(keep, thermostat, state.thermostat)
        return SGMCMCState(
            torch.where(keep_row, position, state.position),
            new_momentum,
            new_thermostat,
            torch.where(keep, energy, state.potential),
            torch.where(keep_row, grad, state.grad),
            state.step + 1,
        )

    def _nonfinite_sites(
        self, energy: torch.Tensor, grad: torch.Tensor, position: torch.Tensor, indices=None
    ) -> Optional[str]:
        """Name what is not finite: 'potential energy' (with the sites whose log-density is not finite, when
        the position is finite and the minibatch ``indices`` are known) and/or the sites with non-finite
        position or gradient (``None`` if everything is finite)."""
        parts = []
        if not bool(torch.isfinite(energy)):
            culprits = []
            if indices is not None and bool(torch.isfinite(position).all()):
                culprits = self.potential.nonfinite_log_densities(position, indices)
            parts.append("potential energy" + (f" ({'; '.join(culprits)})" if culprits else ""))
        for site in self.potential.sites:
            bad = []
            if not bool(torch.isfinite(position[site.slice]).all()):
                bad.append("value")
            if not bool(torch.isfinite(grad[site.slice]).all()):
                bad.append("gradient")
            if bad:
                parts.append(f"{' and '.join(bad)} of site {site.name!r}")
        return ", ".join(parts) or None


def _mean(values: Union[float, torch.Tensor]) -> float:
    """The mean of a tensor as a float (one chain: its value, without a reduction); a number as it is."""
    if not torch.is_tensor(values):
        return float(values)
    return float(values) if values.numel() == 1 else float(values.mean())


def _chain_value(values: Union[float, torch.Tensor], chain: int) -> float:
    """Chain ``chain``'s entry of a per-chain tensor ``(C, ...)``, or the number shared by all chains."""
    return float(values[chain]) if torch.is_tensor(values) else float(values)


def _as_real(value, name: str) -> float:
    """``float(value)`` for a real number (bools, strings, arrays refused); huge ints become inf."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _non_negative(value, name: str, meaning: str) -> float:
    real = _as_real(value, name)
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"{name} must be a finite float >= 0 ({meaning}); got {value!r}")
    return real


def _positive(value, name: str) -> float:
    real = _as_real(value, name)
    if not math.isfinite(real) or real <= 0:
        raise ValueError(f"{name} must be a finite float > 0; got {value!r}")
    return real


def _choice(value, name: str, accepted) -> str:
    if not isinstance(value, str) or value not in accepted:
        raise ValueError(f"{name} must be one of {accepted}; got {value!r}")
    return value


def _start_at_centre(value, control_variate) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"start_at_centre must be True or False; got {value!r}")
    if value and (control_variate is None or control_variate == "auto"):
        raise ValueError(
            "start_at_centre=True needs control_variate='map' or a dict (the centre is where the chains start)"
        )
    return value
