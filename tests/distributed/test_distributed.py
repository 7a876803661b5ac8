"""Runs on real ``torch.distributed`` process groups: gloo, 2 processes on 127.0.0.1, a free port.

One launch (:func:`pyro_sgmcmc.distributed.launch`, i.e. ``torch.multiprocessing`` with torchrun's
environment variables) does everything of the module-scoped fixture, to pay the start-up of the
processes (importing torch and Pyro, about 5 s on a quiet machine) once:

* chains across ranks: 6 chains in 3 superchains on 2 ranks (superchain 1 straddles them) must give
  *exactly* the draws of a one-process run with the same seed, gathered on rank 0 in global order;
* data-parallel gradients on conjugate linear regression, both ranks holding one half of the data:
  with full shards the run must follow the one-process full-batch run step by step; with
  minibatches the replicas must stay identical and the InferenceData hold each rank's shard;

and then the failure scenario, which ends the launch: rank 1 raises in the middle of a run while
rank 0 waits in a collective, and the launch must stop with rank 1's error, not hang.

The statistical test (slow, its own launch): 2 ranks with shards and minibatches against a
one-process run with the combined minibatch and against the exact posterior, on the moments of
64 SGLD chains (tolerances derived at the test). Another slow test runs the documented
``torchrun --nproc_per_node=2`` launch, successful and failing.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.multiprocessing import ProcessRaisedException

from pyro_sgmcmc import MCMC, SGHMC, SGLD, to_inference_data
from pyro_sgmcmc.distributed import (
    DistributedMCMC,
    data_parallel,
    free_port,
    init_distributed,
    launch,
    rank_chain_ids,
    shard,
)

LAUNCH_TIMEOUT = 240  # seconds; a quiet machine needs about 15 (imports), a loaded one up to 4 times more


# ---------------------------------------------------------------------- models and data
def small_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(2.0))
    with pyro.plate("data", x.shape[0], subsample_size=10) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def small_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 2, generator=g)
    return x, x @ torch.tensor([1.0, -1.0]) + torch.randn(50, generator=g)


# Conjugate regression: w ~ N(0, PRIOR_SD^2 I), y_n ~ N(x_n . w, 1). The prior is strong (precision
# 100 against about 200 from the data) so that counting it once per rank, instead of once, moves the
# posterior by many standard errors (see the power check in the test).
N, D, PRIOR_SD, BATCH = 200, 2, 0.1, 40
NUM_CHAINS, WARMUP, DRAWS = 64, 300, 1000  # the slow moments test


def regression_model(x, y, batch):
    w = pyro.sample("w", dist.Normal(torch.zeros(D, dtype=x.dtype), PRIOR_SD).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])


def regression_data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -1.0], dtype=torch.float64) + torch.randn(N, generator=g, dtype=torch.float64)
    return x, y


def posterior(x, y, prior_copies=1, likelihood_weight=1.0):
    """Exact posterior mean and covariance (the prior counted ``prior_copies`` times, the likelihood weighted)."""
    precision = prior_copies * torch.eye(D, dtype=x.dtype) / PRIOR_SD**2 + likelihood_weight * x.T @ x
    cov = torch.linalg.inv(precision)
    return cov @ (likelihood_weight * x.T @ y), cov


def sgld_step_size(x):
    """eps with h * lambda_max = 0.1 (h = eps / N): stable, tau_int ~ 2 / (h lambda) ~ 20-25 steps."""
    _, cov = posterior(x, x.new_zeros(N))
    lambda_max = float(torch.linalg.eigvalsh(torch.linalg.inv(cov)).max())
    return 0.1 * N / lambda_max


# ---------------------------------------------------------------------- the jobs run on each rank
def chains_job():
    pyro.set_rng_seed(1)
    x, y = small_data()
    mcmc = DistributedMCMC(
        SGHMC(small_model, step_size=0.05), num_samples=20, warmup_steps=30, num_chains=6, num_superchains=3,
        seed=3, disable_progbar=True,
    )  # fmt: skip
    mcmc.run(x, y)
    out = {
        "samples": mcmc.get_samples(group_by_chain=True),
        "stats": mcmc.sample_stats,
        "superchain_ids": mcmc.superchain_ids,
        "chain_ids": mcmc.chain_ids,
    }
    if torch.distributed.get_rank() == 0:
        idata = to_inference_data(mcmc)
        out["idata"] = {
            "chain": idata.posterior.chain.values.tolist(),
            "superchain": idata.posterior.superchain.values.tolist(),
            "w": idata.posterior["w"].values,
        }
    return out


COUPLED_START = {"w": torch.tensor([[0.5, 0.5], [-0.3, 0.2], [0.0, 0.0]], dtype=torch.float64)}


def coupled_run(x, y, batch, parallel: bool):
    """20 SGLD steps of 3 chains from fixed points, seed 7 (full-batch when batch = the data size)."""
    kernel = SGLD(regression_model, step_size=sgld_step_size(regression_data()[0]))
    if parallel:
        data_parallel(kernel, plate="data")  # the plate is not subsampled on full shards: name it
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, num_chains=3, initial_params=COUPLED_START,
                chain_method="vectorized", seed=7, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y, batch)
    return mcmc, kernel


def data_parallel_job():
    torch.set_default_dtype(torch.float64)
    x, y = regression_data()
    x_shard, y_shard = shard((x, y))
    out = {}
    # Full shards: the all-reduced potential is exactly the full-data one, so the run is coupled
    # step by step with a one-process full-batch run with the same noise streams.
    mcmc, kernel = coupled_run(x_shard, y_shard, x_shard.shape[0], parallel=True)
    out["coupled"] = mcmc.get_samples(group_by_chain=True)["w"]
    out["num_data"] = kernel.run_num_data  # the N the drift and noise are normalised by
    # Subsampled shards: the replicas stay identical (shared noise, all-reduced gradients).
    kernel = data_parallel(SGLD(regression_model, step_size=sgld_step_size(x), **FIXED_STEP))
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=10, num_chains=4, chain_method="vectorized", seed=7,
                disable_progbar=True)  # fmt: skip
    mcmc.run(x_shard, y_shard, BATCH // 2)
    out["w"] = mcmc.get_samples(group_by_chain=True)["w"]
    idata = to_inference_data(mcmc, log_likelihood=True)  # this rank's shard of the data
    out["idata"] = {
        "log_likelihood": idata.log_likelihood["y"].values,
        "observed": idata.observed_data["y"].values,
        "w": idata.posterior["w"].values,
    }
    # The replicas must agree on the seed: a rank-dependent seed is refused with a clear error.
    other = MCMC(data_parallel(SGLD(regression_model, step_size=0.01)), num_samples=1, warmup_steps=0,
                 chain_method="vectorized", seed=torch.distributed.get_rank(), disable_progbar=True)  # fmt: skip
    try:
        other.run(x_shard, y_shard, BATCH // 2)
    except ValueError as error:
        out["seed_error"] = str(error)
    return out


class _Interrupted(Exception):
    pass


def checkpoint_job(out: str):
    """Chains across ranks, stopped by an exception at step 37 of 50 (both ranks) and run again with the
    same ``checkpoint_path``: the second run resumes each rank from its own file (``.rank<r>``, last
    written after step 30) and must give exactly the draws of an uninterrupted run."""
    x, y = small_data()
    path = Path(out) / "chains.ckpt"

    def run(hook=None, checkpoint=True):
        pyro.set_rng_seed(1)
        mcmc = DistributedMCMC(
            SGHMC(small_model, step_size=0.05), num_samples=20, warmup_steps=30, num_chains=6, num_superchains=3,
            seed=3, disable_progbar=True, hook_fn=hook,
            **({"checkpoint_path": path, "checkpoint_every": 10} if checkpoint else {}),
        )  # fmt: skip
        mcmc.run(x, y)
        return mcmc

    def stop(kernel, values, stage, i):  # i counts within the stage (Pyro's hook_fn); state.step is the run's
        if kernel.state.step - 1 == 37:
            raise _Interrupted

    try:
        run(hook=stop)
        interrupted = False
    except _Interrupted:
        interrupted = True
    rank = torch.distributed.get_rank()
    saved = torch.load(f"{path}.rank{rank}", weights_only=False)
    steps_run = []  # the resumed run must start at the checkpoint, not at step 0 (which gives the same draws)
    resumed = run(hook=lambda kernel, values, stage, i: steps_run.append(kernel.state.step - 1))
    resumed = resumed.get_samples(group_by_chain=True)
    reference = run(checkpoint=False).get_samples(group_by_chain=True)
    return {
        "interrupted": interrupted,
        "steps_in_checkpoint": saved["steps_done"],
        "steps_resumed": steps_run,
        "equal": {name: torch.equal(resumed[name], reference[name]) for name in reference},
        "shape": {name: tuple(reference[name].shape) for name in reference},
    }


def all_jobs(out: str):
    """The jobs (results saved per rank), then the failure scenario, which ends the launch."""
    results = {"chains": chains_job(), "data_parallel": data_parallel_job(), "checkpoint": checkpoint_job(out)}
    torch.save(results, Path(out) / f"rank{torch.distributed.get_rank()}.pt")
    failing_job()


def failing_job():
    """Rank 1 raises at its 5th step; rank 0 is then blocked in the next all-reduce."""

    def hook(kernel, params, phase, step):
        if step == 5 and torch.distributed.get_rank() == 1:
            raise ValueError("rank 1 failed on purpose")

    x, y = regression_data()
    kernel = data_parallel(SGLD(regression_model, step_size=0.01))
    mcmc = MCMC(kernel, num_samples=50, warmup_steps=0, num_chains=2, chain_method="vectorized", seed=0,
                hook_fn=hook, disable_progbar=True)  # fmt: skip
    mcmc.run(*shard((x, y)), BATCH // 2)
    return "finished"


@pytest.fixture(scope="module")
def launch_outcome(tmp_path_factory):
    """One launch for the module: ``(per-rank results, the exception launch raised, seconds taken)``."""
    out = tmp_path_factory.mktemp("ranks")
    start = time.monotonic()
    try:
        launch(all_jobs, nprocs=2, args=(str(out),), timeout=LAUNCH_TIMEOUT)
        error = None
    except ProcessRaisedException as raised:  # expected: rank 1 fails on purpose at the end
        error = raised
    seconds = time.monotonic() - start
    results = [torch.load(out / f"rank{r}.pt", weights_only=False) if (out / f"rank{r}.pt").exists() else None
               for r in range(2)]  # fmt: skip
    return results, error, seconds


@pytest.fixture(scope="module")
def launched(launch_outcome):
    results, error, _ = launch_outcome
    if None in results:
        pytest.fail(f"a rank did not finish its jobs: {error}")
    return results


# ---------------------------------------------------------------------- chains across ranks
def test_chains_across_ranks_equal_one_process_run(launched):
    rank0, rank1 = launched[0]["chains"], launched[1]["chains"]
    pyro.set_rng_seed(1)  # as on the ranks: rank 0 draws the starting points as this run does
    x, y = small_data()
    reference = MCMC(SGHMC(small_model, step_size=0.05), num_samples=20, warmup_steps=30, num_chains=6,
                     num_superchains=3, chain_method="vectorized", seed=3, disable_progbar=True)  # fmt: skip
    reference.run(x, y)
    expected = reference.get_samples(group_by_chain=True)
    # Rank 0 gathered all chains in global order: bit-identical to the one-process run (same
    # streams (seed, chain id), same starting points, same operations per chain).
    assert rank0["chain_ids"] == list(range(6)) and rank0["superchain_ids"].tolist() == [0, 0, 1, 1, 2, 2]
    for name in ("w", "sigma"):
        assert rank0["samples"][name].shape == expected[name].shape
        assert torch.equal(rank0["samples"][name], expected[name]), name
    for key, value in reference.sample_stats.items():
        assert torch.equal(rank0["stats"][key], value), key
    # Rank 1 keeps its own block, with the global ids of its chains and superchains.
    assert rank1["chain_ids"] == [3, 4, 5] and rank1["superchain_ids"].tolist() == [1, 2, 2]
    assert torch.equal(rank1["samples"]["w"], expected["w"][3:])
    # The InferenceData built on rank 0 carries the global chain and superchain ids.
    idata = rank0["idata"]
    assert idata["chain"] == list(range(6)) and idata["superchain"] == [0, 0, 1, 1, 2, 2]
    np.testing.assert_array_equal(idata["w"], expected["w"].numpy())


def test_chains_across_ranks_resume_from_their_checkpoints_exactly(launched):
    for rank, result in enumerate(launched):
        outcome = result["checkpoint"]
        assert outcome["interrupted"] and outcome["steps_in_checkpoint"] == 30, (rank, outcome)
        assert outcome["steps_resumed"] == list(range(30, 50)), (rank, outcome)
        # rank 0 holds the gathered draws of all 6 chains, rank 1 its own 3
        assert outcome["shape"]["w"] == ((6 if rank == 0 else 3), 20, 2), (rank, outcome)
        assert all(outcome["equal"].values()), (rank, outcome)


# ---------------------------------------------------------------------- data-parallel gradients
def _moments_and_errors(draws: np.ndarray):
    """Per coordinate: mean, variance, their Monte Carlo standard errors (ArviZ ESS over all chains).

    The SE of the variance uses the Gaussian formula ``var * sqrt(2 / ESS)``: the draws are
    Gaussian to a good approximation (linear dynamics, Gaussian noise) and the ESS of ``w`` itself
    is smaller than that of ``(w - mean)^2`` (autocorrelation rho^k against rho^(2k)), so it is
    conservative.
    """
    import arviz as az

    ess = np.array([az.ess(draws[..., i]) for i in range(draws.shape[-1])])
    flat = draws.reshape(-1, draws.shape[-1])
    mean, var = flat.mean(0), flat.var(0, ddof=1)
    return mean, var, np.sqrt(var / ess), var * np.sqrt(2 / ess), ess


def test_data_parallel_is_the_full_data_step_and_replicas_agree(launched, float64):
    rank0, rank1 = launched[0]["data_parallel"], launched[1]["data_parallel"]
    x, y = regression_data()
    assert rank0["num_data"] == N  # the sum of the shards' sizes: the noise variance 2 eps T / N is global
    # With full shards the mean of the ranks' potentials (prior + 2 x shard likelihood) is the
    # full-data potential, and the noise comes from the same streams (seed 7, chains 0-2): the run
    # follows the one-process full-batch run step by step, up to float64 rounding (~1e-16 per
    # step, amplified by at most (1 + h lambda)^20 < 7 over 20 steps).
    reference, _ = coupled_run(x, y, N, parallel=False)
    expected = reference.get_samples(group_by_chain=True)["w"]
    for rank in (rank0, rank1):
        torch.testing.assert_close(rank["coupled"], expected, rtol=1e-12, atol=1e-12)
    # With subsampled shards, the replicas take identical steps: same noise and same all-reduced gradient.
    assert torch.equal(rank0["w"], rank1["w"]) and rank0["w"].shape == (4, 50, 2)
    assert torch.isfinite(rank0["w"]).all()
    assert "different seeds" in rank0["seed_error"] and "different seeds" in rank1["seed_error"]
    # InferenceData on each rank: all chains; observed data and pointwise log-likelihood of its shard.
    for rank, (x_shard, y_shard) in ((rank0, shard((x, y), 0, 2)), (rank1, shard((x, y), 1, 2))):
        np.testing.assert_array_equal(rank["idata"]["w"], rank0["w"].numpy())
        np.testing.assert_array_equal(rank["idata"]["observed"], y_shard.numpy())
        w = rank0["w"][1, 7]  # chain 1, draw 7
        expected = dist.Normal(x_shard @ w, 1.0).log_prob(y_shard).numpy()
        np.testing.assert_allclose(rank["idata"]["log_likelihood"][1, 7], expected, rtol=1e-12)


#: the step size these statistical comparisons were sized for (sgld_step_size), not the warmup's adapted one
FIXED_STEP = dict(adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)


def moments_job():
    torch.set_default_dtype(torch.float64)
    x, y = regression_data()
    kernel = data_parallel(SGLD(regression_model, step_size=sgld_step_size(x), **FIXED_STEP))
    mcmc = MCMC(kernel, num_samples=DRAWS, warmup_steps=WARMUP, num_chains=NUM_CHAINS, chain_method="vectorized",
                seed=7, disable_progbar=True)  # fmt: skip
    mcmc.run(*shard((x, y)), BATCH // 2)
    return mcmc.get_samples(group_by_chain=True)["w"]


@pytest.mark.slow
def test_data_parallel_posterior_moments_match_one_process_run(float64):
    """Conjugate regression, shards of 100, B_r = 20 per rank, 64 SGLD chains x 1000 draws."""
    ranks = launch(moments_job, nprocs=2, timeout=LAUNCH_TIMEOUT)
    assert torch.equal(ranks[0], ranks[1])
    x, y = regression_data()
    # Reference: one process, all N data, minibatch B = B_0 + B_1, same kernel settings, other seed.
    reference = MCMC(SGLD(regression_model, step_size=sgld_step_size(x), **FIXED_STEP), num_samples=DRAWS,
                     warmup_steps=WARMUP, num_chains=NUM_CHAINS, chain_method="vectorized", seed=8,
                     disable_progbar=True)  # fmt: skip
    reference.run(x, y, BATCH)
    dp = _moments_and_errors(ranks[0].numpy())
    sp = _moments_and_errors(reference.get_samples(group_by_chain=True)["w"].numpy())
    assert dp[4].min() > 1000 and sp[4].min() > 1000, (dp[4], sp[4])  # enough draws for the bounds below

    # Tolerances. Both runs have the same step size, data and total minibatch size, so the same
    # discretisation and gradient-noise inflation of the variance (about h lambda / 2 + eps N F / (2 B),
    # ~ 5 % + 15 %); the one difference, stratified (per-shard) against uniform minibatches, changes
    # the gradient-noise variance by O(1 / N_r), ~ 1 % of the 15 %. What is left is Monte Carlo
    # error: the difference of two independent estimates has SE sqrt(se_dp^2 + se_sp^2). Four
    # comparisons at 4 SE: a false failure has probability < 3e-4.
    z = 4.0
    mean_tol = z * np.hypot(dp[2], sp[2])
    var_tol = z * np.hypot(dp[3], sp[3])
    print(f"data-parallel: mean {dp[0]}, var {dp[1]}, ESS {dp[4]}; one process: mean {sp[0]}, var {sp[1]}, "
          f"ESS {sp[4]}; tolerances: mean {mean_tol}, var {var_tol}; exact: {posterior(x, y)}")  # fmt: skip
    np.testing.assert_array_less(np.abs(dp[0] - sp[0]), mean_tol)
    np.testing.assert_array_less(np.abs(dp[1] - sp[1]), var_tol)

    # Against the exact posterior: SGLD's stationary mean on a Gaussian target is exact (linear
    # drift, unbiased gradient estimate), so the mean is within z MCSE of the truth; the variance
    # is the exact one times the inflation above, between 1 and 1.3.
    mean, cov = posterior(x, y)
    np.testing.assert_array_less(np.abs(dp[0] - mean.numpy()), z * dp[2])
    ratio = dp[1] / cov.diagonal().numpy()
    assert ((ratio > 1.0 - z * dp[3] / dp[1]) & (ratio < 1.3 + z * dp[3] / dp[1])).all(), ratio

    # Power: the errors a wrong reduction would make are far outside these bounds. Prior counted on
    # each of the 2 ranks (mean shrunk by ~25 %), or the shard likelihoods averaged instead of summed
    # (~ 1/3 of the data's weight lost): the posterior mean moves by more than 5 tolerances.
    for wrong_mean, _ in (posterior(x, y, prior_copies=2), posterior(x, y, likelihood_weight=0.5)):
        assert (np.abs(wrong_mean.numpy() - mean.numpy()) > 5 * mean_tol).all()


# ---------------------------------------------------------------------- failure behaviour
def test_a_failing_rank_stops_the_run_with_its_error(launch_outcome):
    """The launch ends with rank 1 raising mid-run while rank 0 waits in the all-reduce."""
    _, error, seconds = launch_outcome
    # Had rank 0 not been stopped, launch would have raised TimeoutError after LAUNCH_TIMEOUT s
    # (failing the fixture); had no rank failed, error would be None.
    assert error is not None and error.error_index == 1
    assert "ValueError: rank 1 failed on purpose" in str(error)  # the rank's own traceback
    assert seconds < LAUNCH_TIMEOUT


def root_cause_dies_last():
    """Rank 1 raises first but lingers at exit; rank 0 raises a consequent error and dies first."""
    import atexit

    if torch.distributed.get_rank() == 1:
        atexit.register(time.sleep, 2.0)  # its process outlives rank 0's
        raise ValueError("rank 1 is the root cause")
    time.sleep(0.5)
    raise RuntimeError("rank 0 failed because its peer did")


def test_launch_reports_the_rank_that_failed_first_not_the_first_to_exit():
    # The OS sees rank 0's process end first; the launcher must still name rank 1, whose error
    # came first (its stamp precedes rank 0's by the 0.5 s rank 0 sleeps).
    with pytest.raises(ProcessRaisedException, match="rank 1 is the root cause") as raised:
        launch(root_cause_dies_last, nprocs=2, timeout=LAUNCH_TIMEOUT)
    assert raised.value.error_index == 1


# ---------------------------------------------------------------------- no processes needed
def test_rank_chain_ids_split_contiguously_and_cover_every_chain():
    for num_chains, world in [(6, 2), (7, 3), (5, 5), (100, 8)]:
        blocks = [list(rank_chain_ids(num_chains, world, r)) for r in range(world)]
        assert sum(blocks, []) == list(range(num_chains))
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
    with pytest.raises(ValueError, match="num_chains=2 is smaller than the number of processes 3"):
        rank_chain_ids(2, 3, 0)
    with pytest.raises(ValueError, match="rank must be"):
        rank_chain_ids(4, 2, 2)


def test_shard_and_bad_input():
    x = torch.arange(7.0)
    assert [shard(x, r, 3).tolist() for r in range(3)] == [[0.0, 1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    a, b = shard((x, 2 * x), 1, 2)
    assert a.tolist() == [4.0, 5.0, 6.0] and b.tolist() == [8.0, 10.0, 12.0]
    with pytest.raises(TypeError, match="shard: data must be a tensor"):
        shard([1, 2], 0, 2)
    with pytest.raises(RuntimeError, match="no torch.distributed process group"):
        data_parallel(SGLD(small_model))
    with pytest.raises(RuntimeError, match="no torch.distributed process group"):
        DistributedMCMC(SGLD(small_model), num_samples=1, num_chains=2)


def test_init_distributed_without_torchrun_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        init_distributed()
    assert 1024 <= free_port() < 65536


def test_mcmc_chain_ids_validation():
    kernel = SGLD(small_model)
    with pytest.raises(ValueError, match="chain_ids must hold num_chains=2 distinct ids"):
        MCMC(kernel, num_samples=1, num_chains=2, chain_method="vectorized", chain_ids=[0, 0])
    with pytest.raises(ValueError, match="chain_ids must be a sequence of non-negative integers"):
        MCMC(kernel, num_samples=1, num_chains=1, chain_method="vectorized", chain_ids=[-1])
    with pytest.raises(ValueError, match="chain_ids need"):
        MCMC(kernel, num_samples=1, num_chains=1, chain_ids=[0])


def test_distributed_mcmc_refuses_the_options_it_sets_itself():
    """chain_method, chain_ids and mp_context are DistributedMCMC's own: a named TypeError, before any group."""
    for option in (dict(chain_method="vectorized"), dict(chain_ids=[0]), dict(mp_context="spawn"), dict(thin=2)):
        with pytest.raises(TypeError, match=next(iter(option))):
            DistributedMCMC(SGLD(small_model), 5, num_chains=2, **option)


def test_data_parallel_needs_a_process_group_and_leaves_the_potential_alone():
    """data_parallel sets the kernel's estimator (tests/distributed/test_sharded.py), never a potential factory:
    the kernel has none to set."""
    from pyro_sgmcmc.kernels.base import SGMCMCKernel

    assert not hasattr(SGMCMCKernel, "potential_factory")
    kernel = SGLD(small_model)
    with pytest.raises(RuntimeError, match="no torch.distributed process group"):
        data_parallel(kernel)
    assert kernel.estimator_factory is None and kernel.control_variate == "auto"


def test_a_slice_of_chains_equals_those_chains_of_the_full_run():
    """The property DistributedMCMC rests on, in one process: chains 2, 3 alone = chains 2, 3 of 4."""
    x, y = small_data()
    common = dict(num_samples=10, warmup_steps=5, chain_method="vectorized", seed=4, disable_progbar=True)
    start = {"w": torch.randn(4, 2), "sigma": torch.randn(4)}  # unconstrained, one point per chain
    full = MCMC(SGLD(small_model, step_size=0.01), num_chains=4, initial_params=start, **common)
    full.run(x, y)
    part = MCMC(SGLD(small_model, step_size=0.01), num_chains=2, chain_ids=[2, 3],
                initial_params={k: v[2:] for k, v in start.items()}, **common)  # fmt: skip
    part.run(x, y)
    assert torch.equal(part.get_samples(group_by_chain=True)["w"], full.get_samples(group_by_chain=True)["w"][2:])
    assert not math.isnan(float(part.get_samples()["sigma"].sum()))


# ---------------------------------------------------------------------- under torchrun itself
TORCHRUN_SCRIPT = """
import json, os, sys
import torch, pyro, pyro.distributions as dist
from pyro_sgmcmc import SGLD
from pyro_sgmcmc.distributed import DistributedMCMC, init_distributed

def model(x):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", x.shape[0], subsample_size=5) as idx:
        pyro.sample("x", dist.Normal(mu, 1.0), obs=x[idx])

def hook(kernel, params, phase, step):
    if "--fail" in sys.argv and step == 3 and torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 failed on purpose")

rank, world_size = init_distributed()
mcmc = DistributedMCMC(SGLD(model, step_size=0.01), num_samples=10, warmup_steps=5, num_chains=6,
                       num_superchains=2, seed=0, hook_fn=hook, disable_progbar=True)
mcmc.run(torch.arange(20.0))
if rank == 0:
    json.dump({"world_size": world_size, "chain_ids": mcmc.chain_ids,
               "superchain_ids": mcmc.superchain_ids.tolist(),
               "shape": list(mcmc.get_samples(group_by_chain=True)["mu"].shape)}, open(sys.argv[1], "w"))
torch.distributed.barrier()
torch.distributed.destroy_process_group()
os._exit(0)  # skip interpreter shutdown, where gloo sometimes aborts (see distributed.rst, Failures)
"""


def _torchrun(tmp_path, *script_args):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "script.py"
    script.write_text(TORCHRUN_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), *script_args]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    return done, time.monotonic() - start


@pytest.mark.slow
def test_torchrun_gathers_on_rank_0_and_stops_on_a_failing_rank(tmp_path):
    """The documented launch, ``torchrun --nproc_per_node=2``, in both outcomes (two launches, ~30 s)."""
    out = tmp_path / "out.json"
    done, _ = _torchrun(tmp_path, str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result == {"world_size": 2, "chain_ids": list(range(6)), "superchain_ids": [0, 0, 0, 1, 1, 1],
                      "shape": [6, 10]}  # fmt: skip
    # Rank 1 raises at step 3; rank 0 is not left waiting: torchrun stops it and fails with rank 1's error.
    done, seconds = _torchrun(tmp_path, str(tmp_path / "unused.json"), "--fail")
    assert done.returncode != 0
    assert "ValueError: rank 1 failed on purpose" in done.stderr, done.stderr
    assert seconds < LAUNCH_TIMEOUT
