"""Keyed permutations (``pyro_sgmcmc.chains.permutation``) and their keys per epoch.

Exactness: a keyed bijection of ``range(2^m)`` read with the values ``>= n`` skipped must give every
``i < n`` exactly once. Randomness: over many random keys, the position of a datum, the inclusion of
each datum in a minibatch and the ordered pair of the first two values must be uniform. Each is a
chi-square test with a fixed seed against the 99.9 % quantile of its distribution, so a correct
generator fails with probability 1e-3 per test (and, seeded, never changes); the weak hash first tried
(multiply-shift) had adjacent positions map to adjacent values and gave a pair statistic of 25,000
against a quantile of 2,670.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from pyro_sgmcmc.chains.permutation import NUM_ROUNDS, KeyedPermutation, epoch_keys, mix31


def _keys(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2**31, (rows, NUM_ROUNDS), generator=torch.Generator().manual_seed(seed))


def _orders(n: int, keys: torch.Tensor) -> torch.Tensor:
    """Each row's permutation of range(n): the bijection of range(span) read in order, values >= n skipped."""
    permutation = KeyedPermutation(n, keys)
    values = permutation(torch.arange(permutation.span).expand(len(keys), -1).contiguous())
    return torch.stack([row[row < n] for row in values])


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097, 100_003])
def test_every_datum_exactly_once(n):
    orders = _orders(n, _keys(3))
    for row in orders:
        assert torch.equal(row.sort().values, torch.arange(n))
    if n > 3:  # different keys, different orders
        assert not torch.equal(orders[0], orders[1])


def _chi2(counts: torch.Tensor, expected: float) -> float:
    return float(((counts.double() - expected) ** 2 / expected).sum())


def test_orders_are_uniform():
    n, batch, rows = 50, 10, 20_000
    orders = _orders(n, _keys(rows, seed=1))
    # position of datum 0
    position = (orders == 0).int().argmax(-1)
    assert _chi2(torch.bincount(position, minlength=n), rows / n) < chi2.ppf(0.999, n - 1)
    # inclusion of each datum in the first minibatch of B
    inclusion = torch.bincount(orders[:, :batch].reshape(-1), minlength=n)
    assert _chi2(inclusion, rows * batch / n) < chi2.ppf(0.999, n - 1)
    # the ordered pair (first, second): uniform over the n (n - 1) pairs of distinct data
    pairs = torch.bincount(orders[:, 0] * n + orders[:, 1], minlength=n * n).reshape(n, n)
    off_diagonal = pairs[~torch.eye(n, dtype=torch.bool)]
    assert int(pairs.diagonal().sum()) == 0
    assert _chi2(off_diagonal, rows / (n * (n - 1))) < chi2.ppf(0.999, n * (n - 1) - 1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n must be at least 1"):
        KeyedPermutation(0, _keys(1))
    with pytest.raises(ValueError, match="keys must be a LongTensor"):
        KeyedPermutation(10, torch.zeros(2, 3, dtype=torch.long))


def test_order_is_the_bijection_read_with_the_large_values_skipped():
    """``order`` (chunked, rows together) equals the reference reading, for chunks that split the rows unevenly."""
    for n, rows in [(1, 2), (5, 3), (1000, 4), (4097, 2)]:
        keys = _keys(rows, seed=n)
        for chunk in (3, 64, 1000, 2**18):
            assert torch.equal(KeyedPermutation(n, keys).order(chunk=chunk), _orders(n, keys)), (n, chunk)


def test_mixer_is_a_bijection_of_31_bits_for_a_fixed_key():
    """On a window of 2^20 inputs: no two collide (a bijection of [0, 2^31) restricted), all below 2^31."""
    values = torch.arange(2**20) * 2047 + 12345
    hashed = mix31(values, torch.tensor(987654321), 0x5BD1E995)
    assert int(hashed.max()) < 2**31 and int(hashed.min()) >= 0 and len(torch.unique(hashed)) == len(values)


def _epoch_orders(n: int, epochs: int, seed: int = 0) -> torch.Tensor:
    """One stream's first ``epochs`` permutations (keys from :func:`epoch_keys`), ``(epochs, n)``."""
    bases = torch.randint(0, 2**31, (1, 2, NUM_ROUNDS), generator=torch.Generator().manual_seed(seed))
    keys = epoch_keys(bases.expand(epochs, -1, -1), torch.arange(1, epochs + 1).unsqueeze(-1))
    assert len({tuple(row.tolist()) for row in keys}) == epochs  # distinct epochs, distinct keys
    return _orders(n, keys)


def test_the_epochs_of_one_stream_are_uniform():
    """The same chi-square tests over the successive epochs of *one* stream (keys derived from the epoch
    number, not drawn): position of a datum, first-minibatch inclusion, ordered first pair."""
    n, batch, epochs = 50, 10, 20_000
    orders = _epoch_orders(n, epochs, seed=4)
    position = (orders == 0).int().argmax(-1)
    assert _chi2(torch.bincount(position, minlength=n), epochs / n) < chi2.ppf(0.999, n - 1)
    inclusion = torch.bincount(orders[:, :batch].reshape(-1), minlength=n)
    assert _chi2(inclusion, epochs * batch / n) < chi2.ppf(0.999, n - 1)
    pairs = torch.bincount(orders[:, 0] * n + orders[:, 1], minlength=n * n).reshape(n, n)
    off_diagonal = pairs[~torch.eye(n, dtype=torch.bool)]
    assert _chi2(off_diagonal, epochs / (n * (n - 1))) < chi2.ppf(0.999, n * (n - 1) - 1)


def test_successive_epochs_are_not_correlated():
    """The position of datum 0 in epoch e against epoch e + 1 of one stream: uniform over the n^2 pairs."""
    n, epochs = 20, 40_001
    orders = _epoch_orders(n, epochs, seed=5)
    position = (orders == 0).int().argmax(-1)
    pairs = torch.bincount(position[:-1] * n + position[1:], minlength=n * n)
    assert _chi2(pairs, (epochs - 1) / n**2) < chi2.ppf(0.999, n * n - 1)
