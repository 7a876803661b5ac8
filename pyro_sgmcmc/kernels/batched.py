"""Vectorised chains: set up a batch of chains and advance them together, one model evaluation per step.

The chains' state carries a leading chain axis (``position`` is ``(num_chains, dim)``); each chain draws its own
noise and minibatches (:class:`~pyro_sgmcmc.chains.streams.ChainGenerators`,
:class:`~pyro_sgmcmc.chains.minibatch.MinibatchSampler`), so chain ``c``'s draws depend only on ``(seed, c)``.

Step order. Set-up evaluates the potential :math:`U` and its gradient at the initial point. Each step then
(1) draws the injected noise, (2) moves with the gradient cached from the previous evaluation
(:meth:`BatchedChains.transition`, a pure rule of :mod:`~pyro_sgmcmc.kernels.diffusions`; under an adapted metric
through :class:`~pyro_sgmcmc.kernels.adaptation.WarmupDriver`), (3) draws the next minibatch and asks the gradient
estimator (:mod:`~pyro_sgmcmc.kernels.gradients`) for :math:`U` and :math:`\\nabla U` at the new point, caching
them. One model evaluation per step; the reported ``lp = -U`` belongs to the returned draw. A non-finite result
is a divergence (:mod:`~pyro_sgmcmc.kernels.divergences`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Callable, Dict, Mapping, Optional, Sequence

import torch

from ..chains.minibatch import MinibatchSampler
from ..chains.streams import ChainGenerators
from ..model.potential import ModelPotential
from ..schedules import Constant
from . import arguments as checks
from . import capture
from .adaptation import warmup_context
from .control_variates import ControlVariate
from .divergences import DivergenceRecord
from .gradients import GradientEstimator, MinibatchGradient, control_variate_potential, user_estimator
from .initialisation import global_superchain_ids, initial_positions, preserved_global_rng
from .sampling import SamplingRun
from .state import SGMCMCState
from .step import Dynamics, nonfinite_point

__all__ = ["BatchedChains"]


class BatchedChains:
    """The vectorised-chains half of :class:`~pyro_sgmcmc.kernels.base.SGMCMCKernel` (module docstring).

    It reads the kernel's settings (``model``, ``init_strategy``, ``num_data``, ``jit_compile``, ``temperature``,
    ``control_variate``, ``init_to_centre``, ``on_divergence``, ``step_size``, ``estimator_factory``,
    ``cuda_graph``) and its ``warmup`` driver; a concrete kernel defines :meth:`transition`.
    """

    #: The estimator factory (``potential -> estimator``): the kernel's ``gradient_estimator=`` (set by
    #: :class:`~pyro_sgmcmc.kernels.base.SGMCMCKernel`) or :func:`~pyro_sgmcmc.distributed.data_parallel`'s;
    #: ``None``: plain minibatches or the control variate.
    estimator_factory: Optional[Callable] = None
    #: Record the sampling step once and replay it (``cuda_graph=`` of the kernel; :mod:`.capture`).
    cuda_graph: bool = False
    #: :math:`N` of this run's gradient estimate, which the drift and noise are normalised by (set by
    #: :meth:`prepare_chains`): the potential's ``num_data``, or the estimator's own (data_parallel's: all shards').
    run_num_data: int = 1

    # ------------------------------------------------------------------ what a kernel defines
    def transition(
        self,
        state: SGMCMCState,
        drift: torch.Tensor,
        step_size,
        noise: Optional[torch.Tensor],
        drift_scale: float = 1.0,
        out: Optional[tuple] = None,
    ):
        """The pure update: new ``(position, momentum, thermostat)`` from ``state`` with normalised drift
        ``drift_scale * drift`` (see :mod:`~pyro_sgmcmc.kernels.diffusions`). ``out``, when given, is
        ``(position buffer, momentum buffer)`` (either may be ``None``) the update may write into."""
        raise NotImplementedError

    #: Which chains' proposed states must not be kept (:class:`~pyro_sgmcmc.kernels.step.Dynamics`): a family
    #: whose update has quantities of its own to check declares its rule here.
    stability_rule = staticmethod(nonfinite_point)

    def _init_auxiliary(self, position: torch.Tensor):
        """Return ``(momentum, thermostat)`` at the start (``None`` where the kernel has none)."""
        return None, None

    def _auxiliary_stats(self, state: SGMCMCState) -> Dict[str, torch.Tensor]:
        return {}

    def _initial_momentum(self, position: torch.Tensor, how: str, mass: float) -> torch.Tensor:
        if how == "zero" or self.noise_temperature == 0:
            return torch.zeros_like(position)
        # The stationary momentum of the tempered dynamics: N(0, mass * T / N), from each chain's stream.
        draw = self.generators.normal(position.shape[1:], position.dtype, step=0, purpose="init_momentum")
        return draw * math.sqrt(mass * self.noise_temperature)

    # ------------------------------------------------------------------ model, starting points, gradients
    def ensure_potential(self, args: tuple, kwargs: Optional[dict]) -> ModelPotential:
        """The potential of ``model(*args, **kwargs)``: traced once per data set (sequential chains on the same
        data reuse it, traced afresh so that a change of the model's globals is seen)."""
        kwargs = dict(kwargs or {})
        # the potential holds the arguments, so their ids identify them while it lives
        key = (tuple(map(id, args)), tuple(sorted((k, id(v)) for k, v in kwargs.items())))
        if self.potential is None or key != self._model_key:
            self.potential = ModelPotential(
                self.model, args, kwargs, init_strategy=self.init_strategy, num_data=self.num_data,
                jit_compile=self.jit_compile,
            )  # fmt: skip
            self._model_key = key
        else:
            self.potential.forget_compiled()
        return self.potential

    def initial_positions(
        self,
        initial_params: Optional[Mapping[str, torch.Tensor]],
        num_chains: int,
        num_superchains: int,
        *,
        seed: Optional[int] = None,
        superchain_ids: Optional[Sequence[int]] = None,
    ) -> torch.Tensor:
        """``(num_chains, dim)`` starting points on the potential of :meth:`ensure_potential`: ``initial_params``
        (checked), or drawn from the init strategy, superchain ``s`` (global id, default ``range``) from
        ``(seed, s)`` only when ``seed`` is given (:mod:`~pyro_sgmcmc.kernels.initialisation`)."""
        return initial_positions(self.potential, initial_params, num_chains, num_superchains, seed, superchain_ids)

    def evaluate(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        """``(U, dU/dz)`` at ``(C, D)`` positions on the minibatch ``indices``, by the kernel's gradient
        estimator (plain minibatches or a control variate)."""
        return self.gradient_estimator.potential_and_grad(positions, indices)

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

        Parameters
        ----------
        warmup_steps : int
            Burn-in steps (divergences there are counted apart).
        args, kwargs :
            The model's arguments.
        num_chains : int
        initial_params : dict, optional
            Unconstrained starting values with a leading axis of size ``num_chains`` or ``num_superchains``.
        num_superchains : int, optional
            ``K`` distinct starting points, each shared by ``num_chains / K`` consecutive chains. Default: every
            chain starts from its own point.
        seed : int, optional
            Seed of the per-chain random streams and of the drawn starting points (superchain ``s`` from
            ``(seed, s)``); torch's global generator is then left untouched. By default drawn from it.
        chain_ids : sequence of int, optional
            Global ids of these chains (stream ``c`` depends only on ``(seed, c)``); default ``range(num_chains)``.
        """
        self.prepare_chains(
            warmup_steps, args, kwargs, num_chains=num_chains, num_superchains=num_superchains, seed=seed,
            chain_ids=chain_ids,
        )  # fmt: skip
        self.start_chains(initial_params)

    def prepare_chains(
        self,
        warmup_steps: int,
        args: tuple = (),
        kwargs: Optional[dict] = None,
        *,
        num_chains: int = 1,
        num_superchains: Optional[int] = None,
        seed: Optional[int] = None,
        chain_ids: Optional[Sequence[int]] = None,
    ) -> None:
        """The first half of :meth:`setup_chains`, what a resumed run needs too: the checks, the model's trace
        (the potential), the chains' random and minibatch streams and superchains. Then :meth:`start_chains`
        (a fresh run) or :meth:`restore_chains` (from a checkpoint)."""
        checks.positive_int(warmup_steps, "warmup_steps", minimum=0)
        checks.positive_int(num_chains, "num_chains")
        num_superchains = num_chains if num_superchains is None else num_superchains
        checks.positive_int(num_superchains, "num_superchains")
        if num_chains % num_superchains:
            raise ValueError(f"num_chains={num_chains} must be a multiple of num_superchains={num_superchains}")
        with preserved_global_rng("cpu") if seed is not None else contextlib.nullcontext():
            potential = self.ensure_potential(args, kwargs)  # traces the model: no draw may reach the global state
        self.transforms = potential.transforms
        self.generators = ChainGenerators(seed, range(num_chains) if chain_ids is None else chain_ids, potential.device)
        if len(self.generators) != num_chains:
            raise ValueError(f"chain_ids has {len(self.generators)} entries for num_chains={num_chains}")
        # the estimate of this data set: plain minibatches or the user's (a fixed control variate replaces it at
        # start_chains); an estimator with a num_data of its own (data_parallel's: the shards') sets N
        factory = self.estimator_factory
        with preserved_global_rng("cpu") if seed is not None else contextlib.nullcontext():  # it may trace the model
            plain = factory is None
            self.gradient_estimator = MinibatchGradient(potential) if plain else user_estimator(factory, potential)
        self._use_streams()
        self.run_num_data = getattr(self.gradient_estimator, "num_data", None) or potential.num_data
        self.noise_temperature = self.temperature / self.run_num_data
        self._inverse_num_data = 1.0 / self.run_num_data
        self.minibatches = MinibatchSampler(potential.subsample_plates, self.generators)
        self.superchain_ids = torch.arange(num_chains) // (num_chains // num_superchains)
        self._prepared = (warmup_steps, num_chains, num_superchains, seed, chain_ids)

    def start_chains(self, initial_params: Optional[Dict[str, torch.Tensor]] = None) -> None:
        """The second half of :meth:`setup_chains` (after :meth:`prepare_chains`): the starting points, the control
        variate (a MAP search for ``"map"``), the first evaluation, the auxiliary state and the warmup."""
        warmup_steps, num_chains, num_superchains, seed, chain_ids = self._prepared
        positions = self.initial_positions(
            initial_params, num_chains, num_superchains, seed=seed,
            superchain_ids=global_superchain_ids(num_chains, num_superchains, chain_ids),
        )  # fmt: skip
        self.gradient_estimator = self._setup_control_variate(positions)
        if self.init_to_centre:  # Baker et al. (2019) start SGLD-CV at the MAP: burn-in then only spreads the chains
            positions = self.gradient_estimator.centre.expand(num_chains, -1).clone()
        energy, grad = self.evaluate(positions, self.minibatches.next())
        momentum, thermostat = self._init_auxiliary(positions)
        self._start(SGMCMCState(positions, momentum, thermostat, energy, grad, 0), warmup_steps)

    def restore_chains(self, saved: dict) -> None:
        """Instead of :meth:`start_chains` (after :meth:`prepare_chains`): the chains of a checkpoint, ``saved``
        being :meth:`state_dict`. None of the fresh set-up's work is done: no starting point is drawn, no
        control-variate centre searched or evaluated on the full data (the checkpoint holds the centre and the
        full-data potential and gradient there), no first evaluation; the warmup's structures are made (no
        evaluation either) and filled from ``saved``. Raises ``KeyError``, ``ValueError``, ... on a state that
        does not fit these chains."""
        warmup_steps, num_chains = self._prepared[:2]
        potential = self.potential
        fields = {k: (v.to(potential.device) if torch.is_tensor(v) else v) for k, v in saved["state"].items()}
        expected = (num_chains, potential.dim)
        if tuple(fields["position"].shape) != expected:
            raise ValueError(f"saved chains have positions of shape {tuple(fields['position'].shape)}, not {expected}")
        self._start(SGMCMCState(**fields), warmup_steps)  # the estimator is prepare_chains' (a saved CV: load)
        self.load_state_dict(saved)
        if self.control_variate is not None and self.control_variate != "auto":
            if not isinstance(self.gradient_estimator, ControlVariate):
                raise ValueError(f"the saved state holds no control variate (control_variate={self.control_variate!r})")
            self._fixed_control_variate = self.gradient_estimator  # as a fresh run keeps it, for this data set

    def _start(self, state: SGMCMCState, warmup_steps: int) -> None:
        """The chains start from ``state``: the noise buffer, divergence record, warmup and first step size."""
        self.state = state
        self.step_size = self.step_size.starting_at(warmup_steps)  # a cyclical schedule counts from sampling
        positions = state.position
        # the step's noise buffer (no step keeps its noise): T = 0 draws none
        self._noise = torch.empty_like(positions) if self.noise_temperature > 0 else None
        self.divergence_record = DivergenceRecord(
            positions.shape[0], positions.device, self.on_divergence, type(self).__name__
        )
        self._sampling: Optional[SamplingRun] = None
        self.state = self.warmup.setup(warmup_steps, state, warmup_context(self))
        self._last_step_size = self.step_size(0)

    def _use_streams(self) -> None:
        """Give the chains' streams to an estimator that draws minibatches of its own (``use_streams``,
        :mod:`~pyro_sgmcmc.kernels.gradients`): at set-up, and when a restore replaces them."""
        use_streams = getattr(self.gradient_estimator, "use_streams", None)
        if use_streams is not None:
            use_streams(self.generators)

    def _setup_control_variate(self, positions: torch.Tensor) -> GradientEstimator:
        """The estimator of :meth:`prepare_chains` (the user's ``gradient_estimator`` or plain minibatches), or the
        fixed control variate (``"map"`` or a dict: computed once per data set); ``"auto"`` starts plain and
        decides in warmup. The control variate is built on the estimator's ``control_variate_potential`` where it
        has one (data parallelism's global potential), else on the model's."""
        if self.control_variate is None or self.control_variate == "auto":  # (a user's estimator: None)
            return self.gradient_estimator
        potential = control_variate_potential(self.gradient_estimator, self.potential)
        cached = self._fixed_control_variate
        if cached is None or cached.potential is not potential:
            self._fixed_control_variate = ControlVariate(potential, self.control_variate, positions[0])
        return self._fixed_control_variate

    def step(self) -> SGMCMCState:
        """Advance every chain by one step (the hot path: no set-up work here). The new state is made of new
        tensors: a state, tensor or view you keep is never overwritten. In sampling it is the kernel's
        :attr:`state`; in warmup the driver may replace the kernel's after the step (a momentum reset when the
        metric changes).

        After warmup the step is :func:`~pyro_sgmcmc.kernels.step.sampling_step` on the parameters the warmup
        froze (:class:`~pyro_sgmcmc.kernels.sampling.SamplingRun`): draw the minibatch and the noise, call the
        pure step, hold its state. In warmup the driver (``kernels/adaptation.py``) adapts after each step."""
        state = self.state
        if state.step >= self.warmup.warmup_steps:
            run = self._sampling if self._sampling is not None else self._start_sampling()
            self.state = state = run.step(self.state, self.minibatches.next(), self.gradient_estimator)
            self._last_step_size = run.step_size
            return state
        # warmup: one step, through the driver (kernels/adaptation.py), which adapts after it
        previous = state
        warmup = self.warmup
        if warmup.in_approach(state.step):
            self.divergence_record.last = self.divergence_record.none
            self._last_step_size = warmup.typical_step()
            self.state = state = warmup.approach_step(state)
            return state
        step_size = self.step_size(state.step) if warmup.chain_step_size is None else warmup.chain_step_size
        # the noise is drawn into the kernel's own buffer (no step keeps it), and the drift -grad U / N is
        # scaled inside the update's pass (drift_scale): no new tensor of the chains' size for either
        noise = self._draw_noise(state.step)
        if warmup.preconditioned:  # the same update in w = L^-1 z (see kernels/preconditioning.py)
            position, momentum, thermostat = warmup.transition(
                state, state.grad, step_size, noise, -self._inverse_num_data
            )
        else:
            position, momentum, thermostat = self.transition(
                state, state.grad, step_size, noise, -self._inverse_num_data
            )
        indices = self.minibatches.next()
        energy, grad = self.gradient_estimator.potential_and_grad(position, indices)
        record = self.divergence_record
        finite = record.finite_mask(energy, grad, state.potential, warmup.jump_threshold)
        state = SGMCMCState(position, momentum, thermostat, energy, grad, state.step + 1)
        if finite is None:
            record.last = record.none
        else:  # sets record.last: the chains that diverged at this step (a frozen chain only once)
            state = record.reject(previous, state, finite, None, self.potential, warmup.jump_threshold, indices)
        self.state = state
        self._last_step_size = step_size
        if state.step <= warmup.warmup_steps:  # warmup only: nothing of this runs while sampling
            state, chosen = warmup.after_step(previous, state, record.last)
            self.state = state
            if chosen is not None:  # control_variate="auto" chose a control variate
                self.gradient_estimator = chosen
        return state

    def dynamics(self) -> Dynamics:
        """The kernel's pure step rule: its update (:meth:`transition`) and stability rule (:attr:`stability_rule`)."""
        return Dynamics(self.transition, self.stability_rule)

    def _draw_noise(self, step: int) -> Optional[torch.Tensor]:
        """The standard normal noise of step ``step`` in the kernel's buffer (``None`` at ``T = 0``): a function of
        ``(seed, chain, step)`` alone (:mod:`~pyro_sgmcmc.chains.philox`), so a replay of a step draws its noise
        again."""
        if self._noise is None or self.step_size.explores(step):  # a cyclical schedule's exploration: none
            return None
        return self.generators.fill_normal(self._noise, step=step)

    def _start_sampling(self) -> SamplingRun:
        """The end of warmup: the parameters it froze, the pure step's run (``kernels/sampling.py``)."""
        parameters = self.warmup.sampling_parameters().replace(
            inverse_num_data=self._inverse_num_data, on_divergence=self.on_divergence
        )
        if parameters.step_size is None and isinstance(self.step_size, Constant):  # no schedule to call each step
            parameters = parameters.replace(step_size=self.step_size(self.state.step))
        schedule = self.step_size
        if schedule.staged:  # called each step; the cycle's peak is each chain's adapted step size, if adapted
            schedule = schedule if parameters.step_size is None else schedule.with_peak(parameters.step_size)
            parameters = parameters.replace(step_size=None)
        record = self.divergence_record
        if self.on_divergence == "freeze" and self.state.frozen is None:  # a mask from now on: one shape
            frozen = record.frozen if record.frozen is not None else torch.zeros_like(record.none)
            self.state = self.state.replace(frozen=frozen)
        self._sampling = SamplingRun(
            self.dynamics(), parameters, schedule, self.warmup.warmup_steps, self._draw_noise, record,
            self.potential, self.state, capture=self._capture(parameters),
        )  # fmt: skip
        return self._sampling

    def _capture(self, parameters) -> Optional[Callable]:
        """With ``cuda_graph=True`` on a CUDA device: how to record the sampling step (``kernels/capture.py``)."""
        if not self.cuda_graph:
            return None
        if self.step_size.staged:  # exploration steps draw no noise: a step the recording cannot switch
            warnings.warn(
                "cuda_graph=True is not applied with a staged schedule (Cyclical): its exploration steps inject no "
                "noise, so the sampling step is not one recorded function; it runs eagerly",
                capture.CaptureFallback, stacklevel=5,
            )  # fmt: skip
            return None
        graph = self.state.position.is_cuda
        if not graph and not capture.STATIC_STEP_ON_CPU:
            warnings.warn(
                "cuda_graph=True needs the chains on a CUDA device (the model's tensors and data there); "
                f"they are on {self.state.position.device}, so the sampling step runs eagerly",
                capture.CaptureFallback, stacklevel=5,
            )  # fmt: skip
            return None
        noise = self._noise
        fill_noise = None if noise is None else (lambda step: self.generators.fill_normal(noise, step=step))
        estimator = self.gradient_estimator.potential_and_grad
        return lambda state, indices: capture.CapturedStep(
            self.dynamics(), parameters, estimator, fill_noise, state, indices, graph
        )

    def flush_divergences(self) -> None:
        """Read the sampling steps' divergences not yet read into :attr:`divergence_record` (``kernels/sampling.py``);
        the read-outs (``diagnostics()``, ``state_dict()``, ``divergences``, ...) call it."""
        if self._sampling is not None:
            self._sampling.flush(self.state)
