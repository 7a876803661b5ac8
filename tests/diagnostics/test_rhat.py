"""Nested R-hat: the formula by hand, arviz-stats agreement, planted failures, N = 1 draw per chain."""

import numpy as np
import pytest

from pyro_sgmcmc.diagnostics import nested_rhat, nested_rhat_threshold


def _by_hand(draws, ids):
    """The definition, one loop per sum (Margossian et al. 2024, eqs. 4-7)."""
    superchains = sorted(set(ids))
    f = draws.mean()
    chain_means = draws.mean(axis=1)
    f_k = [chain_means[ids == k].mean() for k in superchains]
    K = len(superchains)
    B = sum((fk - f) ** 2 for fk in f_k) / (K - 1)
    W = 0.0
    for k, fk in zip(superchains, f_k):
        members = np.flatnonzero(ids == k)
        M, N = len(members), draws.shape[1]
        b = 0.0 if M == 1 else sum((chain_means[m] - fk) ** 2 for m in members) / (M - 1)
        w = 0.0 if N == 1 else sum(((draws[m] - chain_means[m]) ** 2).sum() / (N - 1) for m in members) / M
        W += (b + w) / K
    return np.sqrt(1 + B / W)


@pytest.mark.parametrize("num_draws", [1, 2, 10])
@pytest.mark.parametrize("per_superchain", [1, 4])
def test_matches_the_definition(num_draws, per_superchain):
    rng = np.random.default_rng(1)
    K = 5
    draws = rng.normal(size=(K * per_superchain, num_draws)) + rng.normal(size=(K * per_superchain, 1)) * 0.3
    ids = np.repeat(np.arange(K), per_superchain)
    rng.shuffle(ids)  # superchain ids need not be contiguous
    if per_superchain == 1 and num_draws == 1:
        with pytest.raises(ValueError, match="superchain_ids: with one draw per chain"):  # W = 0: undefined
            nested_rhat(draws, ids)
        return
    assert np.isclose(nested_rhat(draws, ids), _by_hand(draws, ids), rtol=1e-12)


def test_agrees_with_arviz_stats_identity_method():
    arviz_stats = pytest.importorskip("arviz_stats")
    from arviz_stats.base import array_stats

    rng = np.random.default_rng(2)
    draws = rng.normal(size=(12, 20, 3)) + np.repeat(rng.normal(size=(4, 1, 3)), 3, axis=0) * 0.5
    ids = np.repeat(np.arange(4), 3)
    ours = nested_rhat(draws, ids)
    theirs = array_stats.rhat_nested(np.moveaxis(draws, (0, 1), (-2, -1)), ids, method="identity")
    assert np.allclose(ours, theirs, rtol=1e-12), (ours, theirs)
    assert arviz_stats is not None


def test_flags_stuck_superchains_and_passes_mixed_ones_with_one_draw_per_chain():
    """N = 1 (last state of each chain), K = 8 superchains of M = 64 chains.

    Mixed: all 512 final states iid N(0, 1). Then W ~ 1 and B ~ chi2_{K-1} / ((K - 1) M), so
    nRhat^2 - 1 < chi2_{7, 0.999} / (7 * 64) = 24.32 / 448 with probability 0.999: nRhat < 1.027.
    Stuck: half of the superchains sit in a mode at +3, the other half at -3 (a bimodal posterior whose
    chains never cross): B ~ 9 * 8 / 7 vs W ~ 1, nRhat ~ 3.4; any seed gives > 2.
    """
    rng = np.random.default_rng(3)
    K, M = 8, 64
    ids = np.repeat(np.arange(K), M)
    mixed = rng.normal(size=(K * M, 1))
    stuck = rng.normal(size=(K * M, 1)) + np.where(ids % 2 == 0, 3.0, -3.0)[:, None]
    bound = np.sqrt(1 + 24.32 / (7 * M))
    assert nested_rhat(mixed, ids) < bound
    assert nested_rhat(stuck, ids) > 2.0
    # the floor-aware threshold is the expected value for mixed chains, between the two
    assert 1.0 < nested_rhat_threshold(M, 1) < bound


def test_inference_data_reads_superchain_coordinate():
    az = pytest.importorskip("arviz")
    rng = np.random.default_rng(4)
    draws = rng.normal(size=(6, 8, 2))
    idata = az.from_dict(posterior={"theta": draws})
    idata.posterior = idata.posterior.assign_coords(superchain=("chain", [0, 0, 1, 1, 2, 2]))
    result = nested_rhat(idata)
    assert np.allclose(result["theta"].values, nested_rhat(draws, [0, 0, 1, 1, 2, 2]))


def test_bad_superchains():
    draws = np.zeros((6, 3))
    with pytest.raises(ValueError, match="one entry per chain"):
        nested_rhat(draws, [0, 1])
    with pytest.raises(ValueError, match="same number of chains"):
        nested_rhat(draws, [0, 0, 0, 1, 1, 2])
    with pytest.raises(ValueError, match="at least 2 superchains"):
        nested_rhat(draws, [0] * 6)
    with pytest.raises(ValueError, match="chains_per_superchain must be a positive integer"):
        nested_rhat_threshold(0)


def test_nested_rhat_reads_a_pyro_mcmc_run():
    """Pyro's own MCMC (no superchains): every chain its own superchain unless superchain_ids says
    otherwise; the value equals that of the same draws passed as an array."""
    import warnings

    import pyro
    import pyro.distributions as dist
    from pyro.infer import MCMC as PyroMCMC

    from pyro_sgmcmc import SGHMC

    def model():
        pyro.sample("x", dist.Normal(0.0, 1.0))

    pyro.set_rng_seed(0)
    run = PyroMCMC(SGHMC(model), num_samples=20, warmup_steps=30, num_chains=4, mp_context=None,
                   disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chains drawn sequentially on this machine
        run.run()
    draws = run.get_samples(group_by_chain=True)["x"]
    assert float(nested_rhat(run)["x"]) == pytest.approx(float(nested_rhat(draws)))
    assert float(nested_rhat(run, superchain_ids=[0, 0, 1, 1])["x"]) == pytest.approx(
        float(nested_rhat(draws, superchain_ids=[0, 0, 1, 1]))
    )


def test_named_input_gives_one_dataset_whatever_its_form():
    """A dict, our MCMC, Pyro's MCMC, InferenceData and its posterior Dataset of the same draws give the same
    xarray.Dataset (as ``arviz.rhat`` returns one for named input): parameter dims named ``<site>_dim_<i>`` as ArviZ
    names them by default, and the values of the bare array (an ndarray, as ``arviz.rhat`` of an array)."""
    import warnings

    import pyro
    import pyro.distributions as dist
    import xarray as xr
    from pyro.infer import MCMC as PyroMCMC

    from pyro_sgmcmc import MCMC, SGHMC, to_inference_data

    def model():
        pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        pyro.sample("s", dist.Normal(0.0, 1.0))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short warmup (slow mixing), Pyro's chains drawn sequentially: not tested here
        ours = MCMC(SGHMC(model), num_samples=10, warmup_steps=20, num_chains=8, num_superchains=4,
                    chain_method="vectorized", seed=0, disable_progbar=True)  # fmt: skip
        ours.run()
        pyro.set_rng_seed(0)
        theirs = PyroMCMC(SGHMC(model), num_samples=10, warmup_steps=20, num_chains=4, mp_context=None,
                          disable_progbar=True)  # fmt: skip
        theirs.run()
    ids = ours.superchain_ids.tolist()
    for run, superchains in ((ours, None), (theirs, [0, 0, 1, 1])):
        draws = {name: value.numpy() for name, value in run.get_samples(group_by_chain=True).items()}
        idata = to_inference_data(run) if run is ours else _idata(draws, superchains)
        results = [
            nested_rhat(draws, superchains if superchains is not None else ids),
            nested_rhat(run, superchains),
            nested_rhat(idata),
            nested_rhat(idata.posterior),  # a Dataset, its superchain coordinate read as from the InferenceData
        ]
        for result in results:
            assert isinstance(result, xr.Dataset)
            assert result["w"].dims == ("w_dim_0",) and result["s"].dims == ()
            assert result.equals(results[0]), (result, results[0])
        bare = nested_rhat(draws["w"], superchains if superchains is not None else ids)
        assert isinstance(bare, np.ndarray) and np.array_equal(results[0]["w"].values, bare)


def _idata(draws, superchain_ids):
    az = pytest.importorskip("arviz")
    idata = az.from_dict(posterior=draws)
    idata.posterior = idata.posterior.assign_coords(superchain=("chain", superchain_ids))
    return idata


def test_nested_rhat_names_what_it_accepts():
    with pytest.raises(TypeError, match="nested_rhat: data must be an array of draws .* got object"):
        nested_rhat(object())


def _ar1_chains(num_chains: int, num_draws: int, rho: float, seed: int) -> np.ndarray:
    """Stationary AR(1) chains with unit variance: the integrated autocorrelation time is (1 + rho) / (1 - rho)."""
    rng = np.random.default_rng(seed)
    draws = np.empty((num_chains, num_draws))
    draws[:, 0] = rng.normal(size=num_chains)
    for n in range(1, num_draws):
        draws[:, n] = rho * draws[:, n - 1] + np.sqrt(1 - rho**2) * rng.normal(size=num_chains)
    return draws


def _mean_variance_ratio(rho: float, n: int) -> float:
    """c_n = Var(mean of n draws) / sigma^2 of an AR(1) chain: (1 + 2 sum_{k<n} (1 - k/n) rho^k) / n."""
    lags = np.arange(1, n)
    return (1 + 2 * np.sum((1 - lags / n) * rho**lags)) / n


def test_mixed_short_chains_fail_arvizs_rule_and_meet_nested_threshold():
    """The maths of "Which R-hat to believe" (docs/concepts.rst), on stationary (mixed) AR(1) chains with
    tau = 7 and N = 100 draws, 4096 chains in K = 512 superchains of M = 8.

    Split R-hat (halves of n = 50): R^2 = (n - 1) / (n (1 - c_n)) = 1.127, R = 1.0616 > 1.01. Its noise: the
    variance of 8192 half means has 8191 degrees of freedom, relative sd sqrt(2 / 8191) = 0.016 on
    B/W ~ 0.13, so sd(R) ~ 0.5 * 0.13 * 0.016 = 0.001; tolerance 0.004.
    Nested R-hat: R^2 = 1 + c_N / (M (c_N + N (1 - c_N) / (N - 1))) = 1.0084, R = 1.0042 < 1.01 =
    nested_rhat_threshold(8, 100). B has 511 degrees of freedom: relative sd 0.063 on B/W = 0.0084, so
    sd(R) ~ 0.5 * 0.0084 * 0.063 = 0.00026; tolerance 0.0011.
    """
    az = pytest.importorskip("arviz")
    rho, num_draws, per_superchain = 0.75, 100, 8
    draws = _ar1_chains(4096, num_draws, rho, seed=5)
    half = num_draws // 2
    c_half, c_all = _mean_variance_ratio(rho, half), _mean_variance_ratio(rho, num_draws)
    classic_expected = np.sqrt((half - 1) / (half * (1 - c_half)))
    within = c_all + num_draws * (1 - c_all) / (num_draws - 1)
    nested_expected = np.sqrt(1 + c_all / (per_superchain * within))

    classic = float(az.rhat(draws, method="split"))
    nested = float(nested_rhat(draws, np.repeat(np.arange(512), per_superchain)))
    assert abs(classic - classic_expected) < 0.004, (classic, classic_expected)
    assert abs(nested - nested_expected) < 0.0011, (nested, nested_expected)
    assert classic > 1.05 and nested < nested_rhat_threshold(per_superchain, num_draws) == 1.01


@pytest.mark.parametrize(
    "superchains, band, above_threshold, above_1_2",
    [(8, (1.019, 1.128), 0.44, 0.0034), (16, (1.029, 1.104), 0.46, 0.00006)],
    ids=["quickstart-8", "chains-tutorial-16"],
)
def test_a_single_run_of_mixed_chains_scatters_as_the_docs_say(superchains, band, above_threshold, above_1_2):
    """The band the docs give for one run of mixed chains with one draw each (docs/concepts.rst "Which R-hat to
    believe", the quickstart with 8 superchains of M = 8, the chains tutorial with 16): nine runs in ten inside
    it, the share above ``nested_rhat_threshold(8)`` and above 1.2.

    Oracle: for independent normal draws, ``B / W`` is exactly ``F(K - 1, K (M - 1))`` distributed (B on
    ``K - 1`` degrees of freedom, W pooled within superchains on ``K (M - 1)``) and ``R^2 = 1 + (B / W) / M``.
    The docs' rounded figures are checked against that distribution (to their rounding), and 40,000 simulated
    runs against it: a share ``p`` has Monte Carlo sd ``sqrt(p (1 - p) / 40000)`` (0.0015 at p = 0.9, 0.0025
    at p = 0.45, 0.0003 at p = 0.0034); the tolerance is 4 of those."""
    scipy_stats = pytest.importorskip("scipy.stats")
    per_superchain, runs = 8, 40_000
    law = scipy_stats.f(superchains - 1, superchains * (per_superchain - 1))
    share_above = lambda r: float(law.sf((r**2 - 1) * per_superchain))  # noqa: E731
    threshold = nested_rhat_threshold(per_superchain)
    exact = {"band": share_above(band[0]) - share_above(band[1]), "threshold": share_above(threshold),
             "1.2": share_above(1.2)}  # fmt: skip
    assert exact["band"] == pytest.approx(0.90, abs=0.005)  # "nine times in ten", the band rounded to 3 digits
    assert exact["threshold"] == pytest.approx(above_threshold, abs=0.005)
    assert exact["1.2"] == pytest.approx(above_1_2, rel=0.25)  # "about 3 runs in a thousand" (8 superchains)

    draws = np.random.default_rng(29).normal(size=(superchains * per_superchain, 1, runs))  # one draw a chain
    values = np.asarray(nested_rhat(draws, np.repeat(np.arange(superchains), per_superchain))).ravel()
    simulated = {"band": np.mean((values > band[0]) & (values < band[1])), "threshold": np.mean(values > threshold),
                 "1.2": np.mean(values > 1.2)}  # fmt: skip
    for key, p in exact.items():
        assert abs(simulated[key] - p) < 4 * np.sqrt(p * (1 - p) / runs) + 1 / runs, (key, simulated[key], p)
