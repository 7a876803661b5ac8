"""Scalable Laplace approximations for Pyro models: :class:`AutoLaplace` and :class:`LaplaceApproximation`.

The Laplace approximation of the posterior, in the unconstrained space of all latent sites, is

.. math::
    p(\\theta \\mid y) \\approx \\mathcal{N}\\big(\\theta_*, \\Lambda^{-1}\\big), \\qquad
    \\Lambda = H_{\\mathrm{lik}}(\\theta_*) + H_{\\mathrm{prior}}(\\theta_*),

with :math:`\\theta_*` the MAP, :math:`H_{\\mathrm{lik}}` a curvature of
:math:`-\\sum_n \\log p(y_n \\mid \\theta)` (see :class:`~pyro_sgmcmc.guides.curvature.Curvature`)
and :math:`H_{\\mathrm{prior}} = -\\nabla^2 \\log p(\\theta)` (for a ``Normal(m, sigma)`` prior, the
precision :math:`1/\\sigma^2`). :class:`AutoLaplace` is the MAP guide that SVI trains, minibatch by
minibatch; :meth:`AutoLaplace.laplace_approximation` sweeps the full data once to build
:math:`\\Lambda` and returns a :class:`LaplaceApproximation`, a Gaussian guide that also gives the
linearised predictive, the marginal likelihood and the prior for the next task.
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import pyro  # noqa: F401  (the docstring examples use it)
import pyro.distributions as dist  # noqa: F401
import pyro.poutine as poutine
import torch
from pyro.infer.autoguide import AutoLaplaceApproximation
from pyro.poutine.util import site_is_subsample

from ..model.argument_types import naming_non_tensor_data
from ..model.potential import ModelPotential
from ._checks import NOT_GIVEN, check_bool, check_callable, check_positive_int, check_precision, renamed_argument
from .approximation import LaplaceApproximation
from .curvature import MAX_FULL_DIM, Curvature, likelihood_curvature, prior_terms
from .evidence import gaussian_noise
from .initialization import init_to_fan_in
from .laplace_evidence import PriorPrecision
from .map_point import MapValues, as_map_values, check_map_values, init_to_map_values, unconstrained_map
from .sites import potential_permutation, site_slices, unconstrained_shapes
from .subset import check_subset, fix_sites, subset_names

__all__ = ["AutoLaplace", "LaplaceApproximation"]


class AutoLaplace(AutoLaplaceApproximation):
    """A MAP guide for SVI whose :meth:`laplace_approximation` scales to neural networks.

    Usage::

        guide = AutoLaplace(model, curvature="diag_ggn")
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
        for step in range(num_steps):
            svi.step(x, y)              # one minibatch of the subsampled plate per step
        laplace = guide.laplace_approximation(x, y)
        laplace.median(), laplace.quantiles([0.05, 0.95])
        Predictive(model, guide=laplace, num_samples=100)(x, y)

    During SVI the guide is a point mass at :math:`\\theta` in unconstrained space (Pyro's
    :class:`~pyro.infer.autoguide.AutoLaplaceApproximation`), so ``Trace_ELBO`` maximises
    :math:`\\log p(\\theta) + \\log|\\det J| + \\frac{N}{B}\\sum_{n\\in\\mathcal B}\\log p(y_n \\mid \\theta)`:
    the unconstrained MAP, one minibatch at a time. Unlike Pyro's guide, whose Laplace step builds
    the dense Hessian of the whole-data loss (``d`` backward passes over all the data at once),
    :meth:`laplace_approximation` walks the data in minibatches and, for the diagonal curvatures,
    keeps ``O(d)`` memory.

    Parameters
    ----------
    model : callable
        A Pyro model with continuous latent sites outside every subsampled plate.
    curvature : str
        ``"diag_ggn"`` (default), ``"diag_ef"``, ``"full"``, ``"full_ggn"`` or ``"kron"``; see
        :class:`~pyro_sgmcmc.guides.curvature.Curvature`. The dense ones need
        ``d <= MAX_FULL_DIM`` (5000) latent dimensions; ``"kron"`` (K-FAC, any size) needs a
        network of ``nn.Linear`` / ``F.linear`` layers (:mod:`pyro_sgmcmc.guides.kron`).
    prior_precision : float or dict, optional
        Replace the model's prior, for the approximation only, by :math:`\\mathcal N(m, \\lambda^{-1} I)`
        in unconstrained space (``m`` the model prior's mean for real sites, 0 otherwise): one
        positive number for every site, or ``{site: number}`` (sites left out get precision 1).
        By default the model's own prior enters through its exact Hessian.
    num_mc_samples : int
        Labels drawn per example for likelihoods whose Fisher has no closed form here (``*_ggn``).
    monte_carlo_fisher : bool
        ``*_ggn`` with Monte Carlo labels for every likelihood, Categorical included: one backward
        pass per label and example instead of one per class, an unbiased estimate of the diagonal.
        (Formerly ``mc_fisher``: that spelling still works for one release, with a ``FutureWarning``.)
    init_loc_fn : callable
        Pyro init strategy for the MAP point. The default,
        :func:`~pyro_sgmcmc.guides.initialization.init_to_fan_in`, starts weight matrices as
        ``torch.nn.Linear`` does (uniform within :math:`\\pm 1/\\sqrt{\\text{fan-in}}`) and other sites
        at their prior mean (Pyro's ``init_to_mean``: biases at 0); a draw of the prior
        (``init_to_sample``) saturates a network.
    map_values : dict or torch.nn.Module, optional
        A MAP you already have, ``{site: constrained value}`` for every latent site, or a trained
        ``nn.Module`` whose parameter names are the site names (see
        :mod:`~pyro_sgmcmc.guides.map_point`): the guide starts exactly there, so
        :meth:`laplace_approximation` needs no fit (any ``subset_of_weights``). Not with ``init_loc_fn``.
    disable_progbar : bool
        Hide the progress bar of the curvature sweep.
    subset_of_weights : "all", "last_layer" or list of str
        The sites the Gaussian covers; the others stay at the MAP (a point mass): ``"last_layer"``
        is the weight and bias of the network's last ``F.linear`` (``nn.Linear``) call, as in
        laplace-torch, or name the sites. Every curvature, the evidence and the GLM predictive
        then work on those sites only; see :mod:`pyro_sgmcmc.guides.subset`.

    Examples
    --------
    >>> from pyro.infer import SVI, Trace_ELBO
    >>> from pyro_sgmcmc.guides import AutoLaplace
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0., 1.).expand([2]).to_event(1))
    ...     with pyro.plate("data", len(y), subsample_size=25) as idx:
    ...         pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])
    >>> x = torch.randn(100, 2, generator=torch.Generator().manual_seed(0))
    >>> y = (x[:, 0] > 0).float()
    >>> pyro.clear_param_store(); _ = pyro.set_rng_seed(0)
    >>> guide = AutoLaplace(model, curvature="diag_ggn", disable_progbar=True)
    >>> svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.1}), Trace_ELBO())
    >>> for step in range(100):
    ...     _ = svi.step(x, y)
    >>> laplace = guide.laplace_approximation(x, y)
    >>> laplace.get_posterior().batch_shape, laplace.get_posterior().event_shape
    (torch.Size([]), torch.Size([2]))
    >>> bool((laplace.quantiles([0.05])["w"] < laplace.median()["w"]).all())
    True
    """

    def __init__(
        self,
        model,
        curvature: str = "diag_ggn",
        *,
        prior_precision: Optional[PriorPrecision] = None,
        num_mc_samples: int = 1,
        monte_carlo_fisher: bool = False,
        init_loc_fn=init_to_fan_in,
        disable_progbar: bool = False,
        subset_of_weights: Union[str, Sequence[str]] = "all",
        map_values: Optional[MapValues] = None,
        mc_fisher=NOT_GIVEN,
    ) -> None:
        check_callable(model, "model")
        self.subset_of_weights = check_subset(subset_of_weights)
        check_callable(init_loc_fn, "init_loc_fn")
        self.map_values = None if map_values is None else as_map_values(map_values)
        if self.map_values is not None:
            if init_loc_fn is not init_to_fan_in:
                raise ValueError("give map_values (the MAP itself) or init_loc_fn (a start for a fit), not both")
            init_loc_fn = init_to_map_values(self.map_values)
        self.curvature = Curvature.parse(curvature)
        monte_carlo_fisher, name = renamed_argument("mc_fisher", mc_fisher, "monte_carlo_fisher", monte_carlo_fisher)
        self.monte_carlo_fisher = check_bool(monte_carlo_fisher, name)
        if prior_precision is not None:
            check_precision(prior_precision)
        num_mc_samples = check_positive_int(num_mc_samples, "num_mc_samples")
        disable_progbar = check_bool(disable_progbar, "disable_progbar")
        self.num_mc_samples = num_mc_samples
        self.disable_progbar = disable_progbar
        self._init_loc_fn = init_loc_fn
        super().__init__(model, init_loc_fn=init_loc_fn)
        self._model_box = (model,)  # a tuple: a PyroModule model is never registered as a submodule
        self.prior_precision = prior_precision  # after Module.__init__: it may be a tensor

    @property
    def mc_fisher(self) -> bool:
        """Deprecated spelling of :attr:`monte_carlo_fisher` (``FutureWarning``)."""
        warnings.warn("AutoLaplace.mc_fisher is deprecated; use AutoLaplace.monte_carlo_fisher", FutureWarning,
                      stacklevel=2)  # fmt: skip
        return self.monte_carlo_fisher

    @property
    def raw_model(self):
        """The model as given (``self.model`` is Pyro's wrapped copy)."""
        return self._model_box[0]

    def forward(self, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """The MAP point's sites (Pyro's ``AutoLaplaceApproximation``); the first call checks the model first."""
        if self.prototype_trace is not None:
            return super().forward(*args, **kwargs)
        trace = self._check_latent_sites(args, kwargs)  # the first call: Pyro's forward sets the guide up
        if self.map_values is not None:
            check_map_values(trace, self.map_values)
        result = super().forward(*args, **kwargs)
        if self.map_values is not None:  # exactly there, whatever the param store held under this guide's name
            with torch.no_grad():
                self.loc.copy_(unconstrained_map(self.prototype_trace, self.map_values))
            result = self.median()
        return result

    def _check_latent_sites(self, args: tuple, kwargs: dict):
        """A clear error for discrete latent sites, latent sites inside a subsampled plate, and non-tensor data;
        returns the model's trace."""

        def run(args, kwargs):
            with poutine.block():
                return poutine.trace(self.model).get_trace(*args, **kwargs)

        with naming_non_tensor_data(self.raw_model, args, kwargs, rerun=run):  # data as a list, a str: named
            trace = run(args, kwargs)
        discrete, local = [], []
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
                continue
            if site["fn"].support.is_discrete:
                discrete.append(name)
            elif any(f.full_size is not None and f.full_size != f.size for f in site["cond_indep_stack"]):
                local.append(name)
        if discrete:
            raise ValueError(
                f"AutoLaplace needs continuous latent sites; {discrete} are discrete. Marginalise them out "
                "(e.g. with a mixture distribution) or observe them"
            )
        if local:
            raise ValueError(
                f"latent sites {local} are inside a subsampled plate; a Laplace approximation over all latent "
                "sites needs them global (move them out of the plate or drop subsample_size)"
            )
        return trace

    def _loc_scale(self, *args, **kwargs):
        """The MAP point and a zero scale: :meth:`median` gives the MAP in constrained space."""
        return self.loc, torch.zeros_like(self.loc)

    def laplace_approximation(self, *args, **kwargs) -> "LaplaceApproximation":
        """Sweep the full data once and return the Gaussian guide :math:`\\mathcal N(\\theta_*, \\Lambda^{-1})`.

        Call it with the model's arguments (the full data: subsampled plates are walked in
        minibatches of their own ``subsample_size``) after fitting the MAP with SVI or
        :meth:`fit_map`, or at once for a guide given ``map_values`` (no fit).

        Returns
        -------
        LaplaceApproximation

        Raises
        ------
        ValueError
            Before any fit (the guide was never run), for a dense curvature with more than
            ``MAX_FULL_DIM`` latent dimensions, or when the precision is not positive definite.
        """
        return self.approximation_at_loc(args, kwargs)

    def approximation_at_loc(self, args: tuple, kwargs: dict, reuse: Optional[dict] = None) -> "LaplaceApproximation":
        """:meth:`laplace_approximation` with the model's arguments as a tuple and a dict; with ``reuse``
        (an empty dict the first time, then the same one; ``marglik_training``) the potential and the prior
        terms of the first call are kept and only the likelihood curvature is recomputed at ``loc`` (the
        prior terms are then those of the first point: right for a Gaussian prior in ``prior_precision``)."""
        if self.prototype_trace is None and self.map_values is not None:
            self(*args, **kwargs)  # set up at the given MAP
        if self.prototype_trace is None:
            raise ValueError(
                "laplace_approximation() needs a fitted MAP: run SVI(model, guide, ...).step(...) or "
                "guide.fit_map(...), or give the MAP you have as AutoLaplace(..., map_values=...)"
            )
        if self.curvature.is_dense and self.latent_dim > MAX_FULL_DIM:
            raise ValueError(
                f"curvature={self.curvature.value!r} builds a dense {self.latent_dim} x {self.latent_dim} "
                f"precision; it is limited to latent dimension <= {MAX_FULL_DIM} (MAX_FULL_DIM). "
                "Use 'diag_ggn' or 'diag_ef' for this model"
            )
        loc = self.loc.detach()
        shapes = unconstrained_shapes(self.prototype_trace)
        slices = site_slices(self.prototype_trace, shapes)
        if not torch.isfinite(loc).all():
            bad = [name for name, where in slices.items() if not torch.isfinite(loc[where]).all()]
            raise ValueError(
                f"the MAP point is not finite at sites {bad}: the SVI fit diverged (lower the learning rate, or "
                "check the model's likelihood); there is no Laplace approximation around a non-finite point"
            )
        if not reuse:
            names, fixed = self._split_sites(args, kwargs)
            potential = ModelPotential(fix_sites(self.raw_model, fixed), args, kwargs)
            perm = potential_permutation(names, shapes, potential)
        else:
            names, fixed, potential, perm = reuse["names"], reuse["fixed"], reuse["potential"], reuse["perm"]
        loc = torch.cat([loc[slices[name]] for name in names])
        position = torch.empty_like(loc)
        position[perm] = loc  # guide order -> potential (sorted-name) order
        likelihood = likelihood_curvature(
            potential, position, self.curvature, num_mc_samples=self.num_mc_samples,
            monte_carlo_fisher=self.monte_carlo_fisher, disable_progbar=self.disable_progbar,
        )  # fmt: skip
        if not reuse:
            prior = prior_terms(potential, position, full=self.curvature.is_dense)
            noise = gaussian_noise(potential, position)
            if reuse is not None:
                reuse.update(names=names, fixed=fixed, potential=potential, perm=perm, prior=prior, noise=noise)
        else:
            prior, noise = reuse["prior"], reuse["noise"]

        def to_guide(tensor):
            return tensor[perm][:, perm] if tensor.dim() == 2 else tensor[perm]

        trace = self.prototype_trace
        if len(names) < len(slices):  # a subset of the sites: the others are fixed at the MAP
            trace = trace.copy()
            for name in set(slices) - set(names):
                trace.remove_node(name)
        precision = self.prior_precision
        if isinstance(precision, Mapping) and fixed:  # a dict over all sites (marglik_training): keep the subset's
            precision = {name: value for name, value in precision.items() if name not in fixed}
        return LaplaceApproximation(
            self.raw_model,
            prototype_trace=trace,
            loc=loc,
            likelihood_curvature=to_guide(likelihood.curvature),
            prior_curvature=to_guide(prior.curvature),
            prior_log_density=prior.log_density,
            prior_grad=to_guide(prior.grad),
            prior_mean=to_guide(prior.mean),
            log_likelihood=likelihood.log_likelihood,
            curvature=self.curvature,
            init_loc_fn=self._init_loc_fn,
            kron_factors=likelihood.kron_factors,
            fixed=fixed,
            noise=noise,
            prior_precision=precision,
        )

    def _split_sites(self, args, kwargs) -> Tuple[list, Dict[str, torch.Tensor]]:
        """The names of the sites in the approximation (guide order) and ``{site: MAP value}`` of the others."""
        all_names = [name for name, _ in self.prototype_trace.iter_stochastic_nodes()]
        if self.subset_of_weights == "all":
            return all_names, {}
        with torch.no_grad():
            values = {name: value.detach() for name, value in self.median().items()}
        names = subset_names(self.subset_of_weights, all_names, self.raw_model, values, args, kwargs)
        return names, {name: value for name, value in values.items() if name not in names}

    def fit_map(self, *args, **kwargs) -> List[float]:
        """Fit the MAP point with Adam on the package's compiled potential (faster than SVI).

        Minimises the same objective as ``SVI(model, guide, Adam, Trace_ELBO())``, the negative
        unconstrained log joint with the likelihood of a fresh minibatch scaled by ``N / B``, but
        through :meth:`~pyro_sgmcmc.ModelPotential.potential_and_grad` as the kernels do; with
        ``jit_compile`` (``"auto"``: only when Pyro's validation is off and the model is
        deterministic; ``True`` whenever the compiled function checks out) the model runs once and
        later steps replay its tensor operations. See :mod:`pyro_sgmcmc.guides.fit`.

        Parameters
        ----------
        num_steps : int
            Adam steps, one minibatch each.
        lr : float
            Adam's learning rate.
        seed : int
            Seed of the minibatch generator.
        jit_compile : bool or "auto"
            As in :class:`~pyro_sgmcmc.ModelPotential`.

        Returns
        -------
        list of float
            The minibatch potential energy at each step.
        """
        from .fit import fit_map

        return fit_map(self, *args, **kwargs)

    def marglik_training(self, *args, **kwargs) -> LaplaceApproximation:
        """Fit the MAP and tune the prior precision in one run (online marginal likelihood, Immer et al. 2021).

        ``num_steps`` optimiser steps (one minibatch each, as ``svi.step``) on the log joint with
        the prior :math:`\\mathcal N(m, \\lambda^{-1})` in unconstrained space; after ``burnin``
        steps, every ``hyper_every`` steps, a Laplace approximation is built at the current point
        and ``hyper_steps`` Adam steps (learning rate ``hyper_lr``) on :math:`\\log\\lambda` raise
        its standard evidence; laplace-torch's defaults are one evidence step per epoch
        (``hyper_every`` = steps per epoch) and the MAP optimiser ``Adam({"lr": 1e-3})``. See
        :mod:`pyro_sgmcmc.guides.marglik`. Call it with the model's arguments, like ``svi.step``.

        Parameters
        ----------
        num_steps : int
            MAP steps.
        optim : pyro.optim.PyroOptim, optional
            The MAP optimiser (default ``pyro.optim.Adam({"lr": 1e-2})``).
        mode : {"scalar", "site", "parameter"}
            One precision, one per latent site (per layer's weight and bias: laplace-torch's
            ``prior_structure="layerwise"``), or one per coordinate (``"diagonal"`` there; not
            with ``"kron"``).
        prior_precision : float
            The starting precision.
        hyper_every, hyper_steps, hyper_lr, burnin : int, int, float, int
            The evidence-step schedule.
        keep_best : bool
            Return the point and precision of the best evidence seen after an evidence step (as
            laplace-torch does) instead of the last ones.

        Returns
        -------
        LaplaceApproximation
            At the final point (the best one with ``keep_best``), with the tuned prior precision
            (also left in ``self.prior_precision``, so a later :meth:`laplace_approximation` uses
            it); ``self.evidence_history`` lists the evidence after each evidence step.
        """
        from .marglik import marglik_training

        return marglik_training(self, *args, **kwargs)
