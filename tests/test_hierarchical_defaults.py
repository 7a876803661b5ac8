"""Hierarchical models on defaults: ``MCMC(SGHMC(model), warmup_steps=2000, num_samples=5000)`` and nothing else.

Issue 29 point 4: a varying-intercept regression (20 groups, N = 20,000, B = 500) on defaults. The model and
its exact reference are ``tests/hierarchical_models.py`` (centred, unbalanced groups: the smallest has about
200 data, 5 in a minibatch; the reference is exact up to quadrature, checked against 4,000 NUTS draws on the
sufficient statistics: every mean within 2.6 and every sd within 3.5 % of NUTS's, inside NUTS's own error).

Criterion (as ``tests/test_posteriordb_defaults.py``): every parameter's ``|mean - exact mean| < 0.2 sd`` and
``|sd / exact sd - 1| < 15 %``, with a bulk ESS of at least ``MIN_ESS = 150`` so that the Monte Carlo error of
the mean is at most 0.08 sd and that of the sd at most 5.8 % (the bound leaves 2.6 of those for the ~5 % sd
bias that the adaptation allows). Measured (4 vectorised chains of the same settings, seed 0): worst mean
error 0.12 sd, sd ratios 0.93-1.11, the two smallest groups' intercepts 4-6 % wide on average (gradient noise
relative to curvature is ``1 / n_j`` for a group with ``n_j`` data in the minibatch), min ESS 420 per chain.
Not tested here, to keep the suite short, measured the same way: the varying-slopes model (``"slopes"``, 42
parameters) worst mean error 0.15 sd, sd ratios 0.93-1.09 (mean 1.013), min ESS 208; the rarest group cut to
40 data (1 in a minibatch, ``smallest_weight=0.04``) keeps its sd within 4 % on average (1.00-1.07), the
step-size noise cap reading the largest coordinate's noise (step 0.15-0.24 against 0.3).
The seed is fixed; it was not chosen by looking at the results.
"""

from __future__ import annotations

import pyro
import pytest
from pyro.infer import MCMC
from pyro.ops.stats import effective_sample_size

from pyro_sgmcmc import SGHMC, SlowMixingWarning

try:  # tests/ is a package
    from .hierarchical_models import build_model, exact_moments, simulate, site_values
except ImportError:  # run as a plain module
    from hierarchical_models import build_model, exact_moments, simulate, site_values

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("float64")]

MEAN_BOUND = 0.2  # posterior sds
SD_BOUND = 0.15  # relative
MIN_ESS = 150
BATCH = 500


def test_varying_intercepts_on_defaults_match_the_exact_posterior():
    data = simulate("intercepts")
    exact = exact_moments(data)
    pyro.set_rng_seed(0)
    kernel = SGHMC(build_model(data, BATCH))
    mcmc = MCMC(kernel, warmup_steps=2000, num_samples=5000, disable_progbar=True)
    mcmc.run()
    draws = site_values(mcmc.get_samples(), "intercepts")
    lines, worst = [], []
    for name, (mean, sd) in exact.items():
        x = draws[name]
        mean_error = abs(float(x.mean()) - mean) / sd
        sd_error = float(x.std()) / sd - 1.0
        ess = float(effective_sample_size(x.reshape(1, -1), chain_dim=0, sample_dim=1))
        ok = mean_error < MEAN_BOUND and abs(sd_error) < SD_BOUND and ess >= MIN_ESS
        flag = "ok " if ok else "BAD"
        lines.append(f"{flag} {name:>9s} mean {mean_error:.3f} sd  sd {100 * sd_error:+.1f} %  ESS {ess:.0f}")
        worst.append((mean_error, sd_error, ess))
    report = "\n".join(lines)
    print("\n" + report)
    assert len(kernel.chain_diagnostics(0)["divergences"]) == 0, report
    assert all(e[2] >= MIN_ESS for e in worst), "ESS too small for the criterion to mean much\n" + report
    assert all(e[0] < MEAN_BOUND for e in worst), report
    assert all(abs(e[1]) < SD_BOUND for e in worst), report


def test_a_non_centred_model_of_data_rich_groups_warns():
    """The same posterior written non-centred (``alpha = mu + tau alpha_raw``): with hundreds of data per group
    every ``alpha_raw_j`` is tied to ``tau`` along a curved ridge that no constant metric fits, and the adapted
    step collapses (measured: 3e-6 to 4.5e-6 in 4 vectorised chains of 2,000 + 5,000 steps, against 0.3
    centred; ``tau`` 5 sds low, every sd under 12 % of the exact one; 1e-3 in this test's chain).
    The defaults cannot sample it, so they must say so at the end of warmup."""
    data = simulate("intercepts")
    pyro.set_rng_seed(0)
    kernel = SGHMC(build_model(data, BATCH, centred=False))
    mcmc = MCMC(kernel, warmup_steps=2000, num_samples=100, disable_progbar=True)
    with pytest.warns(SlowMixingWarning, match="(?s)mix slowly.*write that model centred"):
        mcmc.run()
    assert kernel.chain_diagnostics(0)["step size"] < 1e-2  # centred: 0.24-0.33
