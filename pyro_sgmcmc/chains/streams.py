"""Per-chain random streams.

Every chain owns a :class:`torch.Generator` seeded from ``(seed, chain_id)`` through NumPy's
``SeedSequence``, so a chain's noise and minibatches depend only on the run's seed and its global
chain id: the same chain gives the same draws whether it runs alone, in a vectorised batch, or on
another process; and a run's randomness is checkpointed by saving the generators' states. The
generators draw the noise; a chain's minibatches come from keys of their own per subsampled plate
(:meth:`ChainGenerators.plate_words`), so that the two streams never consume each other.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch

__all__ = ["ChainGenerators", "chain_seed"]


def chain_seed(seed: int, chain_id: int) -> int:
    """A 63-bit seed for chain ``chain_id`` of a run seeded with ``seed`` (independent streams)."""
    state = np.random.SeedSequence([int(seed), int(chain_id)]).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


class ChainGenerators:
    """One :class:`torch.Generator` per chain.

    Parameters
    ----------
    seed : int or None
        The run's seed. ``None`` draws one from torch's global generator, so
        ``pyro.set_rng_seed`` makes the run reproducible.
    chain_ids : sequence of int
        Global ids of the chains held here.
    device : torch.device
        Where the generators (and the tensors they draw) live.
    """

    def __init__(self, seed: Optional[int], chain_ids: Sequence[int], device: torch.device = torch.device("cpu")):
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()))
        self.seed = int(seed)
        self.chain_ids = [int(c) for c in chain_ids]
        self.device = torch.device(device)
        self.generators: List[torch.Generator] = []
        for chain_id in self.chain_ids:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(chain_seed(self.seed, chain_id))
            self.generators.append(generator)

    def __len__(self) -> int:
        return len(self.generators)

    def normal(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Standard normal draws of shape ``(num_chains, *shape)``, each chain from its own stream."""
        # one chain: the whole (contiguous) tensor at once, the same draws as its one row
        return self.fill_normal(torch.empty((len(self.generators), *shape), dtype=dtype, device=self.device))

    def fill_normal(self, out: torch.Tensor) -> torch.Tensor:
        """Fill ``out`` (``(num_chains, ...)``, contiguous) in place with the draws :meth:`normal` would
        return, each chain's row from its own stream; returns ``out``."""
        if len(self.generators) == 1:
            return out.normal_(generator=self.generators[0])
        for row, generator in zip(out, self.generators):
            row.normal_(generator=generator)
        return out

    def plate_words(self, plate: str, count: int) -> torch.Tensor:
        """``count`` 31-bit integers per chain determined by ``(seed, chain id, plate)`` only, ``(num_chains,
        count)`` LongTensor: the root of chain ``c``'s minibatch stream of the subsampled plate ``plate``.

        They come from NumPy's ``SeedSequence`` of ``[seed, chain id, plate tag]`` (the tag is the plate's
        name as an integer), independent of the chain's generator (so minibatches do not consume the
        noise stream), of the other chains held here and of the other plates of the model.
        """
        tag = int.from_bytes(b"\x01" + plate.encode("utf-8"), "big")  # the leading byte: distinct names, distinct tags
        words = np.stack(
            [np.random.SeedSequence([self.seed, c, tag]).generate_state(count, np.uint32) for c in self.chain_ids]
        )
        return torch.from_numpy((words & 0x7FFFFFFF).astype(np.int64)).to(self.device)

    def get_state(self) -> List[torch.Tensor]:
        return [g.get_state() for g in self.generators]

    def set_state(self, states: Sequence[torch.Tensor]) -> None:
        if len(states) != len(self.generators):
            raise ValueError(f"expected {len(self.generators)} generator states, got {len(states)}")
        for generator, state in zip(self.generators, states):
            generator.set_state(state)
