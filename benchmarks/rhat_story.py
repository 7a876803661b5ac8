"""Which R-hat to believe: ArviZ's rank-normalised split R-hat against nested R-hat, on many short chains.

The numbers of the section "Which R-hat to believe" in ``docs/concepts.rst``. One run of 64 vectorised SGHMC
chains in 8 superchains of ``M = 8`` (the chains of a superchain share a starting point), 500 warmup steps, then
``--draws`` kept draws per chain, on the chains tutorial's model (Bayesian linear regression, two weights,
1,000 observations read 100 at a time). The first ``N`` draws of every chain, for several ``N``, are exported
with :func:`pyro_sgmcmc.to_inference_data` and judged by

* ``arviz.rhat`` (rank-normalised split R-hat, Vehtari et al. 2021), whose rule is ``< 1.01``;
* :func:`pyro_sgmcmc.nested_rhat` against :func:`pyro_sgmcmc.nested_rhat_threshold` ``(M, N)``;

beside the values stationary chains are expected to give (derived in the docs section): with an integrated
autocorrelation time ``tau`` (estimated once, from all draws of all chains, as ``64 N / ESS_bulk``) and split
chains of ``n = N / 2`` draws, classic R-hat is about ``sqrt((n - 1) / (n - tau))``, nested R-hat about
``sqrt(1 + tau / (M N))``. A last run with 20 warmup steps (chains still near their starting points) shows both
diagnostics flag chains that have not mixed. Prints the date, the machine, its load and the thread count.

Run with one thread (about 30 s on an idle 2-core machine)::

    OMP_NUM_THREADS=1 python benchmarks/rhat_story.py
"""

from __future__ import annotations

import math
import time
import warnings

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import scipy.stats
import torch

import pyro_sgmcmc
from pyro_sgmcmc import SGHMC, nested_rhat, nested_rhat_threshold, to_inference_data

if __package__:  # imported as benchmarks.rhat_story
    from . import harness
else:  # run as a script: benchmarks/ is on sys.path
    import harness

CHAINS, SUPERCHAINS = 64, 8
PER_SUPERCHAIN = CHAINS // SUPERCHAINS
OBSERVATIONS, BATCH, NOISE = 1000, 100, 0.5


def regression():
    """The chains tutorial's model and data: ``y = x @ [1, -2] + 0.5 * noise``, 1,000 observations."""
    pyro.set_rng_seed(0)
    x = torch.randn(OBSERVATIONS, 2)
    y = x @ torch.tensor([1.0, -2.0]) + NOISE * torch.randn(OBSERVATIONS)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", OBSERVATIONS, subsample_size=BATCH) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, NOISE), obs=y[idx])

    return model, (x, y)


def run(warmup_steps: int, num_samples: int, step_size=None) -> pyro_sgmcmc.MCMC:
    model, data = regression()
    kernel = SGHMC(model) if step_size is None else SGHMC(model, step_size=step_size)
    mcmc = pyro_sgmcmc.MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, num_chains=CHAINS,
                            num_superchains=SUPERCHAINS, chain_method="vectorized", seed=0,
                            disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unmixed run warns that it is too short: that is its point
        mcmc.run(*data)
    return mcmc


def initial_positive(autocorrelation: np.ndarray) -> np.ndarray:
    """The autocorrelation up to Geyer's initial positive sequence (``rho_2m + rho_2m+1 > 0``), zero beyond: past
    it the estimate is noise, whose sum over all lags is biased to ``-1/2`` by the subtracted chain mean."""
    kept = autocorrelation.copy()
    pairs = kept[: len(kept) // 2 * 2].reshape(-1, 2, kept.shape[-1]).sum(axis=1)
    for column in range(kept.shape[-1]):
        negative = np.flatnonzero(pairs[:, column] < 0)
        if len(negative):
            kept[2 * negative[0] :, column] = 0.0
    return kept


def mean_variance_ratio(autocorrelation: np.ndarray, draws: int) -> np.ndarray:
    """``c_N = Var(mean of N draws) / sigma^2 = (1 + 2 sum_{k<N} (1 - k/N) rho_k) / N`` of a stationary chain."""
    lags = np.arange(1, draws)[:, None]
    return (1 + 2 * ((1 - lags / draws) * autocorrelation[1:draws]).sum(axis=0)) / draws


def expected_if_mixed(autocorrelation: np.ndarray, draws: int) -> dict:
    """What stationary chains with this autocorrelation give, on average (derived in the docs section).

    Classic split R-hat (halves of ``n = N/2`` draws): ``E s^2 = sigma^2 n (1 - c_n) / (n - 1)`` and the chain
    means vary by ``sigma^2 c_n``, so ``R^2 = (n - 1) / (n (1 - c_n))``. Nested R-hat: ``B = sigma^2 c_N / M``,
    ``W = sigma^2 (c_N + N (1 - c_N) / (N - 1))`` (``sigma^2`` if ``N = 1``), ``R^2 = 1 + B / W``. In a single
    run ``B / W`` scatters about its mean as an ``F(K - 1, K (M N_eff - 1))`` variable, ``N_eff = 1 / c_N`` the
    independent draws a chain's mean is worth: exactly so for one independent normal draw per chain (``B`` on
    ``K - 1`` degrees of freedom, ``W`` on ``K (M - 1)``); its 5 and 95 % points give the range of a single run.
    """
    half = draws // 2
    classic = np.sqrt((half - 1) / (half * (1 - mean_variance_ratio(autocorrelation, half)))) if half > 1 else None
    c = mean_variance_ratio(autocorrelation, draws)
    within = c + draws * (1 - c) / (draws - 1) if draws > 1 else np.ones_like(c)
    ratio = c / (PER_SUPERCHAIN * within)
    within_dof = SUPERCHAINS * (PER_SUPERCHAIN / c - 1)  # W's degrees of freedom, per parameter
    spread = scipy.stats.f(SUPERCHAINS - 1, within_dof[:, None]).ppf([[0.05, 0.95]])  # B/W over its mean
    return {
        "az.rhat": classic.tolist() if classic is not None else [math.nan, math.nan],
        "nested_rhat": np.sqrt(1 + ratio).tolist(),
        "nested_rhat 5-95 %": np.sqrt(1 + ratio[:, None] * spread).tolist(),
    }


def judge(posterior, draws: int) -> dict:
    """Both R-hats of the first ``draws`` draws of every chain, with the threshold nested R-hat is read against."""
    first = posterior.isel(draw=slice(0, draws))
    # ArviZ needs 4 draws per chain (2 per split half); below that its R-hat is not defined
    classic = az.rhat(first, var_names=["w"])["w"].values if draws >= 4 else np.full(2, np.nan)
    return {
        "draws per chain": draws,
        "az.rhat": classic.tolist(),
        "nested_rhat": nested_rhat(first, var_names=["w"])["w"].values.tolist(),
        "nested_rhat_threshold": nested_rhat_threshold(PER_SUPERCHAIN, draws),
    }


def effective_threshold(draws: int, tau: float) -> float:
    """``nested_rhat_threshold(M, N)`` counts independent draws: given ``N`` correlated ones, count ``N / tau``."""
    return nested_rhat_threshold(PER_SUPERCHAIN, max(1, int(draws // tau)))


def main() -> None:
    args = harness.parser(__doc__, out=None, tiny=None).parse_args()
    torch.set_num_threads(1)
    log, start = harness.Log(), time.perf_counter()
    info = harness.machine_info(load_average=harness.load_average())
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    log(f"{stamp}; {info['cpu']}, {info['cpus']} cores, load {info['load_average']}; "
        f"torch threads {info['torch_threads']}; pyro_sgmcmc {info['pyro_sgmcmc']}")  # fmt: skip
    log(f"{CHAINS} SGHMC chains in {SUPERCHAINS} superchains of M = {PER_SUPERCHAIN}, 500 warmup steps, seed 0")

    mixed = run(warmup_steps=500, num_samples=1000)
    posterior = to_inference_data(mixed).posterior
    ess = az.ess(posterior, var_names=["w"], method="bulk")["w"].values
    tau = CHAINS * posterior.sizes["draw"] / ess
    values = np.moveaxis(posterior["w"].values, 1, -1)  # (chain, parameter, draw)
    autocorrelation = initial_positive(az.autocorr(values, axis=-1).mean(axis=0).T)  # (lag, parameter)
    log(f"integrated autocorrelation time tau = 64 x 1000 / ESS_bulk: {np.round(tau, 2).tolist()} steps; "
        f"lag-1 autocorrelation {[round(float(r), 3) for r in autocorrelation[1]]}")  # fmt: skip
    rows = [{**judge(posterior, draws), "if mixed": expected_if_mixed(autocorrelation, draws),
             "threshold for N / tau draws": effective_threshold(draws, float(tau.mean()))}
            for draws in (1, 10, 100, 1000)]  # fmt: skip

    unmixed = run(warmup_steps=19, num_samples=10, step_size=0.05)  # the chains tutorial's 20-step run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ: more chains than draws (on purpose)
        unmixed_posterior = to_inference_data(unmixed).posterior
    rows.append({**judge(unmixed_posterior, 10), "draws per chain": "10, after 20 steps",
                 "threshold for N / tau draws": effective_threshold(10, float(tau.mean()))})  # fmt: skip

    def pair(values) -> str:
        return " ".join("   nan" if math.isnan(v) else f"{v:6.3f}" for v in values)

    def mixed_value(row, key, index=None) -> str:
        expected = row.get("if mixed")
        if expected is None:
            return ""
        return pair(expected[key]) if index is None else " ".join(f"{a:.3f}-{b:.3f}" for a, b in expected[key])

    header = ["N / chain", "az.rhat w", "if mixed", "nested_rhat w", "if mixed", "5-95 % if mixed",
              "threshold(8, N)", "threshold(8, N / tau)"]  # fmt: skip
    log(harness.text_table(header, [
        [r["draws per chain"], pair(r["az.rhat"]), mixed_value(r, "az.rhat"), pair(r["nested_rhat"]),
         mixed_value(r, "nested_rhat"), mixed_value(r, "nested_rhat 5-95 %", 0), f"{r['nested_rhat_threshold']:.4f}",
         f"{r['threshold for N / tau draws']:.4f}"]
        for r in rows
    ]))  # fmt: skip
    log(f"ArviZ's rule: az.rhat < 1.01. Wall time {time.perf_counter() - start:.0f} s")
    if args.out is not None:
        harness.write_json(args.out, {"machine": info, "tau": tau.tolist(), "rows": rows, "log": log.lines})


if __name__ == "__main__":
    main()
