"""Curvature of the log joint of a Pyro model, accumulated over the full data set.

A Laplace approximation needs the precision :math:`\\Lambda = H_{\\mathrm{lik}} + H_{\\mathrm{prior}}`
at the MAP :math:`\\theta_*` (unconstrained space). This module computes both pieces for a model
wrapped in a :class:`~pyro_sgmcmc.ModelPotential` (flat position, latent sites in sorted-name
order):

* :func:`likelihood_curvature` walks the whole data set, minibatch by minibatch, and sums the
  curvature of the negative log-likelihood; the :class:`Curvature` options say which;
* :func:`prior_terms` returns the log prior, its gradient and its exact Hessian (diagonal or full)
  in unconstrained space, the log-det-Jacobian of the constraining transforms included.

**How the data set is walked.** The likelihood is split into *terms*
:math:`\\ell_n(\\theta) = w_n \\log p(y_n \\mid \\theta)`, :math:`w_n` the site's own scale
(``poutine.scale``, e.g. a likelihood temperature; the ``N / B`` factor of a subsampled plate is
removed, so every term counts once). With exactly one subsampled plate (the usual
``pyro.plate("data", N, subsample_size=B)``) an *example* is one index of that plate, and the
fastest route that applies is taken:

* **linear layers** (diagonal curvatures): when every latent site is the weight or bias of one
  ``F.linear`` call on a ``(batch, in)`` input (a ``PyroModule`` network with ``PyroSample``
  weights), the layer calls are recorded with a :class:`torch.overrides.TorchFunctionMode` and
  :math:`\\sum_n (\\delta_n a_n^\\top)^2 = (\\delta \\circ \\delta)^\\top (a \\circ a)` gives the
  diagonal from one backward pass per output column, with no per-example gradient stored. The
  first four examples are checked against plain per-example gradients;
* **per-example gradients**: the model runs under :func:`torch.func.vmap` on one plate index per
  vmapped instance, and :func:`torch.func.vjp` gives each example's gradient (one backward pass per
  output column). To let the plate accept one index, Pyro's check that a conditioned subsample has
  the plate's ``subsample_size`` is lifted for that plate while the sweep runs
  (:func:`free_subsample_length`). A model that cannot run on one index (a shape hard-coded to
  ``B``, an op without a batching rule) falls back, with a warning, to:
* **Jacobians of minibatches** (also for no or several subsampled plates): the plates are walked
  in consecutive chunks of their own ``subsample_size`` (the last chunk overlaps the one before it
  and the overlap is masked out) and the Jacobian of the vector of terms is taken by batched
  backward passes; a term is one element of an observed site's batch shape. This costs ``B``
  backward passes per chunk: for small models.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions import Unit
from pyro.distributions.torch_distribution import ExpandedDistribution, MaskedDistribution
from pyro.poutine.subsample_messenger import SubsampleMessenger, _Subsample
from torch.distributions import Independent

from ..model.potential import SubsamplePlate

__all__ = [
    "Curvature",
    "MAX_FULL_DIM",
    "LikelihoodCurvature",
    "PriorTerms",
    "likelihood_curvature",
    "prior_terms",
    "free_subsample_length",
]

#: Largest number of latent dimensions for the dense curvatures (``"full"``, ``"full_ggn"``):
#: a dense precision holds ``d^2`` numbers (200 MB in float64 at ``d = 5000``) and its Cholesky
#: factorisation costs ``d^3 / 3`` flops.
MAX_FULL_DIM = 5000


class Curvature(str, enum.Enum):
    r"""The curvature of the negative log-likelihood used as the Laplace precision.

    With :math:`\ell_n(\theta) = \log p(y_n \mid \theta)` the log-likelihood of example
    :math:`n`, :math:`f_n(\theta)` the parameters of its distribution (the network output) and
    :math:`J_n = \partial f_n / \partial \theta` their Jacobian:

    .. math::
        H_{\mathrm{EF}} = \sum_n \nabla\ell_n \nabla\ell_n^\top, \qquad
        H_{\mathrm{GGN}} = \sum_n J_n^\top F(f_n) J_n, \qquad
        H = -\sum_n \nabla^2 \ell_n,

    where :math:`F(f) = \mathbb{E}_{y \sim p(y \mid f)}[\nabla_f \log p \, \nabla_f \log p^\top]` is the
    Fisher information of the output distribution.
    """

    #: Diagonal empirical Fisher, :math:`\sum_n (\nabla_\theta \ell_n)^2`, from exact per-example
    #: gradients (not squared minibatch gradients). One backward pass per example.
    DIAG_EF = "diag_ef"
    #: Diagonal generalised Gauss-Newton / conditional Fisher, :math:`\mathrm{diag}\sum_n J_n^\top F J_n`.
    #: Exact for ``Normal`` (``F = diag(1/sigma^2)`` for the loc, ``2/sigma^2`` for a scale that
    #: depends on theta), ``Bernoulli`` (``F = p(1-p)`` on the logit) and ``Categorical``
    #: (``F = diag(p) - p p^T`` on the logits) likelihoods, at one backward pass per output column.
    #: Any other likelihood uses Monte Carlo labels: :math:`\frac1S \sum_s (\nabla\log p(\hat y_s\mid\theta))^2`,
    #: :math:`\hat y_s \sim p(y \mid f_n)`, an unbiased estimate of the same diagonal.
    DIAG_GGN = "diag_ggn"
    #: Full exact Hessian of the negative log joint (Pyro's ``AutoLaplaceApproximation``), summed
    #: over the data; small models only (``d <= MAX_FULL_DIM``). Not PSD away from a maximum.
    FULL = "full"
    #: Full (dense) GGN / conditional Fisher, always PSD; small models only (``d <= MAX_FULL_DIM``).
    FULL_GGN = "full_ggn"
    #: Kronecker-factored GGN (K-FAC) for networks of ``F.linear`` layers (``nn.Linear`` in a
    #: ``PyroModule`` with ``PyroSample`` weight and bias): a layer's weight block is
    #: :math:`G \otimes A`, :math:`A = \frac1N\sum_n a_n a_n^\top` (layer inputs),
    #: :math:`G = \sum_n \sum_k \delta_{nk}\delta_{nk}^\top` (output gradients of the whitened
    #: outputs of ``diag_ggn``); its bias block is :math:`G` itself (exact). Blocks of different
    #: sites are independent. See :mod:`pyro_sgmcmc.guides.kron`.
    KRON = "kron"

    @property
    def is_diagonal(self) -> bool:
        return self in (Curvature.DIAG_EF, Curvature.DIAG_GGN)

    @property
    def is_dense(self) -> bool:
        return self in (Curvature.FULL, Curvature.FULL_GGN)

    @classmethod
    def parse(cls, value) -> "Curvature":
        """Return the member named by ``value``; a ``ValueError`` lists the accepted names."""
        try:
            return cls(value)
        except ValueError:
            accepted = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"unknown curvature {value!r}; accepted: {accepted}") from None


@dataclass
class LikelihoodCurvature:
    """The result of :func:`likelihood_curvature` (potential order)."""

    curvature: torch.Tensor  #: ``(d,)`` diagonal or ``(d, d)`` dense curvature of :math:`-\sum_n \ell_n`
    log_likelihood: torch.Tensor  #: :math:`\sum_n \ell_n(\theta_*)` on the full data (0-dim)
    num_terms: int  #: number of likelihood terms visited (examples, or elements on the Jacobian path)
    method: str  #: ``"per-example"``, ``"jacobian"`` or ``"hessian"``
    #: ``"kron"`` only: ``{site: factors}``, ``(G, A)`` for a weight (block :math:`G \otimes A`) and
    #: ``(G,)`` for a bias; ``curvature`` then holds the diagonal of these blocks
    kron_factors: Optional[Dict[str, Tuple[torch.Tensor, ...]]] = None


@dataclass
class PriorTerms:
    """The prior in unconstrained space at one position (potential order).

    ``log_density`` is :math:`\\log p(T(z)) + \\log|\\det J_T(z)|`, ``grad`` its gradient,
    ``curvature`` its negative Hessian (``(d,)`` diagonal or ``(d, d)``), and ``mean`` the mean
    of each real-valued site's prior (0 for constrained sites), the centre of the Gaussian prior
    that replaces it when a prior precision is set.
    """

    log_density: torch.Tensor
    grad: torch.Tensor
    curvature: torch.Tensor
    mean: torch.Tensor


# ---------------------------------------------------------------------------------- plate patch
_FREE_PLATES: set = set()
_ORIGINAL_SUBSAMPLE = SubsampleMessenger.__dict__["_subsample"]


def _subsample_any_length(name, size=None, subsample_size=None, subsample=None, use_cuda=None, device=None):
    if name in _FREE_PLATES:
        subsample_size = None  # the length follows the conditioned indices
    return _ORIGINAL_SUBSAMPLE.__func__(name, size, subsample_size, subsample, use_cuda, device)


@contextlib.contextmanager
def free_subsample_length(names: Sequence[str]) -> Iterator[None]:
    """Let the plates ``names`` take conditioned subsamples of any length inside the block.

    Pyro raises ``ValueError`` when ``len(subsample) != subsample_size``. Inside this context the
    plates named here take the length of the conditioned indices instead (their ``N / B`` scale
    follows), which lets the model run on a single example. Not thread-safe: it swaps
    ``SubsampleMessenger._subsample`` for the duration of the block.
    """
    added = set(names) - _FREE_PLATES
    _FREE_PLATES.update(added)
    SubsampleMessenger._subsample = staticmethod(_subsample_any_length)
    try:
        yield
    finally:
        _FREE_PLATES.difference_update(added)
        if not _FREE_PLATES:
            SubsampleMessenger._subsample = _ORIGINAL_SUBSAMPLE


# ---------------------------------------------------------------------------------- tracing
def _trace(potential, position: torch.Tensor, indices: Dict[str, torch.Tensor]):
    """Trace the model at the flat unconstrained ``position`` with the given plate indices."""
    data = dict(indices)
    for site in potential.sites:
        data[site.name] = site.transform(position[site.slice].reshape(site.unconstrained_shape))
    model = poutine.condition(potential.model, data=data)
    return poutine.trace(model).get_trace(*potential.model_args, **potential.model_kwargs)


def _observed_sites(trace, latent_names) -> List[dict]:
    return [
        site for name, site in trace.nodes.items() if site["type"] == "sample" and site["is_observed"]
        and name not in latent_names and not isinstance(site["fn"], _Subsample)
    ]  # fmt: skip


def _site_weight(site) -> float:
    """The site's own scale: ``site["scale"]`` without the ``size / subsample_size`` of its plates."""
    plate_factor = 1.0
    for frame in site["cond_indep_stack"]:
        if frame.full_size is not None and frame.size not in (None, 0):
            plate_factor *= frame.full_size / frame.size
    scale = site["scale"]
    return scale / plate_factor


def _masked_log_prob(site) -> torch.Tensor:
    log_prob = site["fn"].log_prob(site["value"])
    mask = site["mask"]
    if mask is not None and mask is not True:
        log_prob = torch.where(torch.as_tensor(mask, device=log_prob.device), log_prob, torch.zeros_like(log_prob))
    return log_prob


def _normal_scale_varies(fn) -> bool:
    """Does the scale of the (possibly wrapped) ``Normal`` require grad? (checked outside transforms)"""
    while isinstance(fn, (Independent, MaskedDistribution, ExpandedDistribution)):
        fn = fn.base_dist
    return isinstance(fn, torch.distributions.Normal) and fn.scale.requires_grad


def _fisher_rows(fn, num_mc_samples: int, keep_scale: bool, mc_fisher: bool = False) -> torch.Tensor:
    """Whitened outputs ``v`` with ``sum_k grad(v_k) grad(v_k)^T = J^T F J``, shape ``batch_shape + (K,)``.

    ``v = A^T f`` with ``F = A A^T`` evaluated at the current point and held constant (detached):

    * ``Normal(loc, scale)``: ``loc / sigma`` and, if the scale depends on theta, ``sqrt(2) scale / sigma``;
    * ``Bernoulli``: ``sqrt(p (1 - p)) * logit``;
    * ``Categorical``: ``sqrt(p_k) (l_k - sum_j p_j l_j)`` for each class ``k`` (``l`` the normalised logits);
    * anything else: ``log p(y_s | theta) / sqrt(S)`` for ``S`` labels ``y_s`` drawn from the model (Monte Carlo).
    """
    if isinstance(fn, Independent):
        rows = _fisher_rows(fn.base_dist, num_mc_samples, keep_scale, mc_fisher)
        return rows.reshape(fn.batch_shape + (-1,))
    if isinstance(fn, MaskedDistribution):
        rows = _fisher_rows(fn.base_dist, num_mc_samples, keep_scale, mc_fisher)
        mask = fn._mask
        if isinstance(mask, bool):
            return rows if mask else torch.zeros_like(rows)
        return rows * mask.expand(fn.batch_shape).unsqueeze(-1).to(rows.dtype)
    if isinstance(fn, ExpandedDistribution):
        rows = _fisher_rows(fn.base_dist, num_mc_samples, keep_scale, mc_fisher)
        return rows.expand(fn.batch_shape + rows.shape[-1:])
    if mc_fisher:
        pass  # Monte Carlo labels for every likelihood, below
    elif isinstance(fn, torch.distributions.Normal):
        sigma = fn.scale.detach()
        loc = fn.loc.expand(fn.batch_shape)
        columns = [loc / sigma]
        if keep_scale:
            columns.append(math.sqrt(2.0) * fn.scale.expand(fn.batch_shape) / sigma)
        return torch.stack(columns, dim=-1)
    elif isinstance(fn, torch.distributions.Bernoulli):
        logits = fn.logits
        p = torch.sigmoid(logits.detach())
        return (torch.sqrt(p * (1 - p)) * logits).unsqueeze(-1)
    elif isinstance(fn, torch.distributions.Categorical):
        logits = fn.logits  # normalised by torch: log-probabilities
        p = logits.detach().exp()
        return p.sqrt() * (logits - (p * logits).sum(-1, keepdim=True))
    # Monte Carlo labels: any distribution that can be sampled
    try:
        labels = fn.sample((num_mc_samples,)).detach()
    except NotImplementedError as error:
        raise ValueError(
            f"curvature 'diag_ggn'/'full_ggn' needs to sample the likelihood {type(fn).__name__} for "
            "Monte Carlo labels and it cannot be sampled; use curvature='diag_ef'"
        ) from error
    log_prob = fn.log_prob(labels)  # (S, *batch_shape)
    return log_prob.movedim(0, -1) / math.sqrt(num_mc_samples)


def _site_rows(site, kind: Curvature, num_mc_samples: int, keep_scale: bool, mc_fisher: bool) -> torch.Tensor:
    """Rows of one observed site, shape ``batch_shape + (K,)`` (weights not applied)."""
    if kind is Curvature.DIAG_EF:
        return _masked_log_prob(site).unsqueeze(-1)
    rows = _fisher_rows(site["fn"], num_mc_samples, keep_scale, mc_fisher)
    mask = site["mask"]
    if mask is not None and mask is not True:
        rows = rows * torch.as_tensor(mask, device=rows.device).expand(rows.shape[:-1]).unsqueeze(-1).to(rows.dtype)
    return rows


# ---------------------------------------------------------------------------------- chunks
def _chunks(size: int, subsample_size: int, device) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive ``(indices, new)`` chunks of length ``subsample_size`` covering ``range(size)``.

    The last chunk overlaps the one before it; ``new`` (bool, same length) marks the indices not
    covered by an earlier chunk, so that every index is counted once.
    """
    chunks, start = [], 0
    while start < size:
        begin = min(start, size - subsample_size)
        indices = torch.arange(begin, begin + subsample_size, device=device)
        chunks.append((indices, indices >= start))
        start += subsample_size
    return chunks


def _combinations(potential) -> Iterator[Tuple[Dict[str, torch.Tensor], Dict[str, Tuple[int, torch.Tensor]]]]:
    plates = list(potential.subsample_plates)
    per_plate = [_chunks(p.size, p.subsample_size, potential.device) for p in plates]
    for combination in itertools.product(*[list(enumerate(c)) for c in per_plate]):
        indices = {p.name: chunk[0] for p, (_, chunk) in zip(plates, combination)}
        flags = {p.name: (number, chunk[1]) for p, (number, chunk) in zip(plates, combination)}
        yield indices, flags


def _overlap_mask(site, shape: torch.Size, flags) -> torch.Tensor:
    """1 for the elements of ``shape`` (the site's batch shape) counted in this chunk combination."""
    mask = torch.ones(shape)
    frames = {f.name: f for f in site["cond_indep_stack"] if f.vectorized}
    for name, (number, new) in flags.items():
        frame = frames.get(name)
        if frame is None:  # the site is not in this plate: count it with the plate's first chunk only
            mask = mask * float(number == 0)
            continue
        axis = len(shape) + frame.dim
        view = [1] * len(shape)
        view[axis] = new.shape[0]
        mask = mask * new.to(mask.dtype).reshape(view)
    return mask


def _progress(iterable, total: int, disable: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, disable=disable, desc=desc, leave=False)


# ---------------------------------------------------------------------------------- likelihood
def likelihood_curvature(
    potential,
    position: torch.Tensor,
    curvature,
    *,
    num_mc_samples: int = 1,
    mc_fisher: bool = False,
    disable_progbar: bool = False,
    path: Optional[str] = None,
) -> LikelihoodCurvature:
    """Curvature of the negative log-likelihood on the full data set, at ``position``.

    Parameters
    ----------
    potential : ModelPotential
        The model, its arguments, latent layout and subsampled plates.
    position : Tensor ``(d,)``
        The flat unconstrained point :math:`\\theta_*` (potential order).
    curvature : str or Curvature
        One of :class:`Curvature`.
    num_mc_samples : int
        Labels drawn per example for likelihoods without an exact Fisher (``diag_ggn``, ``full_ggn``).
    mc_fisher : bool
        Use Monte Carlo labels for *every* likelihood, the exact ones included: ``num_mc_samples``
        backward passes per example instead of one per output (``K`` for ``K`` classes), at the
        price of an unbiased estimate instead of the exact diagonal.
    disable_progbar : bool
        Hide the tqdm progress bar over minibatches.
    path : {None, "linear-layers", "per-example", "jacobian"}
        Force a path (tests); by default the fastest that applies, in that order.

    Returns
    -------
    LikelihoodCurvature
    """
    kind = Curvature.parse(curvature)
    position = position.detach()
    if kind is Curvature.FULL:
        return _hessian_sweep(potential, position, disable_progbar)
    plates = potential.subsample_plates
    if kind is Curvature.KRON:
        result = None
        plate = plates[0] if len(plates) == 1 else (_full_data_plate(potential, position) if not plates else None)
        if plate is not None:
            result = _linear_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar, plate=plate)
        if result is None:
            raise ValueError(
                "curvature='kron' needs a network of F.linear layers (nn.Linear in a PyroModule, PyroSample "
                "weights and biases, every latent site the weight or bias of exactly one layer on (batch, in) "
                "inputs) and one data plate (subsampled or not) holding every observation; use "
                "curvature='diag_ggn' for this model"
            )
        return result
    auto = path is None
    if path is None:
        path = "per-example" if len(plates) == 1 else "jacobian"
    if path == "linear-layers":
        if len(plates) != 1 or not kind.is_diagonal:
            raise ValueError("the linear-layers path needs exactly one subsampled plate and a diagonal curvature")
        result = _linear_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar, check=False)
        if result is None:
            raise ValueError("the model's latent sites are not all weights and biases of F.linear layers")
        return result
    if path == "per-example":
        if len(plates) != 1:
            raise ValueError("the per-example path needs exactly one subsampled plate")
        try:
            if kind.is_diagonal and auto:
                result = _linear_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar)
                if result is not None:
                    return result
            return _per_example_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar)
        except (RuntimeError, ValueError, IndexError, TypeError) as error:
            if isinstance(error, _UserFacingError):
                raise
            warnings.warn(
                f"the model could not be evaluated one example at a time ({type(error).__name__}: {error}); "
                "computing the curvature from Jacobians of whole minibatches instead, which is slower",
                RuntimeWarning,
                stacklevel=2,
            )
    return _jacobian_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar)


class _UserFacingError(ValueError):
    """An error about the model itself (not a reason to fall back to the Jacobian path)."""


def _keep_scales(potential, position, indices) -> Dict[str, bool]:
    """Which observed Normal sites have a scale that depends on theta (outside any transform)."""
    with torch.enable_grad():
        z = position.detach().requires_grad_(True)
        trace = _trace(potential, z, indices)
        return {site["name"]: _normal_scale_varies(site["fn"]) for site in _observed_sites(trace, potential.site_names)}


def _check_ggn_sites(potential, position, indices, mc_fisher) -> None:
    with torch.no_grad():
        trace = _trace(potential, position, indices)
    for site in _observed_sites(trace, potential.site_names):
        fn = site["fn"]
        while isinstance(fn, (Independent, MaskedDistribution, ExpandedDistribution)):
            fn = fn.base_dist
        exact = (torch.distributions.Normal, torch.distributions.Bernoulli, torch.distributions.Categorical)
        if isinstance(fn, exact) and not mc_fisher:
            continue
        try:
            if isinstance(fn, Unit):  # pyro.factor: a log-density without a distribution over data
                raise NotImplementedError
            fn.sample()
        except NotImplementedError:
            raise _UserFacingError(
                f"observed site {site['name']!r} ({type(fn).__name__}) cannot be sampled, so its Fisher "
                "cannot be estimated with Monte Carlo labels; use curvature='diag_ef'"
            ) from None


def _trace_sites(potential, unconstrained: Sequence[torch.Tensor], indices: Dict[str, torch.Tensor]):
    """Trace the model at per-site unconstrained values (one tensor per site, potential order)."""
    data = dict(indices)
    for site, u in zip(potential.sites, unconstrained):
        data[site.name] = site.transform(u)
    model = poutine.condition(potential.model, data=data)
    return poutine.trace(model).get_trace(*potential.model_args, **potential.model_kwargs)


def _example_rows(trace, latent_names, plate_name, kind, num_mc_samples, keep_scale, mc_fisher, first):
    """Rows (one example: ``(K,)``) and the weighted log-likelihood of a trace on one plate index."""
    rows, loglik = [], None
    for site in _observed_sites(trace, latent_names):
        in_plate = any(f.name == plate_name for f in site["cond_indep_stack"])
        weight = float(_site_weight(site))
        factor = 1.0 if in_plate else first  # a site outside the plate counts once, with example 0
        term = (weight * factor * _masked_log_prob(site)).sum()
        loglik = term if loglik is None else loglik + term
        site_rows = _site_rows(site, kind, num_mc_samples, keep_scale.get(site["name"], False), mc_fisher)
        if kind is Curvature.DIAG_EF:  # one row per example: its whole log-likelihood
            rows.append((math.sqrt(weight) * factor * site_rows).sum().reshape(1))
        else:
            rows.append((math.sqrt(weight) * factor * site_rows).reshape(-1))
    if kind is Curvature.DIAG_EF:
        return torch.stack(rows).sum(0), loglik
    return torch.cat(rows), loglik


def _site_values(potential, position) -> Tuple[torch.Tensor, ...]:
    return tuple(position[site.slice].reshape(site.unconstrained_shape) for site in potential.sites)


def _flatten_sites(potential, parts: Sequence[torch.Tensor], lead: Tuple[int, ...] = ()) -> torch.Tensor:
    return torch.cat([part.reshape(lead + (site.numel,)) for site, part in zip(potential.sites, parts)], dim=-1)


def _per_example_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar) -> LikelihoodCurvature:
    """Per-example gradients under ``vmap`` (one plate index per vmapped instance).

    The model is differentiated with respect to one tensor per site (not the flat vector, whose
    slicing would write ``d`` numbers per site and example in the backward pass), and each call
    handles at most ``_VMAP_BUDGET`` numbers of per-example gradients, so the buffers stay small.
    """
    (plate,) = potential.subsample_plates
    d = position.shape[0]
    latent_names = set(potential.site_names)
    first_indices = {plate.name: torch.arange(plate.subsample_size, device=position.device)}
    keep_scale = _keep_scales(potential, position, first_indices) if kind is not Curvature.DIAG_EF else {}
    if kind is not Curvature.DIAG_EF:
        _check_ggn_sites(potential, position, first_indices, mc_fisher)
    diagonal = kind.is_diagonal
    values = _site_values(potential, position)

    def one_example(index, first):
        def fn(*sites):
            trace = _trace_sites(potential, sites, {plate.name: index})
            return _example_rows(trace, latent_names, plate.name, kind, num_mc_samples, keep_scale, mc_fisher, first)

        rows, vjp_fn, loglik = torch.func.vjp(fn, *values, has_aux=True)
        basis = torch.eye(rows.shape[0], dtype=rows.dtype, device=rows.device)
        if diagonal:  # one backward pass per row, squared and summed at once: O(d) memory per example
            total = None
            for cotangent in basis:
                squares = [g**2 for g in vjp_fn(cotangent)]
                total = squares if total is None else [t + q for t, q in zip(total, squares)]
            return tuple(total), loglik
        return tuple(torch.stack(g) for g in zip(*[vjp_fn(c) for c in basis])), loglik

    batched = torch.func.vmap(one_example, randomness="different")
    size, step = plate.size, max(1, min(plate.subsample_size, _VMAP_BUDGET // max(d, 1)))
    curvature = position.new_zeros(d) if diagonal else position.new_zeros(d, d)
    loglik = position.new_zeros(())
    starts = range(0, size, step)
    with free_subsample_length([plate.name]), pyro.validation_enabled(False):
        for start in _progress(starts, len(starts), disable_progbar, "Laplace curvature"):
            index = torch.arange(start, min(start + step, size), device=position.device)
            first = (index == 0).to(position.dtype)
            parts, logliks = batched(index.unsqueeze(-1), first)
            if diagonal:
                curvature += torch.cat([part.detach().sum(0).reshape(-1) for part in parts])
            else:
                rows = _flatten_sites(potential, [p.detach() for p in parts], (index.shape[0], parts[0].shape[1]))
                rows = rows.reshape(-1, d)
                curvature += rows.T @ rows
            loglik += logliks.detach().sum()
    return LikelihoodCurvature(curvature, loglik, size, "per-example")


# Numbers of per-example gradient entries per vmapped call (4M: 16 MB in float32), small enough for
# the allocator to reuse its buffers instead of mapping fresh pages for every chunk.
_VMAP_BUDGET = 4_000_000


# ---------------------------------------------------------------------------------- linear layers
class _LinearRecorder(torch.overrides.TorchFunctionMode):
    """Record every ``F.linear(input, weight, bias)`` whose weight or bias is a latent site value."""

    def __init__(self, names_by_id: Dict[int, str]) -> None:
        super().__init__()
        self.names_by_id = names_by_id
        self.calls: List[tuple] = []
        self.other_uses: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.nn.functional.linear:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            weight_name = self.names_by_id.get(id(weight))
            bias_name = self.names_by_id.get(id(bias)) if bias is not None else None
            if weight_name is not None or bias_name is not None:
                self.calls.append((weight_name, bias_name, args[0], out))
        return out


def _linear_layers_cover(potential, recorder, batch: int) -> bool:
    """Is every site the weight or bias of exactly one ``F.linear`` call on a ``(batch, in)`` input?"""
    used = []
    for weight_name, bias_name, inputs, out in recorder.calls:
        if inputs.dim() != 2 or inputs.shape[0] != batch or out.dim() != 2:
            return False
        used += [n for n in (weight_name, bias_name) if n is not None]
    return sorted(used) == sorted(potential.site_names) and all(not s.has_jacobian for s in potential.sites)


def _linear_chunk(potential, position, index, plate_name, kind, num_mc_samples, keep_scale, mc_fisher):
    r"""Diagonal curvature of one chunk from layer inputs and output gradients, or ``None``.

    For a weight used as ``z_n = W a_n`` the per-example gradient is :math:`\delta_n a_n^\top` with
    :math:`\delta_n = \partial r_n / \partial z_n`, so :math:`\sum_n (\delta_n a_n^\top)^2 =
    (\delta \circ \delta)^\top (a \circ a)`, one matrix product: no per-example gradient is formed.
    """
    latent_names = set(potential.site_names)
    with torch.enable_grad():
        leaves = [v.detach().clone().requires_grad_(True) for v in _site_values(potential, position)]
        values = [site.transform(u) for site, u in zip(potential.sites, leaves)]
        recorder = _LinearRecorder({id(v): site.name for site, v in zip(potential.sites, values)})
        data = {plate_name: index, **{site.name: v for site, v in zip(potential.sites, values)}}
        with recorder:
            trace = poutine.trace(poutine.condition(potential.model, data=data)).get_trace(
                *potential.model_args, **potential.model_kwargs
            )
        batch = index.shape[0]
        if not _linear_layers_cover(potential, recorder, batch):
            return None
        rows, loglik = [], position.new_zeros(())
        for site in _observed_sites(trace, latent_names):
            frames = [f for f in site["cond_indep_stack"] if f.name == plate_name]
            log_prob = _masked_log_prob(site)
            if not frames or log_prob.dim() + frames[0].dim != 0:  # the plate must be the leading batch dim
                return None
            weight = float(_site_weight(site))
            loglik = loglik + weight * log_prob.sum()
            site_rows = _site_rows(site, kind, num_mc_samples, keep_scale.get(site["name"], False), mc_fisher)
            site_rows = math.sqrt(weight) * site_rows.reshape(batch, -1)
            rows.append(site_rows.sum(-1, keepdim=True) if kind is Curvature.DIAG_EF else site_rows)
        rows = torch.cat(rows, dim=-1)
        if kind is Curvature.DIAG_EF:
            rows = rows.sum(-1, keepdim=True)
        outputs = [out for _, _, _, out in recorder.calls]
        if kind is Curvature.KRON:
            return _kron_chunk(recorder, rows, outputs), loglik.detach()
        diag = {name: torch.zeros_like(v) for name, v in zip(potential.site_names, values)}
        # delta[k, n] = d rows[n, k] / d z_n for every layer output z, all K columns in one batched
        # backward pass; sum_k (delta_k^2)^T a^2 = (sum_k delta_k^2)^T a^2: one product per layer.
        num_columns = rows.shape[1]
        basis = torch.eye(num_columns, dtype=rows.dtype, device=rows.device)
        cotangents = basis.unsqueeze(1).expand(num_columns, *rows.shape)
        try:
            if num_columns == 1:  # one column (regression, the empirical Fisher): a plain backward pass
                deltas = torch.autograd.grad(rows.sum(), outputs, allow_unused=True)
                squares = [None if delta is None else delta.detach() ** 2 for delta in deltas]
            else:
                deltas = torch.autograd.grad(rows, outputs, grad_outputs=cotangents, is_grads_batched=True,
                                             allow_unused=True)  # fmt: skip
                squares = [None if delta is None else (delta.detach() ** 2).sum(0) for delta in deltas]
        except RuntimeError:  # no batching rule somewhere in the network: one pass per column
            squares = [None] * len(outputs)
            for k in range(num_columns):
                deltas = torch.autograd.grad(rows[:, k].sum(), outputs, retain_graph=True, allow_unused=True)
                for i, delta in enumerate(deltas):
                    if delta is not None:
                        squared = delta.detach() ** 2
                        squares[i] = squared if squares[i] is None else squares[i] + squared
        for (weight_name, bias_name, inputs, _), squared in zip(recorder.calls, squares):
            if squared is None:
                continue
            if weight_name is not None:
                diag[weight_name] += squared.T @ inputs.detach() ** 2
            if bias_name is not None:
                diag[bias_name] += squared.sum(0)
    return torch.cat([diag[name].reshape(-1) for name in potential.site_names]), loglik.detach()


def _kron_chunk(recorder, rows, outputs) -> Dict[str, Tuple[torch.Tensor, ...]]:
    """Per layer, the chunk's :math:`\\sum_n a_n a_n^\\top` and :math:`\\sum_{n,k} \\delta_{nk}\\delta_{nk}^\\top`."""
    num_columns = rows.shape[1]
    deltas: List[Optional[torch.Tensor]]
    if num_columns == 1:
        deltas = [None if d is None else d.unsqueeze(0) for d in
                  torch.autograd.grad(rows.sum(), outputs, allow_unused=True)]  # fmt: skip
    else:
        basis = torch.eye(num_columns, dtype=rows.dtype, device=rows.device)
        cotangents = basis.unsqueeze(1).expand(num_columns, *rows.shape)
        try:  # all K columns in one batched backward pass: (K, batch, out) per layer
            deltas = list(torch.autograd.grad(rows, outputs, grad_outputs=cotangents, is_grads_batched=True,
                                              allow_unused=True))  # fmt: skip
        except RuntimeError:  # no batching rule somewhere in the network: one pass per column
            columns = [torch.autograd.grad(rows[:, k].sum(), outputs, retain_graph=True, allow_unused=True)
                       for k in range(num_columns)]  # fmt: skip
            deltas = [None if column[0] is None else torch.stack(column) for column in zip(*columns)]
    factors = {}
    for (weight_name, bias_name, inputs, out), delta in zip(recorder.calls, deltas):
        if delta is not None:
            delta = delta.detach().reshape(-1, out.shape[-1])  # (K * batch, out)
            g = delta.T @ delta
        else:
            g = out.new_zeros(out.shape[-1], out.shape[-1])
        a = inputs.detach()
        if weight_name is not None:
            factors[weight_name] = (g, a.T @ a)
        if bias_name is not None:
            factors[bias_name] = (g,)
    return factors


def _full_data_plate(potential, position) -> Optional[SubsamplePlate]:
    """The one plate (not subsampled) that holds every observed site, as a plate walked in one chunk."""
    with torch.no_grad():
        trace = _trace(potential, position, {})
    names = set()
    for site in _observed_sites(trace, set(potential.site_names)):
        frames = [f for f in site["cond_indep_stack"] if f.vectorized]
        if len(frames) != 1:
            return None
        names.add((frames[0].name, frames[0].size))
    if len(names) != 1:
        return None
    ((name, size),) = names
    return SubsamplePlate(name, size, size)


def _linear_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar, check: bool = True,
                  plate=None):  # fmt: skip
    """Diagonal curvature of a network of ``F.linear`` layers, chunk by chunk; ``None`` if it does not apply.

    With ``check``, the empirical Fisher of the first four examples is also computed from plain
    per-example gradients (one model run per example) and the two must agree to rounding: this
    catches sites used outside the layers and examples that interact (batch norm), and the sweep
    then falls back to :func:`_per_example_sweep`.
    """
    if plate is None:
        (plate,) = potential.subsample_plates
    first_indices = {plate.name: torch.arange(plate.subsample_size, device=position.device)}
    keep_scale = _keep_scales(potential, position, first_indices) if kind is not Curvature.DIAG_EF else {}
    if kind is not Curvature.DIAG_EF:
        _check_ggn_sites(potential, position, first_indices, mc_fisher)
    if any(
        not any(f.name == plate.name for f in site["cond_indep_stack"])
        for site in _observed_sites(_trace(potential, position, first_indices), set(potential.site_names))
    ):
        return None  # an observation outside the data plate
    args = (plate.name, kind, num_mc_samples, keep_scale, mc_fisher)
    size, step = plate.size, plate.subsample_size
    curvature, loglik = position.new_zeros(position.shape[0]), position.new_zeros(())
    with free_subsample_length([plate.name]), pyro.validation_enabled(False):
        if check:
            probe = torch.arange(min(4, size), device=position.device)
            # the check is about the network's structure, so it uses the deterministic EF rows
            check_args = (plate.name, Curvature.DIAG_EF, num_mc_samples, keep_scale, mc_fisher)
            try:
                result = _linear_chunk(potential, position, probe, *check_args)
            except (ValueError, RuntimeError, IndexError) as error:
                if plate.subsample_size != plate.size or kind is not Curvature.KRON:
                    raise
                raise _UserFacingError(
                    f"curvature='kron' checks the network on a few examples of plate {plate.name!r}, and the "
                    "model could not run on them: without subsample_size, index the data with the plate's "
                    "indices (plate = pyro.plate('data', N); f = net(x[plate.indices]); with plate: ...)"
                ) from error
            if result is None:
                return None
            reference = _plain_per_example_diag(potential, position, probe, *check_args)
            tolerance = 1e-4 if position.dtype == torch.float32 else 1e-9
            scale = reference.abs().max().clamp(min=torch.finfo(position.dtype).tiny)
            if ((result[0] - reference).abs().max() / scale) > tolerance:
                return None
        starts = range(0, size, step)
        sums: Dict[str, List[torch.Tensor]] = {}
        for start in _progress(starts, len(starts), disable_progbar, "Laplace curvature"):
            index = torch.arange(start, min(start + step, size), device=position.device)
            result = _linear_chunk(potential, position, index, *args)
            if result is None:
                return None
            if kind is Curvature.KRON:
                for name, parts in result[0].items():
                    sums[name] = list(parts) if name not in sums else [t + p for t, p in zip(sums[name], parts)]
            else:
                curvature += result[0]
            loglik += result[1]
    if kind is not Curvature.KRON:
        return LikelihoodCurvature(curvature, loglik, size, "linear-layers")
    factors = {}
    for site in potential.sites:
        parts = sums[site.name]
        if len(parts) == 2:  # a weight: G and A = sum_n a_n a_n^T / N, so that G (x) A ~ sum_n G_n (x) a_n a_n^T
            factors[site.name] = (parts[0], parts[1] / size)
            diagonal = torch.outer(parts[0].diagonal(), parts[1].diagonal() / size)
        else:
            factors[site.name] = (parts[0],)
            diagonal = parts[0].diagonal()
        curvature[site.slice] = diagonal.reshape(-1)
    return LikelihoodCurvature(curvature, loglik, size, "linear-layers", kron_factors=factors)


def _plain_per_example_diag(potential, position, indices, plate_name, kind, num_mc_samples, keep_scale, mc_fisher):
    """The diagonal curvature of a few examples by plain autograd, one example and one row at a time."""
    latent_names = set(potential.site_names)
    total = torch.zeros_like(position)
    for index in indices:
        with torch.enable_grad():
            leaves = [v.detach().clone().requires_grad_(True) for v in _site_values(potential, position)]
            trace = _trace_sites(potential, leaves, {plate_name: index.reshape(1)})
            rows, _ = _example_rows(trace, latent_names, plate_name, kind, num_mc_samples, keep_scale, mc_fisher, 1.0)
            for row in rows:
                grads = torch.autograd.grad(row, leaves, retain_graph=True, allow_unused=True)
                total += torch.cat([_or_zeros(g, u).reshape(-1) for g, u in zip(grads, leaves)]) ** 2
    return total


def _jacobian_sweep(potential, position, kind, num_mc_samples, mc_fisher, disable_progbar) -> LikelihoodCurvature:
    d = position.shape[0]
    latent_names = set(potential.site_names)
    combos = list(_combinations(potential)) or [({}, {})]
    keep_scale = _keep_scales(potential, position, combos[0][0]) if kind is not Curvature.DIAG_EF else {}
    if kind is not Curvature.DIAG_EF:
        _check_ggn_sites(potential, position, combos[0][0], mc_fisher)
    curvature = position.new_zeros(d) if kind.is_diagonal else position.new_zeros(d, d)
    loglik, num_terms = position.new_zeros(()), 0
    for indices, flags in _progress(combos, len(combos), disable_progbar, "Laplace curvature"):
        with torch.enable_grad():
            z = position.clone().requires_grad_(True)
            trace = _trace(potential, z, indices)
            rows = []
            for site in _observed_sites(trace, latent_names):
                weight = _site_weight(site)
                log_prob = _masked_log_prob(site)
                mask = _overlap_mask(site, log_prob.shape, flags).to(log_prob)
                loglik = loglik + (weight * mask * log_prob).sum().detach()
                num_terms += int(mask.sum())
                site_rows = _site_rows(site, kind, num_mc_samples, keep_scale.get(site["name"], False), mc_fisher)
                rows.append((math.sqrt(weight) * mask.sqrt().unsqueeze(-1) * site_rows).reshape(-1))
            rows = torch.cat(rows)
            jacobian = _jacobian(rows, z)
        if kind.is_diagonal:
            curvature += (jacobian**2).sum(0)
        else:
            curvature += jacobian.T @ jacobian
    return LikelihoodCurvature(curvature, loglik, num_terms, "jacobian")


def _jacobian(outputs: torch.Tensor, z: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """``d outputs / d z`` (``(M, d)``) by batched backward passes over the rows."""
    if not outputs.requires_grad:
        return z.new_zeros(outputs.shape[0], z.shape[0])
    pieces = []
    for start in range(0, outputs.shape[0], chunk):
        basis = torch.eye(outputs.shape[0], dtype=outputs.dtype, device=outputs.device)[start : start + chunk]
        try:
            (rows,) = torch.autograd.grad(outputs, z, grad_outputs=basis, retain_graph=True,
                                          is_grads_batched=True, allow_unused=True)  # fmt: skip
        except RuntimeError:  # an op without a batching rule: one backward pass per row
            rows = torch.stack([
                _or_zeros(torch.autograd.grad(outputs, z, grad_outputs=b, retain_graph=True, allow_unused=True)[0], z)
                for b in basis
            ])  # fmt: skip
        pieces.append(_or_zeros(rows, z, basis.shape[0]))
    return torch.cat(pieces).detach()


def _or_zeros(grad, z, rows: Optional[int] = None):
    if grad is not None:
        return grad
    return z.new_zeros(z.shape) if rows is None else z.new_zeros(rows, z.shape[0])


def _hessian_sweep(potential, position, disable_progbar) -> LikelihoodCurvature:
    d = position.shape[0]
    latent_names = set(potential.site_names)
    combos = list(_combinations(potential)) or [({}, {})]
    curvature = position.new_zeros(d, d)
    loglik, num_terms = position.new_zeros(()), 0
    for indices, flags in _progress(combos, len(combos), disable_progbar, "Laplace curvature"):
        with torch.enable_grad():
            z = position.clone().requires_grad_(True)
            trace = _trace(potential, z, indices)
            total = z.new_zeros(())
            for site in _observed_sites(trace, latent_names):
                log_prob = _masked_log_prob(site)
                mask = _overlap_mask(site, log_prob.shape, flags).to(log_prob)
                total = total + _site_weight(site) * (mask * log_prob).sum()
                num_terms += int(mask.sum())
            loglik += total.detach()
            if total.requires_grad:
                (grad,) = torch.autograd.grad(total, z, create_graph=True)
                curvature -= _jacobian(grad, z)
    return LikelihoodCurvature(0.5 * (curvature + curvature.T), loglik, num_terms, "hessian")


# ---------------------------------------------------------------------------------- prior
def _is_elementwise(site, fn) -> bool:
    """True when the site's prior and transform act element by element (a diagonal prior Hessian block)."""
    while isinstance(fn, (Independent, MaskedDistribution, ExpandedDistribution)):
        fn = fn.base_dist
    if tuple(fn.event_shape) != ():
        return False
    transform = site.transform
    while isinstance(transform, torch.distributions.transforms.IndependentTransform):
        transform = transform.base_transform
    parts = transform.parts if isinstance(transform, torch.distributions.transforms.ComposeTransform) else [transform]
    return all(p.domain.event_dim == 0 and p.codomain.event_dim == 0 for p in parts)


def _prior_mean(site, fn, dtype) -> torch.Tensor:
    """The prior mean of a real site (unconstrained = constrained), 0 for constrained sites."""
    zeros = torch.zeros(site.numel, dtype=dtype)
    if site.has_jacobian:
        return zeros
    try:
        mean = fn.mean.detach()
        mean = mean.expand(site.unconstrained_shape).reshape(-1).to(dtype)
    except (NotImplementedError, RuntimeError, AttributeError):
        return zeros
    return mean if torch.isfinite(mean).all() else zeros


def prior_terms(potential, position: torch.Tensor, full: bool = False) -> PriorTerms:
    """Log prior (unconstrained space), its gradient, its negative Hessian and the prior means.

    The negative Hessian is exact: for a site whose prior and constraining transform act element
    by element (``Normal(...).expand(...).to_event(k)``, a positive site with an ``exp`` transform,
    ...) its diagonal block is diagonal and one Hessian-vector product with the site's indicator
    gives it; other sites (``MultivariateNormal``, simplex, ...) get one product per coordinate.
    For a ``Normal(m, sigma)`` prior the result is the precision ``1 / sigma^2``.

    Parameters
    ----------
    potential : ModelPotential
    position : Tensor ``(d,)``
    full : bool
        Return the dense ``(d, d)`` negative Hessian instead of its diagonal.
    """
    indices = {p.name: torch.arange(p.subsample_size, device=position.device) for p in potential.subsample_plates}
    with torch.enable_grad():
        z = position.detach().clone().requires_grad_(True)
        trace = _trace(potential, z, indices)
        log_density = z.new_zeros(())
        fns = {}
        for site in potential.sites:
            node = trace.nodes[site.name]
            fns[site.name] = node["fn"]
            log_prob = _masked_log_prob(node)
            log_density = log_density + (node["scale"] * log_prob).sum()
            if site.has_jacobian:
                u = z[site.slice].reshape(site.unconstrained_shape)
                log_density = log_density + site.transform.log_abs_det_jacobian(u, node["value"]).sum()
        if log_density.requires_grad:
            (grad,) = torch.autograd.grad(log_density, z, create_graph=True, allow_unused=True)
            grad = _or_zeros(grad, z)
        else:
            grad = torch.zeros_like(z)
        d = z.shape[0]
        if not grad.requires_grad:
            curvature = z.new_zeros(d, d) if full else z.new_zeros(d)
        elif full:
            curvature = -_jacobian(grad, z)
            curvature = 0.5 * (curvature + curvature.T)
        else:
            curvature = z.new_zeros(d)
            for site in potential.sites:
                block = grad[site.slice]
                if _is_elementwise(site, fns[site.name]):
                    (hv,) = torch.autograd.grad(block.sum(), z, retain_graph=True, allow_unused=True)
                    curvature[site.slice] = -_or_zeros(hv, z)[site.slice].detach()
                else:
                    rows = _jacobian(block, z)[:, site.slice]
                    curvature[site.slice] = -rows.diagonal()
    mean = torch.cat([_prior_mean(site, fns[site.name], position.dtype) for site in potential.sites])
    return PriorTerms(log_density.detach(), grad.detach(), curvature.detach(), mean.to(position.device))
