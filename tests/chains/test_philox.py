"""Philox4x32-10 in tensor operations, and the keyed noise streams built on it.

Oracles:

* exact: Random123's published known-answer vectors for philox4x32-10, and a plain-Python integer implementation
  of the rounds (written here from Salmon et al. 2011, no tensors) on random counters and keys; the uniforms'
  formulas evaluated in exact rational arithmetic; the batched draw (:class:`PhiloxNormals`) against the
  composition of the reference functions, bit for bit;
* statistical: moments, KS tests and correlations of about 10^6 draws, each in units of its Monte Carlo
  standard error (written beside the assertion), at ``Z = 5`` (a two-sided normal tail of 6e-7 per assertion;
  the seeds are fixed, so the test is deterministic);
* the counter property: chain ``c``'s draw at step ``t`` is the same alone, beside 3 or 400 other chains and in
  any order, and the number of ATen operators of a draw does not depend on the number of chains.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch
from scipy import stats
from torch.utils._python_dispatch import TorchDispatchMode

from pyro_sgmcmc.chains.philox import MULTIPLIERS, WEYL, PhiloxNormals, mulhilo, normals, philox4x32, uniforms
from pyro_sgmcmc.chains.streams import PURPOSES, ChainGenerators

MASK = 0xFFFFFFFF
Z = 5.0  # standard errors: a two-sided normal tail of 5.7e-7 per assertion
# Random123 (tests/kat_vectors): philox4x32 10, counter, key, expected words
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def reference_block(counter, key):
    """Philox4x32-10 on Python ints (unbounded: no overflow question arises)."""
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + WEYL[0]) & MASK, (k1 + WEYL[1]) & MASK
        p0, p1 = MULTIPLIERS[0] * x0, MULTIPLIERS[1] * x2
        x0, x1, x2, x3 = (p1 >> 32) ^ x1 ^ k0, p1 & MASK, (p0 >> 32) ^ x3 ^ k1, p0 & MASK
    return x0, x1, x2, x3


def words(values):
    return torch.tensor(values, dtype=torch.long)


# ---------------------------------------------------------------------- exact references
@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS, ids=["zeros", "ones", "pi"])
def test_known_answer_vectors(counter, key, expected):
    assert reference_block(counter, key) == expected  # the plain reference agrees with Random123 ...
    assert tuple(philox4x32(words(counter), words(key)).tolist()) == expected  # ... and so do the tensor ops


def test_blocks_equal_the_plain_python_rounds_on_random_words():
    rng = random.Random(20111112)
    edges = [0, 1, 2**31 - 1, 2**31, MASK - 1, MASK]
    counters = [[rng.choice(edges) for _ in range(4)] for _ in range(50)]
    counters += [[rng.getrandbits(32) for _ in range(4)] for _ in range(950)]
    keys = [[rng.choice(edges + [rng.getrandbits(32)]) for _ in range(2)] for _ in range(1000)]
    expected = [reference_block(c, k) for c, k in zip(counters, keys)]
    assert philox4x32(words(counters), words(keys)).tolist() == [list(e) for e in expected]
    # broadcasting: one key, many counters
    got = philox4x32(words(counters[:7]), words(keys[0]))
    assert got.tolist() == [list(reference_block(c, keys[0])) for c in counters[:7]]


@pytest.mark.parametrize("multiplier", MULTIPLIERS)
def test_mulhilo_is_the_exact_64_bit_product_without_overflow(multiplier):
    """The worst case 0xD2511F53 * 0xFFFFFFFF overflows a signed int64; the decomposition never does."""
    rng = random.Random(1)
    values = [0, 1, 2, 2**31 - 1, 2**31, 2**32 - 2, MASK] + [rng.getrandbits(32) for _ in range(2000)]
    word = words(values)
    high, low = mulhilo(word, multiplier)
    assert [(h << 32) | lo for h, lo in zip(high.tolist(), low.tolist())] == [v * multiplier for v in values]
    assert int(high.min()) >= 0 and int(high.max()) <= MASK and int(low.min()) >= 0 and int(low.max()) <= MASK
    assert MASK * multiplier >= 2**63  # the plain product of the largest word would have overflowed int64
    assert min(v * (multiplier - 2**32) for v in values) > -(2**62)  # the decomposition's product fits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_uniforms_are_the_exact_formula_and_never_0_or_1(dtype):
    rng = random.Random(2)
    blocks = [[0, 0, 0, 0], [MASK] * 4, [0, MASK, MASK, 0]] + [
        [rng.getrandbits(32) for _ in range(4)] for _ in range(500)
    ]
    got = uniforms(words(blocks), dtype)
    for block, row in zip(blocks, got.tolist()):
        if dtype == torch.float32:
            expected = [(Fraction(w >> 9) + Fraction(1, 2)) / 2**23 for w in block]
        else:
            expected = [(Fraction(((block[i] >> 12) << 32) | block[i + 1]) + Fraction(1, 2)) / 2**52 for i in (0, 2)]
        assert [Fraction(u) for u in row] == expected  # exact: no rounding anywhere
    eps = 2.0 ** (-24 if dtype == torch.float32 else -53)
    assert got[0].tolist() == [eps] * got.shape[1] and got[1].tolist() == [1 - eps] * got.shape[1]
    assert 0 < float(got.min()) and float(got.max()) < 1


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 4e-6), (torch.float64, 1e-13)])
def test_normals_are_box_muller_of_the_uniforms(dtype, tolerance):
    """Against the formula in float64 Python maths; tolerance: a few units of the dtype's rounding of values
    up to |z| <= 8.6 (float32 eps 1.2e-7 times about 30)."""
    rng = random.Random(3)
    blocks = [[rng.getrandbits(32) for _ in range(4)] for _ in range(2000)] + [[0, 0, 0, 0], [MASK] * 4]
    u = uniforms(words(blocks), dtype).double().tolist()
    expected = []
    for row in u:
        out = []
        for i in range(0, len(row), 2):
            radius, angle = math.sqrt(-2 * math.log(row[i])), 2 * math.pi * row[i + 1]
            out += [radius * math.cos(angle), radius * math.sin(angle)]
        expected.append(out)
    got = normals(words(blocks), dtype)
    assert got.dtype == dtype and got.shape == (len(blocks), 4 if dtype == torch.float32 else 2)
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=tolerance)


def draw_by_reference(keys, step, values, dtype):
    """Rows of :class:`PhiloxNormals` by the reference functions: blocks ``(b, t mod 2^32, t // 2^32, 0)``."""
    per_block = 4 if dtype == torch.float32 else 2
    blocks = -(-values // per_block)
    counter = torch.zeros(blocks, 4, dtype=torch.long)
    counter[:, 0], counter[:, 1], counter[:, 2] = torch.arange(blocks), step & MASK, step >> 32
    return normals(philox4x32(counter, keys.unsqueeze(1)), dtype).flatten(1)[:, :values]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("values", [1, 3, 4, 5, 64, 3151])
def test_batched_draws_equal_the_reference_composition_bit_for_bit(dtype, values):
    keys = words([[random.Random(c).getrandbits(32) for _ in range(2)] for c in range(5)])
    draws = PhiloxNormals(keys)
    for step in (0, 7, 2**32 + 5, 2**61 + 2**33 + 1):
        expected = draw_by_reference(keys, step, values, dtype)
        assert torch.equal(draws.fill(torch.empty(5, values, dtype=dtype), step), expected), step
        assert torch.equal(draws.fill(torch.empty(5, values, dtype=dtype), torch.tensor(step)), expected), step
    strided = torch.empty(values, 5, dtype=dtype).T  # a non-contiguous buffer is filled the same
    assert torch.equal(draws.fill(strided, 7), draw_by_reference(keys, 7, values, dtype))


def test_other_floating_dtypes_get_the_float32_draw_rounded():
    streams = ChainGenerators(4, range(3))
    half = streams.normal((9,), torch.float16, step=2)
    assert torch.equal(half, streams.normal((9,), torch.float32, step=2).half())


# ---------------------------------------------------------------------- the counter property
@pytest.mark.parametrize("dtype, shape", [(torch.float32, (3151,)), (torch.float64, (7,)), (torch.float32, (2, 3))])
def test_a_chains_draw_depends_on_its_seed_id_purpose_and_step_only(dtype, shape):
    for step in (0, 13, 2**32 + 3):
        alone = ChainGenerators(9, [3]).normal(shape, dtype, step=step)[0]
        beside_3 = ChainGenerators(9, range(4)).normal(shape, dtype, step=step)[3]
        beside_400 = ChainGenerators(9, range(401)).normal(shape, dtype, step=step)[3]
        reordered = ChainGenerators(9, [7, 3, 0, 500]).normal(shape, dtype, step=step)[1]
        assert torch.equal(alone, beside_3) and torch.equal(alone, beside_400) and torch.equal(alone, reordered)
    reference = ChainGenerators(9, [3]).normal(shape, dtype, step=13)
    for other in (
        ChainGenerators(10, [3]).normal(shape, dtype, step=13),  # another seed
        ChainGenerators(9, [4]).normal(shape, dtype, step=13),  # another chain
        ChainGenerators(9, [3]).normal(shape, dtype, step=14),  # another step
        ChainGenerators(9, [3]).normal(shape, dtype, step=13, purpose="init_momentum"),  # another purpose
    ):
        assert not torch.equal(reference, other)


def test_a_longer_draw_starts_with_the_shorter_one():
    streams = ChainGenerators(1, range(3))
    assert torch.equal(
        streams.normal((5,), torch.float32, step=4), streams.normal((3151,), torch.float32, step=4)[:, :5]
    )


def test_draws_leave_torch_global_generator_alone():
    state = torch.get_rng_state()
    ChainGenerators(5, range(4)).normal((10,), torch.float32, step=1)
    assert torch.equal(state, torch.get_rng_state())


class _Operators(TorchDispatchMode):
    """The names of the ATen operators dispatched in the block."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_number_of_operators_does_not_depend_on_the_number_of_chains(dtype):
    """A step on the device (a 0-d tensor, as a CUDA graph replays it): the same operators at 1, 256 and 4096
    chains, none of which reads a value back to the host. A step given as an int: each call is the same
    evaluation, or (few chains) a copy from the steps evaluated ahead with it."""
    on_device, evaluations, copies = set(), set(), set()
    for num_chains in (1, 256, 4096):
        streams = ChainGenerators(0, range(num_chains))
        out = torch.empty(num_chains, 37, dtype=dtype)
        streams.fill_normal(out, step=torch.tensor(0))  # the first draw of a shape sets up its buffers
        with _Operators() as operators:
            streams.fill_normal(out, step=torch.tensor(1))
        on_device.add(len(operators.names))
        assert not any("_local_scalar_dense" in name or "item" in name for name in operators.names)  # no sync
        streams.fill_normal(out, step=0)  # an int step's buffers (several steps at a time) are set up apart
        for step in range(1, 40):
            with _Operators() as operators:
                streams.fill_normal(out, step=step)
            (evaluations if len(operators.names) > 10 else copies).add(len(operators.names))
    assert len(on_device) == 1 and on_device.pop() < 100
    assert len(evaluations) == 1 and max(copies) <= 6


def test_draws_made_ahead_equal_draws_made_alone():
    """With few chains an int step's evaluation covers the next steps: each equals its own evaluation."""
    ahead = ChainGenerators(6, [1, 4])
    for step in [*range(30), 3, 2**40, 2**40 + 1, 0]:
        alone = ChainGenerators(6, [1, 4]).fill_normal(torch.empty(2, 3151), step=torch.tensor(step))
        assert torch.equal(ahead.normal((3151,), torch.float32, step=step), alone), step


# ---------------------------------------------------------------------- statistics
def _draws(dtype, num_chains=256, values=1024, steps=4, purpose="noise"):
    streams = ChainGenerators(2026, range(num_chains))
    return torch.stack([streams.normal((values,), dtype, step=t, purpose=purpose) for t in range(steps)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_moments_of_the_normals(dtype):
    z = _draws(dtype).double().flatten()
    n = z.numel()
    mean, var = z.mean(), z.var()
    centred = (z - mean) / var.sqrt()
    skew, kurt = centred.pow(3).mean(), centred.pow(4).mean() - 3
    assert abs(float(mean)) < Z / math.sqrt(n)  # se of the mean: 1 / sqrt(n)
    assert abs(float(var) - 1) < Z * math.sqrt(2 / n)  # se of the variance: sqrt((m4 - 1) / n) = sqrt(2 / n)
    assert abs(float(skew)) < Z * math.sqrt(6 / n)  # se of the skewness: sqrt(6 / n)
    assert abs(float(kurt)) < Z * math.sqrt(24 / n)  # se of the excess kurtosis: sqrt(24 / n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_normals_and_uniforms_pass_kolmogorov_smirnov(dtype):
    z = _draws(dtype).double().flatten().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-6  # n = 2^20: detects a CDF error of about 3e-3
    rng = random.Random(4)
    raw = uniforms(words([[rng.getrandbits(32) for _ in range(4)] for _ in range(2**17)]), dtype)
    assert stats.kstest(raw.double().flatten().numpy(), "uniform").pvalue > 1e-6
    keyed = philox4x32(torch.stack([torch.arange(2**17), *torch.zeros(3, 2**17, dtype=torch.long)], -1), words([1, 2]))
    assert stats.kstest(uniforms(keyed, dtype).double().flatten().numpy(), "uniform").pvalue > 1e-6  # a plain counter


def _correlation(x, y):
    x, y = x.double().flatten(), y.double().flatten()
    return float(torch.corrcoef(torch.stack([x, y]))[0, 1]), x.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_correlation_between_chains_steps_positions_and_purposes(dtype):
    z = _draws(dtype)  # (steps, chains, values)
    momentum = _draws(dtype, purpose="init_momentum")
    pairs = {
        "neighbouring chains": (z[:, :-1], z[:, 1:]),
        "consecutive steps": (z[:-1], z[1:]),
        "neighbouring values (a Box-Muller pair or a block boundary)": (z[..., :-1], z[..., 1:]),
        "values of neighbouring blocks": (z[..., :-4], z[..., 4:]),
        "squares of a Box-Muller pair": (z[..., 0::2] ** 2, z[..., 1::2] ** 2),
        "purposes at the same step": (z, momentum),
    }
    for what, (x, y) in pairs.items():
        r, n = _correlation(x, y)
        assert abs(r) < Z / math.sqrt(n), (what, r)  # se of a correlation of independent variables: 1 / sqrt(n)


# ---------------------------------------------------------------------- interface and devices
def test_bad_arguments_are_refused_naming_them():
    streams = ChainGenerators(0, range(2))
    out = torch.empty(2, 3)
    for step in (-1, 2**62, 1.0, True, torch.tensor([1]), torch.tensor(1.0), torch.tensor(1, dtype=torch.int32)):
        with pytest.raises(ValueError, match="step"):
            streams.fill_normal(out, step=step)
    with pytest.raises(ValueError, match="purpose"):
        streams.fill_normal(out, step=0, purpose="minibatch")
    with pytest.raises(ValueError, match="out"):
        streams.fill_normal(torch.empty(3, 3), step=0)
    with pytest.raises(ValueError, match="out"):
        streams.fill_normal(torch.empty(2, 3, dtype=torch.long), step=0)
    with pytest.raises(ValueError, match="chain_ids"):
        ChainGenerators(0, [-1])
    with pytest.raises(ValueError, match="seed"):
        ChainGenerators(-3, [0])
    assert set(PURPOSES) == {"noise", "init_momentum"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_cuda_draws_equal_the_cpu_draws_without_synchronising(dtype, tolerance):
    """The words and uniforms are integers and exact arithmetic: equal on both devices; the normals go
    through the devices' own log, cos and sin, so they agree to a few units of rounding (values |z| < 9)."""
    cpu, cuda = ChainGenerators(8, range(300)), ChainGenerators(8, range(300), "cuda")
    expected = cpu.normal((101,), dtype, step=2**32 + 9)
    step = torch.tensor(2**32 + 9, device="cuda")
    out = torch.empty(300, 101, dtype=dtype, device="cuda")
    cuda.fill_normal(out, step=step)  # set-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        cuda.fill_normal(out, step=step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.allclose(out.cpu(), expected, rtol=0, atol=tolerance)
    block = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(philox4x32(block.cuda(), words([1, 2]).cuda()).cpu(), philox4x32(block, words([1, 2])))
