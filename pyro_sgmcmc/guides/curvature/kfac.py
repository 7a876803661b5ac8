r"""Kronecker factors (K-FAC) of a network of ``F.linear`` layers, from one chunk's layer calls.

For a layer :math:`z_n = W a_n + b` the GGN block of ``vec(W)`` is :math:`\sum_n G_n \otimes a_n
a_n^\top`, :math:`G_n = \sum_k \delta_{nk}\delta_{nk}^\top`, :math:`\delta_{nk} = \partial r_{nk}/\partial
z_n`; K-FAC keeps :math:`G = \sum_n G_n` and :math:`A = \frac1N \sum_n a_n a_n^\top` (block
:math:`G \otimes A`), and the bias block :math:`G` (exact). See :mod:`pyro_sgmcmc.guides.kron`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

__all__ = ["kron_chunk", "kron_factors"]


def kron_chunk(recorder, rows, outputs, keep: torch.Tensor) -> Dict[str, Tuple[torch.Tensor, ...]]:
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
        a = inputs.detach() * keep.to(inputs.dtype).unsqueeze(-1)  # overlapping examples count once
        if weight_name is not None:
            factors[weight_name] = (g, a.T @ a)
        if bias_name is not None:
            factors[bias_name] = (g,)
    return factors



def kron_factors(potential, sums: Dict[str, List[torch.Tensor]], size: int, curvature: torch.Tensor):
    """``{site: (G, A)}`` (weights, ``A`` divided by ``N``) or ``{site: (G,)}`` (biases), and their diagonal.

    ``sums`` holds the summed chunk factors; the diagonal of every block is written into
    ``curvature`` (``(d,)``, potential order).
    """
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
    return factors
