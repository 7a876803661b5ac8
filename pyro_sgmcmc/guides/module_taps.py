r"""Per-example Jacobians and K-FAC factors of chosen ``nn.Linear`` parameters of a plain ``nn.Module``.

A LoRA adapter is a pair of ``nn.Linear`` layers (``lora_A``: ``in -> r``, ``lora_B``: ``r -> out``,
no bias) added to a frozen layer, and a classifier head is one more ``nn.Linear``. For a layer
:math:`z_{nt} = W a_{nt} + b` applied at positions :math:`t` (tokens) of example :math:`n`, and any
scalar :math:`r_{nk}` of example :math:`n` (a logit, or a whitened output of the GGN), the chain
rule gives, with :math:`\delta_{nkt} = \partial r_{nk} / \partial z_{nt}`,

.. math::
    \frac{\partial r_{nk}}{\partial W} = \sum_t \delta_{nkt}\, a_{nt}^\top, \qquad
    \frac{\partial r_{nk}}{\partial b} = \sum_t \delta_{nkt} .

:class:`LinearTaps` records :math:`a_{nt}` and :math:`z_{nt}` with forward hooks, and
:func:`output_gradients` takes :math:`\delta` by one backward pass per column :math:`k` of the
summed rows (the examples of a batch must not interact: ``eval()`` mode, no batch norm). Nothing
is written to the module or its parameters: only their ``requires_grad`` flags are switched on
while recording (:meth:`LinearTaps.__enter__`) and restored on exit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

__all__ = ["LayerRecord", "LinearTaps", "output_gradients", "per_example_jacobian", "position_weights", "kfac_factors"]


@dataclass
class LayerRecord:
    """The chosen parameters of one ``nn.Linear`` and its calls in the last forward pass."""

    weight: Optional[str]  #: the weight's parameter name if chosen
    bias: Optional[str]  #: the bias's parameter name if chosen
    inputs: List[torch.Tensor] = field(default_factory=list)  #: ``(b, T, in)`` per call (detached)
    outputs: List[torch.Tensor] = field(default_factory=list)  #: ``(b, T, out)`` per call (with graph)


class LinearTaps:
    """Forward hooks on the ``nn.Linear`` layers that own the chosen parameters.

    Parameters
    ----------
    module : nn.Module
    names : sequence of str
        Parameter names (``module.named_parameters()``), each the ``weight`` or ``bias`` of an
        ``nn.Linear`` (a ``ValueError`` names any other).
    """

    def __init__(self, module: nn.Module, names: Sequence[str]) -> None:
        self.module = module
        parameters = dict(module.named_parameters())
        self.layers: Dict[str, LayerRecord] = {}
        for name in names:
            if name not in parameters:
                raise ValueError(f"parameters: {name!r} is not a parameter of the module")
            path, _, leaf = name.rpartition(".")
            owner = module.get_submodule(path)
            if not isinstance(owner, nn.Linear) or leaf not in ("weight", "bias"):
                raise ValueError(
                    f"parameters: {name!r} is not the weight or bias of an nn.Linear (it belongs to "
                    f"{type(owner).__name__}); only nn.Linear parameters (LoRA adapters, a last layer) are supported"
                )
            record = self.layers.setdefault(path, LayerRecord(None, None))
            setattr(record, leaf, name)
        self.parameters = {name: parameters[name] for name in names}
        self._handles: list = []
        self._flags: Dict[str, bool] = {}

    def __enter__(self) -> "LinearTaps":
        for path, record in self.layers.items():
            record.inputs.clear()
            record.outputs.clear()
            self._handles.append(self.module.get_submodule(path).register_forward_hook(self._hook(record)))
        self._flags = {name: p.requires_grad for name, p in self.parameters.items()}
        for p in self.parameters.values():
            p.requires_grad_(True)
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for name, flag in self._flags.items():
            self.parameters[name].requires_grad_(flag)

    @staticmethod
    def _hook(record: LayerRecord):
        def hook(layer, args, output):
            inputs = args[0]
            batch = inputs.shape[0] if inputs.dim() > 1 else 1
            record.inputs.append(inputs.detach().reshape(batch, -1, inputs.shape[-1]))
            record.outputs.append(output)

        return hook

    def clear(self) -> None:
        """Drop the recorded tensors (and the graph they hold)."""
        for record in self.layers.values():
            record.inputs.clear()
            record.outputs.clear()


def output_gradients(taps: LinearTaps, rows: torch.Tensor) -> Dict[str, torch.Tensor]:
    r"""``{layer: delta}`` with ``delta`` of shape ``(K, b, T, out)``, :math:`\partial r_{nk}/\partial z_{nt}`.

    ``rows`` is ``(b, K)``; one backward pass per column (the graph is kept until the last). A layer
    not called is absent, one the rows do not depend on gets zeros; several calls of one layer are
    concatenated along ``T``.
    """
    paths = [path for path, record in taps.layers.items() if record.outputs]
    outputs = [out for path in paths for out in taps.layers[path].outputs]
    if not outputs:
        return {}
    columns = []
    for k in range(rows.shape[1]):
        grads = torch.autograd.grad(rows[:, k].sum(), outputs, retain_graph=k + 1 < rows.shape[1], allow_unused=True)
        columns.append(grads)
    result, position = {}, 0
    for path in paths:
        record = taps.layers[path]
        parts = []
        for number, out in enumerate(record.outputs):
            batch = record.inputs[number].shape[0]
            grads = [column[position + number] for column in columns]
            if any(g is None for g in grads):
                grads = [torch.zeros_like(out) if g is None else g for g in grads]
            parts.append(torch.stack(grads).detach().reshape(len(columns), batch, -1, out.shape[-1]))
        position += len(record.outputs)
        result[path] = torch.cat(parts, dim=2)
    return result


def per_example_jacobian(record: LayerRecord, delta: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``{parameter: J}`` with ``J`` of shape ``(K, b, *parameter shape)``: :math:`\\sum_t \\delta a^\\top`."""
    out = {}
    if record.weight is not None:
        inputs = torch.cat(record.inputs, dim=1)
        out[record.weight] = torch.einsum("kbto,bti->kboi", delta, inputs)
    if record.bias is not None:
        out[record.bias] = delta.sum(2)
    return out


def position_weights(record: LayerRecord, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``(b, T)`` weights of a layer's positions: ``mask`` (``(b, T_mask)``) for every call over ``T_mask``
    positions (the token axis), 1 for other calls (a classifier head on pooled features) or without a mask."""
    parts = []
    for inputs in record.inputs:
        if mask is not None and inputs.shape[1] == mask.shape[1]:
            parts.append(mask.to(inputs.dtype))
        else:
            parts.append(inputs.new_ones(inputs.shape[:2]))
    return torch.cat(parts, dim=1)


def kfac_factors(record: LayerRecord, delta: torch.Tensor, kind: str,
                 mask: Optional[torch.Tensor] = None) -> Dict[str, tuple]:  # fmt: skip
    r"""One batch's unnormalised K-FAC sums ``{parameter: (G, A, count)}`` or ``{bias: (G,)}``.

    With :math:`w_{nt}` the weight of position :math:`t` (its ``mask`` value, e.g. the attention
    mask, so that padding does not count; 1 without a mask, see :func:`position_weights`):
    ``"expand"`` (every position an example, as for a language model's tokens):
    :math:`G = \sum_{n,k,t}\delta_{nkt}\delta_{nkt}^\top`, :math:`A = \sum_{n,t} w_{nt} a_{nt}a_{nt}^\top`,
    ``count`` :math:`= \sum_{n,t} w_{nt}`; ``"reduce"`` (Eschenhagen et al., 2023):
    :math:`G = \sum_{n,k}(\sum_t\delta_{nkt})(\sum_t\delta_{nkt})^\top`,
    :math:`A = \sum_n \bar a_n \bar a_n^\top`, :math:`\bar a_n = \sum_t w_{nt} a_{nt} / \sum_t w_{nt}`,
    ``count`` the number of examples. The caller divides :math:`A` by the total count. :math:`G` sums
    over every position (a masked one has :math:`\delta = 0` when the mask removes it from the
    output). The bias block is exact: :math:`\sum_{n,k}(\sum_t\delta_{nkt})(\sum_t\delta_{nkt})^\top`.
    """
    out = {}
    summed = delta.sum(2).reshape(-1, delta.shape[-1])  # (K * b, out)
    if record.weight is not None:
        inputs = torch.cat(record.inputs, dim=1)  # (b, T, in)
        weights = position_weights(record, mask)  # (b, T)
        if kind == "expand":
            flat_delta = delta.reshape(-1, delta.shape[-1])
            flat_inputs = inputs.reshape(-1, inputs.shape[-1])
            weighted = flat_inputs * weights.reshape(-1, 1)
            out[record.weight] = (flat_delta.T @ flat_delta, weighted.T @ flat_inputs, float(weights.sum()))
        else:
            mean = (inputs * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True)
            out[record.weight] = (summed.T @ summed, mean.T @ mean, mean.shape[0])
    if record.bias is not None:
        out[record.bias] = (summed.T @ summed,)
    return out
