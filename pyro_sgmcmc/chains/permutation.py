"""Random permutations of ``range(n)`` computed on the fly, for data too large to shuffle per chain.

A stored permutation costs ``O(n)`` memory and time per chain and per epoch: with ``10^7`` data
and 256 chains the index table alone is 20 GB. Here the permutation is a *keyed bijection*
:math:`\\pi_k` of :math:`\\{0, \\dots, 2^m - 1\\}` with :math:`2^{m-1} < n \\le 2^m`, read in order
with the values :math:`\\ge n` skipped: the values below ``n`` then come out in a pseudo-random order,
each exactly once. A chain's stream costs ``O(B)`` per step (about ``2B`` evaluations of
:math:`\\pi_k`) and a few integers of state (the keys and a cursor), not a table.

Construction: an alternating (unbalanced) Feistel network (Luby and Rackoff 1988; Black and Rogaway
2002 for the skipping, "cycle walking" by another name). ``x`` is split into a high part ``L`` of
``a = m // 2`` bits and a low part ``R`` of ``m - a`` bits; even rounds set
:math:`L \\leftarrow L \\oplus F(R, k_r)`, odd rounds :math:`R \\leftarrow R \\oplus F(L, k_r)`. Each round
is its own inverse, so any round function ``F`` gives a bijection. ``F`` hashes the other half and the
round key with xorshift-multiply steps modulo :math:`2^{31}` (the shape of MurmurHash3's finaliser) and
keeps the top bits; every product stays below :math:`2^{62}`, inside int64. The statistical tests in
``tests/chains/test_permutation.py`` check that the positions, pairs and inclusion counts are uniform.
"""

from __future__ import annotations

import torch

__all__ = ["KeyedPermutation", "NUM_ROUNDS"]

#: Feistel rounds (three on each half).
NUM_ROUNDS = 6
_MULTIPLIERS = (0x5BD1E995, 0x2545F491, 0x1B873593, 0x7FEB352D, 0x68E31DA5, 0x3C6EF373)
_LOW31 = (1 << 31) - 1
_MIX = 0x4C2B2AE5  # odd, below 2^31


class KeyedPermutation:
    """A batch of keyed bijections of ``range(2^m)``, ``2^(m-1) < n <= 2^m``, one per row of ``keys``.

    Parameters
    ----------
    n : int
        Size of the set to permute (``n >= 1``); :attr:`span` is ``2^m``.
    keys : LongTensor ``(rows, NUM_ROUNDS)``
        Round keys in ``[0, 2^31)``, one row per permutation (e.g. per chain); draw them uniformly
        for a random permutation.
    """

    def __init__(self, n: int, keys: torch.Tensor) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1; got {n}")
        if keys.dim() != 2 or keys.shape[1] != NUM_ROUNDS or keys.dtype != torch.long:
            raise ValueError(f"keys must be a LongTensor of shape (rows, {NUM_ROUNDS}); got {tuple(keys.shape)}")
        bits = max(1, (n - 1).bit_length())
        if bits > 62:
            raise ValueError(f"n must be below 2^62; got {n}")
        self.n = int(n)
        self.span = 1 << bits
        self.high_bits = bits // 2
        self.low_bits = bits - self.high_bits
        self.keys = keys
        self._round_keys = [keys[:, r : r + 1] for r in range(NUM_ROUNDS)]  # views: follow in-place key updates

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """:math:`\\pi_{row}(positions[row, j])` for positions ``(rows, m)`` in ``[0, span)``."""
        high, low = positions >> self.low_bits, positions & ((1 << self.low_bits) - 1)
        for r, key in enumerate(self._round_keys):
            if r % 2 == 0:
                high = high ^ self._hash(low, key, _MULTIPLIERS[r], self.high_bits)
            else:
                low = low ^ self._hash(high, key, _MULTIPLIERS[r], self.low_bits)
        return (high << self.low_bits) | low

    @staticmethod
    def _hash(value: torch.Tensor, key: torch.Tensor, multiplier: int, bits: int) -> torch.Tensor:
        # a 31-bit xorshift-multiply mixer (the shape of MurmurHash3's finaliser): every bit of the input
        # reaches every bit of the output; masked to 31 bits before each product, which stays below 2^62
        h = (value ^ key) & _LOW31
        h = h ^ (h >> 15)
        h = ((h * multiplier) & _LOW31) ^ key
        h = h ^ (h >> 13)
        h = (h * _MIX) & _LOW31
        h = h ^ (h >> 16)
        return h >> (31 - bits) if bits <= 31 else h
