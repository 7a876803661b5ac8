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

__all__ = ["Placement"]


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

    def write(self, target: torch.Tensor, values: torch.Tensor) -> None:
        """``target[d, place of (k, ...)] = values[d, k, ...]``, cast to the target's dtype and device."""
        if self.axis is not None:
            merged = values.movedim(1, 1 + self.axis).flatten(1 + self.axis, 2 + self.axis)  # (D, ..., K B, ...)
            target.narrow(1 + self.axis, self.first, merged.shape[1 + self.axis]).copy_(merged)
            return
        draws = torch.arange(values.shape[0], device=target.device).view(-1, *[1] * (values.dim() - 1))
        index = (draws, *(i.to(target.device) for i in self.index))
        target.index_put_(index, values.to(target.device, target.dtype))
