r"""The peak memory of a :class:`~pyro_sgmcmc.guides.ModuleLaplace` step, and the refusal past a budget.

Counted in numbers of the parameters' dtype, beyond what the module itself holds for its forward
pass (its activations, which the module's user already pays for when training). For a batch of
:math:`b` examples with :math:`K` outputs, :math:`d` chosen weights (:math:`d_\ell` in layer
:math:`\ell`, whose calls cover :math:`T_\ell` positions with :math:`o_\ell` outputs and
:math:`i_\ell` inputs):

* the recorded output gradients :math:`\delta`: :math:`R = \sum_\ell K b T_\ell o_\ell`, in every step;
* fitting ``diag_ggn``: :math:`R + K b \max_\ell d_\ell + d` (one layer's per-example Jacobian);
* fitting ``kron``: :math:`R + \sum_\ell (o_\ell^2 + i_\ell^2)` (the factors before truncation);
* fitting ``full_ggn``: :math:`R + K b d + d^2` (all per-example Jacobians, the dense GGN);
* the linearised predictive: :math:`R + 2 K b d + 5 K b \max_\ell d_\ell + b K^2` (the Jacobian
  :math:`J`, its whitening :math:`J\Lambda^{-1/2}`, up to five temporaries of one layer's block
  while whitening it, and the covariances).

So for the predictive, peak memory grows as :math:`2Kbd`: 70k LoRA weights in blocks of at most
3,072 (rank 8, width 384), 2 classes and a batch of 32 take 9.9M numbers (40 MB in float32).
These are upper bounds: on CPU (float32, 393k weights in blocks of 131k, 4 outputs, a batch of
64) the peak resident memory (``VmHWM``, reset before the call) rose during ``predict`` by 904 MiB
(diagonal) and 1,298 MiB (rank-64 Kronecker), against a stated 1,412 MiB
(``tests/guides/test_module_memory.py`` checks the bound on a smaller case). :func:`check_memory`
raises a ``ValueError`` naming the size when a step would exceed ``max_memory`` bytes.
"""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

__all__ = ["fit_numbers", "predict_numbers", "check_memory"]


def fit_numbers(curvature: str, batch: int, outputs: int, layers: Iterable[Tuple[int, int, int, int]]) -> int:
    """Numbers held by one fitting step; ``layers`` gives ``(positions, out, in, chosen weights)`` per layer."""
    layers = list(layers)
    records = sum(outputs * batch * positions * out for positions, out, _, _ in layers)
    total = sum(count for *_, count in layers)
    if curvature == "diag_ggn":
        return records + outputs * batch * max(count for *_, count in layers) + total
    if curvature == "kron":
        return records + sum(out**2 + inp**2 for _, out, inp, _ in layers)
    return records + outputs * batch * total + total**2


def predict_numbers(batch: int, outputs: int, layers: Iterable[Tuple[int, int, int, int]]) -> int:
    """Numbers held by one step of the linearised predictive (same ``layers`` as :func:`fit_numbers`)."""
    layers = list(layers)
    records = sum(outputs * batch * positions * out for positions, out, _, _ in layers)
    total = sum(count for *_, count in layers)
    largest = max(count for *_, count in layers)
    return records + 2 * outputs * batch * total + 5 * outputs * batch * largest + batch * outputs**2


def check_memory(what: str, numbers: int, itemsize: int, max_memory: Optional[int], batch: int) -> None:
    """Raise a ``ValueError`` naming the size if ``numbers`` of ``itemsize`` bytes exceed ``max_memory``."""
    if max_memory is None:
        return
    size = numbers * itemsize
    if size > max_memory:
        raise ValueError(
            f"{what} with a batch of {batch} needs about {size / 2**20:.1f} MiB ({numbers} numbers of {itemsize} "
            f"bytes) beyond the module's activations, over max_memory={max_memory} bytes "
            f"({max_memory / 2**20:.1f} MiB); use smaller batches, fewer adapted parameters, curvature='kron' "
            "with a smaller kron_rank, or a larger max_memory"
        )
