"""Minibatch indices for subsampled plates, drawn per chain.

Each chain walks through its own random permutation of every subsampled plate, ``B`` indices per
step, and reshuffles when fewer than ``B`` remain (an epoch; a remainder of ``N mod B`` indices is
skipped). Each step's minibatch is therefore a uniformly random ``B``-subset of the ``N`` data, so
the ``N / B``-scaled log-likelihood stays an unbiased estimate; within an epoch minibatches do not
overlap, which lowers the gradient-noise variance over an epoch (sampling without replacement, as
in SGD practice).

Two ways to hold the permutations, chosen per plate at set-up:

* a **table** (``torch.randperm`` per chain and epoch) while ``num_chains * N`` is at most
  :data:`TABLE_LIMIT` indices (256 MB): a step reads a slice of it;
* **computed** permutations (:class:`~pyro_sgmcmc.chains.permutation.KeyedPermutation`) above that: each
  chain keeps a few random keys per epoch and a cursor, and a step evaluates the keyed bijection at
  about ``2B`` positions, so memory and set-up stay ``O(num_chains)`` instead of
  ``O(num_chains N)`` (at ``N = 10^7`` a table for 32 chains is 2.6 GB and 9 s of ``randperm``).

Both draw every datum exactly once per epoch, in an order that is uniformly random (table) or
pseudo-random (computed); the streams of the two differ.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import torch

from ..model.potential import SubsamplePlate
from .permutation import NUM_ROUNDS, KeyedPermutation
from .streams import ChainGenerators

__all__ = ["MinibatchSampler", "TABLE_LIMIT"]

#: Largest ``num_chains * N`` held as a table of permutations (int64: 256 MB).
TABLE_LIMIT = 2**25


class MinibatchSampler:
    """Per-chain epoch permutations of each subsampled plate.

    Parameters
    ----------
    plates : sequence of SubsamplePlate
        The model's subsampled plates (from :class:`~pyro_sgmcmc.ModelPotential`).
    generators : ChainGenerators
        One random stream per chain.
    table_limit : int, optional
        Plates with ``num_chains * size`` above this use computed permutations; default
        :data:`TABLE_LIMIT` (read when the sampler is made).
    """

    def __init__(
        self, plates: Sequence[SubsamplePlate], generators: ChainGenerators, table_limit: Optional[int] = None
    ) -> None:
        table_limit = TABLE_LIMIT if table_limit is None else table_limit
        self.plates = [p for p in plates if not p.user_indices]  # the model draws the others itself
        self.generators = generators
        num_chains = len(generators)
        device = generators.device
        tabled = [p for p in self.plates if num_chains * p.size <= table_limit]
        self.permutations: Dict[str, torch.Tensor] = {
            p.name: torch.empty((num_chains, p.size), dtype=torch.long, device=device) for p in tabled
        }
        # computed permutations: keys per chain (drawn at each epoch), a cursor per chain in [0, span)
        self.keys: Dict[str, torch.Tensor] = {
            p.name: torch.zeros((num_chains, NUM_ROUNDS), dtype=torch.long, device=device)
            for p in self.plates
            if p.name not in self.permutations
        }
        self.positions: Dict[str, torch.Tensor] = {
            name: torch.zeros(num_chains, dtype=torch.long, device=device) for name in self.keys
        }
        # set-up, once per computed plate: the bijection (it reads the keys, refilled in place each epoch) and
        # the offsets of the positions a step evaluates. At most half of the span is >= N, so ~2B positions
        # give B values; the margin (6 sd of the binomial count) makes a second try rare, the loop exact.
        self._bijections: Dict[str, KeyedPermutation] = {}
        self._offsets: Dict[str, torch.Tensor] = {}
        for plate in self.plates:
            if plate.name in self.keys:
                bijection = KeyedPermutation(plate.size, self.keys[plate.name])
                ratio, batch = plate.size / bijection.span, plate.subsample_size
                width = math.ceil(batch / ratio + 6 * math.sqrt(batch * (1 - ratio)) / ratio) + 8
                self._bijections[plate.name] = bijection
                self._offsets[plate.name] = torch.arange(width, device=device)
        # Cursor at the end: the first call shuffles. (Computed plates count the data drawn this epoch.)
        self.cursors: Dict[str, int] = {p.name: p.size for p in self.plates}
        # epochs begun per plate: a checkpoint rewrites a plate's permutation table only when this changes
        self.epochs: Dict[str, int] = {p.name: 0 for p in self.plates}

    def next(self) -> Dict[str, torch.Tensor]:
        """Indices for the next step: ``{plate name: LongTensor (num_chains, subsample_size)}``."""
        indices = {}
        for plate in self.plates:
            cursor = self.cursors[plate.name]
            if plate.name not in self.permutations:
                indices[plate.name] = self._next_computed(plate, cursor)
                continue
            permutation = self.permutations[plate.name]
            if cursor + plate.subsample_size > plate.size:
                for chain in range(len(self.generators)):
                    permutation[chain] = self.generators.permutation(chain, plate.size)
                cursor = 0
                self.epochs[plate.name] += 1
            indices[plate.name] = permutation[:, cursor : cursor + plate.subsample_size]
            self.cursors[plate.name] = cursor + plate.subsample_size
        return indices

    def _next_computed(self, plate: SubsamplePlate, drawn: int) -> torch.Tensor:
        name, batch = plate.name, plate.subsample_size
        positions, bijection, offsets = self.positions[name], self._bijections[name], self._offsets[name]
        if drawn + batch > plate.size:  # a new epoch: new keys (in place: the bijection reads them), from the start
            self.keys[name].copy_(self.generators.integers(2**31, (NUM_ROUNDS,)))
            positions.zero_()
            drawn = 0
            self.epochs[name] += 1
        while True:  # values >= N are skipped
            candidate = positions.unsqueeze(-1) + offsets
            values = bijection(candidate)
            valid = (values < plate.size) & (candidate < bijection.span)
            rank = valid.cumsum(-1)
            if bool((rank[:, -1] >= batch).all()):
                break
            offsets = torch.arange(2 * offsets.numel(), device=offsets.device)  # rare: near the end of the span
        take = valid & (rank <= batch)
        positions += (rank < batch).sum(-1) + 1  # past the B-th value taken
        self.cursors[name] = drawn + batch
        return values[take].view(len(self.generators), batch)

    def state_dict(self) -> dict:
        return {
            "permutations": {k: v.clone() for k, v in self.permutations.items()},
            "keys": {k: v.clone() for k, v in self.keys.items()},
            "positions": {k: v.clone() for k, v in self.positions.items()},
            "cursors": dict(self.cursors),
            "epochs": dict(self.epochs),
        }

    def load_state_dict(self, state: dict) -> None:
        for name in self.permutations:
            self.permutations[name] = state["permutations"][name].clone()
        for name in self.keys:  # in place: the bijections read these keys
            self.keys[name].copy_(state["keys"][name])
            self.positions[name].copy_(state["positions"][name])
        for name in self.cursors:
            self.cursors[name] = int(state["cursors"][name])
            self.epochs[name] = int(state.get("epochs", {}).get(name, 0))
