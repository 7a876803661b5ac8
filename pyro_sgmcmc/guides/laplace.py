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

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import pyro  # noqa: F401  (the docstring examples use it)
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.infer.autoguide import AutoContinuous, AutoLaplaceApproximation
from pyro.infer.autoguide.initialization import init_to_median
from torch.distributions import biject_to

from ..model.potential import ModelPotential
from ._checks import NOT_GIVEN, check_bool, check_callable, check_positive_int, check_precision, renamed_argument
from .curvature import MAX_FULL_DIM, Curvature, likelihood_curvature, prior_terms
from .evidence import GaussianNoise, gaussian_noise
from .kron import KroneckerNormal, KroneckerPrecision
from .laplace_evidence import EvidenceMixin, PriorPrecision
from .predictive import GLMPrediction, linearized_predictive
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
        Pyro init strategy for the MAP point (``init_to_sample`` breaks the symmetry of a network).
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
        init_loc_fn=init_to_median,
        disable_progbar: bool = False,
        subset_of_weights: Union[str, Sequence[str]] = "all",
        mc_fisher=NOT_GIVEN,
    ) -> None:
        check_callable(model, "model")
        self.subset_of_weights = check_subset(subset_of_weights)
        check_callable(init_loc_fn, "init_loc_fn")
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
    def _raw_model(self):
        return self._model_box[0]

    def _setup_prototype(self, *args, **kwargs) -> None:
        with poutine.block():
            trace = poutine.trace(self.model).get_trace(*args, **kwargs)
        discrete, local = [], []
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site["is_observed"] or type(site["fn"]).__name__ == "_Subsample":
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
        super()._setup_prototype(*args, **kwargs)

    def _loc_scale(self, *args, **kwargs):
        """The MAP point and a zero scale: :meth:`median` gives the MAP in constrained space."""
        return self.loc, torch.zeros_like(self.loc)

    def laplace_approximation(self, *args, **kwargs) -> "LaplaceApproximation":
        """Sweep the full data once and return the Gaussian guide :math:`\\mathcal N(\\theta_*, \\Lambda^{-1})`.

        Call it with the model's arguments (the full data: subsampled plates are walked in
        minibatches of their own ``subsample_size``) after fitting the MAP with SVI.

        Returns
        -------
        LaplaceApproximation

        Raises
        ------
        ValueError
            Before any fit (the guide was never run), for a dense curvature with more than
            ``MAX_FULL_DIM`` latent dimensions, or when the precision is not positive definite.
        """
        if self.prototype_trace is None:
            raise ValueError(
                "laplace_approximation() needs a fitted MAP: run SVI(model, guide, ...).step(...) "
                "(or call the guide once) before asking for the Laplace approximation"
            )
        if self.curvature.is_dense and self.latent_dim > MAX_FULL_DIM:
            raise ValueError(
                f"curvature={self.curvature.value!r} builds a dense {self.latent_dim} x {self.latent_dim} "
                f"precision; it is limited to latent dimension <= {MAX_FULL_DIM} (MAX_FULL_DIM). "
                "Use 'diag_ggn' or 'diag_ef' for this model"
            )
        loc = self.loc.detach()
        if not torch.isfinite(loc).all():
            slices = _guide_slices(self).items()
            bad = [name for name, (start, stop) in slices if not torch.isfinite(loc[start:stop]).all()]
            raise ValueError(
                f"the MAP point is not finite at sites {bad}: the SVI fit diverged (lower the learning rate, or "
                "check the model's likelihood); there is no Laplace approximation around a non-finite point"
            )
        names, fixed = self._split_sites(args, kwargs)
        slices = _guide_slices(self)
        loc = torch.cat([loc[slices[name][0] : slices[name][1]] for name in names])
        potential = ModelPotential(fix_sites(self._raw_model, fixed), args, kwargs)
        perm = _permutation(names, self._unconstrained_shapes, potential)
        position = torch.empty_like(loc)
        position[perm] = loc  # guide order -> potential (sorted-name) order
        likelihood = likelihood_curvature(
            potential, position, self.curvature, num_mc_samples=self.num_mc_samples,
            monte_carlo_fisher=self.monte_carlo_fisher, disable_progbar=self.disable_progbar,
        )  # fmt: skip
        prior = prior_terms(potential, position, full=self.curvature.is_dense)

        def to_guide(tensor):
            return tensor[perm][:, perm] if tensor.dim() == 2 else tensor[perm]

        approximation = LaplaceApproximation(
            self._raw_model,
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
            noise=gaussian_noise(potential, position),
        )
        approximation._copy_prototype(self, names)
        precision = self.prior_precision
        if isinstance(precision, Mapping) and fixed:  # a dict over all sites (marglik_training): keep the subset's
            precision = {name: value for name, value in precision.items() if name not in fixed}
        approximation.set_prior_precision(precision)
        return approximation

    def _split_sites(self, args, kwargs) -> Tuple[list, Dict[str, torch.Tensor]]:
        """The names of the sites in the approximation (guide order) and ``{site: MAP value}`` of the others."""
        all_names = [name for name, _ in self.prototype_trace.iter_stochastic_nodes()]
        if self.subset_of_weights == "all":
            return all_names, {}
        with torch.no_grad():
            values = {name: value.detach() for name, value in self.median().items()}
        names = subset_names(self.subset_of_weights, all_names, self._raw_model, values, args, kwargs)
        return names, {name: value for name, value in values.items() if name not in names}

    def fit_map(
        self, *args, num_steps: int, lr: float = 1e-2, seed: int = 0, jit_compile="auto", **kwargs
    ) -> List[float]:
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

        return fit_map(self, *args, num_steps=num_steps, lr=lr, seed=seed, jit_compile=jit_compile, **kwargs)

    def marglik_training(
        self,
        *args,
        num_steps: int,
        optim: Optional[pyro.optim.PyroOptim] = None,
        mode: str = "site",
        prior_precision: float = 1.0,
        hyper_every: int = 100,
        hyper_steps: int = 10,
        hyper_lr: float = 0.1,
        burnin: int = 0,
        **kwargs,
    ) -> "LaplaceApproximation":
        """Fit the MAP and tune the prior precision in one run (online marginal likelihood, Immer et al. 2021).

        ``num_steps`` optimiser steps (one minibatch each, as ``svi.step``) on the log joint with
        the prior :math:`\\mathcal N(m, \\lambda^{-1})` in unconstrained space; after ``burnin``
        steps, every ``hyper_every`` steps, a Laplace approximation is built at the current point
        and ``hyper_steps`` Adam steps (learning rate ``hyper_lr``) on :math:`\\log\\lambda` raise
        its standard evidence. See :mod:`pyro_sgmcmc.guides.marglik`. Call it with the model's
        arguments, like ``svi.step``.

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

        Returns
        -------
        LaplaceApproximation
            At the final point, with the tuned prior precision (also left in
            ``self.prior_precision``, so a later :meth:`laplace_approximation` uses it).
        """
        from .marglik import marglik_training

        return marglik_training(
            self, *args, num_steps=num_steps, optim=optim, mode=mode, prior_precision=prior_precision,
            hyper_every=hyper_every, hyper_steps=hyper_steps, hyper_lr=hyper_lr, burnin=burnin, **kwargs,
        )  # fmt: skip


class LaplaceApproximation(EvidenceMixin, AutoContinuous):
    """The Gaussian guide :math:`\\mathcal N(\\theta_*, \\Lambda^{-1})` over all latent sites (unconstrained).

    Built by :meth:`AutoLaplace.laplace_approximation`. It is a Pyro
    :class:`~pyro.infer.autoguide.AutoContinuous` guide: :meth:`get_posterior` (``Normal(...).to_event(1)``
    for a diagonal precision, ``MultivariateNormal`` for a dense one), :meth:`median`,
    :meth:`quantiles`, sampling (calling it) and ``pyro.infer.Predictive(model, guide=laplace,
    num_samples=...)`` all work. On top of that:

    * :meth:`predict`: the linearised (GLM) predictive of a network output, with probit or Monte
      Carlo class probabilities;
    * :meth:`log_marginal_likelihood` and :meth:`optimize_prior_precision` (scalar or per site);
    * :meth:`as_prior`: the posterior as prior distributions for a next task's model.

    The buffer ``precision`` is the ``(d,)`` diagonal or the ``(d, d)`` dense precision; for
    ``curvature="kron"`` (:attr:`is_kron`) the precision is a
    :class:`~pyro_sgmcmc.guides.kron.KroneckerPrecision` and ``precision`` holds the reciprocal
    marginal variances :math:`1 / (\\Lambda^{-1})_{ii}`.

    The vector :math:`\\theta` follows Pyro's ``AutoContinuous`` layout (sites in the order the
    model samples them); :attr:`site_slices` gives each site's slice.

    Parameters
    ----------
    model : callable
        The Pyro model.
    loc : Tensor ``(d,)``
        The MAP :math:`\\theta_*` in unconstrained space.
    likelihood_curvature, prior_curvature : Tensor ``(d,)`` or ``(d, d)``
        :math:`H_{\\mathrm{lik}}` and the model prior's :math:`-\\nabla^2 \\log p(\\theta_*)`.
    prior_log_density, prior_grad : Tensor
        The model prior's :math:`\\log p(\\theta_*)` (with the log-det-Jacobian) and its gradient.
    prior_mean : Tensor ``(d,)``
        The centre :math:`m` of the Gaussian prior used when a prior precision is set.
    log_likelihood : Tensor
        :math:`\\sum_n \\log p(y_n \\mid \\theta_*)` on the full data.
    curvature : str
        The curvature name, for the record.
    kron_factors : dict, optional
        ``curvature="kron"`` only: ``{site: (G, A)}`` for a weight, ``{site: (G,)}`` for a bias
        (see :class:`~pyro_sgmcmc.guides.kron.KroneckerPrecision`); ``likelihood_curvature`` is
        then the diagonal of these blocks.
    fixed : dict, optional
        ``{site: constrained value}`` of the sites outside the Gaussian (``subset_of_weights``):
        point masses at the MAP. Calling the guide samples them as ``Delta`` sites, and
        :meth:`median`, :meth:`quantiles` and :meth:`params` include them; :meth:`get_posterior`,
        :attr:`covariance`, :meth:`as_prior` and the evidence are over the Gaussian's sites only.
    noise : GaussianNoise, optional
        The model's fixed Gaussian noise scale and number of observations, when its likelihood is
        Gaussian of one fixed scale: the noise scale can then be tuned with the prior precision.
    """

    def __init__(
        self,
        model,
        *,
        loc: torch.Tensor,
        likelihood_curvature: torch.Tensor,
        prior_curvature: torch.Tensor,
        prior_log_density: torch.Tensor,
        prior_grad: torch.Tensor,
        prior_mean: torch.Tensor,
        log_likelihood: torch.Tensor,
        curvature: str = "diag_ggn",
        init_loc_fn=init_to_median,
        kron_factors: Optional[Dict[str, tuple]] = None,
        fixed: Optional[Dict[str, torch.Tensor]] = None,
        noise: Optional[GaussianNoise] = None,
    ) -> None:
        super().__init__(model, init_loc_fn=init_loc_fn)
        self._fixed = {name: value.detach() for name, value in (fixed or {}).items()}
        self._noise = noise
        self._sigma_noise: Optional[torch.Tensor] = None
        self._kron_factors = kron_factors
        self._kron: Optional[KroneckerPrecision] = None
        self.curvature = Curvature.parse(curvature)
        self.register_buffer("loc", loc.detach().clone())
        self.register_buffer("likelihood_curvature", likelihood_curvature.detach().clone())
        self.register_buffer("prior_curvature", prior_curvature.detach().clone())
        self.register_buffer("prior_log_density", torch.as_tensor(prior_log_density).detach().clone())
        self.register_buffer("prior_grad", prior_grad.detach().clone())
        self.register_buffer("prior_mean", prior_mean.detach().clone())
        self.register_buffer("log_likelihood", torch.as_tensor(log_likelihood).detach().clone())
        self._prior_precision: Optional[Dict[str, torch.Tensor]] = None
        self._scale_tril: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ set-up
    def _copy_prototype(self, guide: AutoContinuous, names: Optional[Sequence[str]] = None) -> None:
        """Reuse the prototype trace of the MAP guide (restricted to the sites ``names``)."""
        trace = guide.prototype_trace
        if names is not None and len(names) < len(guide._unconstrained_shapes):
            trace = trace.copy()
            for name in set(guide._unconstrained_shapes) - set(names):
                trace.remove_node(name)
        keep = set(guide._unconstrained_shapes if names is None else names)
        self.prototype_trace = trace
        self._prototype_frames = dict(guide._prototype_frames)
        self._unconstrained_shapes = {k: v for k, v in guide._unconstrained_shapes.items() if k in keep}
        self._cond_indep_stacks = {k: v for k, v in guide._cond_indep_stacks.items() if k in keep}
        self.latent_dim = sum(math.prod(shape) for shape in self._unconstrained_shapes.values())
        self.site_slices = {}
        offset = 0
        for name, _ in self.prototype_trace.iter_stochastic_nodes():
            numel = math.prod(self._unconstrained_shapes[name])
            self.site_slices[name] = slice(offset, offset + numel)
            offset += numel
        if self._kron_factors is not None:
            ones = torch.ones(len(self.site_slices), dtype=self.loc.dtype, device=self.loc.device)
            self._kron = KroneckerPrecision(self._kron_factors, self.site_slices, ones)

    def _setup_prototype(self, *args, **kwargs) -> None:  # pragma: no cover - built from AutoLaplace
        if self.prototype_trace is None:
            raise ValueError("build a LaplaceApproximation with AutoLaplace.laplace_approximation(...)")

    @property
    def is_diagonal(self) -> bool:
        return self._kron is None and self.precision.dim() == 1

    @property
    def is_kron(self) -> bool:
        """Is the precision Kronecker-factored (``curvature="kron"``)?"""
        return self._kron is not None

    def _site_values(self, vector: torch.Tensor, what: str) -> torch.Tensor:
        """One number per site from a ``(d,)`` vector constant within each site (Kronecker blocks)."""
        values = []
        for name, where in self.site_slices.items():
            block = vector[where]
            if not torch.allclose(block, block[0].expand_as(block), rtol=1e-6, atol=0.0):
                raise ValueError(
                    f"curvature='kron' needs one {what} per site (an isotropic Gaussian prior on each weight and "
                    f"bias); site {name!r} has several. Pass prior_precision=... (a number or {{site: number}})"
                )
            values.append(block[0])
        return torch.stack(values)

    # ------------------------------------------------------------------ prior precision
    @property
    def prior_precision(self) -> Optional[Dict[str, torch.Tensor]]:
        """``None`` (the model's own prior) or ``{site: precision}`` of the Gaussian prior in use."""
        return None if self._prior_precision is None else dict(self._prior_precision)

    def set_prior_precision(self, prior_precision: Optional[PriorPrecision]) -> None:
        """Use the Gaussian prior :math:`\\mathcal N(m, \\lambda^{-1} I)` (or the model's prior for ``None``).

        The precision becomes :math:`\\Lambda = H_{\\mathrm{lik}} + \\mathrm{diag}(\\lambda)`; the mean
        stays at :math:`\\theta_*`.

        Parameters
        ----------
        prior_precision : None, float or dict
            One positive number for every site, or ``{site: positive number}`` (sites left out get
            precision 1).

        Raises
        ------
        ValueError
            For an invalid value, or when the resulting precision is not positive definite or
            not representable in the model's dtype; the approximation is then left unchanged.
        """
        previous = self._prior_precision
        kron_previous = None if self._kron is None else self._kron.prior_precision
        try:
            self._apply_prior_precision(prior_precision)
        except ValueError:
            self._prior_precision = previous
            if self._kron is not None:
                self._kron.set_prior_precision(kron_previous, self._likelihood_scale())
            raise

    def _apply_prior_precision(self, prior_precision: Optional[PriorPrecision]) -> None:
        if self._kron is not None:
            if prior_precision is None:
                lambdas = self._site_values(self.prior_curvature, "prior curvature")
                self._prior_precision = None
            else:
                self._prior_precision = self._precision_dict(prior_precision)
                lambdas = self._site_values(self._precision_vector(self._prior_precision), "prior precision")
            self._kron.set_prior_precision(lambdas, self._likelihood_scale())
            bad = [name for name, ok in self._kron.is_positive().items() if not ok]
            if bad:
                raise ValueError(f"the Laplace precision is not positive for sites {bad}; pass prior_precision=...")
            variances = self._kron.variances()
            if not (torch.isfinite(variances).all() and torch.isfinite(variances.reciprocal()).all()):
                raise ValueError(
                    f"the marginal variances of the Laplace approximation underflow or overflow in {variances.dtype} "
                    "(a huge or tiny prior_precision?); use a moderate prior_precision or float64"
                )
            self._set_buffer("precision", variances.reciprocal())  # 1 / marginal variances
            return
        h = self.likelihood_curvature * self._likelihood_scale()
        if prior_precision is None:
            self._prior_precision = None
            precision = h + self.prior_curvature
        else:
            self._prior_precision = self._precision_dict(prior_precision)
            vector = self._precision_vector(self._prior_precision)
            precision = h + (torch.diag(vector) if not self._diag_h else vector)
        self._set_precision(precision)

    @property
    def _diag_h(self) -> bool:
        return self.likelihood_curvature.dim() == 1

    def _precision_dict(self, value: PriorPrecision) -> Dict[str, torch.Tensor]:
        return self._precision_from(value, "prior_precision")

    def _precision_from(self, value: PriorPrecision, name: str) -> Dict[str, torch.Tensor]:
        """``{site: tensor}`` from a checked scalar or mapping (sites left out of a mapping get 1)."""
        _check_precision_values(value, name)
        like = self.loc
        sizes = {site: where.stop - where.start for site, where in self.site_slices.items()}
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(self.site_slices))
            if unknown:
                raise ValueError(f"{name} names unknown sites {unknown}; latent sites: {list(self.site_slices)}")
            return {
                site: _as_precision(value.get(site, 1.0), f"{name}[{site!r}]", like, sizes[site])
                for site in self.site_slices
            }
        tensor = _as_precision(value, name, like, 1)
        return {site: tensor for site in self.site_slices}

    def _precision_vector(self, precision: Mapping[str, torch.Tensor]) -> torch.Tensor:
        vector = torch.empty_like(self.loc)
        for name, where in self.site_slices.items():
            vector[where] = precision[name]
        return vector

    def _set_precision(self, precision: torch.Tensor) -> None:
        if precision.dim() == 1:
            bad = [name for name, where in self.site_slices.items() if not (precision[where] > 0).all()]
            if bad:
                raise ValueError(
                    f"the Laplace precision is not positive for sites {bad} (the prior's curvature there is "
                    "not positive and the likelihood does not make up for it); pass prior_precision=... "
                    "or check that the MAP fit converged"
                )
            self._scale_tril = None
        else:
            cholesky, info = torch.linalg.cholesky_ex(precision)
            if int(info) != 0:
                raise ValueError(
                    "the Laplace precision (Hessian of the negative log joint) is not positive definite: the "
                    "point is not a local maximum (fit the MAP longer) or use curvature='full_ggn'"
                )
            covariance = torch.cholesky_inverse(cholesky)
            scale_tril, info = torch.linalg.cholesky_ex(0.5 * (covariance + covariance.T))
            if int(info) != 0 or not torch.isfinite(scale_tril).all():
                raise ValueError(
                    f"the Laplace covariance (the inverse precision) underflows in {precision.dtype}: the precision "
                    "is too large or too ill-conditioned for this dtype (a huge prior_precision?); use a smaller "
                    "prior_precision or float64"
                )
            self._scale_tril = scale_tril
        self._set_buffer("precision", precision.detach())

    def _set_buffer(self, name: str, value: torch.Tensor) -> None:
        if name in self._buffers:
            setattr(self, name, value.detach())
        else:
            self.register_buffer(name, value.detach())

    # ------------------------------------------------------------------ the Gaussian
    def get_posterior(self, *args, **kwargs):
        """``Normal(loc, precision^-1/2).to_event(1)`` (diagonal), ``MultivariateNormal(loc, scale_tril)``
        (dense) or :class:`~pyro_sgmcmc.guides.kron.KroneckerNormal` (``"kron"``)."""
        if self._kron is not None:
            return KroneckerNormal(self.loc, self._kron)
        if self.is_diagonal:
            return dist.Normal(self.loc, self.precision.rsqrt()).to_event(1)
        return dist.MultivariateNormal(self.loc, scale_tril=self._scale_tril)

    def _loc_scale(self, *args, **kwargs):
        if self.is_diagonal or self._kron is not None:  # for "kron", precision holds 1 / marginal variances
            return self.loc, self.precision.rsqrt()
        return self.loc, self._scale_tril.pow(2).sum(-1).sqrt()

    @property
    def scale(self) -> torch.Tensor:
        """Marginal standard deviations in unconstrained space, ``(d,)``."""
        return self._loc_scale()[1]

    @property
    def covariance(self) -> torch.Tensor:
        """The covariance :math:`\\Lambda^{-1}`: ``(d,)`` variances if diagonal, else ``(d, d)``."""
        if self.is_diagonal:
            return self.precision.reciprocal()
        if self._kron is not None:
            if self.loc.shape[0] > MAX_FULL_DIM:
                raise ValueError(
                    f"the dense covariance of a 'kron' approximation is limited to latent dimension <= {MAX_FULL_DIM}"
                )
            identity = torch.eye(self.loc.shape[0], dtype=self.loc.dtype, device=self.loc.device)
            return self._kron.apply_power(identity, -1.0)
        return self._scale_tril @ self._scale_tril.T

    def params(self, latent: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
        """Constrained site values ``{name: value}`` at ``latent`` (default: the MAP), fixed sites included."""
        latent = self.loc if latent is None else latent
        values = {site["name"]: biject_to(site["fn"].support)(value) for site, value in self._unpack_latent(latent)}
        return {**self._fixed, **values}

    @property
    def fixed(self) -> Dict[str, torch.Tensor]:
        """``{site: value}`` of the sites held at the MAP (empty unless ``subset_of_weights`` chose some)."""
        return dict(self._fixed)

    def forward(self, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """Draw the Gaussian's sites, and the fixed sites as ``Delta`` point masses at the MAP."""
        result = super().forward(*args, **kwargs)
        for name, value in self._fixed.items():
            result[name] = pyro.sample(name, dist.Delta(value, event_dim=value.dim()))
        return result

    def median(self, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """The posterior median of every site in constrained space (the fixed sites at the MAP)."""
        return {**self._fixed, **super().median(*args, **kwargs)}

    def quantiles(self, quantiles, *args, **kwargs) -> Dict[str, torch.Tensor]:
        """Marginal quantiles in constrained space; a fixed site repeats its MAP value."""
        result = super().quantiles(quantiles, *args, **kwargs)
        count = len(quantiles)
        for name, value in self._fixed.items():
            result[name] = value.expand((count,) + value.shape).clone()
        return result

    # ------------------------------------------------------------------ continual learning
    def as_prior(self) -> Dict[str, dist.Distribution]:
        """The approximation as prior distributions ``{site: distribution}`` in constrained space.

        Each site gets its own marginal: ``Normal(mean, sd).to_event(k)`` over the unconstrained
        value, ``k`` the site's own event dimension, so its plate dimensions stay batch dimensions
        (``MultivariateNormal`` over the site's block for a dense precision, and the site's
        :class:`~pyro_sgmcmc.guides.kron.KroneckerNormal` block for ``"kron"``, reshaped to the
        site's shape: the whole site is then one event), pushed through ``biject_to(support)``
        for constrained sites. Correlations *between* sites are dropped. Use them in the next task's model, e.g.
        ``pyro.sample("w", priors["w"])`` or ``PyroSample(priors["layer.weight"])``.
        """
        priors = {}
        loc, scale = self._loc_scale()
        covariance = None if self.is_diagonal or self._kron is not None else self.covariance
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            where = self.site_slices[name]
            shape = self._unconstrained_shapes[name]
            if self._kron is not None:  # the site's own Kronecker block: the whole site is one event
                base = KroneckerNormal(loc[where].clone(), self._kron.site(name))
                if tuple(shape) != (where.stop - where.start,):
                    reshape = torch.distributions.transforms.ReshapeTransform(base.event_shape, shape)
                    base = dist.TransformedDistribution(base, [reshape])
            elif covariance is None:
                base = dist.Normal(loc[where].reshape(shape).clone(), scale[where].reshape(shape).clone())
                # the site's own event dims (in unconstrained space): its plate dims stay batch dims
                base = base.to_event(site["fn"].event_dim + len(shape) - site["value"].dim())
            else:
                block = covariance[where, where].clone()
                base = dist.MultivariateNormal(loc[where].clone(), covariance_matrix=0.5 * (block + block.T))
                if tuple(shape) != (where.stop - where.start,):
                    reshape = torch.distributions.transforms.ReshapeTransform(base.event_shape, shape)
                    base = dist.TransformedDistribution(base, [reshape])
            transform = biject_to(site["fn"].support)
            if _is_identity(transform):
                priors[name] = base
            else:
                priors[name] = dist.TransformedDistribution(base, [transform])
        return priors

    # ------------------------------------------------------------------ predictive
    def predict(
        self,
        fn,
        x: torch.Tensor,
        *,
        link: Optional[str] = None,
        num_samples: int = 1000,
        batch_size: int = 32,
        generator: Optional[torch.Generator] = None,
    ) -> Union[GLMPrediction, torch.Tensor]:
        """Linearised (GLM) predictive :math:`f(x) \\sim \\mathcal N(f(x, \\theta_*), J \\Sigma J^\\top)` of an output.

        ``fn(params, x)`` returns the output for constrained site values ``params``; ``link`` is
        ``None`` (mean and covariance), ``"probit"`` or ``"mc"`` (class probabilities). See
        :func:`~pyro_sgmcmc.guides.predictive.linearized_predictive` for the details.
        """
        return linearized_predictive(
            self, fn, x, link=link, num_samples=num_samples, batch_size=batch_size, generator=generator
        )


# ---------------------------------------------------------------------------------- helpers
def _check_precision_values(value, name: str = "prior_precision") -> None:
    check_precision(value, name)


def _as_precision(value, name: str, like: torch.Tensor, numel: int) -> torch.Tensor:
    """``value`` as a tensor of ``like``'s dtype and device that broadcasts to ``(numel,)``."""
    tensor = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if tensor.dim() > 0 and tensor.reshape(-1).shape[0] not in (1, numel):
        raise ValueError(f"{name} has {tensor.numel()} entries; the site has {numel} coordinates (or give 1 number)")
    if not (torch.isfinite(tensor).all() and (tensor > 0).all()):
        raise ValueError(
            f"{name} = {value!r} is not a positive finite number in {like.dtype} (it overflows or underflows)"
        )
    return tensor.reshape(-1) if tensor.dim() > 0 else tensor


def _guide_slices(guide) -> Dict[str, tuple]:
    slices, offset = {}, 0
    for name, _ in guide.prototype_trace.iter_stochastic_nodes():
        numel = math.prod(guide._unconstrained_shapes[name])
        slices[name] = (offset, offset + numel)
        offset += numel
    return slices


def _is_identity(transform) -> bool:
    while isinstance(transform, torch.distributions.transforms.IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, torch.distributions.transforms.ComposeTransform) and not transform.parts


def _permutation(names: Sequence[str], shapes: Mapping[str, torch.Size], potential: ModelPotential) -> torch.Tensor:
    """Indices ``perm`` with ``guide_vector = potential_vector[perm]`` for the guide's sites ``names``."""
    by_name = {site.name: site for site in potential.sites}
    if sorted(names) != sorted(by_name):
        raise ValueError(f"the guide's latent sites {list(names)} differ from the model's {sorted(by_name)}")
    parts = []
    for name in names:
        site = by_name[name]
        if tuple(site.unconstrained_shape) != tuple(shapes[name]):
            raise ValueError(f"site {name!r} changed shape since the guide was set up")
        parts.append(torch.arange(site.offset, site.offset + site.numel))
    return torch.cat(parts)
