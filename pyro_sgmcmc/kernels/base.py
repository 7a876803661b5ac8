"""The shared :class:`~pyro.infer.mcmc.mcmc_kernel.MCMCKernel` shell of the SG-MCMC kernels.

A concrete kernel (SGLD, SGHMC, SGNHT) says how to start its auxiliary state (``_init_auxiliary``) and how to take
one step given the normalised drift (:meth:`SGMCMCKernel.transition`, a call into
:mod:`~pyro_sgmcmc.kernels.diffusions`), and declares its own keyword arguments in ``configure_dynamics``. The
rest is shared, each job in its module: the argument checks and deprecated spellings (``arguments``), the starting
points (``initialisation``), the gradient estimate (``gradients``, ``control_variates``), the warmup
(``adaptation``), the divergences (``divergences``) and the configuration that changes the draws
(``configuration``). This module speaks Pyro's protocol (``setup``, ``sample``, ``logging``, ``diagnostics``) and
advances vectorised chains (:meth:`SGMCMCKernel.setup_chains`, :meth:`SGMCMCKernel.step`).

Chains. The state always carries a leading chain axis: ``position`` is ``(num_chains, dim)``. Under
:class:`pyro.infer.MCMC` a kernel runs one chain at a time; :class:`pyro_sgmcmc.MCMC` with
``chain_method="vectorized"`` advances all chains together, each with its own noise and minibatches
(:class:`~pyro_sgmcmc.chains.streams.ChainGenerators`, :class:`~pyro_sgmcmc.chains.minibatch.MinibatchSampler`).

Step order. Set-up evaluates the potential :math:`U` and its gradient at the initial point. Each step then
(1) draws the injected noise, (2) moves with the gradient cached from the previous evaluation, (3) draws the next
minibatch and evaluates :math:`U` and :math:`\\nabla U` at the new point, caching them. One model evaluation per
step; the reported ``lp = -U`` belongs to the returned draw. A non-finite result is a divergence
(:mod:`~pyro_sgmcmc.kernels.divergences`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Union

import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ..chains.minibatch import MinibatchSampler
from ..chains.streams import ChainGenerators
from ..model.potential import JitMode, ModelPotential, check_jit_compile
from ..schedules import Schedule, as_schedule
from . import arguments as checks
from .adapt.stability import FIRST_ORDER_CONSTANT, StabilityRule
from .adaptation import WarmupDriver, warmup_context
from .batched import BatchedChains
from .configuration import describe
from .control_variates import ControlVariate
from .divergences import ON_DIVERGENCE, DivergenceRecord
from .gradients import GradientEstimator, control_variate_potential
from .state import DivergenceError, DivergenceWarning, SGMCMCState, SlowMixingWarning

__all__ = ["SGMCMCState", "SGMCMCKernel", "DivergenceError", "DivergenceWarning", "SlowMixingWarning"]

StepSize = Union[None, float, Schedule, Callable[[int], float]]
#: The step size ``step_size=None`` stands for (an initial value that the warmup adapts, by default).
DEFAULT_STEP_SIZE = 1e-3
#: :meth:`SGMCMCKernel.logging` formats its figures afresh at least this often (in steps).
LOGGING_EVERY = 25


class SGMCMCKernel(BatchedChains, MCMCKernel):
    """Base class of the stochastic-gradient kernels; see :class:`~pyro_sgmcmc.SGLD` for the arguments."""

    _logging_cache: Optional[tuple] = None  # (step, phase, divergences, what logging() shows)

    #: The previous release's order of the arguments after ``step_size`` (still accepted, with a FutureWarning).
    LEGACY_POSITIONAL = ("temperature", "num_data", "init_strategy", "on_divergence")

    def __new__(cls, *args, **kwargs):
        # a clear error for an argument of Pyro's HMC/NUTS (checked before __init__)
        checks.reject_nuts_arguments(cls.__name__, kwargs)
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = checks.kernel_signature(SGMCMCKernel.__init__, cls.configure_dynamics)

    def __init__(
        self,
        model: Callable,
        step_size: StepSize = None,
        *legacy_positional,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        full_mass: Optional[bool] = None,
        init_strategy: Callable = init_to_uniform,
        temperature: float = 1.0,
        num_data: Optional[int] = None,
        control_variate: Union[None, str, Dict[str, torch.Tensor]] = "auto",
        init_to_centre: bool = False,
        on_divergence: str = "restart",
        jit_compile: JitMode = "auto",
        cuda_graph: bool = False,
        gradient_estimator: Optional[Callable] = None,
        **dynamics,
    ) -> None:
        shared = dict(
            adapt_step_size=adapt_step_size, adapt_mass_matrix=adapt_mass_matrix, full_mass=full_mass,
            init_strategy=init_strategy, temperature=temperature, num_data=num_data, control_variate=control_variate,
            init_to_centre=init_to_centre, on_divergence=on_divergence, jit_compile=jit_compile, cuda_graph=cuda_graph,
            gradient_estimator=gradient_estimator,
        )  # fmt: skip
        name = type(self).__name__
        old = checks.resolve_legacy_arguments(name, legacy_positional, self.LEGACY_POSITIONAL, dynamics, shared)
        own = checks.keyword_names(self.configure_dynamics)
        for key in dynamics:
            if key not in own:
                raise TypeError(f"{name}.__init__() got an unexpected keyword argument {key!r}")
        try:
            self._configure(model, step_size, **shared)
            self.configure_dynamics(**dynamics)
        except (TypeError, ValueError) as error:
            if not old:
                raise
            raise checks.respelled(error, old) from None
        self._dynamics_names = tuple(own)

    def _configure(
        self, model, step_size, *, adapt_step_size, adapt_mass_matrix, full_mass, init_strategy, temperature,
        num_data, control_variate, init_to_centre, on_divergence, jit_compile, cuda_graph, gradient_estimator,
    ) -> None:  # fmt: skip
        if not callable(model):
            raise ValueError(f"model must be a callable Pyro model; got {type(model).__name__}")
        self.model = model
        self.step_size = as_schedule(DEFAULT_STEP_SIZE if step_size is None else step_size, "step_size")
        self._given_step_size = step_size
        checks.check_adaptation(step_size, adapt_step_size, adapt_mass_matrix, full_mass)
        self.adapt_step_size, self.adapt_mass_matrix, self.full_mass = adapt_step_size, adapt_mass_matrix, full_mass
        self.control_variate = checks.check_control_variate(control_variate)
        self.estimator_factory = checks.check_gradient_estimator(gradient_estimator, control_variate)
        if self.estimator_factory is not None:  # the user's estimator replaces the automatic control variate
            self.control_variate = None
        self.init_to_centre = checks.check_init_to_centre(init_to_centre, control_variate)
        self.temperature = checks.non_negative(
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
        self.on_divergence = checks.choice(on_divergence, "on_divergence", ON_DIVERGENCE)
        self.jit_compile = check_jit_compile(jit_compile)
        self.cuda_graph = checks.flag(cuda_graph, "cuda_graph")

        self.transforms = None
        self.potential: Optional[ModelPotential] = None
        self.state: Optional[SGMCMCState] = None
        self.generators: Optional[ChainGenerators] = None
        self.minibatches: Optional[MinibatchSampler] = None
        self.gradient_estimator: Optional[GradientEstimator] = None
        self.divergence_record: Optional[DivergenceRecord] = None
        self.warmup = WarmupDriver()
        self.superchain_ids: Optional[torch.Tensor] = None
        self._fixed_control_variate: Optional[ControlVariate] = None  # "map" or dict, per data set
        self._prepared: Optional[tuple] = None  # the chains of prepare_chains, for start_chains or restore_chains
        self._model_key = None
        self._initial_params: Optional[Dict[str, torch.Tensor]] = None
        self._params: Optional[Dict[str, torch.Tensor]] = None
        self._last_step_size: Union[float, torch.Tensor] = float("nan")
        self._sampling = None  # the sampling phase's SamplingRun (kernels/sampling.py), from the first sampling step

    def configure_dynamics(self) -> None:
        """The kernel's own keyword arguments (a subclass declares them here, keyword-only, and stores each
        under its name); they join the shared signature."""

    @property
    def damping(self) -> float:
        """:math:`\\alpha`, the coefficient of the injected noise (SGLD: 1; SGHMC: the friction; SGNHT: the
        diffusion): the warmup's gradient-noise cap and relaxation time read it."""
        return 1.0

    def warmup_stability_rule(self) -> StabilityRule:
        """The family's step-size rule for the warmup (``kernels/adapt/stability.py``): first order (Langevin)."""
        return StabilityRule(FIRST_ORDER_CONSTANT, second_order=False, damping=self.damping)

    def configuration(self) -> Dict[str, object]:
        """The settings that change the draws, JSON-able (for checkpoint fingerprints).

        The kernel's class, the step size or schedule *as given* (not the adapted one), the adaptation flags,
        ``full_mass``, ``temperature``, ``num_data``, the init strategy, the control-variate setting (a dict
        centre as a SHA-256 of its tensors), ``init_to_centre``, ``on_divergence``, ``jit_compile``, ``cuda_graph``,
        ``gradient_estimator`` and the kernel's own arguments (friction, mass, ...); nothing adapted or drawn.
        """
        settings = {
            "step_size": self._given_step_size,
            "adapt_step_size": self.adapt_step_size,
            "adapt_mass_matrix": self.adapt_mass_matrix,
            "full_mass": self.full_mass,
            "temperature": self.temperature,
            "num_data": self.num_data,
            "init_strategy": self.init_strategy,
            "control_variate": self.control_variate,
            "init_to_centre": self.init_to_centre,
            "on_divergence": self.on_divergence,
            "jit_compile": self.jit_compile,
            "cuda_graph": self.cuda_graph,
            "gradient_estimator": self.estimator_factory,
        }
        settings.update({name: getattr(self, name) for name in self._dynamics_names})
        return {"kernel": f"{type(self).__module__}.{type(self).__qualname__}", **describe(settings)}

    # ------------------------------------------------------------------ Pyro protocol (one chain)
    @property
    def initial_params(self) -> Optional[Dict[str, torch.Tensor]]:
        """Unconstrained starting values ``{site: tensor}``; after ``setup``, the ones in use."""
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Optional[Dict[str, torch.Tensor]]) -> None:
        self._initial_params = params

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Pyro's protocol: set up one chain for ``model(*args, **kwargs)``; its random stream is seeded from
        torch's global generator, so ``pyro.set_rng_seed`` makes runs reproducible."""
        initial = None
        if self._initial_params is not None:  # validated without the chain axis, so errors show the site's shape
            potential = self.ensure_potential(args, kwargs)
            initial = potential.unpack(potential.pack(self._initial_params).unsqueeze(0))
        self.setup_chains(warmup_steps, args, kwargs, num_chains=1, initial_params=initial)
        self._initial_params = self._params = self.potential.unpack(self.state.position[0])

    def cleanup(self) -> None:
        """Pyro's protocol: forget the initial parameters so the next chain of a sequential run starts afresh."""
        self._initial_params = None
        self.warn_divergences()

    def warn_divergences(self) -> None:
        """Warn, naming the counts, if any step of the run diverged (the MCMC drivers call it at the end)."""
        if self.divergence_record is not None:
            self.flush_divergences()
            self.divergence_record.warn(adapted=self.warmup.adaptation is not None)

    def sample(self, params: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Pyro's protocol: one step of the single chain from ``params`` (unconstrained)."""
        if params is not self._params:  # moved by the caller: re-evaluate at the given point
            self.flush_divergences()
            position = self.potential.pack(params).unsqueeze(0)
            potential, grad = self.evaluate(position, self.minibatches.next())
            self.state = self.state.replace(position=position, potential=potential, grad=grad)
            self.flush_divergences()  # the divergences' window starts afresh at the new point
        self.step()
        self._params = self.potential.unpack(self.state.position[0])
        return self._params

    def logging(self) -> "OrderedDict[str, str]":
        """Shown in the progress bar: phase, step size, mean minibatch log density, divergences so far.

        :class:`pyro.infer.MCMC` asks for it after every step, progress bar or not (then JSON-encodes and logs
        it): the figures are formatted afresh when the phase or the divergence count changes and otherwise
        every ``LOGGING_EVERY`` steps, not at every step (a progress bar shows a few a second at most). The
        divergences of sampling are counted as of their last read (``kernels/sampling.py``); a refresh reads them."""
        step = self.state.step if self.state is not None else 0
        phase = self.phase
        count = 0 if self.divergence_record is None else self.divergence_record.count
        cached = self._logging_cache
        if cached is not None and cached[1:3] == (phase, count) and 0 <= step - cached[0] < LOGGING_EVERY:
            return cached[3]
        count = self.num_divergences
        shown = OrderedDict(
            [
                ("phase", phase),
                ("step size", f"{checks.mean_value(self._last_step_size):.2e}"),
                ("lp", f"{-checks.mean_value(self.state.potential):.4g}"),
                ("div", str(count)),
            ]
        )
        self._logging_cache = (step, phase, count, shown)
        return shown

    def diagnostics(self) -> dict:
        """Pyro's protocol (first chain): ``divergences`` holds the indices of the divergent *draws*."""
        return self.chain_diagnostics(0)

    def chain_diagnostics(self, chain: int) -> dict:
        """Chain ``chain``'s divergences (indices of the divergent *draws*), warmup divergences, final step
        size, and the warmup's statistics: its phases' lengths, the approach's refused steps, the adapted
        inverse mass matrix's diagonal and the sampling phase's jump threshold (``kernels/warmup.py``)."""
        self.flush_divergences()
        record = self.divergence_record
        out = {
            "divergences": list(record.divergences[chain]),
            "warmup divergences": int(record.num_warmup_divergences[chain]),
            "step size": float(self._last_step_size[chain]) if torch.is_tensor(self._last_step_size)
            else float(self._last_step_size),
            **self.warmup.diagnostics(chain),
            "control variate": isinstance(self.gradient_estimator, ControlVariate),
        }  # fmt: skip
        if self.warmup.jump_threshold is not None:
            out["jump threshold"] = float(self.warmup.jump_threshold[chain])
        return out

    def state_dict(self) -> dict:
        """Everything needed to continue these chains exactly: state, random streams, minibatch
        cursors, divergence records, warmup. Tensors are moved to the CPU (load puts them back)."""
        self.flush_divergences()
        state = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in self.state.as_dict().items()}
        out = {
            "state": state,
            "seed": self.generators.seed,
            "chain_ids": list(self.generators.chain_ids),
            "minibatches": self.minibatches.state_dict(),
            "last_step_size": self._last_step_size,
            **self.divergence_record.state_dict(),
            **self.warmup.state_dict(),
        }
        if isinstance(self.gradient_estimator, ControlVariate):
            out["control_variate"] = self.gradient_estimator.state_dict()
        return out

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
        self._sampling = None  # the next sampling step starts it afresh from the restored warmup
        self.generators = ChainGenerators(saved["seed"], saved["chain_ids"], device)
        self._use_streams()
        self.minibatches = MinibatchSampler(self.potential.subsample_plates, self.generators)
        self.minibatches.load_state_dict(saved["minibatches"])
        self.divergence_record.load_state_dict(saved, device)
        self._last_step_size = saved["last_step_size"]
        if "control_variate" in saved:
            if isinstance(self.gradient_estimator, ControlVariate):
                self.gradient_estimator.load_state_dict(saved["control_variate"], device)
            else:  # "auto": chosen in warmup
                saved_centre = saved["control_variate"]  # on the estimator's potential for one (data parallelism)
                potential = control_variate_potential(self.gradient_estimator, self.potential)
                self.gradient_estimator = ControlVariate.from_state_dict(potential, saved_centre, device)
        self.warmup.load_state_dict(saved, self.state, warmup_context(self))

    # ------------------------------------------------------------------ statistics and read-outs
    @property
    def last_stats(self) -> Dict[str, torch.Tensor]:
        """Statistics of the last step, per chain (tensors of shape ``(num_chains,)``).

        ArviZ's names where they apply (``lp``, ``step_size``, ``diverging``), plain names for the
        rest (``temperature``; ``kinetic_energy`` and ``thermostat`` where the kernel has them;
        ``sampling_stage`` and ``cycle`` with a :class:`~pyro_sgmcmc.Cyclical` schedule).
        ``lp`` is the minibatch estimate of the log density in unconstrained space.
        """
        num_chains = self.state.position.shape[0]
        options = {"dtype": torch.float64, "device": self.state.position.device}  # float64: a huge T or step fits
        step_size = self._last_step_size
        stats = {
            "lp": -self.state.potential,
            "step_size": (
                step_size.reshape(num_chains).to(**options)
                if torch.is_tensor(step_size)
                else torch.full((num_chains,), step_size, **options)
            ),
            "diverging": self.divergence_record.last.clone(),
            "temperature": torch.full((num_chains,), self.temperature, **options),
            "num_divergences": self.divergence_record.num_divergences.clone(),
        }
        stats.update(self._auxiliary_stats(self.state))
        stats.update(self.step_size.stage_stats(self.state.step - 1, num_chains, options["device"]))  # its stage
        return stats

    @property
    def num_divergences(self) -> int:
        """Divergences so far, over all chains, warmup included."""
        if self.divergence_record is None:
            return 0
        self.flush_divergences()
        return self.divergence_record.count

    @property
    def divergences(self) -> List[List[int]]:
        """Per chain, the indices of the divergent draws (sampling phase)."""
        self.flush_divergences()
        return self.divergence_record.divergences

    @property
    def divergence_log(self) -> List[tuple]:
        """``(chain, step, phase, what)`` for every divergence of the run."""
        self.flush_divergences()
        return self.divergence_record.log

    @property
    def phase(self) -> str:
        """``"approach"``, ``"adaptation"`` (the rest of warmup), ``"warmup"`` (no adaptation) or ``"sampling"``."""
        return self.warmup.phase(self.state.step if self.state is not None else 0)

    @property
    def inverse_mass_matrix(self) -> Optional[torch.Tensor]:
        """The preconditioner :math:`P = L L^\\top` per chain in normalised units, ``(C, D)`` (diagonal)
        or ``(C, D, D)`` (``full_mass``); ``None`` without ``adapt_mass_matrix``. Frozen after warmup."""
        return self.warmup.inverse_mass_matrix

    start_at_centre = checks.renamed_attribute("start_at_centre", "init_to_centre")


SGMCMCKernel.__signature__ = checks.kernel_signature(SGMCMCKernel.__init__, SGMCMCKernel.configure_dynamics)

