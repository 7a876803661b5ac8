"""Philox4x32-10 in torch tensor operations: keyed, counter-based random numbers for many streams at once.

Philox4x32-10 (Salmon, Moraes, Dror and Shaw 2011, the generator of Random123 and cuRAND) maps a 128-bit
*counter* :math:`(x_0, x_1, x_2, x_3)` and a 64-bit *key* :math:`(k_0, k_1)` (32-bit words) to 128 bits
that look uniform and independent for distinct (counter, key) pairs. Ten rounds of

.. math::

    (h_0, l_0) = M_0 x_0, \\quad (h_1, l_1) = M_1 x_2, \\qquad
    (x_0, x_1, x_2, x_3) \\leftarrow (h_1 \\oplus x_1 \\oplus k_0,\\ l_1,\\ h_0 \\oplus x_3 \\oplus k_1,\\ l_0),

where :math:`(h, l)` are the high and low words of the 64-bit product, :math:`M = (\\mathtt{D2511F53},
\\mathtt{CD9E8D57})`, and the key is bumped by the Weyl constants :math:`W = (\\mathtt{9E3779B9},
\\mathtt{BB67AE85})` (modulo :math:`2^{32}`) between rounds. The words live in int64 tensors. The product of a
word :math:`x < 2^{32}` and :math:`M > 2^{31}` does not fit a signed int64, so it is computed exactly as
:math:`x M = 2^{32} x + x (M - 2^{32})`: the second term, :math:`p = x (M - 2^{32})`, lies in
:math:`(-2^{62}, 0]`, and :math:`h = x + \\lfloor p / 2^{32} \\rfloor` (an arithmetic shift),
:math:`l = p \\bmod 2^{32}` (a mask) (:func:`mulhilo`). No operation overflows.

From the words (:func:`uniforms`): in float32, each word gives :math:`u = (\\lfloor w / 2^9 \\rfloor + 1/2)
2^{-23}`; in float64, each pair of words :math:`(w_{2i}, w_{2i+1})` gives :math:`u = (k + 1/2) 2^{-52}` with the
52 bits :math:`k = \\lfloor w_{2i} / 2^{12} \\rfloor 2^{32} + w_{2i+1}`. Both are exact in their dtype and lie
in :math:`[2^{-24}, 1 - 2^{-24}]` (float32) or :math:`[2^{-53}, 1 - 2^{-53}]` (float64): never 0 or 1. (53
random bits could not be centred exactly in a 53-bit significand; the 53rd bit of ``u`` is the half.) Standard
normals by Box-Muller (:func:`normals`), each pair of uniforms :math:`(u, v)` giving
:math:`\\sqrt{-2 \\ln u} \\cos(2 \\pi v)` and :math:`\\sqrt{-2 \\ln u} \\sin(2 \\pi v)`: four normals per block
in float32, two in float64, in that order (the angle is ``v`` times :math:`2 \\pi` rounded to the dtype). The
smallest ``u`` bounds the normals: :math:`|z| \\le 5.77` in float32 (a standard normal exceeds it with
probability 8e-9), :math:`8.57` in float64.

:class:`PhiloxNormals` evaluates a whole draw, every stream (key) at once, with a fixed number of tensor
operations (about 80, whatever the number of streams and values), on the keys' device; there the products
are taken modulo :math:`2^{64}` (``x M`` with ``M`` unsigned: the int64 multiplication wraps, its bits are
exact) and one mask a round clears the bits above the words. The operations never depend on the number of
streams, on the CPU either: cache-sized tiles of rows were measured 1.4x faster at 4096 rows of 3151 values
(2026-11-27) but make the count grow with the work, and were not kept.

Reference: J. K. Salmon, M. A. Moraes, R. O. Dror and D. E. Shaw, "Parallel random numbers: as easy as 1, 2,
3", SC'11 (2011); the known-answer vectors of its Random123 library are tested in ``tests/chains/test_philox.py``.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple, Union

import torch

__all__ = [
    "DRAW_AHEAD_BLOCKS",
    "MULTIPLIERS",
    "ROUNDS",
    "WEYL",
    "PhiloxNormals",
    "mulhilo",
    "normals",
    "philox4x32",
    "uniforms",
]

#: The round multipliers :math:`M_0, M_1` and the key increments (Weyl constants) :math:`W_0, W_1`.
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)
#: Rounds of Philox4x32-10.
ROUNDS = 10
_MASK = 0xFFFFFFFF
_TWO_PI = 2.0 * math.pi
#: An int step's evaluation covers the next steps too while ``steps x streams x blocks`` stays under this.
DRAW_AHEAD_BLOCKS = 2**14
#: per dtype: (normals per block, bits dropped from a word for float32 / from the high word for float64)
_LAYOUT = {torch.float32: (4, 9), torch.float64: (2, 12)}

Step = Union[int, torch.Tensor]


def mulhilo(word: torch.Tensor, multiplier: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``word * multiplier`` for int64 ``word`` in ``[0, 2^32)`` and
    ``multiplier`` in ``(2^31, 2^32)``, exactly and without overflow (module docstring)."""
    product = word * (multiplier - (1 << 32))  # in (-2^62, 0]
    return word + (product >> 32), product & _MASK


def philox4x32(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The Philox4x32-10 block: ``(..., 4)`` words of ``counter`` and ``(..., 2)`` words of ``key`` (int64 in
    ``[0, 2^32)``, broadcasting against each other) to ``(..., 4)`` int64 words in ``[0, 2^32)``.

    >>> from pyro_sgmcmc.chains.philox import philox4x32
    >>> [hex(w) for w in philox4x32(torch.zeros(4, dtype=torch.long), torch.zeros(2, dtype=torch.long)).tolist()]
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    if counter.dtype != torch.long or key.dtype != torch.long:
        raise TypeError(f"counter and key must be int64 tensors of 32-bit words; got {counter.dtype}, {key.dtype}")
    if counter.shape[-1:] != (4,) or key.shape[-1:] != (2,):
        raise ValueError(f"counter must end in 4 words and key in 2; got {tuple(counter.shape)}, {tuple(key.shape)}")
    x0, x1, x2, x3 = counter.unbind(-1)
    k0, k1 = key.unbind(-1)
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + WEYL[0]) & _MASK, (k1 + WEYL[1]) & _MASK
        h0, l0 = mulhilo(x0, MULTIPLIERS[0])
        h1, l1 = mulhilo(x2, MULTIPLIERS[1])
        x0, x1, x2, x3 = h1 ^ x1 ^ k0, l1, h0 ^ x3 ^ k1, l0
    return torch.stack(torch.broadcast_tensors(x0, x1, x2, x3), -1)


def uniforms(words: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Uniforms in ``(0, 1)`` from ``(..., 4)`` words: ``(..., 4)`` in float32, ``(..., 2)`` in float64 (module
    docstring: never 0 or 1, exact)."""
    if dtype == torch.float32:
        return ((words >> 9).to(dtype) + 0.5) * 2.0**-23
    if dtype == torch.float64:
        bits = ((words[..., 0::2] >> 12) << 32) | words[..., 1::2]
        return (bits.to(dtype) + 0.5) * 2.0**-52
    raise ValueError(f"dtype must be torch.float32 or torch.float64; got {dtype}")


def normals(words: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Standard normals from ``(..., 4)`` words by Box-Muller: ``(..., 4)`` in float32, ``(..., 2)`` in float64.

    Uniforms ``u`` (:func:`uniforms`), taken in pairs ``(u[2i], u[2i+1])``: radius ``sqrt(-2 log u[2i])``,
    angle ``u[2i+1] * 2 pi``, normals ``radius * cos(angle)`` then ``radius * sin(angle)``.
    """
    u = uniforms(words, dtype)
    radius = (u[..., 0::2].log() * -2.0).sqrt()
    angle = u[..., 1::2] * _TWO_PI
    return torch.stack([radius * angle.cos(), radius * angle.sin()], -1).flatten(-2)


def _check_step(step: Step) -> None:
    """``step`` is an int in ``[0, 2^62)`` or a 0-d int64 tensor (whose value is not read: no synchronisation)."""
    if torch.is_tensor(step):
        if step.dim() != 0 or step.dtype != torch.long:
            raise ValueError(
                f"step must be an int or a 0-d int64 tensor; got a {step.dtype} tensor of shape {tuple(step.shape)}"
            )
    elif isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 1 << 62:
        raise ValueError(f"step must be an int in [0, 2^62) or a 0-d int64 tensor; got {step!r}")


class _Scratch:
    """The buffers of draws of one shape, ``blocks`` Philox blocks for each of ``streams`` keys at ``steps``
    consecutive steps, and their lanes (views made once: a view is an operation too). Layout
    ``(lane, step, stream, block)``; :attr:`first` is the first step whose draws :attr:`staging` holds."""

    def __init__(self, streams: int, blocks: int, steps: int, dtype: torch.dtype, device: torch.device):
        words = {"dtype": torch.long, "device": device}
        self.blocks, self.steps, self.dtype, self.first = blocks, steps, dtype, None
        self.offsets = torch.arange(steps, **words).view(steps, 1, 1)
        self.step_words = (torch.empty_like(self.offsets), torch.empty_like(self.offsets))
        # the counters of round 0, the same for every stream: lanes (x0, x2) = (block, step high), (x3, x1) = (0, low)
        self.counter_a = torch.empty((2, steps, 1, blocks), **words)
        self.counter_a[0] = torch.arange(blocks, device=device)
        self.counter_b = torch.zeros((2, steps, 1, 1), **words)
        self.step_high, self.step_low = self.counter_a[1], self.counter_b[1]
        self.first_product, self.first_high = torch.empty_like(self.counter_a), torch.empty_like(self.counter_a)
        self.first_high_lanes = self.first_high.unbind(0)
        # the rounds on every stream: a = (x0, x2), h the high words, two products (x3, x1) taking turns
        shape = (2, steps, streams, blocks)
        self.a, self.h = torch.empty(shape, **words), torch.empty(shape, **words)
        self.a_lanes, self.h_lanes = self.a.unbind(0), self.h.unbind(0)
        self.products = (torch.empty_like(self.a), torch.empty_like(self.a))
        self.staging = torch.empty((steps, streams, blocks, _LAYOUT[dtype][0]), dtype=dtype, device=device)
        self.staging_values = self.staging.unbind(-1)
        # the float work reuses the int64 buffers free by then (float32: two lanes in half a buffer)
        if dtype == torch.float32:
            self.radius, self.angle = self.a.view(-1).view(dtype).view(2, *shape).unbind(0)
            self.cosine = self.products[0].view(-1).view(dtype)[: self.a.numel()].view(shape)
        else:
            self.uniform = self.products[0].view(-1).view(dtype).view(shape)
            self.radius, self.cosine = self.a.view(-1).view(dtype).view(shape).unbind(0)
        self.radius_lanes, self.angle_lanes, self.cosine_lanes = (
            t.unbind(0) for t in (self.radius, getattr(self, "angle", self.radius), self.cosine)
        )
        self.uniform_lanes = self.uniform.unbind(0) if dtype == torch.float64 else ()
        # the last round keeps only the bits the uniforms use: a word's high 23 (float32), the high word's 20 (float64)
        self.last_mask = _MASK ^ ((1 << _LAYOUT[dtype][1]) - 1)
        self.half = torch.tensor(0.5 * 2.0 ** -(23 if dtype == torch.float32 else 52), dtype=dtype, device=device)


class PhiloxNormals:
    """Standard normals for many keyed streams at once: row ``s`` of a draw at step ``t`` is block after block
    :func:`normals` of :func:`philox4x32` with key ``keys[s]`` and counter ``(b, t mod 2^32, t // 2^32, 0)``,
    ``b`` the block's index within the row (blocks of 4 values in float32, 2 in float64; a row of ``D``
    values is the first ``D`` of its blocks).

    So a row depends on its key, ``t`` and ``D`` only: not on the other rows, their number or order. An
    evaluation is a fixed sequence of about 80 tensor operations over all rows together (none per row), in
    buffers set up at the first draw of each shape and dtype. A step given as a 0-d
    tensor is read on the device (no host synchronisation) and evaluated alone. For a step given as an int,
    when the rows are few (``streams x blocks`` under :data:`DRAW_AHEAD_BLOCKS`) the evaluation covers the next
    ``DRAW_AHEAD_BLOCKS // (streams x blocks)`` steps too, and the draws of those steps are then copied
    from it (one operation): the fixed cost of the operations is shared, the values are the same.

    Parameters
    ----------
    keys : LongTensor ``(streams, 2)``
        One key (two 32-bit words) per stream, on the device the draws are made on.
    """

    def __init__(self, keys: torch.Tensor):
        if keys.dim() != 2 or keys.shape[1] != 2 or keys.dtype != torch.long:
            raise ValueError(f"keys must be a LongTensor of shape (streams, 2); got {keys.dtype} {tuple(keys.shape)}")
        self.num_streams, self.device = keys.shape[0], keys.device
        rounds = torch.arange(ROUNDS, device=keys.device).view(ROUNDS, 1, 1)
        weyl = torch.tensor(WEYL, device=keys.device)
        round_keys = (keys + rounds * weyl) & _MASK  # (ROUNDS, streams, 2): the key of each round
        self.round_keys = [(k[:, 0:1], k[:, 1:2]) for k in round_keys]  # (streams, 1) each: broadcast over blocks
        self.last_key = round_keys[-1].T.flip(0).view(2, 1, -1, 1).contiguous()  # (k1, k0) of the last round
        self.multipliers = torch.tensor(MULTIPLIERS, device=keys.device).view(2, 1, 1, 1)  # unsigned: products wrap
        self.keys = keys
        self._scratch: Dict[Tuple[torch.dtype, int, int], _Scratch] = {}

    def scratch(self, dtype: torch.dtype, values: int, steps: int = 1) -> _Scratch:
        """The buffers for draws of ``values`` per stream in ``dtype``, ``steps`` at a time (the last two kept)."""
        if dtype not in _LAYOUT:
            raise ValueError(f"dtype must be torch.float32 or torch.float64; got {dtype}")
        key = (dtype, values, steps)
        if key not in self._scratch:
            if len(self._scratch) >= 2:
                del self._scratch[next(iter(self._scratch))]
            self._scratch[key] = _Scratch(self.num_streams, self.blocks(dtype, values), steps, dtype, self.device)
        return self._scratch[key]

    @staticmethod
    def blocks(dtype: torch.dtype, values: int) -> int:
        """Philox blocks of a row of ``values`` draws in ``dtype``."""
        return -(-values // _LAYOUT[dtype][0])

    def fill(self, out: torch.Tensor, step: Step) -> torch.Tensor:
        """Fill ``out`` (``(streams, ...)``, floating point) with the draw at ``step``; returns ``out``.

        ``step``: an int in ``[0, 2^62)`` or a 0-d int64 tensor (read on the device). Draws in float32 and
        float64 are made in their dtype, in other floating dtypes in float32 and rounded."""
        if out.dim() == 0 or out.shape[0] != self.num_streams:
            raise ValueError(f"out must have {self.num_streams} rows (one per stream); got {tuple(out.shape)}")
        if not out.is_floating_point():
            raise ValueError(f"out must be a floating-point tensor; got {out.dtype}")
        _check_step(step)
        values = out[0].numel()
        if values == 0:
            return out
        dtype = out.dtype if out.dtype in _LAYOUT else torch.float32
        ahead = (
            1 if torch.is_tensor(step) else max(1, DRAW_AHEAD_BLOCKS // (self.num_streams * self.blocks(dtype, values)))
        )
        s = self.scratch(dtype, values, ahead)
        if s.first is not None and not torch.is_tensor(step) and 0 <= step - s.first < s.steps:  # drawn ahead
            return self._copy(s, step - s.first, out, values)
        per_block = _LAYOUT[dtype][0]
        direct = s.steps == 1 and out.dtype == dtype and out.is_contiguous() and values == s.blocks * per_block
        target = out.view(1, self.num_streams, s.blocks, per_block).unbind(-1) if direct else s.staging_values
        self._rounds(s, step)
        self._box_muller(s, target)
        s.first = None if direct or torch.is_tensor(step) else step
        return out if direct else self._copy(s, 0, out, values)

    def _copy(self, s: _Scratch, index: int, out: torch.Tensor, values: int) -> torch.Tensor:
        """Copy the draws of step ``s.first + index`` from the staging buffer into ``out``."""
        flat = s.staging[index].view(self.num_streams, -1)[:, :values]
        if out.is_contiguous():
            out.view(self.num_streams, values).copy_(flat)
        else:
            out.copy_(flat.reshape(out.shape))
        return out

    def _rounds(self, s: _Scratch, step: Step) -> None:
        """The ten rounds; after them ``s.h`` holds the words ``(x2, x0)`` and the last product ``(x3, x1)``
        (its low 32 bits). Lanes: ``a = (x0, x2)``; the products ``(p0, p2)`` hold ``(x3, x1)`` of the next
        round in their low words, unmasked.

        Five passes a round: the product :math:`p = a M` of a word and an unsigned multiplier is taken modulo
        :math:`2^{64}` (the int64 multiplication wraps, as the hardware's does: the bits of the 64-bit product
        are exact), so its high word is bits 32-63 of ``p >> 32``; the arithmetic shift's sign bits above
        them, and the bits above the low word of the previous product, are cleared by one mask after the xors
        (:math:`(h \\oplus p' \\oplus k) \\wedge (2^{32} - 1)`, as ``k < 2^{32}``)."""
        steps, shifted = s.step_words
        torch.add(s.offsets, step, out=steps)  # the steps t, t + 1, ... evaluated together
        s.step_high.copy_(torch.bitwise_right_shift(steps, 32, out=shifted))
        torch.bitwise_and(steps, _MASK, out=s.step_low)
        # round 0 on the counter, which every stream shares; the keys spread it over the streams
        torch.mul(s.counter_a, self.multipliers, out=s.first_product)
        torch.bitwise_right_shift(s.first_product, 32, out=s.first_high)
        s.first_high.bitwise_xor_(s.counter_b).bitwise_and_(_MASK)
        k0, k1 = self.round_keys[0]
        torch.bitwise_xor(s.first_high_lanes[1], k0, out=s.a_lanes[0])
        torch.bitwise_xor(s.first_high_lanes[0], k1, out=s.a_lanes[1])
        low = s.first_product
        for r in range(1, ROUNDS):
            product = s.products[r % 2]
            torch.mul(s.a, self.multipliers, out=product)
            torch.bitwise_right_shift(product, 32, out=s.h).bitwise_xor_(low)  # (h0 ^ x3, h1 ^ x1), high bits junk
            if r < ROUNDS - 1:
                k0, k1 = self.round_keys[r]
                torch.bitwise_xor(s.h_lanes[1], k0, out=s.a_lanes[0])
                torch.bitwise_xor(s.h_lanes[0], k1, out=s.a_lanes[1])
                s.a.bitwise_and_(_MASK)
            else:
                s.h.bitwise_xor_(self.last_key).bitwise_and_(s.last_mask)
            low = product

    def _box_muller(self, s: _Scratch, out: Tuple[torch.Tensor, ...]) -> None:
        """Normals from the words of :meth:`_rounds` into ``out`` (the values of each block: ``per block`` views
        ``(streams, blocks)``), by :func:`normals`' formulas in the same operations (so the same bits)."""
        high, low = s.h, s.products[(ROUNDS - 1) % 2]  # high (x2, x0), low (x3, x1) unmasked
        radius, angle, cosine = s.radius_lanes, s.angle_lanes, s.cosine_lanes
        if s.dtype == torch.float32:
            # w with its low 9 bits cleared is k 2^9, k < 2^23: exact in float32, and k 2^-23 = (k 2^9) 2^-32
            torch.add(s.half, s.radius.copy_(high), alpha=2.0**-32, out=s.radius)  # (u2, u0)
            s.radius.log_().mul_(-2.0).sqrt_()
            low.bitwise_and_(s.last_mask)
            torch.add(s.half, s.angle.copy_(low), alpha=2.0**-32, out=s.angle).mul_(_TWO_PI)  # (u3, u1) * 2 pi
            torch.cos(s.angle, out=s.cosine)
            s.angle.sin_()
            for lane, first in ((1, 0), (0, 2)):  # (r0, angle1) -> z0, z1; (r2, angle3) -> z2, z3
                torch.mul(radius[lane], cosine[lane], out=out[first])
                torch.mul(radius[lane], angle[lane], out=out[first + 1])
        else:
            low.bitwise_and_(_MASK)
            high.bitwise_left_shift_(20).bitwise_or_(low)  # bits of (u1, u0): (w >> 12) << 32 = (w & ~4095) << 20
            torch.add(s.half, s.uniform.copy_(high), alpha=2.0**-52, out=s.uniform)
            torch.log(s.uniform_lanes[1], out=s.radius).mul_(-2.0).sqrt_()
            angle = s.uniform_lanes[0].mul_(_TWO_PI)
            torch.cos(angle, out=s.cosine)
            angle.sin_()
            torch.mul(s.radius, s.cosine, out=out[0])
            torch.mul(s.radius, angle, out=out[1])
