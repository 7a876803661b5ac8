"""Preallocated storage of a vectorised run's kept draws and their statistics.

A run knows from the start how many draws it keeps (``num_samples``, or ``keep_last``), so the
positions live in one ``(num_chains, capacity, dim)`` tensor and each statistic in one
``(num_chains, capacity)`` tensor, written in place draw after draw. Nothing is allocated per step
(no clone, no dict), the resident memory grows with the pages actually written (``torch.empty``
does not touch its pages), and the run's result is a view of the filled part: no final stack.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

__all__ = ["DrawStore"]


class DrawStore:
    """The kept draws of ``num_chains`` chains, in tensors preallocated for ``capacity`` draws.

    Parameters
    ----------
    num_chains, capacity, dim : int
        Chains, draws to keep (at most), and length of the flat unconstrained position.
    dtype, device :
        Those of the positions.

    Examples
    --------
    >>> import torch
    >>> store = DrawStore(2, 3, 4, torch.float32, "cpu")
    >>> store.append(torch.ones(2, 4), {"lp": torch.zeros(2, dtype=torch.float64)})
    >>> positions, stats = store.filled()
    >>> tuple(positions.shape), tuple(stats["lp"].shape), store.count
    ((2, 1, 4), (2, 1), 1)
    """

    def __init__(self, num_chains: int, capacity: int, dim: int, dtype: torch.dtype, device) -> None:
        self.num_chains = num_chains
        self.capacity = capacity
        self.positions = torch.empty((num_chains, capacity, dim), dtype=dtype, device=device)
        self.stats: Dict[str, torch.Tensor] = {}
        self.count = 0

    def append(self, position: torch.Tensor, stats: Dict[str, torch.Tensor]) -> None:
        """Copy one draw (``(num_chains, dim)``) and its statistics (``(num_chains, ...)`` each) in place."""
        if self.count >= self.capacity:
            raise RuntimeError(f"DrawStore is full ({self.capacity} draws)")
        if not self.stats:
            self._allocate_stats(stats)
        index = self.count
        self.positions[:, index].copy_(position)
        for key, value in stats.items():
            self.stats[key][:, index].copy_(value)
        self.count = index + 1

    def extend(self, positions: torch.Tensor, stats: Dict[str, torch.Tensor]) -> None:
        """Copy ``n`` draws at once (``(num_chains, n, dim)`` and ``(num_chains, n, ...)``): a resumed run's."""
        n = positions.shape[1]
        if n == 0:
            return
        if self.count + n > self.capacity:
            raise RuntimeError(f"DrawStore holds {self.capacity} draws; cannot add {n} to {self.count}")
        if not self.stats:
            self._allocate_stats({key: value[:, 0] for key, value in stats.items()})
        if set(stats) != set(self.stats):
            raise ValueError(f"statistics {sorted(stats)} differ from the stored {sorted(self.stats)}")
        window = slice(self.count, self.count + n)
        self.positions[:, window].copy_(positions)
        for key, value in stats.items():
            self.stats[key][:, window].copy_(value)
        self.count += n

    def place(self, start: int, positions: torch.Tensor, stats: Dict[str, torch.Tensor]) -> None:
        """Copy draws ``start .. start + n`` (``(num_chains, n, dim)`` and ``(num_chains, n, ...)``) to their
        place, in any order (a resumed run's chunks, read from the last): :attr:`count` becomes the end of the
        furthest draws placed. The caller places every draw before it."""
        n = positions.shape[1]
        if start < 0 or start + n > self.capacity:
            raise RuntimeError(f"DrawStore holds {self.capacity} draws; cannot place draws {start} to {start + n}")
        if not self.stats:
            self._allocate_stats({key: value[:, 0] for key, value in stats.items()})
        if set(stats) != set(self.stats):
            raise ValueError(f"statistics {sorted(stats)} differ from the stored {sorted(self.stats)}")
        window = slice(start, start + n)
        self.positions[:, window].copy_(positions)
        for key, value in stats.items():
            self.stats[key][:, window].copy_(value)
        self.count = max(self.count, start + n)

    def filled(self, start: int = 0, stop: Optional[int] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """Views of draws ``start`` to ``stop`` (default: all written): positions and statistics."""
        window = slice(start, self.count if stop is None else stop)
        return self.positions[:, window], {key: value[:, window] for key, value in self.stats.items()}

    @property
    def nbytes(self) -> int:
        """Bytes of the draws written so far (positions and statistics)."""
        per_draw = self.positions[:, 0].nelement() * self.positions.element_size() + sum(
            value[:, 0].nelement() * value.element_size() for value in self.stats.values()
        )
        return per_draw * self.count

    def _allocate_stats(self, stats: Dict[str, torch.Tensor]) -> None:
        self.stats = {
            key: torch.empty((self.num_chains, self.capacity, *value.shape[1:]), dtype=value.dtype, device=value.device)
            for key, value in stats.items()
        }
