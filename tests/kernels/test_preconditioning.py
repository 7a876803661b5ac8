"""Mass-matrix adaptation (``adapt_mass_matrix=True``) and the default step size.

* the preconditioned update is exactly the documented one (coupled noise, exact arithmetic);
* ``step_size=None`` without adaptation is the old default, bit for bit;
* the mass matrix is adapted per chain in warmup and frozen for sampling;
* checkpoint resume in mid-adaptation, with a control variate, is bit-identical;
* a badly scaled, correlated Gaussian is sampled exactly with default settings by all kernels;
* (slow) posteriordb regressions written as in Stan, no reparametrisation, no step size given:
  SGHMC and SGLD reproduce the reference means within 0.2 sd and sds within 15 %.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_value
from pyro.ops.stats import effective_sample_size

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT
from pyro_sgmcmc.chains.streams import ChainGenerators

from ..posteriordb_plain import POSTERIORDB, build, least_squares_init, reference

# A correlated Gaussian with scales 1e-3 .. 1e2 (condition number of the covariance about 1e10).
SCALES = torch.tensor([1e-3, 1.0, 1e2], dtype=torch.float64)
CORRELATION = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, -0.3], [0.0, -0.3, 1.0]], dtype=torch.float64)
COVARIANCE = SCALES.unsqueeze(-1) * CORRELATION * SCALES
LOC = torch.tensor([5.0, -1.0, 300.0], dtype=torch.float64)


def gaussian_model():
    pyro.sample("x", dist.MultivariateNormal(LOC, covariance_matrix=COVARIANCE))


def regression_model(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=torch.float64), 10.0).to_event(1))
    sigma = pyro.sample("sigma", dist.LogNormal(torch.zeros((), dtype=torch.float64), 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=20) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def regression_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 30.0, 0.1], dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.05, 4.0], dtype=torch.float64) + 0.3 * torch.randn(200, generator=g).double()
    return x, y


@pytest.mark.parametrize("full_mass", [False, True])
@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC])
def test_preconditioned_update_is_exact(kernel_cls, full_mass):
    """One step equals the documented preconditioned rule with the same noise draw:
    SGLD ``z' = z + eps P a + sqrt(2 eps T / N) L zeta``; SGHMC
    ``m' = (1 - eps alpha / s2) m + eps L^T a + sqrt(2 eps alpha T / N) zeta``, ``z' = z + eps L m' / s2``,
    with ``a`` the normalised drift, ``P = L L^T`` and ``eps`` the chain's own adapted step size. Warmup of 40
    steps: 10 of approach (no dynamics), then the preconditioned update, checked at its sixth step: after its
    first, second and fourth the curvature is probed and the metric replaced with the momentum reset (the state
    ``step()`` returns is the chains' state, reset included), so the fifth starts from rest and the sixth from
    a moving chain under an unchanged metric."""
    x, y = regression_data()
    kernel = kernel_cls(regression_model, adapt_mass_matrix=True, full_mass=full_mass, temperature=0.7)
    kernel.setup_chains(40, (x, y), num_chains=3, seed=4)
    for _ in range(15):
        kernel.step()
    state, factor = kernel.state, kernel.warmup.adaptation.factor
    streams = ChainGenerators(kernel.generators.seed, kernel.generators.chain_ids)  # the same keys
    zeta = streams.normal(state.position.shape[1:], state.position.dtype, step=state.step)
    assert kernel.phase == "adaptation"
    eps, n = kernel.warmup.chain_step_size.clone(), kernel.potential.num_data  # (C, 1): one step size per chain
    assert eps.shape == (3, 1)
    calt = kernel.temperature / n
    drift = -state.grad / n
    lower = factor if full_mass else torch.diag_embed(factor)
    assert kernel_cls is SGLD or bool((state.momentum != 0).all())
    new = kernel.step()
    if kernel_cls is SGLD:
        pre = lower @ lower.transpose(-1, -2)
        expected = state.position + eps * (pre @ drift.unsqueeze(-1)).squeeze(-1)
        expected = expected + torch.sqrt(2 * eps * calt) * (lower @ zeta.unsqueeze(-1)).squeeze(-1)
    else:
        alpha, mass = kernel.friction, kernel.mass
        drift_w = (lower.transpose(-1, -2) @ drift.unsqueeze(-1)).squeeze(-1)
        momentum = (1 - eps * alpha / mass) * state.momentum + eps * drift_w + torch.sqrt(2 * eps * calt * alpha) * zeta
        expected = state.position + eps / mass * (lower @ momentum.unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(new.momentum, momentum, rtol=1e-10, atol=1e-12)
    assert torch.allclose(new.position, expected, rtol=1e-10, atol=1e-12)


def test_default_step_size_without_adaptation_is_unchanged():
    """``step_size=None`` (the new default) without adaptation is the old default 1e-3, bit for bit."""
    x, y = regression_data()
    runs = []
    for step_size in (None, 1e-3):
        pyro.set_rng_seed(0)  # the initial point is drawn from the global generator
        kernel = SGHMC(regression_model, step_size=step_size)
        kernel.setup_chains(0, (x, y), num_chains=2, seed=0)
        runs.append(torch.stack([kernel.step().position for _ in range(20)]))
    assert torch.equal(runs[0], runs[1])
    assert kernel.inverse_mass_matrix is None


def test_mass_matrix_adapts_per_chain_in_warmup_and_is_frozen_for_sampling():
    x, y = regression_data()
    seen = []

    def hook(kernel, params, stage, t):
        if kernel.phase != "approach":  # the approach (first 25 % of warmup) has no metric yet
            seen.append((stage, kernel.inverse_mass_matrix.clone(), kernel.warmup.chain_step_size.clone()))

    fit = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1)  # start at the data's fit (not far out)
    start = init_to_value(values={"w": fit, "sigma": (y - x @ fit).std()})
    kernel = SGHMC(regression_model, adapt_mass_matrix=True, full_mass=False, init_strategy=start)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=200, num_chains=3, chain_method="vectorized", seed=0,
                disable_progbar=True, hook_fn=hook)  # fmt: skip
    mcmc.run(x, y)
    warm = [m for stage, m, _ in seen if stage == "Warmup"]
    sampling = [(m, e) for stage, m, e in seen if stage == "Sample"]
    assert any(not torch.equal(warm[0], m) for m in warm)  # adapted during warmup
    assert all(torch.equal(sampling[0][0], m) and torch.equal(sampling[0][1], e) for m, e in sampling)  # then frozen
    assert sampling[0][1].shape == (3, 1)  # one step size per chain
    final = sampling[0][0]
    assert final.shape == (3, 4) and not torch.equal(final[0], final[1])  # one per chain, from its own draws
    # the adapted metric is the posterior scale: sd of the coefficients differ by about 300x (covariate sds)
    # exact ratio of the posterior variances of w[1] and w[2] (given sigma): about (0.1 / 30)^2 = 1e-5, against 1
    # without adaptation. The adapted one is a per-chain estimate from minibatch Hessians and gradients (B = 20
    # of 200) at the chain's draws. Its spread, measured over 60 chains (seeds 8-27): log-sd 0.34, range
    # 0.55-3.23 times the exact ratio (the same before and after the control variate's search was staged:
    # log-sd 0.35, 0.48-2.21). So each chain within 5x (4.6 log-sds; a failed adaptation is 1e5 off) and the
    # median of the three within 2x (the median of 3 has about 0.6 of one chain's log-sd: 3.4 of them).
    w = kernel.potential.unpack(final)["w"]  # (3 chains, 3)
    exact = torch.linalg.inv(x.T @ x).diagonal()
    ratio = (w[:, 1] / w[:, 2]) / (exact[1] / exact[2])
    assert bool(((ratio < 5) & (ratio > 0.2)).all()), ratio
    assert 0.5 < float(ratio.median()) < 2, ratio


def test_checkpoint_resume_mid_adaptation_is_bit_identical(tmp_path):
    """Interrupted in warmup (adaptation under way), with a control variate: resume equals the straight run."""
    x, y = regression_data()

    def run(path=None, hook=None):
        pyro.set_rng_seed(0)  # the initial point is drawn from the global generator
        kernel = SGHMC(regression_model, adapt_mass_matrix=True, control_variate="map")
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=60, num_chains=2, chain_method="vectorized", seed=2,
                    disable_progbar=True, checkpoint_path=path, checkpoint_every=path and 5, hook_fn=hook)  # fmt: skip
        mcmc.run(x, y)
        return mcmc

    class Stop(Exception):
        pass

    def stop(kernel, params, stage, t):
        if t == 32:
            raise Stop

    straight = run()
    path = tmp_path / "run.ckpt"
    with pytest.raises(Stop):
        run(path, stop)
    assert torch.load(path, weights_only=False)["steps_done"] == 30
    resumed = run(path)
    for name, value in straight.get_samples().items():
        assert torch.equal(value, resumed.get_samples()[name]), name


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, pytest.param(SGNHT, marks=pytest.mark.slow)])  # SGNHT: 1800 steps
def test_badly_scaled_gaussian_with_default_settings(kernel_cls):
    """Scales 1e-3 .. 1e2 with correlation 0.9, no step size given: means and sds within Monte
    Carlo error plus the heuristic's bias.

    Without preconditioning no single step size works here (stable steps for the 1e-3 direction
    leave the 1e2 one unmoved for 1e10 steps). Tolerances: ``|mean - loc| <= 4 sd / sqrt(ESS)``;
    ``|sd / sd_true - 1| <= 4 / sqrt(2 ESS) + 0.05``, the 0.05 bounding the variance bias the
    step-size rule allows (SGLD: eps lambda / 2 <= 5 %; SGHMC, SGNHT: about c^2 / 4 = 4 %), halved
    for the sd and doubled for the estimate of lambda_max.
    """
    kernel = kernel_cls(gaussian_model, adapt_mass_matrix=True, init_strategy=init_to_value(values={"x": LOC}))
    num_samples = 1500 if kernel_cls is SGNHT else 600  # SGNHT's default step is 4x smaller (its thermostat)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=300, num_chains=16, chain_method="vectorized", seed=1,
                disable_progbar=True)  # fmt: skip
    mcmc.run()
    draws = mcmc.get_samples(group_by_chain=True)["x"]
    ess = effective_sample_size(draws, chain_dim=0, sample_dim=1)
    assert float(ess.min()) > 400, ess
    flat = draws.reshape(-1, 3)
    assert bool(((flat.mean(0) - LOC).abs() <= 4 * SCALES / ess.sqrt()).all())
    ratio = flat.std(0) / SCALES
    assert bool(((ratio - 1).abs() <= 4 / (2 * ess).sqrt() + 0.05).all()), ratio
    assert kernel.num_divergences == 0


def test_bad_input():
    # adapt_mass_matrix=True at T = 0 is no error: nothing is adapted, the kernel optimises with the given step
    kernel = SGLD(gaussian_model, step_size=1e-3, adapt_mass_matrix=True, temperature=0.0)
    kernel.setup_chains(40, (), num_chains=2, seed=0)  # 40 steps would adapt at T > 0 (MIN_ADAPTATION_WARMUP = 20)
    assert kernel.warmup.adaptation is None
    for _ in range(10):
        kernel.step()
    assert kernel.inverse_mass_matrix is None and kernel.last_stats["step_size"].tolist() == [1e-3, 1e-3]
    with pytest.raises(ValueError, match="needs adapt_mass_matrix=True"):
        SGHMC(gaussian_model, adapt_mass_matrix=False, full_mass=True)  # adapt_mass_matrix=True is the default
    with pytest.raises(TypeError, match="adapt_mass_matrix must be True or False"):
        SGNHT(gaussian_model, adapt_mass_matrix="yes")
    with pytest.raises(TypeError, match="full_mass must be"):
        SGNHT(gaussian_model, adapt_mass_matrix=True, full_mass=1)


# ---------------------------------------------------------------------------- posteriordb (slow)
POSTERIORS = ["sblrc-blr", "kidiq-kidscore_interaction", "earnings-logearn_interaction_z"]


@pytest.mark.slow
@pytest.mark.skipif(not (POSTERIORDB / "README.md").exists(), reason=f"no posteriordb references at {POSTERIORDB}")
@pytest.mark.parametrize("kernel_cls", [SGHMC, SGLD])
@pytest.mark.parametrize("folder", POSTERIORS)
def test_posteriordb_regressions_with_default_settings(folder, kernel_cls):
    """``kernel_cls(model, adapt_mass_matrix=True)``, nothing else tuned, on the raw model (no
    reparametrisation), full batch, 16 chains started at the least-squares fit (computed from the
    data): every reference mean within 0.2 reference sd, every sd within 15 % (the issue's bar).

    Why the bar is a test and not a coin flip: the run must reach ESS >= 400 on every parameter
    (asserted), so the Monte Carlo sd of a mean is <= 0.05 sd (0.2 sd is 4 of them) and of an sd
    <= 3.5 % (15 % is 4 of them once the <= 2.5 % bias the step-size rule allows is taken off).
    The reference's own MCSE is 1 % of an sd. Measured (seed 0): largest mean errors 0.01-0.05 sd,
    sd errors 1-5 %.
    """
    torch.set_default_dtype(torch.float64)
    try:
        model, _, names = build(folder)
        start = init_to_value(values=least_squares_init(folder))
        kernel = kernel_cls(model, adapt_mass_matrix=True, init_strategy=start)
        mcmc = MCMC(kernel, num_samples=1000, warmup_steps=600, num_chains=16, chain_method="vectorized", seed=0,
                    disable_progbar=True)  # fmt: skip
        mcmc.run()
    finally:
        torch.set_default_dtype(torch.float32)
    samples = mcmc.get_samples(group_by_chain=True)
    ref = reference(folder)
    for name, value in names.items():
        x = value(samples)
        ess = float(effective_sample_size(x.unsqueeze(-1), chain_dim=0, sample_dim=1))
        assert ess >= 400, (name, ess)
        assert abs(float(x.mean()) - ref[name]["mean"]) <= 0.2 * ref[name]["sd"], name
        assert abs(float(x.reshape(-1).std()) / ref[name]["sd"] - 1) <= 0.15, name
    assert kernel.num_divergences == 0
