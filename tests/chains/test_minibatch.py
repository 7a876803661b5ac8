"""The minibatch sampler (``pyro_sgmcmc.chains.minibatch``): one method, one stream per (seed, chain, plate).

Each chain's epochs are keyed permutations whose keys come from ``(seed, chain id, plate, epoch)``;
the sampler evaluates them ahead in blocks (whole epochs when they fit, else parts of one), and the
indices must not depend on how: :func:`epoch_orders` (whole epochs, materialised) is the reference.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

import pyro_sgmcmc.chains.minibatch as minibatch
from pyro_sgmcmc.chains.minibatch import DRAW_AHEAD_ON_DEVICE, MinibatchSampler, epoch_orders
from pyro_sgmcmc.chains.permutation import NUM_ROUNDS
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.model.potential import SubsamplePlate


def _sampler(n: int, batch: int, chains, seed: int = 0, **options) -> MinibatchSampler:
    chain_ids = range(chains) if isinstance(chains, int) else chains
    return MinibatchSampler([SubsamplePlate("data", n, batch)], ChainGenerators(seed, chain_ids), **options)


def _epochs(sampler: MinibatchSampler, n: int, batch: int, epochs: int, name: str = "data") -> torch.Tensor:
    """``(epochs, num_chains, (n // batch) * batch)``: the indices of the next whole epochs, step by step."""
    steps = n // batch
    return torch.stack([torch.cat([sampler.next()[name] for _ in range(steps)], dim=-1) for _ in range(epochs)])


@pytest.mark.parametrize("n, batch, chains", [(1000, 10, 3), (1003, 100, 4), (97, 97, 2), (5000, 7, 1), (1, 1, 2)])
def test_the_stream_is_the_keyed_permutation_however_it_is_drawn_ahead(n, batch, chains):
    """Whole epochs at once, parts of an epoch, one step at a time: the same indices, those of epoch_orders."""
    reference = torch.stack(
        [epoch_orders(ChainGenerators(0, range(chains)), "data", n, e)[:, : (n // batch) * batch] for e in (1, 2, 3)]
    )
    for draw_ahead in (1, 50, 2**12, 2**16, 2**18, DRAW_AHEAD_ON_DEVICE):  # the last: the default on a GPU
        assert torch.equal(_epochs(_sampler(n, batch, chains, draw_ahead=draw_ahead), n, batch, 3), reference)


@pytest.mark.parametrize("n, batch", [(1000, 10), (1003, 100), (97, 97), (5000, 7)])
def test_epochs_cover_the_data_once(n, batch):
    """Within an epoch each chain's minibatches are disjoint and cover floor(N / B) * B distinct data;
    the next epoch reshuffles; the chains differ."""
    epochs = _epochs(_sampler(n, batch, 3), n, batch, 2)
    for epoch in epochs:
        for row in epoch:
            assert len(torch.unique(row)) == (n // batch) * batch and int(row.min()) >= 0 and int(row.max()) < n
    if n > batch:
        assert not torch.equal(epochs[0, 0], epochs[1, 0])  # reshuffled
    assert not torch.equal(epochs[0, 0], epochs[0, 1])  # chains differ


def _chi2(counts: torch.Tensor, expected: float) -> float:
    return float(((counts.double() - expected) ** 2 / expected).sum())


def test_first_minibatches_are_uniform_over_chains():
    """Inclusion counts of each datum over many chains' first minibatch: uniform (chi-square, 99.9 %)."""
    n, batch, chains = 40, 8, 5000
    first = _sampler(n, batch, chains, seed=3).next()["data"]
    counts = torch.bincount(first.reshape(-1), minlength=n)
    assert _chi2(counts, chains * batch / n) < chi2.ppf(0.999, n - 1)


def test_a_chain_stream_depends_on_seed_chain_and_plate_only():
    """Chain 5's indices: the same beside other chains, alone, and beside other plates (in any order);
    another seed, chain or plate name gives another stream."""
    a, b = SubsamplePlate("a", 300, 7), SubsamplePlate("b", 50, 5)

    def chain_5(plates, chain_ids, seed=1, plate="a", steps=100, chain=5):
        sampler = MinibatchSampler(plates, ChainGenerators(seed, chain_ids))
        row = list(chain_ids).index(chain)
        return torch.stack([sampler.next()[plate][row] for _ in range(steps)])

    alone = chain_5([a], [5])
    assert torch.equal(alone, chain_5([a], range(8)))
    assert torch.equal(alone, chain_5([b, a], range(40)))
    assert torch.equal(alone, chain_5([a, b], [9, 5]))
    assert not torch.equal(alone, chain_5([a], [5], seed=2))
    assert not torch.equal(alone, chain_5([a], [6, 5], chain=6))
    renamed = SubsamplePlate("b", 300, 7)
    assert not torch.equal(alone, chain_5([renamed], [5], plate="b"))


def test_minibatches_do_not_use_the_noise_streams():
    """The noise of a step is the same whether minibatches were drawn before it or not."""
    sampler = _sampler(100, 10, 2, seed=4)
    before = sampler.generators.normal((5,), torch.float32, step=3)
    for _ in range(25):
        sampler.next()
    assert torch.equal(before, sampler.generators.normal((5,), torch.float32, step=3))
    assert torch.equal(before, ChainGenerators(4, range(2)).normal((5,), torch.float32, step=3))


@pytest.mark.parametrize("draw_ahead", [1, 2**16])
def test_resumes_exactly_and_is_reproducible(draw_ahead):
    sampler = _sampler(500, 30, 4, seed=7, draw_ahead=draw_ahead)
    for _ in range(20):  # into the second epoch (16 steps per epoch)
        sampler.next()
    saved = sampler.state_dict()
    assert saved["permutations"] == {} and saved["epochs"] == {"data": 2}
    ahead = [sampler.next()["data"] for _ in range(30)]
    for other_draw_ahead in (1, 100, 2**16):  # the state does not depend on the drawing ahead either
        other = _sampler(500, 30, 4, seed=7, draw_ahead=other_draw_ahead)
        other.load_state_dict(saved)
        assert all(torch.equal(a, other.next()["data"]) for a in ahead)
    again, fresh = _sampler(500, 30, 4, seed=7), _sampler(500, 30, 4, seed=7)
    assert all(torch.equal(again.next()["data"], fresh.next()["data"]) for _ in range(20))


def test_a_state_of_the_earlier_samplers_is_refused():
    """States with permutation tables, or with keys drawn from the generators, cannot be continued."""
    sampler = _sampler(500, 30, 2)
    sampler.next()
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="earlier pyro_sgmcmc"):
        _sampler(500, 30, 2).load_state_dict({**state, "permutations": {"data": torch.zeros(2, 500).long()}})
    with pytest.raises(ValueError, match="earlier pyro_sgmcmc"):
        _sampler(500, 30, 2).load_state_dict({**state, "keys": {"data": state["keys"]["data"] + 1}})


def test_large_data_many_chains_hold_no_table():
    """At N = 10^7 and 32 chains a table would be 2.6 GB: the sampler holds keys and a block of indices."""
    sampler = _sampler(10**7, 100, 32)
    batch = sampler.next()["data"]
    assert batch.shape == (32, 100) and all(len(torch.unique(row)) == 100 for row in batch)
    assert sampler.keys["data"].shape == (32, NUM_ROUNDS)
    held = sum(t.numel() for block in sampler.ahead.values() for t in (block.values, block.positions))
    assert held <= 4 * minibatch.DRAW_AHEAD


def test_deprecated_table_spellings_warn_and_have_no_effect():
    with pytest.warns(FutureWarning, match="table_limit"):
        sampler = MinibatchSampler([SubsamplePlate("data", 100, 10)], ChainGenerators(0, range(2)), table_limit=0)
    with pytest.warns(FutureWarning, match="permutations is deprecated"):
        assert sampler.permutations == {}
    with pytest.warns(FutureWarning, match="TABLE_LIMIT is deprecated"):
        assert minibatch.TABLE_LIMIT == 2**25
    assert torch.equal(sampler.next()["data"], _sampler(100, 10, 2).next()["data"])
    with pytest.raises(AttributeError):
        minibatch.NO_SUCH_NAME  # noqa: B018
