"""Computed permutations (``pyro_sgmcmc.chains.permutation``) and the minibatch sampler that uses them.

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

from pyro_sgmcmc.chains.minibatch import MinibatchSampler
from pyro_sgmcmc.chains.permutation import NUM_ROUNDS, KeyedPermutation
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.model.potential import SubsamplePlate


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


def _samplers(n: int, batch: int, chains: int, seed: int = 0):
    plate = SubsamplePlate("data", n, batch)
    table = MinibatchSampler([plate], ChainGenerators(seed, range(chains)))
    computed = MinibatchSampler([plate], ChainGenerators(seed, range(chains)), table_limit=0)
    assert "data" in table.permutations and "data" in computed.keys and "data" not in computed.permutations
    return table, computed


@pytest.mark.parametrize("n, batch", [(1000, 10), (1003, 100), (97, 97), (5000, 7)])
def test_computed_sampler_epochs_cover_the_data_once(n, batch):
    """Computed permutations keep the table's epoch contract: within an epoch each chain's minibatches
    are disjoint and cover floor(N / B) * B distinct data; the next epoch reshuffles (new keys)."""
    _, sampler = _samplers(n, batch, chains=3)
    steps = n // batch
    for _epoch in range(2):
        epoch = torch.cat([sampler.next()["data"] for _ in range(steps)], dim=-1)
        assert epoch.shape == (3, steps * batch)
        for row in epoch:
            assert len(torch.unique(row)) == steps * batch and int(row.min()) >= 0 and int(row.max()) < n
    assert not torch.equal(epoch[0], epoch[1])  # chains differ


def test_computed_sampler_minibatches_are_uniform():
    """Inclusion counts of each datum over many chains' first minibatch: uniform (chi-square)."""
    n, batch, chains = 40, 8, 5000
    _, sampler = _samplers(n, batch, chains, seed=3)
    first = sampler.next()["data"]
    counts = torch.bincount(first.reshape(-1), minlength=n)
    assert _chi2(counts, chains * batch / n) < chi2.ppf(0.999, n - 1)


def test_computed_sampler_resumes_exactly_and_is_reproducible():
    _, sampler = _samplers(500, 30, chains=4, seed=7)
    for _ in range(20):  # into the second epoch (16 steps per epoch)
        sampler.next()
    saved, generator_states = sampler.state_dict(), sampler.generators.get_state()
    ahead = [sampler.next()["data"] for _ in range(30)]
    _, other = _samplers(500, 30, chains=4, seed=7)
    other.load_state_dict(saved)
    other.generators.set_state(generator_states)
    assert all(torch.equal(a, other.next()["data"]) for a in ahead)
    _, again = _samplers(500, 30, chains=4, seed=7)
    _, fresh = _samplers(500, 30, chains=4, seed=7)
    assert all(torch.equal(again.next()["data"], fresh.next()["data"]) for _ in range(20))


def test_large_data_many_chains_use_computed_permutations():
    """At N = 10^7 and 32 chains a table would be 2.6 GB: the sampler holds keys instead."""
    plate = SubsamplePlate("data", 10**7, 100)
    sampler = MinibatchSampler([plate], ChainGenerators(0, range(32)))
    assert sampler.permutations == {} and sampler.keys["data"].shape == (32, NUM_ROUNDS)
    batch = sampler.next()["data"]
    assert batch.shape == (32, 100) and all(len(torch.unique(row)) == 100 for row in batch)
