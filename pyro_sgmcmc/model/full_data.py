"""The full data, walked minibatch by minibatch: one walker for every full-data evaluation.

A model with ``pyro.plate(name, N, subsample_size=B)`` only runs on index sets of its own size ``B``
(the plate fixes it). A full-data quantity is therefore computed over *chunks* of ``B`` indices, in one
of two ways (:class:`PlateChunks`):

* **covering** (the default): ``ceil(N / B)`` consecutive chunks, the last one shifted back to end at
  ``N`` (it overlaps the one before): every datum is seen at least once. For values assigned per datum
  (per-datum log-likelihoods, non-finite data), where a datum seen twice is written twice alike;
* **equal weights**: the ``K = N / gcd(N, B)`` chunks :math:`\\{(kB + j) \\bmod N\\}_{j<B}`, which see every
  datum exactly ``B / gcd(N, B)`` times, so that the mean of the minibatch potentials is exactly the
  full-data potential:

  .. math:: U(z) = \\frac1K \\sum_{k<K} \\widehat U(z; \\mathcal{B}_k)
            \\quad\\text{(each } \\widehat U \\text{ scaled by } N/B \\text{ as Pyro does).}

Several subsampled plates are walked through every combination of their chunks
(:func:`chunk_combinations`). :func:`trace_at` traces the model at given latent values and indices.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import pyro.poutine as poutine
import torch

from .trace import SubsamplePlate

__all__ = ["PlateChunks", "chunk_combinations", "full_data_potential_and_grad", "trace_at"]

#: data per vectorised call of :func:`full_data_potential_and_grad` (``2^18 / B`` minibatches): large enough
#: that the model's per-call overhead is negligible, small enough that its intermediates stay in the tens of MB
DATA_PER_CALL = 2**18


class PlateChunks:
    """The full data of one subsampled plate as chunks of its ``subsample_size`` indices (module docstring).

    Parameters
    ----------
    plate : SubsamplePlate
    device : torch.device
    equal_weights : bool
        ``False``: covering chunks (each datum at least once); ``True``: each datum equally often.
    """

    def __init__(self, plate: SubsamplePlate, device: torch.device, equal_weights: bool = False) -> None:
        self.plate = plate
        self.equal_weights = equal_weights
        size, batch = plate.size, plate.subsample_size
        self._arange = torch.arange(batch, device=device)
        if equal_weights:
            self._starts = None
            self.num_chunks = size // math.gcd(size, batch)
        else:
            starts = list(range(0, size - batch + 1, batch))
            if starts[-1] + batch < size:
                starts.append(size - batch)
            self._starts = torch.tensor(starts, device=device)
            self.num_chunks = len(starts)

    def rows(self, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        """Chunks ``start`` to ``stop`` as a ``(stop - start, subsample_size)`` LongTensor."""
        stop = self.num_chunks if stop is None else min(stop, self.num_chunks)
        start = min(start, stop)
        if self._starts is not None:
            return self._starts[start:stop].unsqueeze(-1) + self._arange
        ks = torch.arange(start, stop, device=self._arange.device)
        return (ks.unsqueeze(-1) * self.plate.subsample_size + self._arange) % self.plate.size

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.rows())

    def __len__(self) -> int:
        return self.num_chunks


def chunk_combinations(plates: Sequence[SubsamplePlate], device: torch.device) -> Iterator[Dict[str, torch.Tensor]]:
    """``{plate name: chunk (B_p,)}`` for every combination of the plates' covering chunks: together, every
    datum of every plate (one empty dict for a model without subsampled plates)."""
    chunks = [PlateChunks(plate, device) for plate in plates]
    for combination in itertools.product(*chunks):
        yield {plate.name: chunk for plate, chunk in zip(plates, combination)}


def trace_at(
    model: Callable,
    args: tuple,
    kwargs: dict,
    values: Mapping[str, torch.Tensor],
    indices: Mapping[str, torch.Tensor],
) -> poutine.Trace:
    """Trace ``model`` with latent ``values`` (constrained) and plate ``indices`` (log-probabilities are not
    computed, scaled or summed: the caller reads the sites it needs)."""
    conditioned = poutine.condition(model, data={**indices, **values})
    return poutine.trace(conditioned).get_trace(*args, **kwargs)


def full_data_potential_and_grad(
    potential, position: torch.Tensor, data_per_call: int = DATA_PER_CALL
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Full-data ``(U(z), dU/dz)`` at one point ``(dim,)``: the mean over equal-weight chunks of the one
    subsampled plate whose minibatches the kernel draws.

    ``potential`` has ``subsample_plates`` and ``batched_potential_and_grad`` (a
    :class:`~pyro_sgmcmc.model.potential.ModelPotential`, or any potential with both); its
    ``summed_potential_and_grad``, when it has one, evaluates ``data_per_call / B`` chunks at a time
    with ``z`` shared; otherwise (or when the model cannot share ``z``) one copy of ``z`` per chunk.
    """
    plates = [p for p in potential.subsample_plates if not p.user_indices]
    if len(plates) != 1:
        raise ValueError(
            "control_variate needs a model with exactly one subsampled pyro.plate (subsample_size=B) whose "
            f"minibatches the kernel draws; this model has {len(plates)}"
        )
    plate = plates[0]
    chunks = PlateChunks(plate, position.device, equal_weights=True)
    rows_per_call = max(1, data_per_call // plate.subsample_size)
    summed = getattr(potential, "summed_potential_and_grad", None)
    total_u = position.new_zeros(())
    total_g = torch.zeros_like(position)
    for start in range(0, chunks.num_chunks, rows_per_call):
        rows = chunks.rows(start, start + rows_per_call)
        result = summed(position, {plate.name: rows}) if summed is not None else None
        if result is None:
            copies = position.detach().unsqueeze(0).expand(len(rows), -1).contiguous()
            u, g = potential.batched_potential_and_grad(copies, {plate.name: rows})
            result = u.sum(), g.sum(0)
        total_u = total_u + result[0]
        total_g = total_g + result[1]
    return total_u / chunks.num_chunks, total_g / chunks.num_chunks
