r"""Predictive uncertainty of a classifier from posterior draws: total, aleatoric and epistemic.

Given ``S`` posterior draws :math:`\theta_1, \dots, \theta_S` and, for one input :math:`x`, the
class probabilities :math:`p_s = p(y \mid x, \theta_s)` over ``K`` classes, the posterior
predictive is :math:`\bar p = \frac1S \sum_s p_s` and its entropy splits into two parts:

.. math::

    \underbrace{H[\bar p]}_{\text{total}}
    = \underbrace{\frac1S \sum_{s=1}^S H[p_s]}_{\text{aleatoric}}
    + \underbrace{H[\bar p] - \frac1S \sum_{s=1}^S H[p_s]}_{\text{epistemic}},
    \qquad H[p] = -\sum_{k=1}^K p_k \log p_k .

The aleatoric part is the noise each network sees in the label itself; the epistemic part is the
mutual information :math:`I(y; \theta \mid x)` between the label and the weights under the
empirical distribution of the draws, i.e. how much the draws disagree. By the concavity of the
entropy (Jensen's inequality) it is non-negative, and it is zero exactly when all draws give the
same probabilities. All three are in nats (natural logarithm); :math:`0 \log 0 = 0`.

:func:`auroc` scores how well one of these quantities separates in-distribution from
out-of-distribution inputs.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, Optional, Union

import numpy as np
import torch

__all__ = ["UncertaintyDecomposition", "decompose_uncertainty", "auroc"]

ArrayLike = Union[torch.Tensor, np.ndarray]


class UncertaintyDecomposition(NamedTuple):
    """Total, aleatoric and epistemic uncertainty, in nats, each of shape ``batch_shape``.

    All three fields have the type of the input (:class:`torch.Tensor` or :class:`numpy.ndarray`)
    and the input's shape without the draw and class dimensions.

    Attributes
    ----------
    total : Tensor or ndarray
        :math:`H[\\bar p]`, the entropy of the mean predictive distribution.
    aleatoric : Tensor or ndarray
        :math:`\\frac1S \\sum_s H[p_s]`, the mean entropy of the draws' distributions.
    epistemic : Tensor or ndarray
        ``total - aleatoric``, the mutual information between label and weights (>= 0).
    """

    total: ArrayLike
    aleatoric: ArrayLike
    epistemic: ArrayLike


def decompose_uncertainty(
    probs: Optional[ArrayLike] = None,
    *,
    logits: Optional[ArrayLike] = None,
    sample_dim: int = 0,
    eps: float = 1e-4,
) -> UncertaintyDecomposition:
    r"""Split the predictive entropy of posterior draws into aleatoric and epistemic parts.

    For each input, with draws :math:`p_1, \dots, p_S` of the class probabilities and
    :math:`\bar p = \frac1S \sum_s p_s`:

    .. math::

        \text{total} = H[\bar p], \qquad
        \text{aleatoric} = \frac1S \sum_{s=1}^S H[p_s], \qquad
        \text{epistemic} = \text{total} - \text{aleatoric} \;\ge 0,

    with :math:`H[p] = -\sum_k p_k \log p_k` in nats and :math:`0 \log 0 = 0`.

    Parameters
    ----------
    probs : Tensor or ndarray, shape ``(S, *batch_shape, K)``
        Class probabilities: ``S >= 1`` draws (along ``sample_dim``, first by default), any batch
        dimensions (inputs, ...), and the ``K`` classes last. Entries must be finite, ``>= -eps``
        (negative round-off is set to 0) and sum to 1 within ``eps`` along the last dimension.
        Integer and boolean inputs are converted to floating point.
    logits : Tensor or ndarray, shape ``(S, *batch_shape, K)``, keyword only
        Unnormalised log probabilities instead of ``probs`` (give exactly one of the two); the
        probabilities are their softmax along the last dimension, computed stably. Entries may be
        ``-inf`` (a class with probability 0) but not NaN or ``+inf``, and each distribution needs
        one finite entry.
    sample_dim : int
        The dimension of the draws (default 0). Negative values count from the end; it cannot be
        the last (class) dimension.
    eps : float
        Tolerance of the checks on ``probs`` (default ``1e-4``, loose enough for float32 softmax
        outputs).

    Returns
    -------
    UncertaintyDecomposition
        ``(total, aleatoric, epistemic)``, each of shape ``batch_shape`` and of the input's kind
        (tensor in, tensors out; array in, arrays out). ``epistemic`` is clamped at 0 to remove
        negative round-off, so ``total == aleatoric + epistemic`` holds to floating-point accuracy.
        For tensors the result is differentiable with respect to the input.

    Raises
    ------
    TypeError
        If the input is not a tensor or an array, or ``sample_dim`` is not an int.
    ValueError
        If both or neither of ``probs`` and ``logits`` are given, the shape has fewer than two
        dimensions or no draws or classes, ``sample_dim`` is out of range or is the class
        dimension, or the values are not probabilities (logits) as described above.

    Examples
    --------
    Two confident draws that disagree: all the uncertainty is epistemic.

    >>> import torch
    >>> from pyro_sgmcmc import decompose_uncertainty
    >>> u = decompose_uncertainty(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    >>> [round(float(v), 4) for v in u]  # log 2 = 0.6931
    [0.6931, 0.0, 0.6931]

    Two identical uncertain draws: all of it is aleatoric. Batch dimensions are kept.

    >>> probs = torch.full((2, 3, 2), 0.5)  # S=2 draws, 3 inputs, K=2 classes
    >>> decompose_uncertainty(probs).epistemic
    tensor([0., 0., 0.])
    """
    if (probs is None) == (logits is None):
        raise ValueError("give exactly one of probs and logits")
    name = "probs" if probs is not None else "logits"
    value = probs if probs is not None else logits
    is_numpy = isinstance(value, np.ndarray)
    x = _as_tensor(value, name)
    if isinstance(sample_dim, bool) or not isinstance(sample_dim, numbers.Integral):
        raise TypeError(f"sample_dim must be an int; got {type(sample_dim).__name__}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (0 <= eps < 1):
        raise ValueError(f"eps must be a real number in [0, 1); got {eps!r}")
    if x.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (draws, ..., classes); got shape {tuple(x.shape)}")
    dim = int(sample_dim)
    if not -x.dim() <= dim < x.dim() or dim % x.dim() == x.dim() - 1:
        raise ValueError(
            f"sample_dim must index a dimension of {name} other than the last (class) one, "
            f"i.e. lie in [{-x.dim()}, {x.dim() - 2}] except {-1}; got {sample_dim}"
        )
    x = x.movedim(dim, 0)  # (S, *batch_shape, K)
    if x.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one draw along sample_dim={sample_dim}; got shape {x.shape}")
    if x.shape[-1] < 1:
        raise ValueError(f"{name} must hold at least one class along the last dimension; got shape {x.shape}")

    if probs is not None:
        p = _check_probs(x, eps)
        log_p = torch.log(p)  # -inf where p == 0; masked below
        mean_p = p.mean(0)
        log_mean_p = torch.log(mean_p)
    else:
        log_p = _log_softmax(x)
        p = log_p.exp()
        # log of the mean predictive without leaving log space: log (1/S) sum_s p_s
        log_mean_p = torch.logsumexp(log_p, dim=0) - np.log(x.shape[0])
        mean_p = log_mean_p.exp()

    aleatoric = _entropy(p, log_p).mean(0)
    total = _entropy(mean_p, log_mean_p)
    epistemic = (total - aleatoric).clamp_min(0.0)
    if is_numpy:
        return UncertaintyDecomposition(*(t.detach().numpy() for t in (total, aleatoric, epistemic)))
    return UncertaintyDecomposition(total, aleatoric, epistemic)


def auroc(scores_in: ArrayLike, scores_out: ArrayLike) -> float:
    r"""Area under the ROC curve for telling out-of-distribution inputs by a higher score.

    The out-of-distribution inputs are the positive class. The area equals the probability that an
    out-of-distribution score exceeds an in-distribution one, ties counting one half, which is the
    Mann-Whitney rank statistic:

    .. math::

        \mathrm{AUROC} = \frac{R_\text{out} - n_\text{out}(n_\text{out} + 1)/2}{n_\text{in}\, n_\text{out}},

    where :math:`R_\text{out}` is the sum of the ranks (1-based, ties given their mean rank) of the
    out-of-distribution scores among all :math:`n_\text{in} + n_\text{out}` scores. 1 is a perfect
    detector, 0.5 is chance.

    Parameters
    ----------
    scores_in, scores_out : Tensor or ndarray, 1-D
        Scores (for example the total or epistemic uncertainty) of the in-distribution and of the
        out-of-distribution inputs; finite, at least one each.

    Returns
    -------
    float
        The AUROC, in [0, 1].

    Examples
    --------
    >>> from pyro_sgmcmc.diagnostics import auroc
    >>> auroc([0.1, 0.2, 0.3], [0.25, 0.4])  # 5 of the 6 pairs ordered correctly
    0.8333333333333334
    """
    a = _as_1d_numpy(scores_in, "scores_in")
    b = _as_1d_numpy(scores_out, "scores_out")
    both = np.concatenate([a, b])
    _, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    # the tied block of the j-th smallest distinct value occupies ranks start_j + 1 .. start_j + counts_j
    start = np.cumsum(counts) - counts
    midrank = start + (counts + 1) / 2.0
    rank_sum_out = midrank[inverse.reshape(-1)][len(a) :].sum()
    n_in, n_out = len(a), len(b)
    return float((rank_sum_out - n_out * (n_out + 1) / 2.0) / (n_in * n_out))


# ------------------------------------------------------------------------------------ helpers
def _as_tensor(value, name: str) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    elif not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or a numpy.ndarray; got {type(value).__name__}")
    if value.is_complex():
        raise TypeError(f"{name} must be real; got dtype {value.dtype}")
    if not value.is_floating_point():
        value = value.to(torch.get_default_dtype())
    return value


def _check_probs(p: torch.Tensor, eps: float) -> torch.Tensor:
    values = p.detach()
    if not torch.isfinite(values).all():
        raise ValueError("probs must be finite; got NaN or infinite entries")
    smallest = float(values.min()) if values.numel() else 0.0
    if smallest < -eps:
        raise ValueError(f"probs must be non-negative (within eps={eps:g}); got an entry {smallest:g}")
    if values.numel():
        error = float((values.sum(-1) - 1.0).abs().max())
        if error > eps:
            raise ValueError(
                f"probs must sum to 1 along the last (class) dimension within eps={eps:g}; got a sum off by {error:.3g}"
            )
    return p.clamp_min(0.0)


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    values = logits.detach()
    if torch.isnan(values).any() or (values == float("inf")).any():
        raise ValueError("logits must not contain NaN or +inf")
    if values.numel() and (values == float("-inf")).all(-1).any():
        raise ValueError("logits must have at least one finite entry in every distribution (last dimension)")
    return torch.log_softmax(logits, dim=-1)


def _entropy(p: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """``-sum_k p_k log p_k`` over the last dimension, with ``0 log 0 = 0``."""
    safe_log_p = torch.where(p > 0, log_p, torch.zeros((), dtype=log_p.dtype, device=log_p.device))
    return -(p * safe_log_p).sum(-1)


def _as_1d_numpy(value, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    elif isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a 1-D torch.Tensor, numpy.ndarray or list; got {type(value).__name__}")
    if value.ndim != 1 or value.size == 0:
        raise ValueError(f"{name} must be 1-D with at least one score; got shape {value.shape}")
    if not np.issubdtype(value.dtype, np.number) or np.issubdtype(value.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold real numbers; got dtype {value.dtype}")
    if not np.isfinite(value).all():
        raise ValueError(f"{name} must be finite; got NaN or infinite scores")
    return value.astype(np.float64)
