"""A tiny classifier with hand-written LoRA adapters, and its exact GGN by ``torch.func`` (test helpers)."""

from __future__ import annotations

from typing import Dict, List

import torch
from torch import nn


class LoRALinear(nn.Module):
    """``base(x) + scaling * B A x`` with a frozen ``base`` (PEFT's layout: ``lora_A``, ``lora_B`` without bias)."""

    def __init__(self, base: nn.Linear, rank: int, scaling: float = 2.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.lora_B.weight, std=0.5)  # not PEFT's zero start: the A block would be 0
        self.scaling = scaling

    def forward(self, x):
        return self.base(x) + self.scaling * self.lora_B(self.lora_A(x))


class TinyLoRAClassifier(nn.Module):
    """Token ids -> frozen embedding -> adapted token mixer (tanh) -> masked mean pool -> adapted head."""

    def __init__(self, vocab: int = 13, width: int = 10, rank: int = 3, classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(vocab, width).requires_grad_(False)
        self.mix = LoRALinear(nn.Linear(width, width), rank)
        self.head = LoRALinear(nn.Linear(width, classes), rank)
        self.seen: List[Dict[str, torch.dtype]] = []

    def forward(self, input_ids, attention_mask):
        self.seen.append({"input_ids": input_ids.dtype, "attention_mask": attention_mask.dtype})
        hidden = torch.tanh(self.mix(self.embedding(input_ids)))
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * mask).sum(1) / mask.sum(1))


def lora_names(model: nn.Module) -> List[str]:
    return [name for name, _ in model.named_parameters() if "lora_" in name]


def tiny_data(num: int = 20, length: int = 5, vocab: int = 13, classes: int = 3, seed: int = 1):
    """``({input_ids, attention_mask}, labels)``: random tokens, the last positions of some rows padded."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (num, length), generator=generator)
    lengths = torch.randint(min(2, length), length + 1, (num,), generator=generator)
    mask = (torch.arange(length) < lengths.unsqueeze(1)).long()
    labels = torch.randint(0, classes, (num,), generator=generator)
    return {"input_ids": ids, "attention_mask": mask}, labels


def batches(inputs, labels, size: int):
    for start in range(0, labels.shape[0], size):
        yield {k: v[start : start + size] for k, v in inputs.items()}, labels[start : start + size]


def flat_logits(model: nn.Module, names: List[str], inputs):
    """``theta -> logits`` with the chosen parameters replaced by slices of the flat ``theta``."""
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in names]

    def logits(theta):
        values, offset = {}, 0
        for name, shape in zip(names, shapes):
            values[name] = theta[offset : offset + shape.numel()].reshape(shape)
            offset += shape.numel()
        return torch.func.functional_call(model, values, args=(), kwargs=inputs)

    theta = torch.cat([params[n].detach().reshape(-1) for n in names])
    return logits, theta


def exact_jacobian(model, names, inputs) -> torch.Tensor:
    """``(n, K, d)`` Jacobian of the logits with respect to the chosen parameters."""
    logits, theta = flat_logits(model, names, inputs)
    return torch.func.jacrev(logits)(theta)


def exact_ggn(model, names, inputs) -> torch.Tensor:
    r""":math:`\sum_n J_n^\top (\mathrm{diag}\,p_n - p_n p_n^\top) J_n`, dense ``(d, d)``."""
    logits, theta = flat_logits(model, names, inputs)
    jacobian = torch.func.jacrev(logits)(theta)
    p = torch.softmax(logits(theta).detach(), -1)
    fisher = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    return torch.einsum("nkd,nkl,nle->de", jacobian, fisher, jacobian)
