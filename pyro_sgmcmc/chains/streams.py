"""Per-chain random streams: keyed, counter-based draws for all chains at once.

A chain's noise is a function of ``(seed, chain id, purpose, step)`` and the draw's shape, nothing else: the
same chain gives the same draws whether it runs alone, beside 3 or 400 other chains, in any order, or on another
process. The generator is Philox4x32-10 (:mod:`pyro_sgmcmc.chains.philox`), evaluated for every chain in one
fixed sequence of about 90 tensor operations (none per chain), so a step's noise costs the same number of
operations for one chain as for 16,384, and a CUDA graph can replay it with the step counter on the device (a
0-d tensor, read there). With few chains, a step given as an int is evaluated with the next ones
(:data:`~pyro_sgmcmc.chains.philox.DRAW_AHEAD_BLOCKS`), which they then copy: the same values, a fraction of
the fixed cost.

**Keys.** Chain ``c``'s key for a purpose (:data:`PURPOSES`: ``"noise"``, the step's injected noise;
``"init_momentum"``, the starting momenta) is the first two words of Philox4x32-10 with the *root key* of the
seed (two words of NumPy's ``SeedSequence([seed, ROOT_TAG])``) and the counter
``(c mod 2^32, c // 2^32, purpose tag, 0)``. Distinct chains and purposes get independent 64-bit keys; they are
made once, at set-up.

**Counters.** Draw ``t`` (the step; ``0`` for the starting momenta) of ``D`` values of chain ``c`` is made of
blocks ``b = 0, 1, ...``, block ``b`` being Philox4x32-10 of that key at the 128-bit counter

    ``(word 0, word 1, word 2, word 3) = (b, t mod 2^32, t // 2^32, 0)``

(word 3 is reserved), turned into 4 normals (float32) or 2 (float64) by Box-Muller, the first ``D`` of them
kept. A restarted chain (after a divergence) keeps counting steps, so no counter is ever used twice.

**State.** The streams' state is the seed and the chain ids (the keys follow from them) and the step, which the
kernel's state carries: a checkpoint holds no generator state. The minibatch streams have keys of their own per
subsampled plate (:meth:`ChainGenerators.plate_words`), unchanged by the noise draws.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import torch

from .philox import PhiloxNormals, Step, philox4x32

__all__ = ["PURPOSES", "ROOT_TAG", "ChainGenerators", "chain_seed"]

#: The streams of a chain: purpose -> the tag in its keys' counter (different purposes: independent streams).
PURPOSES = {"noise": 1, "init_momentum": 2}
#: The second entropy word of the root key's ``SeedSequence`` (the bytes ``b"\x02philox"``: distinct from the
#: plates' tags, which start with ``b"\x01"``).
ROOT_TAG = int.from_bytes(b"\x02philox", "big")
_WORD = 1 << 32


def chain_seed(seed: int, chain_id: int) -> int:
    """A 63-bit seed for chain ``chain_id`` of a run seeded with ``seed`` (independent streams); the starting
    points of superchain ``s`` are drawn from torch's generator seeded with ``chain_seed(seed, s)``."""
    state = np.random.SeedSequence([int(seed), int(chain_id)]).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def chain_keys(seed: int, chain_ids: Sequence[int], purpose: str) -> torch.Tensor:
    """``(num_chains, 2)`` int64: the Philox keys (two 32-bit words) of ``purpose`` of the chains (module
    docstring), on the CPU."""
    root = np.random.SeedSequence([int(seed), ROOT_TAG]).generate_state(2, np.uint32).astype(np.int64)
    ids = torch.tensor(chain_ids, dtype=torch.long).reshape(-1)
    counter = torch.stack(
        [ids % _WORD, ids // _WORD, torch.full_like(ids, PURPOSES[purpose]), torch.zeros_like(ids)], -1
    )
    return philox4x32(counter, torch.from_numpy(root))[:, :2].contiguous()


class ChainGenerators:
    """The random streams of a batch of chains: Philox keys per chain and purpose (module docstring).

    Parameters
    ----------
    seed : int or None
        The run's seed (a non-negative int). ``None`` draws one from torch's global generator, so
        ``pyro.set_rng_seed`` makes the run reproducible.
    chain_ids : sequence of int
        Global ids of the chains held here, in ``[0, 2^63)``.
    device : torch.device
        Where the keys (and the tensors drawn) live.

    Examples
    --------
    >>> from pyro_sgmcmc.chains.streams import ChainGenerators
    >>> streams = ChainGenerators(0, [3, 7])
    >>> noise = streams.normal((5,), torch.float32, step=12)
    >>> torch.equal(noise[1], ChainGenerators(0, [7]).normal((5,), torch.float32, step=12)[0])
    True
    """

    def __init__(self, seed: Optional[int], chain_ids: Sequence[int], device: torch.device = torch.device("cpu")):
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()))
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise ValueError(f"seed must be a non-negative int or None; got {seed!r}")
        self.seed = int(seed)
        self.chain_ids = [int(c) for c in chain_ids]
        if any(not 0 <= c < 1 << 63 for c in self.chain_ids):
            raise ValueError(f"chain_ids must lie in [0, 2^63); got {self.chain_ids}")
        self.device = torch.device(device)
        self._draws: Dict[str, PhiloxNormals] = {
            purpose: PhiloxNormals(chain_keys(self.seed, self.chain_ids, purpose).to(self.device))
            for purpose in PURPOSES
        }

    def __len__(self) -> int:
        return len(self.chain_ids)

    def keys(self, purpose: str = "noise") -> torch.Tensor:
        """``(num_chains, 2)``: the chains' Philox keys of ``purpose``, on the CPU."""
        return chain_keys(self.seed, self.chain_ids, self._purpose(purpose))

    def normal(self, shape: Sequence[int], dtype: torch.dtype, *, step: Step, purpose: str = "noise") -> torch.Tensor:
        """Standard normal draws of shape ``(num_chains, *shape)``: chain ``c``'s row is its draw ``step`` of
        ``purpose`` (module docstring), whatever the other rows."""
        out = torch.empty((len(self), *shape), dtype=dtype, device=self.device)
        return self.fill_normal(out, step=step, purpose=purpose)

    def fill_normal(self, out: torch.Tensor, *, step: Step, purpose: str = "noise") -> torch.Tensor:
        """Fill ``out`` (``(num_chains, ...)``, floating point, on :attr:`device`) in place with the draws
        :meth:`normal` returns; returns ``out``. ``step``: an int, or a 0-d int64 tensor on the device, which is
        read there (no host synchronisation: a CUDA graph can replay the draw with the step advancing)."""
        return self._draws[self._purpose(purpose)].fill(out, step)

    def plate_words(self, plate: str, count: int) -> torch.Tensor:
        """``count`` 31-bit integers per chain determined by ``(seed, chain id, plate)`` only, ``(num_chains,
        count)`` LongTensor: the root of chain ``c``'s minibatch stream of the subsampled plate ``plate``.

        They come from NumPy's ``SeedSequence`` of ``[seed, chain id, plate tag]`` (the tag is the plate's
        name as an integer), independent of the noise keys (so minibatches and noise never consume each
        other), of the other chains held here and of the other plates of the model.
        """
        tag = int.from_bytes(b"\x01" + plate.encode("utf-8"), "big")  # the leading byte: distinct names, distinct tags
        words = np.stack(
            [np.random.SeedSequence([self.seed, c, tag]).generate_state(count, np.uint32) for c in self.chain_ids]
        )
        return torch.from_numpy((words & 0x7FFFFFFF).astype(np.int64)).to(self.device)

    @staticmethod
    def _purpose(purpose: str) -> str:
        if purpose not in PURPOSES:
            raise ValueError(f"purpose must be one of {sorted(PURPOSES)}; got {purpose!r}")
        return purpose
