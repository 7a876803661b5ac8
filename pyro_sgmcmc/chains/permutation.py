"""Random permutations of ``range(n)`` computed on the fly, keyed by integers: the minibatch method.

A stored permutation costs ``O(n)`` memory and time per chain and per epoch: with ``10^7`` data
and 256 chains the index table alone is 20 GB. Here the permutation is a *keyed bijection*
:math:`\\pi_k` of :math:`\\{0, \\dots, 2^m - 1\\}` with :math:`2^{m-1} < n \\le 2^m`, read in order
with the values :math:`\\ge n` skipped: the values below ``n`` then come out in a pseudo-random order,
each exactly once. A chain's stream costs ``O(B)`` per step (at most ``2B`` evaluations of
:math:`\\pi_k`) and a few integers of state (the keys and a cursor), not a table; and since the
permutation is a function of its keys, any part of it (a step's ``B`` indices, a whole epoch:
:meth:`KeyedPermutation.order`) can be evaluated on its own and gives the same values.

The keys of epoch :math:`e` of a stream are a function of the stream's two roots per round and of
:math:`e` (:func:`epoch_keys`), so a stream is fixed by its roots alone; the sampler derives the
roots from ``(seed, chain id, plate)`` (:mod:`pyro_sgmcmc.chains.minibatch`).

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

import functools
from typing import Optional, Tuple

import torch

__all__ = ["KeyedPermutation", "NUM_ROUNDS", "epoch_keys", "mix31"]

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
        self.n = int(n)
        self.span = self.span_of(self.n)
        bits = self.span.bit_length() - 1
        self.high_bits = bits // 2
        self.low_bits = bits - self.high_bits
        self.keys = keys
        self._round_keys = [keys[:, r : r + 1] for r in range(NUM_ROUNDS)]  # views: follow in-place key updates

    @staticmethod
    def span_of(n: int) -> int:
        """The size ``2^m`` of the domain for ``n``: the least power of two ``>= n``, at least 2."""
        bits = max(1, (int(n) - 1).bit_length())
        if bits > 62:
            raise ValueError(f"n must be below 2^62; got {n}")
        return 1 << bits

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """:math:`\\pi_{row}(positions[row, j])` for positions ``(rows, m)`` in ``[0, span)``.

        The rounds are computed in place in two buffers of the positions' size: about 90 elementwise
        passes and no other allocation (fresh tensors per pass cost as much again).
        """
        high, low = positions >> self.low_bits, positions & ((1 << self.low_bits) - 1)
        h, t = torch.empty_like(high), torch.empty_like(high)
        for r, key in enumerate(self._round_keys):
            # L <- L xor F(R, k_r) in even rounds, R <- R xor F(L, k_r) in odd ones; F = mix31, top bits kept
            source, target, bits = (low, high, self.high_bits) if r % 2 == 0 else (high, low, self.low_bits)
            mix31(source, key, _MULTIPLIERS[r], out=(h, t))
            target.bitwise_xor_(h.bitwise_right_shift_(31 - bits))
        return high.bitwise_left_shift_(self.low_bits).bitwise_or_(low)

    def order(self, chunk: int = 2**18) -> torch.Tensor:
        """Each row's whole permutation of ``range(n)``, ``(rows, n)``: the bijection read in order with
        the values ``>= n`` skipped, i.e. the sequence a minibatch sampler walks through, materialised.
        About ``chunk`` positions are evaluated at a time (all rows together), so that the temporaries
        stay small."""
        rows, device = self.keys.shape[0], self.keys.device
        out = torch.empty((rows, self.n), dtype=torch.long, device=device)
        filled = torch.arange(rows, device=device).unsqueeze(-1) * self.n - 1  # flat index before each row's next
        width = max(1, chunk // rows)
        for start in range(0, self.span, width):
            values = self(torch.arange(start, min(start + width, self.span), device=device).expand(rows, -1))
            keep = values < self.n
            rank = keep.cumsum(-1)
            out.view(-1)[(filled + rank)[keep]] = values[keep]  # a row may keep more of a chunk than another
            filled += rank[:, -1:]
        return out


def mix31(value: torch.Tensor, key, multiplier, out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """A keyed 31-bit mixer: ``value`` and ``key`` in ``[0, 2^31)`` to a hash in ``[0, 2^31)``.

    Two xorshift-multiply steps modulo :math:`2^{31}` (the shape of MurmurHash3's finaliser), the key
    mixed in before each: every bit of the input reaches every bit of the output. For a fixed key it is
    a bijection of ``[0, 2^31)`` (xor with a constant, ``h ^ (h >> s)`` and a product with an odd
    multiplier modulo :math:`2^{31}` each are). Each product is of two numbers below :math:`2^{31}`, so
    it stays below :math:`2^{62}`, inside int64. ``key`` and ``multiplier`` broadcast against ``value``.

    ``out``: two buffers of the result's shape; the hash is written into the first (the second is
    scratch) and no other tensor is allocated.
    """
    if out is None:
        shape = _broadcast_shape(value.shape, torch.as_tensor(key).shape, torch.as_tensor(multiplier).shape)
        out = (value.new_empty(shape), value.new_empty(shape))
    h, t = out
    torch.bitwise_xor(value, key, out=h)
    h.bitwise_xor_(torch.bitwise_right_shift(h, 15, out=t))
    h.mul_(multiplier).bitwise_and_(_LOW31).bitwise_xor_(key)
    h.bitwise_xor_(torch.bitwise_right_shift(h, 13, out=t))
    h.mul_(_MIX).bitwise_and_(_LOW31)
    return h.bitwise_xor_(torch.bitwise_right_shift(h, 16, out=t))


def _broadcast_shape(*shapes: Tuple[int, ...]) -> Tuple[int, ...]:
    """The shape ``shapes`` broadcast to (NumPy's rule), in Python: ``torch.broadcast_shapes`` imports sympy
    (seconds) the first time a process calls it, and ``torch.broadcast_tensors`` would add operators."""
    ndim = max(len(shape) for shape in shapes)
    out = []
    for sizes in zip(*[(1,) * (ndim - len(shape)) + tuple(shape) for shape in shapes]):
        others = {size for size in sizes if size != 1}
        if len(others) > 1:
            raise RuntimeError(f"shapes {[tuple(shape) for shape in shapes]} do not broadcast")
        out.append(others.pop() if others else 1)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _multipliers(device: torch.device) -> torch.Tensor:
    """The mixer's multipliers on ``device``, made once (a copy from the host per call is a wait on a GPU)."""
    return torch.tensor(_MULTIPLIERS, dtype=torch.long, device=device)


def epoch_keys(bases: torch.Tensor, epoch) -> torch.Tensor:
    """The round keys of epoch ``epoch`` of each stream, ``(rows, NUM_ROUNDS)`` in ``[0, 2^31)``.

    ``bases`` (``(rows, 2, NUM_ROUNDS)``, 31-bit) fixes a stream, ``epoch`` (an int, or a LongTensor
    broadcasting against ``(rows, 1)``) the permutation within it:
    :math:`k_r(e) = h_r(h_r(e, b_{0r}), b_{1r})` with the mixer :func:`mix31` (multiplier ``r``, then
    ``5 - r``). For one stream, distinct epochs (below :math:`2^{31}`) get distinct keys in every
    round, so its permutations never repeat.
    """
    multipliers = _multipliers(bases.device)
    if isinstance(epoch, torch.Tensor):
        epoch = epoch.to(device=bases.device, dtype=torch.long) & _LOW31
    else:  # a fill, not a copy from the host (which a GPU waits for)
        epoch = bases.new_full((), int(epoch) & _LOW31)
    if epoch.dim() == 0:
        epoch = epoch.expand(bases.shape[0], 1)
    return mix31(mix31(epoch, bases[:, 0], multipliers), bases[:, 1], multipliers.flip(0))
