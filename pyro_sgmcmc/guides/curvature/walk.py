"""How a sweep walks the data: chunks of a plate, their combinations, and batched Jacobians.

Plates are walked in consecutive chunks of their own ``subsample_size``, so that Pyro's plate
always receives a subsample of the length it was declared with; the last chunk overlaps the one
before it and a mask (``new``) counts every index once.
"""

from __future__ import annotations

import itertools
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "VMAP_BUDGET",
    "chunks",
    "combinations",
    "overlap_mask",
    "progress",
    "jacobian",
    "or_zeros",
    "site_values",
    "flatten_sites",
]

#: Numbers of per-example gradient entries per batched backward call (4M: 16 MB in float32), small
#: enough for the allocator to reuse its buffers instead of mapping fresh pages for every chunk.
VMAP_BUDGET = 4_000_000


def chunks(size: int, subsample_size: int, device) -> List[Tuple[torch.Tensor, torch.Tensor]]:
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


def combinations(potential) -> Iterator[Tuple[Dict[str, torch.Tensor], Dict[str, Tuple[int, torch.Tensor]]]]:
    plates = list(potential.subsample_plates)
    per_plate = [chunks(p.size, p.subsample_size, potential.device) for p in plates]
    for combination in itertools.product(*[list(enumerate(c)) for c in per_plate]):
        indices = {p.name: chunk[0] for p, (_, chunk) in zip(plates, combination)}
        flags = {p.name: (number, chunk[1]) for p, (number, chunk) in zip(plates, combination)}
        yield indices, flags


def overlap_mask(site, shape: torch.Size, flags) -> torch.Tensor:
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


def progress(iterable, total: int, disable: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, disable=disable, desc=desc, leave=False)



def jacobian(outputs: torch.Tensor, z: torch.Tensor, chunk: int = 256) -> torch.Tensor:
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
                or_zeros(torch.autograd.grad(outputs, z, grad_outputs=b, retain_graph=True, allow_unused=True)[0], z)
                for b in basis
            ])  # fmt: skip
        pieces.append(or_zeros(rows, z, basis.shape[0]))
    return torch.cat(pieces).detach()


def or_zeros(grad, z, rows: Optional[int] = None):
    if grad is not None:
        return grad
    return z.new_zeros(z.shape) if rows is None else z.new_zeros(rows, z.shape[0])



def site_values(potential, position) -> Tuple[torch.Tensor, ...]:
    return tuple(position[site.slice].reshape(site.unconstrained_shape) for site in potential.sites)


def flatten_sites(potential, parts: Sequence[torch.Tensor], lead: Tuple[int, ...] = ()) -> torch.Tensor:
    return torch.cat([part.reshape(lead + (site.numel,)) for site, part in zip(potential.sites, parts)], dim=-1)

