"""Where a block of values goes in a site's full-data array: a slice when its data indices follow each other, an
indexed write otherwise.

A vectorised call gives a site's quantity as a block ``(D, K, *minibatch shape)``: ``D`` draws times ``K`` chunk
combinations of the subsampled plates. Its place in the target ``(D, *full shape)`` depends only on the
combinations' data indices, which are the same for every block of draws, so it is worked out once per
combination block (:meth:`Placement.of`) and reused (:meth:`Placement.write`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

__all__ = ["Placement", "target_like"]


@dataclass(frozen=True)
class Placement:
    """The place of a block ``(D, K, *minibatch shape)`` in a target ``(D, *full shape)``.

    ``axis`` and ``first``: the block is the slice ``first : first + K B`` of that axis of the target (one
    subsampled plate, the site's only one, whose chunks follow each other, as all but the overlapping last chunk
    do); ``axis`` None: an indexed write at ``index`` (one index tensor per axis of the full shape, broadcasting
    to the block's shape without its draw axis)."""

    axis: Optional[int]
    first: int
    index: Tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, layout, rows: Dict[str, torch.Tensor]) -> "Placement":
        """The place of a block of ``layout``'s site (a :class:`~pyro_sgmcmc.export.pointwise.SiteLayout`) for the
        chunk combinations ``rows`` (``{plate: (K, B_p)}``)."""
        plates = [plate for plate in layout.plate_axes if plate is not None]
        if len(plates) == 1 and len(rows) == 1:
            chunk = rows[plates[0]].reshape(-1)
            first = int(chunk[0])
            if bool((chunk == torch.arange(first, first + chunk.numel(), device=chunk.device)).all()):
                return cls(layout.plate_axes.index(plates[0]), first, ())
        ndim = 1 + len(layout.shape)  # the combination axis, then the full shape's
        index: List[torch.Tensor] = []
        for axis, plate in enumerate(layout.plate_axes):
            shape = [1] * ndim
            if plate is None:
                shape[1 + axis] = layout.shape[axis]
                index.append(torch.arange(layout.shape[axis]).view(shape))
            else:
                shape[0], shape[1 + axis] = rows[plate].shape
                index.append(rows[plate].cpu().view(shape))
        return cls(None, 0, tuple(index))

    def arranged(self, values: torch.Tensor) -> Optional[torch.Tensor]:
        """The block ``values`` ``(D, K, *minibatch shape)`` as a view on the target's axes ``(D, ..., K B, ...)``
        (``None`` for an indexed write, whose block has the combination axis instead)."""
        if self.axis is None:
            return None
        return values.movedim(1, 1 + self.axis).flatten(1 + self.axis, 2 + self.axis)

    def write(self, target: torch.Tensor, values: torch.Tensor) -> None:
        """``target[d, place of (k, ...)] = values[d, k, ...]``, cast to the target's dtype and device."""
        merged = self.arranged(values)
        if merged is not None:
            target.narrow(1 + self.axis, self.first, merged.shape[1 + self.axis]).copy_(merged)
            return
        draws = torch.arange(values.shape[0], device=target.device).view(-1, *[1] * (values.dim() - 1))
        index = (draws, *(i.to(target.device) for i in self.index))
        target.index_put_(index, values.to(target.device, target.dtype))


def target_like(
    place: Optional[Placement], block: Optional[torch.Tensor], shape, dtype: torch.dtype, device
) -> torch.Tensor:
    """A new tensor of ``shape`` ``(S, *full shape)`` whose axes lie in memory in the order of ``block``'s
    arrangement by ``place`` (:meth:`Placement.arranged`), the axis with the largest stride outermost: each
    block is then written by a copy that streams through both. Row-major without a block, or for an indexed
    write. Axes of size one in the block (one draw a call) go outermost."""
    arranged = place.arranged(block) if place is not None and block is not None else None
    if arranged is None or arranged.dim() != len(shape):
        return torch.empty(shape, dtype=dtype, device=device)
    order = sorted(range(len(shape)), key=lambda axis: (arranged.shape[axis] != 1, -arranged.stride(axis), axis))
    physical = torch.empty([shape[axis] for axis in order], dtype=dtype, device=device)
    return physical.permute([order.index(axis) for axis in range(len(shape))])
