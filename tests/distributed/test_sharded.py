"""Data parallelism as a gradient-estimator value (``distributed/data_parallel.py``, ``distributed/sharded.py``).

In one process, on a real gloo process group of one rank (``one_rank``, ``conftest.py``; ``P = 1``: the
all-reduce is the identity and the shard is all the data), so that the composition can be checked exactly and
fast; the two-rank behaviour is ``test_distributed.py``'s.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed

from pyro_sgmcmc import MCMC, SGLD, CheckpointSettings, ModelPotential
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.distributed import DataParallel, ShardedMinibatches, data_parallel, sharded
from pyro_sgmcmc.distributed.sharded import MINIBATCH_STREAM_OFFSET
from pyro_sgmcmc.distributed.sharded_potential import ShardedPotential
from pyro_sgmcmc.kernels.gradients import MinibatchGradient, all_reduced

from .models import regression as model


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64)
    return x, x @ torch.tensor([1.0, -1.0], dtype=torch.float64) + torch.randn(40, generator=g, dtype=torch.float64)


def test_data_parallel_sets_the_estimator_not_the_potential(one_rank):
    """The kernel keeps building its own ModelPotential: data_parallel sets its estimator factory, and the
    estimator is sharded(all_reduced(...)) with the global N; no potential factory exists on the kernel."""
    kernel = data_parallel(SGLD(model, step_size=1e-3))
    assert not hasattr(kernel, "potential_factory")
    assert isinstance(kernel.estimator_factory, DataParallel) and kernel.control_variate == "auto"
    x, y = data()
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=0, num_chains=2, chain_method="vectorized", seed=1,
                disable_progbar=True)  # fmt: skip
    mcmc.run(x, y, 10)
    assert type(kernel.potential) is ModelPotential
    estimator = kernel.gradient_estimator
    assert isinstance(estimator, ShardedMinibatches) and not estimator.replayable
    assert estimator.potential is kernel.potential and estimator.num_data == kernel.run_num_data == 40
    assert [p.name for p in estimator.plates] == ["data"]
    # the chains' streams, handed over by the kernel (use_streams); rank 0 draws none of its own (the kernel's)
    assert estimator.streams is kernel.generators and estimator.started and estimator.sampler is None
    assert isinstance(estimator.control_variate_potential, ShardedPotential)
    assert [(p.size, p.subsample_size) for p in estimator.control_variate_potential.global_plates] == [(40, 10)]
    # made data-parallel twice: not scaled twice
    again = data_parallel(kernel, plate="data")
    assert again.estimator_factory.inner is None and again.estimator_factory.plate == "data"


def test_one_rank_full_shard_run_equals_the_plain_run(one_rank, float64):
    """P = 1 with the whole shard each step: the sharded, all-reduced estimate is the plain one, so the run is
    the plain full-batch run draw for draw (same noise streams, same starting points from the same seed)."""
    x, y = data()
    common = dict(num_samples=15, warmup_steps=5, num_chains=3, chain_method="vectorized", seed=2,
                  disable_progbar=True)  # fmt: skip
    runs = []
    for parallel in (False, True):
        kernel = SGLD(model, step_size=0.05, adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)
        if parallel:
            data_parallel(kernel, plate="data")
        mcmc = MCMC(kernel, **common)
        mcmc.run(x, y, x.shape[0])
        runs.append(mcmc.get_samples(group_by_chain=True)["w"])
    assert torch.equal(runs[0], runs[1])


def test_sharded_estimator_draws_from_the_ranks_streams(one_rank, float64):
    """Rank 0 evaluates on the kernel's own minibatch (so that one rank is the one-process run); rank r > 0 on its
    own streams (seed, chain + r 2^40), a second call moving on to the next minibatch (rank 1 is simulated by
    setting the estimator's rank before its first call)."""
    x, y = data()
    potential = ModelPotential(model, (x, y, 8))
    positions = torch.tensor([[0.3, -0.2], [1.0, 0.5]])
    from pyro_sgmcmc.chains.minibatch import MinibatchSampler

    plain = MinibatchGradient(potential)
    kernel_indices = MinibatchSampler(potential.subsample_plates, ChainGenerators(5, [0, 1]))
    for rank in (0, 1):
        estimator = DataParallel()(potential)
        estimator.rank = rank
        estimator.use_streams(ChainGenerators(5, [0, 1]))
        offset = rank * MINIBATCH_STREAM_OFFSET
        expected = MinibatchSampler(potential.subsample_plates, ChainGenerators(5, [offset + c for c in (0, 1)]))
        for _ in range(2):
            given = kernel_indices.next() if rank == 0 else {"data": torch.zeros(2, 8, dtype=torch.long)}
            u, g = estimator(positions, given)
            u0, g0 = plain(positions, given if rank == 0 else expected.next())
            assert torch.equal(u, u0) and torch.equal(g, g0)
        if rank == 0:
            kernel_indices = MinibatchSampler(potential.subsample_plates, ChainGenerators(5, [0, 1]))
            assert torch.equal(kernel_indices.next()["data"], expected.next()["data"])  # rank 0's stream: (5, c)


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("explicit_group", [False, True])
def test_a_data_parallel_run_resumes_from_its_checkpoint(one_rank, float64, tmp_path, explicit_group):
    """Interrupted at step 27 (checkpoint of step 20) and run again: it resumes at step 20 (its fingerprint,
    which describes the DataParallel estimator, is the same, with an explicit process group too) and, with
    whole shards (no minibatch stream to restart), gives exactly the draws of an uninterrupted run."""
    x, y = data()
    path = tmp_path / "dp.ckpt"
    group = torch.distributed.new_group([0]) if explicit_group else None

    def run(hook=None, checkpoint=True):
        kernel = SGLD(model, step_size=0.05, adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)
        data_parallel(kernel, plate="data", group=group)
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=20, num_chains=2, chain_method="vectorized", seed=4,
                    disable_progbar=True, hook_fn=hook, **({"checkpoint": CheckpointSettings(path, every=10)}
                                                           if checkpoint else {}))  # fmt: skip
        mcmc.run(x, y, x.shape[0])
        return mcmc.get_samples(group_by_chain=True)["w"]

    def stop(kernel, values, stage, i):
        if kernel.state.step == 27:
            raise _Interrupted

    with pytest.raises(_Interrupted):
        run(stop)
    steps = []
    resumed = run(lambda kernel, values, stage, i: steps.append(kernel.state.step - 1))
    assert steps == list(range(20, 40))
    assert torch.equal(resumed, run(checkpoint=False))


def test_all_reduced_hands_the_streams_on_to_a_sharded_estimator_inside(one_rank, float64):
    """Composed the other way round, all_reduced(sharded(...)), the sharded estimator still gets the kernel's
    streams (and so the same minibatches as sharded(all_reduced(...))), and its N reaches the kernel."""
    x, y = data()
    made = []

    def factory(potential):
        made.append(sharded(MinibatchGradient(potential), potential.subsample_plates, num_data=77))
        return all_reduced(made[-1])

    runs = []
    for estimator in (factory, None):
        kernel = SGLD(model, step_size=0.05, adapt_step_size=False, adapt_mass_matrix=False, control_variate=None,
                      gradient_estimator=estimator, num_data=77)  # fmt: skip
        if estimator is None:
            data_parallel(kernel)  # sharded(all_reduced(MinibatchGradient)) with N = the kernel's num_data
        mcmc = MCMC(kernel, num_samples=10, warmup_steps=0, num_chains=2, chain_method="vectorized", seed=6,
                    disable_progbar=True)  # fmt: skip
        mcmc.run(x, y, 10)
        runs.append(mcmc.get_samples(group_by_chain=True)["w"])
        assert kernel.run_num_data == 77
    assert made[0].streams is not None and made[0].started  # rank 0: the kernel's minibatches, no sampler of its own
    assert torch.equal(runs[0], runs[1])


def test_the_warmup_measures_the_data_parallel_gradient_noise(one_rank, float64):
    """The warmup's step-size cap reads the minibatch drift noise through the kernel's estimator. With the data
    plate hidden from the kernel (the potential factory before), the warmup saw no subsampled plate and took the
    gradient for exact (noise 0, no cap); now it sees the plate and measures the sharded estimate's noise."""
    x, y = data()
    kernel = data_parallel(SGLD(model))
    mcmc = MCMC(kernel, num_samples=2, warmup_steps=40, num_chains=2, chain_method="vectorized", seed=1,
                disable_progbar=True)  # fmt: skip
    mcmc.run(x, y, 10)
    assert [p.name for p in kernel.warmup.context.plates] == ["data"]
    noise, evaluations = kernel.warmup.probes.drift_noise_covariance(kernel.state.position)
    assert evaluations > 0 and bool((noise.diagonal(dim1=-2, dim2=-1) > 0).all())
