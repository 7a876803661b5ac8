"""From a Pyro model to an unconstrained, minibatch log density and its gradient.

Pyro's :func:`pyro.infer.mcmc.util.initialize_model` refuses models with subsampled plates,
because an exact MCMC kernel cannot work with a noisy density. Stochastic-gradient kernels
need exactly that noisy density, so this module does the model initialisation itself:

* the model is traced once (in :class:`ModelPotential`'s constructor, i.e. the kernel's
  ``setup``) to find the latent sites, their shapes and supports, the subsampled plates and
  the number of data ``N``;
* every latent site is moved to unconstrained space with
  ``torch.distributions.biject_to(site.support)``; the log-det Jacobian is added to the target;
* each evaluation re-runs the model with the latent values substituted, so every call draws a
  fresh minibatch through the model's ``pyro.plate(..., subsample_size=B)`` statements, and
  Pyro scales each site's log-probability by ``size / subsample_size``. The estimate

  .. math:: \\widehat{\\log \\pi}(z) = \\log p(\\theta) + \\frac{N}{B} \\sum_{n \\in \\mathcal{B}}
            \\log p(y_n \\mid \\theta) + \\log |\\det J_{T}(z)|, \\qquad \\theta = T(z),

  and its gradient are unbiased for the full-data log posterior in unconstrained space.

The position of one chain is a flat vector ``z`` of ``dim`` unconstrained values; the sites are
views into it in the sorted order of their names (Pyro's own convention for ``MCMC`` draws).
"""

from __future__ import annotations

import inspect
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Literal, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide.initialization import InitMessenger, init_to_uniform
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from pyro.poutine.util import is_validation_enabled
from pyro.util import warn_if_inf, warn_if_nan
from torch.distributions import biject_to

__all__ = ["LatentSite", "SubsamplePlate", "ModelPotential", "ModelError"]

#: ``jit_compile``'s accepted values (see :class:`ModelPotential`).
JitMode = Union[bool, Literal["auto"]]


class ModelError(ValueError):
    """The model cannot be sampled by a stochastic-gradient kernel (the message says why)."""


def check_jit_compile(jit_compile: object) -> JitMode:
    """``jit_compile`` itself if it is True, False or ``"auto"``; a TypeError naming it otherwise."""
    if isinstance(jit_compile, bool) or jit_compile == "auto":
        return jit_compile  # type: ignore[return-value]
    raise TypeError(f'jit_compile must be True, False or "auto"; got {jit_compile!r}')


@dataclass(frozen=True)
class LatentSite:
    """A latent sample site and where its unconstrained value lives in the flat position."""

    name: str
    shape: torch.Size  # constrained shape
    unconstrained_shape: torch.Size
    offset: int
    numel: int
    transform: torch.distributions.Transform  # unconstrained -> constrained
    has_jacobian: bool  # False for the identity (real support): no log-det term to add

    @property
    def slice(self) -> slice:
        return slice(self.offset, self.offset + self.numel)


@dataclass(frozen=True)
class SubsamplePlate:
    """A plate that was subsampled: its name, full ``size`` and ``subsample_size``.

    ``user_indices`` is True when the model passes ``pyro.plate(..., subsample=indices)`` itself:
    the kernels then leave the choice of minibatch to the model.
    """

    name: str
    size: int
    subsample_size: int
    user_indices: bool = False

    @property
    def scale(self) -> float:
        return self.size / self.subsample_size


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

        hint = _data_dtype_and_device(self.model_args, self.model_kwargs)
        self._init_fn = _discrete_from_prior(init_strategy, *hint)
        with poutine.block():
            checked = _SubsampleCheck()(InitMessenger(self._init_fn)(model))
            prototype = poutine.trace(checked).get_trace(*self.model_args, **self.model_kwargs)
        self.subsample_plates = _find_subsample_plates(prototype)
        self.sites, self._prototype_values = _find_latent_sites(prototype, self.subsample_plates)
        _check_observed_shapes(prototype)
        self.dim = sum(site.numel for site in self.sites)
        self._site_sizes = [site.numel for site in self.sites]
        # per site, decided once: (name, unconstrained shape, transform or None for the identity); the shapes
        # as plain tuples, which Tensor.view parses faster than torch.Size
        self._layout = [
            (site.name, tuple(site.unconstrained_shape), site.transform if site.has_jacobian else None)
            for site in self.sites
        ]
        # the position's dtype: promoted over the latent values and the observed data
        values = list(self._prototype_values.values()) + [
            site["value"] for site in prototype.nodes.values()
            if site["type"] == "sample" and site["is_observed"] and torch.is_tensor(site["value"])
            and site["value"].is_floating_point()
        ]  # fmt: skip
        self.dtype = _promote([v.dtype for v in values if v.is_floating_point()] or [torch.get_default_dtype()])
        self.device = hint[1] if hint[1] is not None else next(iter(self._prototype_values.values())).device
        self.num_data = (
            _default_num_data(prototype, self.subsample_plates) if num_data is None else _check_num_data(num_data)
        )

        # Built once: the model with latent values substituted from a dict refilled in place.
        self._values: Dict[str, torch.Tensor] = {}
        # Normal priors of the latent sites are evaluated in a cheaper but equal form (_FastNormalPriors).
        priors = _FastNormalPriors(self.site_names)
        self._conditioned_model = priors(poutine.condition(model, data=self._values))
        # The hot path: one handler that conditions, swaps the priors and sums the log-probabilities as
        # the model runs (no trace is built); it gives the same sum, in the same order, as the trace.
        self._log_joint = _LogJoint(self._values, priors, _StandardPriors.find(prototype, self.sites))
        self._batched_fn = None
        self._vectorizable = True
        self._summed_fn = None
        self._summable = True
        _check_finite_data(self)

    # ------------------------------------------------------------------ layout
    @property
    def site_names(self) -> List[str]:
        return [site.name for site in self.sites]

    @property
    def transforms(self) -> Dict[str, torch.distributions.Transform]:
        """The map ``{name: transform}`` from constrained to unconstrained space (Pyro's convention)."""
        return {site.name: site.transform.inv for site in self.sites}

    def unpack(self, position: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Split a flat position ``(..., dim)`` into unconstrained site values ``(..., *shape)``."""
        # one split into views (one call) rather than an indexing per site
        parts = position.split(self._site_sizes, -1)
        if position.dim() == 1 and position.stride(0) == 1:  # one chain (Pyro's sample(), at every step)
            return {name: part.view(shape) for (name, shape, _), part in zip(self._layout, parts)}
        batch = tuple(position.shape[:-1])
        return {name: part.reshape(batch + shape) for (name, shape, _), part in zip(self._layout, parts)}

    def pack(self, params: Mapping[str, torch.Tensor], batch_shape: Tuple[int, ...] = ()) -> torch.Tensor:
        """Concatenate unconstrained site values ``{name: (*batch_shape, *shape)}`` into ``(*batch_shape, dim)``."""
        missing = [s.name for s in self.sites if s.name not in params]
        unknown = sorted(set(params) - set(self.site_names))
        if missing or unknown:
            raise ValueError(
                f"initial_params must give exactly the latent sites {self.site_names}; "
                f"missing {missing}, unknown {unknown}"
            )
        if not isinstance(params, Mapping):
            raise TypeError(
                f"initial_params must be a dict {{site name: unconstrained tensor}}; got {type(params).__name__}"
            )
        parts = []
        for site in self.sites:
            try:
                value = torch.as_tensor(params[site.name], dtype=self.dtype, device=self.device)
            except (TypeError, ValueError, RuntimeError) as error:
                raise TypeError(
                    f"initial_params[{site.name!r}] must be a tensor or array of numbers; got {params[site.name]!r}"
                ) from error
            expected = tuple(batch_shape) + tuple(site.unconstrained_shape)
            if tuple(value.shape) != expected:
                raise ValueError(
                    f"initial_params[{site.name!r}] must have the unconstrained shape {expected}; "
                    f"got {tuple(value.shape)}"
                )
            parts.append(value.reshape(tuple(batch_shape) + (site.numel,)))
        return torch.cat(parts, dim=-1)

    def constrain(self, position: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Map a flat unconstrained position to constrained site values."""
        return {site.name: site.transform(u) for site, u in zip(self.sites, self.unpack(position).values())}

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
        log_det = None
        # one split into per-site views (cheaper under vmap than a slice per site)
        for (name, shape, transform), flat in zip(self._layout, position.split(self._site_sizes)):
            u = flat.view(shape)
            if transform is None:  # real support: the identity (Pyro's would return u itself)
                values[name] = u
                continue
            x = values[name] = transform(u)
            term = transform.log_abs_det_jacobian(u, x).sum()
            log_det = term if log_det is None else log_det + term
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
            compiled = self._jitted if self._jitted is not None else self._compile(position, indices)
            if compiled is not None:
                return _value_and_grad(compiled, position, [indices[p.name] for p in self.subsample_plates])
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
        if self._batched_fn is None:
            # the forward pass under vmap, the backward by plain autograd: the chains are independent, so
            # the gradient of the sum of their potentials holds each chain's gradient in its row. Bit for
            # bit what vmap(grad_and_value) gives, and 5-7 % faster at 256 chains of a 3k-weight MLP
            self._batched_fn = torch.func.vmap(self._potential, in_dims=(0, 0), randomness="different")
        if self._vectorizable:
            try:
                with pyro.validation_enabled(False), torch.enable_grad():
                    z = positions.detach().requires_grad_(True)
                    potential = self._batched_fn(z, dict(indices))
                    (grad,) = torch.autograd.grad(potential.sum(), z, allow_unused=True)
                if grad is None:  # a potential that does not depend on the position
                    grad = torch.zeros_like(positions)
                return potential.detach().to(positions.dtype), grad
            except RuntimeError as error:  # e.g. .item() or data-dependent control flow in the model
                if _out_of_memory(error):  # not a property of the model: never a reason to give up vmap
                    raise
                self._vectorizable = False
                warnings.warn(
                    f"the model cannot run under torch.func.vmap ({str(error).splitlines()[0]}); "
                    "chains are evaluated one by one, which is slower (chain_method='vectorized')",
                    RuntimeWarning,
                )
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
        if not self._summable:
            return None
        if self._summed_fn is None:
            per_batch = torch.func.vmap(self._potential, in_dims=(None, 0), randomness="different")
            self._summed_fn = torch.func.grad_and_value(lambda z, idx: per_batch(z, idx).sum())
        try:
            with pyro.validation_enabled(False), torch.enable_grad():
                grad, potential = self._summed_fn(position.detach(), dict(indices))
        except RuntimeError as error:  # e.g. data-dependent control flow: the caller falls back to copies of z
            if _out_of_memory(error):
                raise
            self._summable = False
            return None
        return potential.detach().to(position.dtype), grad.detach()

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

    def _compile(self, position: torch.Tensor, indices: Mapping[str, torch.Tensor]) -> Optional[Callable]:
        """Trace the single-chain potential with :func:`torch.jit.trace` (once); check it at the
        example point and at a moved point with other indices; ``None`` on failure (with a warning
        for ``jit_compile=True``; ``"auto"`` also declines, without a warning, while Pyro's
        validation is on and for a model whose repeated evaluation is not bit-identical)."""
        if self.jit_failure is not None:
            return None
        automatic = self.jit_compile == "auto"
        if automatic and is_validation_enabled():
            return None  # decided again at the next evaluation: validation may be switched off later
        names = [plate.name for plate in self.subsample_plates]

        def potential(z, *plate_indices):
            return -self.log_density(z, dict(zip(names, plate_indices)))

        example = [indices[name] for name in names]
        try:
            at_example = _value_and_grad(potential, position, example)
            if automatic:
                if not all(bool(torch.isfinite(t).all()) for t in at_example):
                    return None  # e.g. an initial point being tried: decided at a finite one
                again = _value_and_grad(potential, position, example)
                if not all(torch.equal(a, b) for a, b in zip(at_example, again)):
                    raise RuntimeError("the model gives different results on the same point and minibatch")
            with pyro.validation_enabled(False), warnings.catch_warnings(), torch.enable_grad():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                # torch (2.13 here) marks torch.jit.trace deprecated; it still works, and if it is ever removed
                # the AttributeError lands in the fallback below
                warnings.filterwarnings("ignore", message=".*torch.jit.trace.*deprecated", category=DeprecationWarning)
                compiled = torch.jit.trace(
                    potential, (position.detach().requires_grad_(True), *example), check_trace=False
                )
            moved = position.detach() + 0.01 * torch.linspace(-1, 1, position.numel(), dtype=position.dtype)
            flipped = [i.flip(0) for i in example]
            for z, plate_indices, expected in ((position, example, at_example), (moved, flipped, None)):
                expected = expected or _value_and_grad(potential, z, plate_indices)
                got = _value_and_grad(compiled, z, plate_indices)
                for a, b in zip(expected, got):
                    # relative to the largest entry: float32 round-off in a gradient of size 1e5 is ~1e-2
                    # on every entry, however small the entry itself
                    scale = float(b.abs().max()) if bool(torch.isfinite(b).all()) and b.numel() else 0.0
                    if not torch.allclose(a, b, rtol=0.0, atol=1e-5 + 1e-4 * scale, equal_nan=True):
                        raise RuntimeError("the compiled potential disagrees with the model at a second point")
        except Exception as error:  # any tracing failure: fall back to the plain potential
            self.jit_failure = str(error).splitlines()[0] if str(error) else type(error).__name__
            if not automatic:
                warnings.warn(
                    f"jit_compile=True: could not compile the model's potential ({self.jit_failure}); "
                    "running without compilation",
                    RuntimeWarning,
                )
            return None
        self._jitted = compiled
        return compiled

    # ------------------------------------------------------------------ what is not finite (failure paths)
    def nonfinite_log_densities(
        self, position: torch.Tensor, indices: Optional[Mapping[str, torch.Tensor]]
    ) -> List[str]:
        """Name the sites whose log-density is not finite at ``position`` (``(dim,)``) on a minibatch.

        Not for the hot path: the model is traced once, each site's log-density computed apart
        (unscaled). Each entry names the site, how many values are ``-inf``, ``+inf`` or NaN, and for
        an observed site in a subsampled plate the data indices at fault (the first five).
        """
        values = {site.name: site.transform(u) for site, u in zip(self.sites, self.unpack(position).values())}
        with pyro.validation_enabled(False), torch.no_grad():
            trace = _trace_at(self, values, dict(indices or {}))
            found = []
            for name, site in trace.nodes.items():
                if site["type"] != "sample" or isinstance(site["fn"], _Subsample):
                    continue
                log_prob = _site_log_prob_unscaled(site)
                if bool(torch.isfinite(log_prob).all()):
                    continue
                kind = "observed site" if site["is_observed"] and name not in values else "site"
                where = _data_indices(site, ~torch.isfinite(log_prob), indices or {})
                found.append(f"{kind} {name!r}: log-density {_count_nonfinite(log_prob)}{where}")
            for site, u in zip(self.sites, self.unpack(position).values()):
                if site.has_jacobian and not bool(
                    torch.isfinite(site.transform.log_abs_det_jacobian(u, values[site.name])).all()
                ):
                    found.append(f"site {site.name!r}: log-Jacobian of its transform to the support is not finite")
        return found

    # ------------------------------------------------------------------ initialisation
    def initial_position(
        self,
        initial_params: Optional[Mapping[str, torch.Tensor]] = None,
        max_tries: int = 100,
    ) -> torch.Tensor:
        """A starting position: ``initial_params`` (unconstrained, Pyro's convention) if given,
        else a draw from ``init_strategy`` with finite potential and gradient (up to ``max_tries`` draws)."""
        if initial_params is not None:
            position = self.pack(initial_params)
            potential, grad = self.potential_and_grad(position, self._check_indices())
            if not (torch.isfinite(potential) and torch.isfinite(grad).all()):
                raise ValueError("initial_params give a non-finite potential energy or gradient")
            return position
        values = self._prototype_values
        for _ in range(max_tries):
            indices = self._check_indices()
            if values is None:
                model = InitMessenger(self._init_fn)(poutine.condition(self.model, data=indices))
                with poutine.block():
                    trace = poutine.trace(model).get_trace(*self.model_args, **self.model_kwargs)
                values = {s.name: trace.nodes[s.name]["value"].detach() for s in self.sites}
            position = torch.cat([s.transform.inv(values[s.name]).reshape(-1) for s in self.sites]).to(self.dtype)
            potential, grad = self.potential_and_grad(position, indices)
            if torch.isfinite(potential) and torch.isfinite(grad).all():
                self._prototype_values = None  # the next call draws a new point
                return position
            values = None
        raise ModelError(
            f"could not find an initial point with finite potential and gradient in {max_tries} draws "
            "of init_strategy; check the model or pass initial_params"
        )

    def _check_indices(self) -> Dict[str, torch.Tensor]:
        """A minibatch for checking a starting point (``B`` indices drawn with replacement, ``O(B)``).

        Left to itself, Pyro's plate draws its subsample from ``torch.randperm(N)``, ``O(N)`` per
        model run: at ``N = 10^7`` that is 70 ms per chain and per run, for a finiteness check.
        """
        return {
            plate.name: torch.randint(plate.size, (plate.subsample_size,), device=self.device)
            for plate in self.subsample_plates
            if not plate.user_indices
        }


def _value_and_grad(potential: Callable, position: torch.Tensor, plate_indices) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(U(z), dU/dz)``, detached, for a single-chain potential ``U(z, *plate_indices)``."""
    with torch.enable_grad():
        z = position.detach().requires_grad_(True)
        value = potential(z, *plate_indices)
        (grad,) = torch.autograd.grad(value, z, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(position)
    return value.detach().to(position.dtype), grad


# ---------------------------------------------------------------------- fast Normal priors
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_functorch = torch._C._functorch


class _StandardNormalForm:
    """Stands in for a (possibly ``Independent``) ``Normal`` at a latent site in the trace.

    .. math:: \\log p(x) = -\\tfrac12 \\sum_e \\Big(\\frac{x_e - \\mu_e}{\\sigma_e}\\Big)^2
              - \\sum_e \\big(\\log \\sigma_e + \\tfrac12 \\log 2\\pi\\big)

    summed over the ``event_dims`` rightmost axes: the same value as ``Normal.log_prob`` (to round-off).
    Constant parameters (the usual fixed prior) make it cheap under :func:`torch.func.vmap`: the
    normaliser is computed on the unbatched parameters, a zero mean skips the subtraction and a unit
    scale the division, so the batched work is one square and one sum. Only ``log_prob`` (all that
    :meth:`pyro.poutine.Trace.log_prob_sum` calls) and the shapes are provided.
    """

    def __init__(self, fn, loc: torch.Tensor, scale: torch.Tensor, event_dims: int) -> None:
        self.base = fn
        self.batch_shape = fn.batch_shape
        self.event_shape = fn.event_shape
        self.loc, self.scale, self.event_dims = loc, scale, event_dims
        shape = fn.batch_shape + fn.event_shape
        self._skip_loc = _is_constant(loc) and bool((loc == 0).all())
        self._skip_scale = _is_constant(scale) and bool((scale == 1).all())
        log_normaliser = (scale.log() + _HALF_LOG_2PI).expand(shape)
        self._log_normaliser = log_normaliser.sum(tuple(range(-event_dims, 0))) if event_dims else log_normaliser

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        standardised = value if self._skip_loc else value - self.loc
        if not self._skip_scale:
            standardised = standardised / self.scale
        square = standardised * standardised
        if self.event_dims:
            square = square.sum(tuple(range(-self.event_dims, 0)))
        return -0.5 * square - self._log_normaliser


def _is_constant(tensor: torch.Tensor) -> bool:
    """True for a tensor that depends on no input of the evaluation: it is not differentiated at any
    level and carries no vmapped (chain) dimension (tensors made inside :func:`torch.func.grad` are
    wrapped for it but do not require grad)."""
    while True:
        if tensor.requires_grad or _functorch.is_batchedtensor(tensor):
            return False
        if not _functorch.is_functorch_wrapped_tensor(tensor):
            return True
        tensor = _functorch.get_unwrapped(tensor)


def _is_batched(tensor: torch.Tensor) -> bool:
    """True inside :func:`torch.func.vmap` for a tensor with a vmapped (chain) dimension."""
    while True:
        if _functorch.is_batchedtensor(tensor):
            return True
        if not _functorch.is_functorch_wrapped_tensor(tensor):
            return False
        tensor = _functorch.get_unwrapped(tensor)


class _FastNormalPriors(Messenger):
    """Swap the ``Normal`` prior of each named latent site for :class:`_StandardNormalForm`.

    Only ``Normal`` and ``Independent(... Normal)`` with plain ``log_prob`` arguments are swapped;
    every other distribution is left as it is. A site whose distribution object is the same as at
    the previous call (a ``PyroSample`` prior built once) reuses the previous stand-in.
    """

    def __init__(self, site_names) -> None:
        super().__init__()
        self.site_names = frozenset(site_names)
        self._cache: Dict[str, tuple] = {}

    def _pyro_sample(self, msg) -> None:
        if msg["name"] not in self.site_names or msg["args"] or msg["kwargs"]:
            return
        fn = msg["fn"]
        cached = self._cache.get(msg["name"])
        if cached is not None and cached[0] is fn:
            msg["fn"] = cached[1]
            return
        normal = _normal_base(fn)
        if normal is None:
            return
        base, event_dims = normal
        # a prior built anew at every call from the same constants (dist.Normal(0., 1.).expand(...))
        # reuses the stand-in made for equal constants: no tensor work at all
        key = _broadcast_constant_key(base.loc), _broadcast_constant_key(base.scale)
        if cached is not None and key[0] is not None and key[1] is not None:
            if cached[2] == (key, event_dims, fn.batch_shape, fn.event_shape):
                msg["fn"] = cached[1]
                return
        fast = _StandardNormalForm(fn, base.loc, base.scale, event_dims)
        if _is_constant(base.loc) and _is_constant(base.scale):
            self._cache[msg["name"]] = (fn, fast, (key, event_dims, fn.batch_shape, fn.event_shape))
        msg["fn"] = fast


def _broadcast_constant_key(tensor: torch.Tensor) -> Optional[tuple]:
    """``(dtype, device, value)`` for a constant tensor that holds one value broadcast over its shape
    (a scalar, or a scalar expanded: all strides of its non-trivial axes are zero), else ``None``.

    Reads the value with ``.item()`` (a device sync): for set-up and rare paths only; the per-step check
    of the standard priors reads no value (:func:`_constant_scalar`, :meth:`_StandardPriors.verify`)."""
    if any(stride for stride, size in zip(tensor.stride(), tensor.shape) if size > 1) or not _is_constant(tensor):
        return None
    return tensor.dtype, tensor.device, tensor[(0,) * tensor.dim()].item()


def _constant_scalar(tensor: torch.Tensor) -> Optional[torch.Tensor]:
    """The one value of a constant broadcast tensor (see :func:`_broadcast_constant_key`) as a 0-d tensor
    that shares its storage, without reading it (no copy, no device sync); ``None`` for anything else.

    ``dist.Normal(0., 1.).expand(shape)`` holds views, all strides zero, of the 0-d tensors made from the
    Python floats: their ``_base`` is that 0-d tensor. Recognising this takes a few attribute reads, far
    fewer than indexing; any other tensor takes the general path."""
    if not (tensor.requires_grad or _functorch.is_functorch_wrapped_tensor(tensor)):
        base = tensor._base
        if (
            base is not None
            and base.dim() == 0
            and not any(tensor.stride())
            and tensor.storage_offset() == base.storage_offset()
        ):  # every element is the base's one element
            return base
    while True:  # unwrap torch.func's wrappers; a differentiated or vmapped tensor is not a constant
        if tensor.requires_grad or _functorch.is_batchedtensor(tensor):
            return None
        if not _functorch.is_functorch_wrapped_tensor(tensor):
            break
        tensor = _functorch.get_unwrapped(tensor)
    if tensor.dim() == 0:
        return tensor
    for stride, size in zip(tensor.stride(), tensor.shape):
        if size != 1 and (stride or not size):  # a varying axis, or no element at all
            return None
    return tensor.as_strided((), ())  # the element at the tensor's storage offset


class _LogJoint(Messenger):
    """Condition, swap the Normal priors and sum the sites' log-probabilities while the model runs.

    Equal to ``poutine.trace(poutine.condition(model, values)).get_trace(...).log_prob_sum()`` with
    :class:`_FastNormalPriors`, without building the trace: each sample site adds
    ``scale_and_mask(fn.log_prob(value), scale, mask).sum()`` once the plates have set its scale (the
    same terms in the trace's order). Subsample sites are skipped (their ``log_prob`` is zero). The
    latent sites found in set-up to have a constant zero-mean ``Normal`` prior on an unconstrained
    value (:class:`_StandardPriors`) are not evaluated one by one: when the model builds the same
    prior (checked for all of them at once after the run), their terms are added together in one
    product of the flat position with itself.
    """

    def __init__(self, values: Dict[str, torch.Tensor], priors: "_FastNormalPriors", standard) -> None:
        super().__init__()
        self.values = values
        self.priors = priors
        self.standard: Optional[_StandardPriors] = standard
        self._standard_names = standard.sites if standard is not None else frozenset()
        # per call: the log-probability terms in the trace's order (a deferred site holds its name),
        # and the deferred sites' (fn, value) and constants for the check after the run
        self._terms: List = []
        self._deferred: Dict[str, tuple] = {}
        self._scalars: List[torch.Tensor] = []

    def run(self, model: Callable, args: tuple, kwargs: dict, position: Optional[torch.Tensor] = None):
        terms, deferred, scalars = self._terms, self._deferred, self._scalars
        try:
            with self:
                model(*args, **kwargs)
            if not deferred:
                return _sum_terms(terms, 0.0)
            matched = self.standard.verify(deferred, scalars)
            if matched is None:  # the usual case: every deferred site built its set-up prior
                return self.standard.log_prob(position, self.values, deferred) + _sum_terms(terms, 0.0)
            return self._fallback(terms, deferred, matched, position)
        finally:  # do not keep the graph alive between calls
            terms.clear()
            deferred.clear()
            scalars.clear()

    def _fallback(self, terms: List, deferred: Dict[str, tuple], matched, position: torch.Tensor):
        """Some deferred site built another prior at this call: evaluate it in its place, as a site that
        was not deferred would have been (same stand-in, same order of the sum)."""
        for i, term in enumerate(terms):
            if isinstance(term, str) and term not in matched:
                fn, value = deferred[term]
                msg = {"name": term, "fn": fn, "args": (), "kwargs": {}}
                self.priors._pyro_sample(msg)
                terms[i] = self._site_log_prob(term, msg["fn"], value, (), {}, 1.0, None)
        total = _sum_terms(terms, 0.0)
        if not matched:
            return total
        return self.standard.log_prob(position, self.values, matched) + total

    # Pyro's Messenger looks the handler method up by name at every message; only sample sites matter here
    def _process_message(self, msg) -> None:
        if msg["type"] == "sample":
            self._pyro_sample(msg)

    def _postprocess_message(self, msg) -> None:
        if msg["type"] == "sample":
            self._pyro_post_sample(msg)

    def _pyro_sample(self, msg) -> None:
        name = msg["name"]
        if name in self.values:  # as poutine.condition
            msg["value"] = self.values[name]
            msg["is_observed"] = msg["value"] is not None
            # the last handler to see the site: its scale and mask are final here
            if name in self._standard_names:
                pair = self.standard.scalars(msg)
                if pair is not None:
                    self._deferred[name] = (msg["fn"], msg["value"])
                    self._scalars += pair
                    self._terms.append(name)
                    return
        self.priors._pyro_sample(msg)

    def _pyro_post_sample(self, msg) -> None:
        fn = msg["fn"]
        name = msg["name"]
        if isinstance(fn, _Subsample) or name in self._deferred:
            return
        self._terms.append(
            self._site_log_prob(name, fn, msg["value"], msg["args"], msg["kwargs"], msg["scale"], msg["mask"])
        )

    @staticmethod
    def _site_log_prob(name: str, fn, value, args, kwargs, scale, mask) -> torch.Tensor:
        try:
            log_p = fn.log_prob(value, *args, **kwargs)
        except ValueError as error:
            raise ValueError(f"Error while computing log_prob at site {name!r}:\n{error}") from error
        log_p = scale_and_mask(log_p, scale, mask).sum()
        if is_validation_enabled():
            warn_if_nan(log_p, f"log_prob_sum at site '{name}'")
            warn_if_inf(log_p, f"log_prob_sum at site '{name}'", allow_neginf=True)
        return log_p


def _sum_terms(terms: List, total):
    """``total + t_1 + t_2 + ...`` over the tensor terms, left to right (the trace's order); a leading
    ``0.0`` is not added (``0.0 + t`` is ``t``: one operation and one backward node fewer)."""
    for term in terms:
        if isinstance(term, str):  # a deferred site, summed apart
            continue
        total = term if isinstance(total, float) and total == 0.0 else total + term
    return total


class _SiteForm(NamedTuple):
    """What a standard prior looks like at set-up: checked at every call without reading a value."""

    event_dims: int
    batch_shape: torch.Size
    event_shape: torch.Size
    loc: tuple  # (dtype, device, value)
    scale: tuple


class _StandardPriors:
    """The latent sites whose prior is ``Normal(0, sigma)`` with constant ``sigma`` (possibly expanded and
    wrapped in ``Independent``) on an unconstrained (real) value, found once in set-up.

    .. math:: \\sum_s \\log \\mathcal{N}(x_s; 0, \\sigma_s^2) = -\\tfrac12 \\sum_s \\sigma_s^{-2}\\, x_s \\cdot x_s
              - \\sum_s d_s \\big(\\log \\sigma_s + \\tfrac12 \\log 2\\pi\\big)

    When all such sites are present (the usual case), this is one dot product of the flat position
    (weighted when the sites are not all of the sites or their ``sigma`` differ). At every call each site
    must still build the same prior, with unit scale and no mask, or it is evaluated the ordinary way.
    The check is in two parts, so that no value is read per site (a ``.item()`` is a device sync):
    :meth:`scalars` compares the structure as the site runs (types, shapes, dtypes, devices, broadcast
    constants) and :meth:`verify`, after the run, compares all the constants at once, in one tensor.
    """

    def __init__(self, forms: Dict[str, _SiteForm], sites) -> None:
        self.forms = forms
        self.sites = frozenset(forms)
        self._last: Dict[str, tuple] = {}  # name -> (fn, its constants) of the last call
        self._expected: Dict[tuple, torch.Tensor] = {}  # deferred names, in order -> their constants
        self._members = [site for site in sites if site.name in self.sites]
        self._inverse_variance = {s.name: 1.0 / forms[s.name].scale[2] ** 2 for s in self._members}
        self._log_normaliser = {
            s.name: s.numel * (math.log(forms[s.name].scale[2]) + _HALF_LOG_2PI) for s in self._members
        }
        self._total_log_normaliser = sum(self._log_normaliser.values())
        dim = sum(site.numel for site in sites)
        inverse_variances = set(self._inverse_variance.values())
        if len(self._members) == len(sites) and len(inverse_variances) == 1:
            self._weights, self._factor = None, -0.5 * inverse_variances.pop()
        else:
            weights = torch.zeros(dim, dtype=torch.float64)
            for s in self._members:
                weights[s.slice] = self._inverse_variance[s.name]
            self._weights, self._factor = weights, -0.5
        self._cast_weights: Dict[tuple, torch.Tensor] = {}

    @classmethod
    def find(cls, trace, sites) -> "Optional[_StandardPriors]":
        forms = {}
        for site in sites:
            node = trace.nodes[site.name]
            if site.has_jacobian or node["args"] or node["kwargs"]:
                continue
            signature = _normal_signature(node["fn"])
            if signature is None:
                continue
            (loc, scale), event_dims, batch_shape, event_shape = signature
            if loc[2] != 0 or not (math.isfinite(scale[2]) and scale[2] > 0):
                continue
            forms[site.name] = _SiteForm(event_dims, torch.Size(batch_shape), torch.Size(event_shape), loc, scale)
        return cls(forms, sites) if forms else None

    def scalars(self, msg) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The site's ``(loc, scale)`` constants as 0-d tensors if the site builds a prior of its set-up
        form (all but the values, checked by :meth:`verify`), with unit scale and no mask; else ``None``."""
        if msg["args"] or msg["kwargs"] or msg["mask"] is not None:
            return None
        scale = msg["scale"]
        if not (isinstance(scale, (int, float)) and scale == 1.0):
            return None
        fn, name = msg["fn"], msg["name"]
        last = self._last.get(name)
        if last is not None and last[0] is fn:  # the same object as last time (a PyroSample prior)
            return last[1]
        form = self.forms[name]
        normal = _normal_base(fn)
        if (
            normal is None
            or normal[1] != form.event_dims
            or fn.batch_shape != form.batch_shape
            or fn.event_shape != form.event_shape
        ):
            return None
        base = normal[0]
        loc, scale = _constant_scalar(base.loc), _constant_scalar(base.scale)
        # the devices are compared in verify, once for all sites
        if loc is None or scale is None or loc.dtype is not form.loc[0] or scale.dtype is not form.scale[0]:
            return None
        pair = (loc, scale)
        self._last[name] = (fn, pair)
        return pair

    def verify(self, deferred: Mapping[str, tuple], scalars: List[torch.Tensor]):
        """``None`` when the deferred sites' constants are their set-up values; else the names of the sites
        whose constants are (found site by site: a rare path).

        Constants on the CPU are read (no device sync, and cheaper than a tensor operation); on another
        device they are compared in one tensor operation, so one sync per call instead of one per site."""
        names = tuple(deferred)
        expected = self._expected.get(names)
        if expected is None:
            expected = self._expected[names] = self._expected_constants(names)
        values, devices = expected
        if devices == _CPU_ONLY and all(scalar.is_cpu for scalar in scalars):
            if [scalar.item() for scalar in scalars] == values:
                return None
        elif devices != _CPU_ONLY:
            try:  # refuses constants on several devices: then checked site by site
                constants = torch.stack(scalars)
            except RuntimeError:
                constants = None
            if constants is not None and constants.device == devices:
                if torch.equal(constants, constants.new_tensor(values)):
                    return None
        return {
            name
            for i, name in enumerate(names)
            if _scalar_key(scalars[2 * i]) == self.forms[name].loc
            and _scalar_key(scalars[2 * i + 1]) == self.forms[name].scale
        }

    def _expected_constants(self, names: Tuple[str, ...]) -> tuple:
        """The set-up constants of these sites, in the order of the check, and their one device (or
        ``_CPU_ONLY``; ``None`` for several devices, which then fail the fast checks)."""
        keys = [key for name in names for key in (self.forms[name].loc, self.forms[name].scale)]
        devices = {key[1] for key in keys}
        device = devices.pop() if len(devices) == 1 else None
        return [key[2] for key in keys], (_CPU_ONLY if device is not None and device.type == "cpu" else device)

    def log_prob(self, position: torch.Tensor, values: Mapping[str, torch.Tensor], names) -> torch.Tensor:
        if len(names) == len(self.sites):
            weighted = position if self._weights is None else position * self._weights_for(position)
            # one chain: one dot product; under vmap, dot's batching rule is slower than a product and a sum
            square = (weighted * position).sum() if _is_batched(position) else torch.dot(weighted, position)
            return self._factor * square - self._total_log_normaliser
        total = 0.0
        for name in sorted(names):  # some sites built another prior at this call: these sites alone
            x = values[name]
            total = total + (-0.5 * self._inverse_variance[name] * (x * x).sum() - self._log_normaliser[name])
        return total

    def _weights_for(self, position: torch.Tensor) -> torch.Tensor:
        key = (position.dtype, position.device)
        if key not in self._cast_weights:
            self._cast_weights[key] = self._weights.to(dtype=position.dtype, device=position.device)
        return self._cast_weights[key]


_CPU_ONLY = "cpu"  # all of a check's constants are on the CPU


def _scalar_key(scalar: torch.Tensor) -> tuple:
    """``(dtype, device, value)`` of a 0-d tensor, as :func:`_broadcast_constant_key` (reads the value)."""
    return scalar.dtype, scalar.device, scalar.item()


def _normal_signature(fn) -> Optional[tuple]:
    """For a (possibly ``Independent``) ``Normal`` with constant broadcast parameters: their keys and the
    shapes; ``None`` for anything else."""
    normal = _normal_base(fn)
    if normal is None:
        return None
    base, event_dims = normal
    keys = _broadcast_constant_key(base.loc), _broadcast_constant_key(base.scale)
    if keys[0] is None or keys[1] is None:
        return None
    return keys, event_dims, tuple(fn.batch_shape), tuple(fn.event_shape)


_NORMALS = (torch.distributions.Normal, pyro.distributions.Normal)


def _normal_base(fn) -> Optional[Tuple[torch.distributions.Normal, int]]:
    """``(the Normal, event dimensions)`` for a ``Normal`` possibly wrapped in ``Independent``\\ s (the
    wrappers' reinterpreted dimensions added up); ``None`` for any other distribution."""
    base, event_dims = fn, 0
    while isinstance(base, torch.distributions.Independent):
        event_dims += base.reinterpreted_batch_ndims
        base = base.base_dist
    return (base, event_dims) if type(base) in _NORMALS else None


# ---------------------------------------------------------------------- data checks (set-up, failure paths)
def _check_finite_data(potential: "ModelPotential") -> None:
    """Refuse data with non-finite values that reach the likelihood, naming the sites and counts.

    Once, at set-up: one ``isfinite`` pass over each floating-point tensor argument of the model.
    Only if one holds a NaN or an infinity is the model traced over the full data (chunk by chunk
    of each subsampled plate) to find the observed sites whose values or log-densities they make
    non-finite; non-finite values the model never uses, or masks, are accepted.
    """
    arguments = _nonfinite_arguments(potential.model_args, potential.model_kwargs, _parameter_names(potential.model))
    if not arguments:
        return
    problems = _nonfinite_observations(potential)
    if problems:
        raise ModelError(
            "the data passed to the model hold non-finite values ("
            + "; ".join(arguments)
            + ") that reach the likelihood: "
            + "; ".join(problems)
            + ". Every minibatch holding one would be a divergence. Remove or impute them, or mask them "
            "(poutine.mask, or obs_mask)"
        )


def _parameter_names(model: Callable) -> List[str]:
    """The model's positional parameter names (empty if its signature cannot be read)."""
    try:
        return [
            p.name
            for p in inspect.signature(model).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return []


def _nonfinite_arguments(args: tuple, kwargs: dict, names: Sequence[str] = ()) -> List[str]:
    """``"argument 1 ('y'): 3 NaN, 1 inf of 300 values"`` for each floating tensor argument not finite."""
    found = []
    named = [
        (f"argument {i}" + (f" ({names[i]!r})" if i < len(names) else ""), value) for i, value in enumerate(args)
    ] + [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        items = (
            value.items()
            if isinstance(value, Mapping)
            else enumerate(value)
            if isinstance(value, (list, tuple))
            else None
        )
        tensors = [(label, value)] if items is None else [(f"{label}[{key!r}]", item) for key, item in items]
        for where, tensor in tensors:
            if torch.is_tensor(tensor) and (tensor.is_floating_point() or tensor.is_complex()):
                if not bool(torch.isfinite(tensor).all()):
                    found.append(f"{where}: {_count_nonfinite(tensor)} of {tensor.numel()} values")
    return found


def _nonfinite_observations(potential: "ModelPotential") -> List[str]:
    """Per observed site, the data points (over the full data) whose value or log-density is not finite."""
    plates = list(potential.subsample_plates)
    chunks = [_index_chunks(p.size, p.subsample_size, potential.device) for p in plates]
    values = dict(potential._prototype_values)
    bad: Dict[str, set] = {}
    totals: Dict[str, int] = {}
    with pyro.validation_enabled(False), torch.no_grad():
        for combination in itertools.product(*chunks):
            indices = {p.name: chunk for p, chunk in zip(plates, combination)}
            trace = _trace_at(potential, values, indices)
            for name, site in trace.nodes.items():
                if site["type"] != "sample" or not site["is_observed"] or isinstance(site["fn"], _Subsample):
                    continue
                if name in values:
                    continue
                value = site["value"]
                mask = ~torch.isfinite(value) if torch.is_tensor(value) and value.is_floating_point() else None
                # non-finite data make the log-density NaN or infinite (an infinite covariate: -inf); the
                # latent values are the prototype's, finite on a minibatch (checked first by initial_position)
                nan = ~torch.isfinite(_site_log_prob_unscaled(site))
                if mask is not None:  # a non-finite observation the distribution does not see as such
                    mask = mask.reshape(mask.shape[: mask.dim() - site["fn"].event_dim] + (-1,)).any(-1)
                    try:
                        nan = nan | torch.broadcast_to(mask, nan.shape)
                    except RuntimeError:  # shapes that do not line up: the log-density's NaN alone
                        pass
                if not bool(nan.any()):
                    continue
                points = _bad_points(site, nan, indices)
                bad.setdefault(name, set()).update(points)
                totals[name] = _plate_total(site, potential)
    return [
        f"observed site {name!r} has {len(points)} of {totals[name]} data points with a non-finite value or "
        f"log-density (first: {sorted(points)[:5]})"
        for name, points in bad.items()
    ]


def _index_chunks(size: int, subsample_size: int, device) -> List[torch.Tensor]:
    """Consecutive chunks of length ``subsample_size`` covering ``range(size)`` (the last overlaps)."""
    starts = list(range(0, size - subsample_size + 1, subsample_size))
    if starts[-1] + subsample_size < size:
        starts.append(size - subsample_size)
    return [torch.arange(s, s + subsample_size, device=device) for s in starts]


def _trace_at(potential: "ModelPotential", values: Mapping[str, torch.Tensor], indices: Mapping[str, torch.Tensor]):
    """Trace the model with latent ``values`` (constrained) and plate ``indices`` (not scaled, not summed)."""
    model = poutine.condition(potential.model, data={**indices, **values})
    return poutine.trace(model).get_trace(*potential.model_args, **potential.model_kwargs)


def _site_log_prob_unscaled(site) -> torch.Tensor:
    log_prob = site["fn"].log_prob(site["value"])
    if site["mask"] is not None:
        log_prob = torch.where(torch.as_tensor(site["mask"]), log_prob, torch.zeros_like(log_prob))
    return log_prob


def _count_nonfinite(tensor: torch.Tensor) -> str:
    """``"2 -inf, 1 NaN"``: the non-finite values of ``tensor`` by kind."""
    counts = [
        (int(torch.isnan(tensor).sum()), "NaN"),
        (int((tensor == math.inf).sum()), "+inf" if bool((tensor == -math.inf).any()) else "inf"),
        (int((tensor == -math.inf).sum()), "-inf"),
    ]
    return ", ".join(f"{n} {kind}" for n, kind in counts if n)


def _subsampled_axis(site, indices: Mapping[str, torch.Tensor]):
    """``(plate name, axis of the log-density)`` of the site's first subsampled plate in ``indices``."""
    for frame in site["cond_indep_stack"]:
        if frame.name in indices and frame.dim is not None:
            return frame.name, frame.dim
    return None


def _bad_points(site, bad: torch.Tensor, indices: Mapping[str, torch.Tensor]) -> set:
    """The data indices (along the site's subsampled plate) where ``bad`` holds; flat positions otherwise."""
    plate = _subsampled_axis(site, indices)
    if plate is None or bad.dim() < -plate[1]:
        return set(bad.reshape(-1).nonzero().flatten().tolist())
    name, axis = plate
    along = bad.movedim(axis, 0).reshape(bad.shape[axis], -1).any(-1)
    return set(indices[name][along.nonzero().flatten()].tolist())


def _plate_total(site, potential: "ModelPotential") -> int:
    sizes = {p.name: p.size for p in potential.subsample_plates}
    for frame in site["cond_indep_stack"]:
        if frame.name in sizes:
            return sizes[frame.name]
    return int(site["fn"].batch_shape.numel()) if site["fn"].batch_shape else 1


def _data_indices(site, bad: torch.Tensor, indices: Mapping[str, torch.Tensor]) -> str:
    """`` at data indices [3, 17]`` for an observed site in a subsampled plate (the first five), else ``""``."""
    plate = _subsampled_axis(site, indices)
    if plate is None or bad.dim() < -plate[1]:
        return f" ({int(bad.sum())} of {bad.numel()} values)"
    points = sorted(_bad_points(site, bad, indices))
    if len(points) == len(indices[plate[0]]):  # every point: the latent values, not particular data
        return f" at all {len(points)} minibatch data points"
    return f" at {len(points)} of {len(indices[plate[0]])} minibatch data points (data indices {points[:5]})"


# ---------------------------------------------------------------------- trace inspection
class _SubsampleCheck(Messenger):
    """Fail early, naming the plate, on a plate size or ``subsample_size`` that is not a usable count.

    Pyro's own errors for these do not name the plate (``ZeroDivisionError`` for ``subsample_size=0``,
    "did you use different subsample_size in the model and guide?" for a negative one, a slice
    ``TypeError`` for ``32.0``) or accept them silently (``True`` is a subsample of one).
    """

    def _pyro_sample(self, msg) -> None:
        fn = msg["fn"]
        if isinstance(fn, _Subsample):
            _check_plate(msg["name"], fn.size, fn.subsample_size)


def _check_plate(name: str, size, subsample_size) -> None:
    """Raise :class:`ModelError` naming plate ``name`` unless ``1 <= subsample_size <= size`` are integers."""
    accepted = "an integer >= 1 (a Python int, or a 0-d integer tensor)"
    if not _is_count(size) or int(size) < 1:
        raise ModelError(
            f"plate {name!r} has size={size!r}; a plate's size must be {accepted} (an empty plate has no data "
            "to subsample: leave the plate out, or check the data passed to the model)"
        )
    if subsample_size is None:
        return
    if not _is_count(subsample_size) or int(subsample_size) < 1:
        raise ModelError(
            f"plate {name!r} has subsample_size={subsample_size!r}; it must be {accepted}, at most the plate's "
            f"size={int(size)} (or None for no subsampling)"
        )
    if int(subsample_size) > int(size):
        raise ModelError(
            f"plate {name!r} has subsample_size={subsample_size!r} larger than its size={int(size)}; "
            f"use subsample_size <= {int(size)}"
        )


def _is_count(value) -> bool:
    """A Python ``int`` that is not a ``bool``, or a 0-d integer tensor (Pyro fails on NumPy integers)."""
    if torch.is_tensor(value):
        return (
            value.dim() == 0 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool
        )
    return isinstance(value, int) and not isinstance(value, bool)


def _discrete_from_prior(init_strategy: Callable, dtype=None, device=None) -> Callable:
    """Make an init strategy total: discrete sites are drawn from the prior (so the site check can
    name them), and sites whose distribution cannot be sampled (``ImproperUniform``, which Pyro's
    strategies call ``.sample()`` on) start at zero in unconstrained space, in the data's dtype."""

    def init(site):
        fn = site["fn"]
        if fn.support.is_discrete:
            return fn.sample().detach()
        try:
            return init_strategy(site)
        except NotImplementedError:
            transform = biject_to(fn.support)
            shape = transform.inverse_shape(fn.batch_shape + fn.event_shape)
            return transform(torch.zeros(shape, dtype=dtype, device=device)).detach()

    return init


def _data_dtype_and_device(args, kwargs):
    """The dtype and device of the first floating-point tensor among the model's arguments."""
    for value in list(args) + list(kwargs.values()):
        if torch.is_tensor(value) and value.is_floating_point():
            return value.dtype, value.device
    return None, None


def _promote(dtypes):
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, dtype)
    return result


def _check_observed_shapes(trace) -> None:
    """An observed value must broadcast with its distribution's shape (e.g. data indexed by the plate)."""
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or isinstance(site["fn"], _Subsample):
            continue
        value = site["value"]
        if not torch.is_tensor(value):
            continue
        expected = site["fn"].batch_shape + site["fn"].event_shape
        try:
            torch.broadcast_shapes(value.shape, expected)
        except RuntimeError:
            plates = [f.name for f in site["cond_indep_stack"]]
            raise ModelError(
                f"observed site {name!r} has a value of shape {tuple(value.shape)} that does not broadcast with its "
                f"distribution's shape {tuple(expected)} (plates {plates}); in a subsampled plate, index the data "
                "with the plate's indices (obs=y[idx])"
            ) from None


def _find_subsample_plates(trace) -> List[SubsamplePlate]:
    plates = []
    for name, site in trace.nodes.items():
        if site["type"] == "sample" and isinstance(site["fn"], _Subsample):
            size = int(site["fn"].size)
            user_indices = site["fn"].subsample_size is None  # the model gave subsample=indices
            subsample_size = len(site["value"]) if user_indices else int(site["fn"].subsample_size)
            if subsample_size < size:
                plates.append(SubsamplePlate(name, size, subsample_size, user_indices))
    return plates


def _find_latent_sites(trace, subsample_plates) -> Tuple[List[LatentSite], Dict[str, torch.Tensor]]:
    subsampled = {p.name for p in subsample_plates}
    latent, discrete, local = [], [], []
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or isinstance(site["fn"], _Subsample):
            continue
        if site["fn"].support.is_discrete:
            discrete.append(name)
            continue
        plates = [f.name for f in site["cond_indep_stack"] if f.name in subsampled]
        if plates:
            local.append(f"{name!r} (in {plates})")
            continue
        latent.append(name)
    if discrete:
        raise ModelError(
            f"discrete latent sites {discrete} cannot be sampled by a gradient-based kernel; "
            "marginalise them out or observe them"
        )
    if local:
        raise ModelError(
            f"latent sites {', '.join(local)} are inside a subsampled plate; stochastic-gradient kernels "
            "sample global latent variables only (move them out of the plate or drop subsample_size)"
        )
    if not latent:
        raise ModelError("the model has no latent sample sites: there is nothing to sample")
    sites, values, offset = [], {}, 0
    for name in sorted(latent):
        site = trace.nodes[name]
        value = site["value"].detach()
        transform = biject_to(site["fn"].support)
        unconstrained = transform.inv(value)
        sites.append(
            LatentSite(
                name=name,
                shape=value.shape,
                unconstrained_shape=unconstrained.shape,
                offset=offset,
                numel=unconstrained.numel(),
                transform=transform,
                has_jacobian=not _is_identity(transform),
            )
        )
        values[name] = value
        offset += unconstrained.numel()
    return sites, values


def _is_identity(transform) -> bool:
    while isinstance(transform, torch.distributions.transforms.IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, torch.distributions.transforms.ComposeTransform) and not transform.parts


def _default_num_data(trace, subsample_plates) -> int:
    full_size = {p.name: p.size for p in subsample_plates}
    num_data = 1
    for site in trace.nodes.values():
        if site["type"] == "sample" and site["is_observed"]:
            sizes = [
                full_size.get(f.name, getattr(f, "full_size", None) or f.size)
                for f in site["cond_indep_stack"]
                if f.vectorized
            ]
            terms = math.prod(size for size in sizes if size is not None and size > 0)
            num_data = max(num_data, int(terms))
    return num_data


def _check_num_data(num_data) -> int:
    if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1:
        raise ValueError(f"num_data must be a positive integer (the number of data N); got {num_data!r}")
    return num_data


def _out_of_memory(error: RuntimeError) -> bool:
    """An allocation failure (CUDA's ``OutOfMemoryError``, or the CPU allocator's ``RuntimeError``): it says
    nothing about whether the model can run vectorised, so it must reach the user, not switch vmap off."""
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)
