"""Minibatch indices for subsampled plates, drawn per chain.

Each chain walks through its own random permutation of every subsampled plate, ``B`` indices per
step, and reshuffles when fewer than ``B`` remain (an epoch; a remainder of ``N mod B`` indices is
skipped). Each step's minibatch is therefore a uniformly random ``B``-subset of the ``N`` data, so
the ``N / B``-scaled log-likelihood stays an unbiased estimate; within an epoch minibatches do not
overlap, which lowers the gradient-noise variance over an epoch (sampling without replacement, as
in SGD practice). A permutation costs ``O(N)`` once per epoch rather than once per step, which is
what makes hundreds of chains, each with its own minibatches, affordable.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from .potential import SubsamplePlate
from .random import ChainGenerators

__all__ = ["MinibatchSampler"]


class MinibatchSampler:
    """Per-chain epoch permutations of each subsampled plate.

    Parameters
    ----------
    plates : sequence of SubsamplePlate
        The model's subsampled plates (from :class:`~pyro_sgmcmc.ModelPotential`).
    generators : ChainGenerators
        One random stream per chain.
    """

    def __init__(self, plates: Sequence[SubsamplePlate], generators: ChainGenerators) -> None:
        self.plates = [p for p in plates if not p.user_indices]  # the model draws the others itself
        self.generators = generators
        num_chains = len(generators)
        device = generators.device
        self.permutations: Dict[str, torch.Tensor] = {
            p.name: torch.empty((num_chains, p.size), dtype=torch.long, device=device) for p in self.plates
        }
        # Cursor at the end: the first call shuffles.
        self.cursors: Dict[str, int] = {p.name: p.size for p in self.plates}

    def next(self) -> Dict[str, torch.Tensor]:
        """Indices for the next step: ``{plate name: LongTensor (num_chains, subsample_size)}``."""
        indices = {}
        for plate in self.plates:
            cursor = self.cursors[plate.name]
            permutation = self.permutations[plate.name]
            if cursor + plate.subsample_size > plate.size:
                for chain in range(len(self.generators)):
                    permutation[chain] = self.generators.permutation(chain, plate.size)
                cursor = 0
            indices[plate.name] = permutation[:, cursor : cursor + plate.subsample_size]
            self.cursors[plate.name] = cursor + plate.subsample_size
        return indices

    def state_dict(self) -> dict:
        return {"permutations": {k: v.clone() for k, v in self.permutations.items()}, "cursors": dict(self.cursors)}

    def load_state_dict(self, state: dict) -> None:
        for name in self.permutations:
            self.permutations[name] = state["permutations"][name].clone()
            self.cursors[name] = int(state["cursors"][name])

    @property
    def plate_names(self) -> List[str]:
        return [p.name for p in self.plates]
