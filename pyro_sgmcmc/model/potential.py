"""From a Pyro model to an unconstrained, minibatch potential energy and its gradient, batched over chains.

The model is traced once (:mod:`~pyro_sgmcmc.model.trace`), its latent sites laid out in one flat
unconstrained vector (:mod:`~pyro_sgmcmc.model.layout`); each evaluation re-runs the model with the
latent values substituted, so every call draws a fresh minibatch through the model's
``pyro.plate(..., subsample_size=B)`` statements, and Pyro scales each site's log-probability by
``size / subsample_size``. The estimate

.. math:: \\widehat{\\log \\pi}(z) = \\log p(\\theta) + \\frac{N}{B} \\sum_{n \\in \\mathcal{B}}
          \\log p(y_n \\mid \\theta) + \\log |\\det J_{T}(z)|, \\qquad \\theta = T(z),

and its gradient are unbiased for the full-data log posterior in unconstrained space; the potential
is :math:`U(z) = -\\widehat{\\log \\pi}(z)`. The log joint is summed as the model runs
(:mod:`~pyro_sgmcmc.model.log_joint`, with the Normal priors of :mod:`~pyro_sgmcmc.model.priors`);
one chain can be compiled and many chains vectorised (:mod:`~pyro_sgmcmc.model.compiled`).
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import pyro.poutine as poutine
import torch
from pyro.infer.autoguide.initialization import InitMessenger, init_to_uniform

from . import checks
from .argument_types import naming_non_tensor_data
from .checks import nonfinite_observations, nonfinite_sites, parameter_names
from .compiled import JitMode, Vectorized, check_jit_compile, compile_potential, value_and_grad
from .data_shapes import check_observed_batch_shapes, naming_short_data, probe_last_rows
from .layout import Layout
from .log_joint import LogJoint
from .priors import FastNormalPriors, StandardPriors
from .trace import LatentSite, ModelError, SubsamplePlate, trace_model

__all__ = [
    "JitMode",
    "LatentSite",
    "ModelError",
    "ModelPotential",
    "SubsamplePlate",
    "check_jit_compile",
]


class ModelPotential:
    """The unconstrained, minibatch potential energy :math:`U(z) = -\\widehat{\\log \\pi}(z)` of a Pyro model.

    Parameters
    ----------
    model : callable
        A Pyro model. Latent sites must be continuous and global (outside every subsampled
        plate); observed sites may sit in any number of plates, subsampled or not, nested or not.
    model_args, model_kwargs :
        The arguments the model is called with on every evaluation.
    init_strategy : callable
        A Pyro init strategy (:func:`pyro.infer.autoguide.init_to_uniform`, ``init_to_median``,
        ``init_to_sample``, ``init_to_value(values=...)``, ...), used by :meth:`initial_position`.
    num_data : int, optional
        :math:`N`, the number of data that normalises the drift. By default the number of
        likelihood terms: over observed sites, the largest product of the *full* sizes of the
        plates around the site (for the usual ``pyro.plate("data", N, subsample_size=B)`` model,
        ``N``). A model with no plate around its observations has ``N = 1``.
    jit_compile : bool or "auto"
        Compile the single-chain potential with :func:`torch.jit.trace` on its first minibatch
        evaluation (as ``pyro.infer.HMC(jit_compile=True)`` does): the Pyro machinery (tracing,
        handlers, transforms) and the model's Python run once, later steps replay the recorded
        tensor operations, several times faster for small models. The model must take the same
        path of Python control flow at every evaluation (no branching on latent values or data)
        and have no Python side effects that later evaluations depend on (a global variable
        changed during the run, Python's or NumPy's random numbers); torch's random numbers are
        replayed fresh. The compiled function is checked against the plain one at two points
        (the example point and a moved point with other indices) and dropped if they disagree or
        if tracing fails. Vectorised chains (:meth:`batched_potential_and_grad` with more than
        one chain) use :func:`torch.func.vmap` instead and ignore this flag.

        * ``"auto"`` (the default) compiles only what can be checked to be safe: not while Pyro's
          validation is on (a compiled function would check only the first minibatch's values;
          ``MCMC`` turns validation off), and only a model that gives bit-identical results when
          run twice on the same point and minibatch (which rules out random numbers of any kind
          in the model). Otherwise, and when the check or tracing fails, it stays uncompiled,
          silently: results are the same, only slower. :attr:`compiled` tells which happened.
        * ``True`` compiles whenever tracing and the two-point check succeed (Pyro's validation
          is switched off while tracing), and warns when it cannot.
        * ``False`` runs the model's Python at every evaluation, as Pyro's own kernels do by
          default: for models with side effects (printing, counting calls, reading a variable
          changed by a hook).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import ModelPotential
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
    ...     with pyro.plate("data", len(y), subsample_size=2) as idx:
    ...         pyro.sample("y", dist.Normal(mu, 1.), obs=y[idx])
    >>> potential = ModelPotential(model, (torch.tensor([0., 1., 2., 3.]),), {})
    >>> potential.dim, potential.num_data, [p.name for p in potential.subsample_plates]
    (1, 4, ['data'])
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: Optional[dict] = None,
        *,
        init_strategy: Callable = init_to_uniform,
        num_data: Optional[int] = None,
        jit_compile: JitMode = "auto",
    ) -> None:
        self.model = model
        self.jit_compile = check_jit_compile(jit_compile)
        self._jitted: Optional[Callable] = None  # the compiled potential, once traced
        #: Why compilation was given up (the first line of the error), or None; once set, not tried again.
        self.jit_failure: Optional[str] = None
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.init_strategy = init_strategy

        args, kwargs, first_run = self.model_args, self.model_kwargs, _first_run(self, num_data)
        with naming_short_data(model, args, kwargs), naming_non_tensor_data(model, args, kwargs, first_run):
            traced = trace_model(model, args, kwargs, init_strategy, num_data)
        check_observed_batch_shapes(traced)
        probe_last_rows(model, args, kwargs, traced)  # an argument shorter than its plate fails here, named
        self._init_fn = traced.init_fn
        self.subsample_plates: List[SubsamplePlate] = traced.subsample_plates
        self.sites: List[LatentSite] = traced.sites
        self.dtype: torch.dtype = traced.dtype
        self.device: torch.device = traced.device
        self.num_data: int = traced.num_data
        #: The flat unconstrained layout of the latent sites (pack, unpack, transforms).
        self.layout = Layout(self.sites, self.dtype, self.device)
        self.dim: int = self.layout.dim
        # the init strategy's values in the trace: the first starting point tried (None once used)
        self._prototype_values: Optional[Dict[str, torch.Tensor]] = traced.values

        # Built once: the model with latent values substituted from a dict refilled in place.
        self._values: Dict[str, torch.Tensor] = {}
        # Normal priors of the latent sites are evaluated in a cheaper but equal form (FastNormalPriors).
        priors = FastNormalPriors(self.site_names)
        self._conditioned_model = priors(poutine.condition(model, data=self._values))
        # The hot path: one handler that conditions, swaps the priors and sums the log-probabilities as
        # the model runs (no trace is built); it gives the same sum, in the same order, as the trace.
        self._log_joint = LogJoint(self._values, priors, StandardPriors.find(traced.trace, self.sites))
        #: The potential vectorised over chains and over minibatches (:mod:`pyro_sgmcmc.model.compiled`).
        self.vectorized = Vectorized(self._potential)
        _check_finite_data(self, traced.values)

    # ------------------------------------------------------------------ layout
    @property
    def site_names(self) -> List[str]:
        return self.layout.site_names

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        """The map ``{name: transform}`` from constrained to unconstrained space (Pyro's convention)."""
        return self.layout.transforms

    def unpack(self, position: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Split a flat position ``(..., dim)`` into unconstrained site values ``(..., *shape)`` (views)."""
        return self.layout.unpack(position)

    def pack(self, params: Mapping[str, torch.Tensor], batch_shape: Tuple[int, ...] = ()) -> torch.Tensor:
        """Concatenate unconstrained site values ``{name: (*batch_shape, *shape)}`` into ``(*batch_shape, dim)``."""
        return self.layout.pack(params, batch_shape)

    def constrain(self, position: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Map a flat unconstrained position to constrained site values."""
        return self.layout.constrain(position)

    # ------------------------------------------------------------------ evaluation
    def log_density(self, position: torch.Tensor, indices: Optional[Mapping[str, torch.Tensor]] = None) -> torch.Tensor:
        """Minibatch estimate of :math:`\\log \\pi(z)` in unconstrained space for one chain.

        Parameters
        ----------
        position : Tensor ``(dim,)``
        indices : dict, optional
            ``{plate name: LongTensor (subsample_size,)}``, the minibatch of each subsampled plate.
            By default each plate draws its own fresh subsample (Pyro's behaviour).
        """
        values = self._values
        values.clear()
        if indices:
            values.update(indices)
        log_det = self.layout.constrain_into(position, values)
        try:
            log_joint = self._log_joint.run(self.model, self.model_args, self.model_kwargs, position)
        except Exception as error:
            # re-run the plain way: its error names the site and shows the shapes traced so far
            trace = poutine.trace(self._conditioned_model).get_trace(*self.model_args, **self.model_kwargs)
            trace.log_prob_sum()
            raise error
        return log_joint if log_det is None else log_joint + log_det

    def potential_and_grad(
        self, position: torch.Tensor, indices: Optional[Mapping[str, torch.Tensor]] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return ``(U(z), dU/dz)`` for one chain, both detached; ``U = -log_density``."""
        if self.jit_compile and indices is not None and len(indices) == len(self.subsample_plates):
            plate_indices = [indices[p.name] for p in self.subsample_plates]
            compiled = self._jitted if self._jitted is not None else self._compile(position, plate_indices)
            if compiled is not None:
                return value_and_grad(compiled, position, plate_indices)
        with torch.enable_grad():
            z = position.detach().requires_grad_(True)
            potential = -self.log_density(z, indices)
            (grad,) = torch.autograd.grad(potential, z, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(position)
        return potential.detach().to(position.dtype), grad

    def batched_potential_and_grad(
        self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(U, dU/dz)`` for a batch of chains in one vectorised call.

        ``positions`` is ``(num_chains, dim)`` and ``indices`` maps each subsampled plate to a
        ``(num_chains, subsample_size)`` LongTensor: every chain sees its own minibatch. The model
        runs once under :func:`torch.func.vmap` (Pyro's validation is switched off inside, as
        ``pyro.infer.MCMC`` does: unconstrained values are always in the support).
        Returns ``(num_chains,)`` and ``(num_chains, dim)``.
        """
        if positions.shape[0] == 1:  # no vmap overhead for a single chain
            potential, grad = self.potential_and_grad(positions[0], {k: v[0] for k, v in indices.items()})
            return potential.unsqueeze(0), grad.unsqueeze(0)
        result = self.vectorized.over_chains(positions, indices)
        if result is not None:
            return result
        results = [self.potential_and_grad(z, {k: v[c] for k, v in indices.items()}) for c, z in enumerate(positions)]
        return torch.stack([r[0] for r in results]), torch.stack([r[1] for r in results])

    def summed_potential_and_grad(
        self, position: torch.Tensor, indices: Mapping[str, torch.Tensor]
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(sum_k U_k(z), sum_k dU_k/dz)`` over ``K`` minibatches at *one* point ``z``.

        ``position`` is ``(dim,)`` and ``indices`` maps each subsampled plate to a ``(K,
        subsample_size)`` LongTensor. The model runs once under :func:`torch.func.vmap` over the
        minibatches only, with ``z`` shared (not batched): the model's products with the latent
        values are then single matrix-vector products over all ``K B`` data instead of ``K``
        batched ones, and the gradient of the sum is taken once (for a logistic regression on
        10^6 data, 4-5 times faster than :meth:`batched_potential_and_grad` on ``K`` copies of
        ``z``). Used for full-data passes (control variates). Returns ``None`` when the model
        cannot run this way (the caller then uses :meth:`batched_potential_and_grad`).
        """
        return self.vectorized.over_minibatches(position, indices)

    def _potential(self, position: torch.Tensor, indices: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return -self.log_density(position, indices)

    def forget_compiled(self) -> None:
        """Drop the compiled potential (and any decision not to compile): the next evaluation decides
        afresh. The kernels call this at every set-up, so a run sees what the model's Python does then
        (a global variable changed between two runs, say), not what it did when the previous run traced it."""
        self._jitted = None
        self.jit_failure = None

    @property
    def compiled(self) -> bool:
        """Whether the single-chain potential now runs as a compiled function (see ``jit_compile``)."""
        return self._jitted is not None

    def _compile(self, position: torch.Tensor, plate_indices: List[torch.Tensor]) -> Optional[Callable]:
        """Compile the single-chain potential once (:func:`~pyro_sgmcmc.model.compiled.compile_potential`);
        ``None`` on failure, with a warning for ``jit_compile=True``."""
        if self.jit_failure is not None:
            return None
        names = [plate.name for plate in self.subsample_plates]

        def potential(z, *indices):
            return -self.log_density(z, dict(zip(names, indices)))

        automatic = self.jit_compile == "auto"
        self._jitted, self.jit_failure = compile_potential(potential, position, plate_indices, automatic)
        if self.jit_failure is not None and not automatic:
            warnings.warn(
                f"jit_compile=True: could not compile the model's potential ({self.jit_failure}); "
                "running without compilation",
                RuntimeWarning,
            )
        return self._jitted

    # ------------------------------------------------------------------ what is not finite (failure paths)
    def nonfinite_log_densities(
        self, position: torch.Tensor, indices: Optional[Mapping[str, torch.Tensor]]
    ) -> List[str]:
        """Name the sites whose log-density is not finite at ``position`` (``(dim,)``) on a minibatch.

        Not for the hot path: the model is traced once, each site's log-density computed apart
        (unscaled). Each entry names the site, how many values are ``-inf``, ``+inf`` or NaN, and for
        an observed site in a subsampled plate the data indices at fault (the first five).
        """
        return nonfinite_sites(self, position, indices)

    # ------------------------------------------------------------------ initialisation
    def initial_position(
        self,
        initial_params: Optional[Mapping[str, torch.Tensor]] = None,
        max_tries: int = 100,
        fresh: bool = False,
    ) -> torch.Tensor:
        """A starting position: ``initial_params`` (unconstrained, Pyro's convention) if given,
        else a draw from ``init_strategy`` with finite potential and gradient (up to ``max_tries`` draws).

        The first draw reuses the values of the trace that built the potential (one model run saved), unless
        ``fresh``: then those are dropped and the point is drawn now, under the caller's random state (a seeded
        start must not return values drawn before its seed was set)."""
        with naming_non_tensor_data(self.model, self.model_args, self.model_kwargs, _first_run(self, self.num_data)):
            return self._initial_position(initial_params, max_tries, fresh)

    def _initial_position(
        self, initial_params: Optional[Mapping[str, torch.Tensor]], max_tries: int, fresh: bool
    ) -> torch.Tensor:
        if initial_params is not None:
            position = self.pack(initial_params)
            potential, grad = self.potential_and_grad(position, self.check_indices())
            if not (torch.isfinite(potential) and torch.isfinite(grad).all()):
                raise ValueError("initial_params give a non-finite potential energy or gradient")
            return position
        for _ in range(max_tries):
            position, indices = self.draw_start(fresh)
            fresh = False
            potential, grad = self.potential_and_grad(position, indices)
            if torch.isfinite(potential) and torch.isfinite(grad).all():
                return position
        raise ModelError(
            f"could not find an initial point with finite potential and gradient in {max_tries} draws "
            "of init_strategy; check the model or pass initial_params"
        )

    def draw_start(self, fresh: bool = False) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """One unchecked draw of ``init_strategy`` (the values of the trace that built the potential, the first
        time, unless ``fresh``) and the minibatch to check it on, drawn first: ``(position, indices)``."""
        indices = self.check_indices()
        values, self._prototype_values = (None if fresh else self._prototype_values), None
        if values is None:
            model = InitMessenger(self._init_fn)(poutine.condition(self.model, data=indices))
            with poutine.block():
                trace = poutine.trace(model).get_trace(*self.model_args, **self.model_kwargs)
            values = {s.name: trace.nodes[s.name]["value"].detach() for s in self.sites}
        return self.layout.unconstrain(values), indices

    def check_indices(self) -> Dict[str, torch.Tensor]:
        """A minibatch for checking a starting point (``B`` indices drawn with replacement, ``O(B)``).

        Left to itself, Pyro's plate draws its subsample from ``torch.randperm(N)``, ``O(N)`` per
        model run: at ``N = 10^7`` that is 70 ms per chain and per run, for a finiteness check.
        """
        return {
            plate.name: torch.randint(plate.size, (plate.subsample_size,), device=self.device)
            for plate in self.subsample_plates
            if not plate.user_indices
        }


def _first_run(potential: ModelPotential, num_data: Optional[int]) -> Callable[[tuple, dict], None]:
    """``run(args, kwargs)``: trace the model on other arguments and take the gradient of its log joint
    once, raising as the potential's set-up would (diagnosis of a failed set-up only)."""

    def run(args: tuple, kwargs: dict) -> None:
        traced = trace_model(potential.model, args, kwargs, potential.init_strategy, num_data)
        values = {name: value.detach().requires_grad_() for name, value in traced.values.items()}
        with poutine.block():
            trace = poutine.trace(poutine.condition(potential.model, data=values)).get_trace(*args, **kwargs)
        trace.log_prob_sum().backward()

    return run


def _check_finite_data(potential: ModelPotential, values: Mapping[str, torch.Tensor]) -> None:
    """Refuse data with non-finite values that reach the likelihood, naming the sites and counts.

    Once, at set-up: one ``isfinite`` pass over each floating-point tensor argument of the model.
    Only if one holds a NaN or an infinity is the model traced over the full data (chunk by chunk
    of each subsampled plate), with the latent sites at ``values``, to find the observed sites whose
    values or log-densities they make non-finite; non-finite values the model never uses, or masks,
    are accepted.
    """
    names = parameter_names(potential.model)
    arguments = checks.nonfinite_arguments(potential.model_args, potential.model_kwargs, names)
    if not arguments:
        return
    problems = nonfinite_observations(potential, dict(values))
    if problems:
        raise ModelError(
            "the data passed to the model hold non-finite values ("
            + "; ".join(arguments)
            + ") that reach the likelihood: "
            + "; ".join(problems)
            + ". Every minibatch holding one would be a divergence. Remove or impute them, or mask them "
            "(poutine.mask, or obs_mask)"
        )
