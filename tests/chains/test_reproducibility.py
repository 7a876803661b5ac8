"""The reproducibility promises of the docs, tested as written.

* docs/reliability.rst: a chain's noise and minibatches depend only on the run's ``seed`` and the
  chain's id, so "chain 3 draws the same noise and minibatches whether it runs with 4 or 400 other
  chains", and its draws are bit-identical on the CPU. Tested with
  ``pyro_sgmcmc.MCMC(..., chain_method="vectorized", seed=)`` at a small ``N`` and at ``N = 10^7``
  (where a table of permutations for 4 chains would not fit the old 256 MB limit but one chain's did:
  the two used to draw different minibatches), for chain 0 and chain 3 alone against 4 chains, and
  for chain 3 beside 4 and beside 400 other chains.
* docs/distributed.rst: a P-process run equals a one-process run, bit for bit: 2 processes (gloo,
  :func:`pyro_sgmcmc.distributed.launch`) running 3 chains each, against one process running all 6.

The starting points are given (``initial_params``) in the comparisons of the streams; ``seed=`` also fixes
the default starting points (superchain ``s`` draws its start from ``(seed, s)``), which the last test of the
first group checks at ``N = 10^7`` with no ``initial_params``.

The model is a Gaussian mean, ``y_n ~ N(mu, 1)``, ``mu ~ N(0, 10)``, with a subsampled plate: cheap
at any ``N`` (``N = 10^7`` float32 data are 40 MB), so the large case takes a few seconds.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, SGLD
from pyro_sgmcmc.chains.minibatch import MinibatchSampler
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.model.potential import SubsamplePlate

BATCH = 10
LAUNCH_TIMEOUT = 240  # seconds (as tests/test_distributed.py: imports on a loaded machine)


def gaussian_mean(data, batch):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", data.shape[0], subsample_size=batch) as idx:
        pyro.sample("y", dist.Normal(mu, 1.0), obs=data[idx])


def make_data(n: int) -> torch.Tensor:
    return 1.5 + torch.randn(n, generator=torch.Generator().manual_seed(0))


def draws(data, chain_ids, *, seed=11, kernel=SGHMC, num_samples=15, warmup_steps=15, given_start=True, **options):
    """Draws of ``mu`` of the chains ``chain_ids`` (global ids), vectorised, from fixed starting points (or, with
    ``given_start=False``, from the init strategy's, drawn from the seed)."""
    ids = torch.tensor(list(chain_ids))
    start = {"mu": -1.0 + 2.0 * ids / 400} if given_start else None  # chain c starts at its own point
    mcmc = MCMC(kernel(gaussian_mean, step_size=1e-3, **options), num_samples=num_samples, warmup_steps=warmup_steps,
                num_chains=len(chain_ids), chain_ids=list(chain_ids), initial_params=start,
                chain_method="vectorized", seed=seed, disable_progbar=True)  # fmt: skip
    mcmc.run(data, BATCH)
    return mcmc.get_samples(group_by_chain=True)["mu"]


@pytest.mark.parametrize("n", [1000, 10**7], ids=["N=1e3", "N=1e7"])
def test_a_chain_draws_the_same_alone_and_beside_three_others(n):
    data = make_data(n)
    together = draws(data, range(4))
    assert together.shape == (4, 15) and len(set(together[:, -1].tolist())) == 4  # the chains differ
    assert torch.equal(draws(data, [0])[0], together[0])  # chain 0 alone (its default id)
    assert torch.equal(draws(data, [3])[0], together[3])  # chain 3 alone (chain_ids=[3])


def test_with_a_seed_the_default_starts_agree_too():
    """No ``initial_params``: chain 3 alone and beside three others start from the init strategy's draw for
    superchain 3 under ``(seed, 3)``, whatever torch's global generator holds, and draw the same."""
    data = make_data(10**7)
    torch.manual_seed(1)
    together = draws(data, range(4), given_start=False)
    torch.manual_seed(2)  # another global state: the seed alone decides
    alone = draws(data, [3], given_start=False)
    assert len(set(together[:, 0].tolist())) == 4  # the chains start apart
    assert torch.equal(alone[0], together[3])


def test_chain_3_draws_the_same_beside_4_and_beside_400_other_chains():
    """docs/reliability.rst's words: "whether it runs with 4 or 400 other chains"."""
    data = make_data(5000)
    for kernel in (SGHMC, SGLD):
        beside_4 = draws(data, range(5), kernel=kernel)
        beside_400 = draws(data, range(401), kernel=kernel)
        assert torch.equal(beside_4[3], beside_400[3]), kernel.__name__


def test_noise_and_minibatches_of_chain_3_do_not_depend_on_the_other_chains():
    """The streams themselves, as the kernels draw them: chain 3's noise and minibatch indices, beside
    4 or 400 other chains, over several epochs (``N = 97``, ``B = 10``: 9 steps an epoch)."""

    def streams(num_chains, steps=40):
        generators = ChainGenerators(5, range(num_chains))
        sampler = MinibatchSampler([SubsamplePlate("data", 97, BATCH), SubsamplePlate("other", 3000, 7)], generators)
        noise, indices = [], []
        for step in range(steps):
            noise.append(generators.normal((3,), torch.float32, step=step)[3])
            batch = sampler.next()
            indices.append(torch.cat([batch["data"][3], batch["other"][3]]))
        return torch.stack(noise), torch.stack(indices)

    noise_4, indices_4 = streams(5)
    noise_400, indices_400 = streams(401)
    assert torch.equal(noise_4, noise_400) and torch.equal(indices_4, indices_400)


# ---------------------------------------------------------------------- several processes
def chains_job(n):
    """On each rank: its block of 6 chains (3 each on 2 ranks), gathered on rank 0."""
    from pyro_sgmcmc.distributed import DistributedMCMC

    mcmc = DistributedMCMC(SGHMC(gaussian_mean, step_size=1e-3), num_samples=10, warmup_steps=10, num_chains=6,
                           initial_params={"mu": torch.linspace(-1.0, 1.0, 6)}, seed=11,
                           disable_progbar=True)  # fmt: skip
    mcmc.run(make_data(n), BATCH)
    return {"mu": mcmc.get_samples(group_by_chain=True)["mu"], "chain_ids": mcmc.chain_ids}


def test_two_processes_draw_what_one_process_draws():
    """docs/distributed.rst: "a P-process run gives the same draws as a one-process MCMC run of the same
    chains with the same seed, bit for bit". ``N = 6 * 10^6``: three chains' permutation tables fitted the
    old limit (on each rank), six did not (one process), so the old streams differed."""
    from pyro_sgmcmc.distributed import launch

    n = 6 * 10**6
    ranks = launch(chains_job, nprocs=2, args=(n,), timeout=LAUNCH_TIMEOUT)
    one = MCMC(SGHMC(gaussian_mean, step_size=1e-3), num_samples=10, warmup_steps=10, num_chains=6,
               initial_params={"mu": torch.linspace(-1.0, 1.0, 6)}, chain_method="vectorized", seed=11,
               disable_progbar=True)  # fmt: skip
    one.run(make_data(n), BATCH)
    expected = one.get_samples(group_by_chain=True)["mu"]
    assert ranks[0]["chain_ids"] == list(range(6)) and ranks[1]["chain_ids"] == [3, 4, 5]
    assert torch.equal(ranks[0]["mu"], expected)
    assert torch.equal(ranks[1]["mu"], expected[3:])
