"""The full-data walker: covering and equal-weight chunks, their combinations, and the full-data potential."""

import math

import pyro
import pyro.distributions as dist
import torch

from pyro_sgmcmc import ModelPotential
from pyro_sgmcmc.model.full_data import PlateChunks, chunk_combinations, full_data_potential_and_grad
from pyro_sgmcmc.model.trace import SubsamplePlate


def test_covering_chunks_see_every_datum_the_last_overlapping():
    chunks = PlateChunks(SubsamplePlate("data", 10, 4), torch.device("cpu"))
    assert chunks.rows().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [6, 7, 8, 9]] and len(chunks) == 3
    exact = PlateChunks(SubsamplePlate("data", 8, 4), torch.device("cpu"))
    assert exact.rows().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_equal_weight_chunks_see_every_datum_equally_often():
    for size, batch in [(10, 4), (12, 5), (9, 3), (7, 7)]:
        chunks = PlateChunks(SubsamplePlate("data", size, batch), torch.device("cpu"), equal_weights=True)
        assert len(chunks) == size // math.gcd(size, batch)
        counts = torch.bincount(chunks.rows().reshape(-1), minlength=size)
        assert (counts == batch // math.gcd(size, batch)).all()
        assert torch.equal(torch.cat([chunks.rows(0, 2), chunks.rows(2)]), chunks.rows())  # in blocks


def test_chunk_combinations_cover_every_pair_of_plates():
    plates = [SubsamplePlate("a", 5, 2), SubsamplePlate("b", 3, 2)]
    seen = set()
    for indices in chunk_combinations(plates, torch.device("cpu")):
        seen.update((i, j) for i in indices["a"].tolist() for j in indices["b"].tolist())
    assert seen == {(i, j) for i in range(5) for j in range(3)}
    assert list(chunk_combinations([], torch.device("cpu"))) == [{}]


def _model(x, y, batch):
    w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=x.dtype), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(torch.tensor(0.0, dtype=x.dtype), 1.0))
    with pyro.plate("data", len(y), subsample_size=batch) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, s), obs=y[idx])


def test_full_data_potential_and_grad_is_the_full_batch_potential():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 2, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    z = torch.tensor([0.3, -0.7, 0.2], dtype=torch.float64)
    full = ModelPotential(_model, (x, y, None)).potential_and_grad(z)
    for batch, per_call in [(4, 2**18), (4, 8), (7, 2**18)]:  # 15 chunks in one call, in 8 calls; 30 chunks of 7
        potential = ModelPotential(_model, (x, y, batch))
        u, g_ = full_data_potential_and_grad(potential, z, data_per_call=per_call)
        assert torch.allclose(u, full[0], rtol=1e-12) and torch.allclose(g_, full[1], rtol=1e-12), batch
