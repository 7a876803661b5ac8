"""The kernels with a cyclical schedule: exploration is SGD, the peak is the adapted step, only the sampling
stages' draws are returned (vectorised, sequential, parallel, ArviZ), resume is exact, and the moments of the
draws on a Gaussian target are those of the exact law of the discretised chain.
"""

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT, CheckpointSettings, Cyclical, to_inference_data
from pyro_sgmcmc.chains.minibatch import MinibatchSampler

from .. import reliability_script as script
from .test_sgd_equivalence import _data, _run_kernel, logistic_model, normalised_potential

# ---------------------------------------------------------------------- exploration is SGD with momentum


def test_sghmc_exploration_at_temperature_one_is_sgd_with_momentum(float64):
    """Oracle (``test_sgd_equivalence``): an SGHMC step without noise, step eps, friction alpha, mass sigma^2, is
    ``SGD(lr=eps/sigma^2, momentum=1 - eps alpha/sigma^2, dampening=1 - eps)``; here eps changes every step, so
    the optimizer's hyperparameters are set before each step. Full data: the same gradients on both sides.
    Tolerance 1e-10 in float64: the same arithmetic in another order (rounding, ~1e-15 a step)."""
    x, y = _data()
    w0 = torch.tensor([0.3, -0.2, 0.1])
    schedule = Cyclical(num_cycles=2, num_steps=200, exploration=0.7, peak=0.3)  # L = 100: 70 noiseless steps
    friction, mass = 2.0, 1.5
    kernel = SGHMC(logistic_model, step_size=schedule, temperature=1.0, friction=friction, mass=mass,
                   adapt_step_size=False, adapt_mass_matrix=False)  # fmt: skip
    ours = _run_kernel(kernel, x, y, w0, 100)

    w = w0.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([w], lr=1.0, momentum=0.5, dampening=0.5)
    optimizer.state[w]["momentum_buffer"] = torch.zeros_like(w)  # -m_0 (test_sgd_equivalence's docstring)
    theirs = []
    for t in range(70):
        eps = schedule(t)
        group = optimizer.param_groups[0]
        group.update(lr=eps / mass, momentum=1 - eps * friction / mass, dampening=1 - eps)
        optimizer.zero_grad()
        normalised_potential(w, x, y).backward()
        optimizer.step()
        theirs.append(w.detach().clone())
    theirs = torch.stack(theirs)
    assert (theirs[-1] - w0).abs().max() > 0.1  # it moves
    assert torch.allclose(ours[:70], theirs, rtol=0, atol=1e-10), (ours[:70] - theirs).abs().max()
    # the sampling stage injects noise: the next steps leave SGD's path (the noise's sd is sqrt(2 eps alpha / N))
    optimizer.zero_grad()
    normalised_potential(w, x, y).backward()
    group.update(lr=schedule(70) / mass, momentum=1 - schedule(70) * friction / mass, dampening=1 - schedule(70))
    optimizer.step()
    assert (ours[70] - w.detach()).abs().max() > 1e-4


def test_sgld_exploration_is_gradient_descent(float64):
    x, y = _data()
    w0 = torch.tensor([0.3, -0.2, 0.1])
    schedule = Cyclical(num_cycles=1, num_steps=50, exploration=0.5, peak=0.5)
    kernel = SGLD(logistic_model, step_size=schedule, adapt_step_size=False, adapt_mass_matrix=False)
    ours = _run_kernel(kernel, x, y, w0, 26)
    w = w0.clone().requires_grad_(True)
    for t in range(25):  # exploration: r = t / 50 < 0.5
        (grad,) = torch.autograd.grad(normalised_potential(w, x, y), w)
        w = (w - schedule(t) * grad).detach().requires_grad_(True)
        assert torch.allclose(ours[t], w, rtol=0, atol=1e-12), t
    assert (ours[25] - (w - schedule(25) * torch.autograd.grad(normalised_potential(w, x, y), w)[0])).abs().max() > 1e-4


def subsampled_logistic_model(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 2.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=20) as idx:
        pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])


def test_sghmc_exploration_is_sgd_with_momentum_on_the_same_minibatches(float64, monkeypatch):
    """As above, on minibatches of 20 of 200 rows: the minibatches the kernel draws are recorded, and PyTorch's SGD
    takes its steps on the same ones (the minibatch potential ``-(log prior + N / B * sum of the B
    log-likelihoods)``, divided by ``N``). The kernel's step ``t`` moves with the gradient at its current point on
    the minibatch drawn for that point: the set-up's first, then one per step."""
    drawn = []
    original = MinibatchSampler.next

    def recording(self):
        indices = original(self)
        drawn.append(indices["data"][0].clone())
        return indices

    monkeypatch.setattr(MinibatchSampler, "next", recording)
    x, y = _data()
    w0 = torch.tensor([0.3, -0.2, 0.1])
    schedule = Cyclical(num_cycles=2, num_steps=200, exploration=0.6, peak=0.3)
    friction, mass = 2.0, 1.5
    kernel = SGHMC(subsampled_logistic_model, step_size=schedule, friction=friction, mass=mass, control_variate=None,
                   adapt_step_size=False, adapt_mass_matrix=False, jit_compile=False)  # fmt: skip
    ours = _run_kernel(kernel, x, y, w0, 60)
    assert len(drawn) == 61 and not torch.equal(drawn[0], drawn[1])  # set-up's, then one per step: all differ

    w = w0.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([w], lr=1.0, momentum=0.5, dampening=0.5)
    optimizer.state[w]["momentum_buffer"] = torch.zeros_like(w)
    n = x.shape[0]
    for t in range(60):  # all exploration steps (r = t / 100 < 0.6)
        eps, rows = schedule(t), drawn[t]
        optimizer.param_groups[0].update(lr=eps / mass, momentum=1 - eps * friction / mass, dampening=1 - eps)
        optimizer.zero_grad()
        prior = torch.distributions.Normal(0.0, 2.0).log_prob(w).sum()
        likelihood = torch.distributions.Bernoulli(logits=x[rows] @ w).log_prob(y[rows]).sum() * n / len(rows)
        (-(prior + likelihood) / n).backward()
        optimizer.step()
        assert torch.allclose(ours[t], w.detach(), rtol=0, atol=1e-10), (t, (ours[t] - w).abs().max())
    assert (w.detach() - w0).abs().max() > 0.1  # it moves


def _subsampled_kernel(kernel_class, temperature, schedule, **kwargs):
    return kernel_class(script.model, step_size=schedule, temperature=temperature, adapt_step_size=False,
                        adapt_mass_matrix=False, control_variate=None, **kwargs)  # fmt: skip


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC])
def test_exploration_on_minibatches_is_the_zero_temperature_run_bit_for_bit(kernel_class):
    """The same seed gives the same minibatches whatever the temperature (the noise has its own stream), so the
    exploration steps of a ``T = 1`` run are those of the ``T = 0`` run (SGD, as above) exactly; the first
    sampling step is not."""
    schedule = Cyclical(num_cycles=2, num_steps=40, exploration=0.5, peak=0.05)
    paths = []
    for temperature in (1.0, 0.0):
        kernel = _subsampled_kernel(kernel_class, temperature, schedule)
        kernel.setup_chains(0, script.data(), num_chains=4, seed=3)
        paths.append(torch.stack([kernel.step().position for _ in range(11)]))
    hot, cold = paths
    assert torch.equal(hot[:10], cold[:10])  # steps 0..9 explore (L = 20)
    assert not torch.equal(hot[10], cold[10])


# ---------------------------------------------------------------------- the peak, and the draws kept


def _run(step_size, chain_method="vectorized", kernel_class=SGHMC, **settings):
    pyro.set_rng_seed(0)
    options = dict(num_samples=60, warmup_steps=40, num_chains=4, chain_method=chain_method, disable_progbar=True)
    if chain_method != "parallel":
        options["seed"] = 5
    options.update(settings)
    mcmc = MCMC(kernel_class(script.model, step_size=step_size), **options)
    mcmc.run(*script.data())
    return mcmc


def test_on_defaults_the_peak_is_each_chains_adapted_step_size():
    """The warmup does not read the schedule but at t = 0 (the peak, 1e-3 = the default step size): a cyclical
    run and a default run of the same seed adapt the same step sizes, and the cyclical run's step at sampling
    step k is that step times the cosine factor (float32 step sizes: relative tolerance 1e-6)."""
    constant = _run(None)
    schedule = Cyclical(num_cycles=3, num_steps=60, exploration=0.4)
    cyclical = _run(schedule)
    adapted = constant.sample_stats["step_size"][:, :1]  # (C, 1): constant through sampling
    assert torch.equal(constant.sample_stats["step_size"], adapted.expand(-1, 60))
    assert adapted.std() > 0  # one per chain
    kept = [k for k in range(60) if schedule.starting_at(40).sampling_stage(40 + k)]
    factor = torch.tensor([schedule(k) / schedule.peak for k in kept], dtype=torch.float64)
    assert torch.allclose(cyclical.sample_stats["step_size"], adapted * factor, rtol=1e-6, atol=0)


def test_peak_factor_multiplies_each_chains_adapted_step_size():
    """``peak_factor=F``: the warmup runs at the base step and adapts what a default run adapts (the same seed),
    and the kept step at sampling step k is F times the adapted step times the cosine factor (float32 step
    sizes: relative tolerance 1e-6)."""
    adapted = _run(None).sample_stats["step_size"][:, :1]
    schedule = Cyclical(num_cycles=3, num_steps=60, exploration=0.4, peak_factor=5.0)
    scaled = _run(schedule)
    kept = [k for k in range(60) if schedule.starting_at(40).sampling_stage(40 + k)]
    cosine = torch.tensor([(math.cos(math.pi * (k % 20) / 20) + 1) / 2 for k in kept], dtype=torch.float64)  # L = 20
    assert torch.allclose(scaled.sample_stats["step_size"], 5.0 * adapted * cosine, rtol=1e-6, atol=0)


def test_only_the_sampling_stages_draws_are_returned_and_the_stats_say_so():
    schedule = Cyclical(num_cycles=3, num_steps=60, exploration=0.4)  # L = 20: 8 exploration steps, 12 kept
    mcmc = _run(schedule)
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["w"].shape == (4, 36, 3) and mcmc.get_samples()["sigma"].shape == (4 * 36,)
    stats = mcmc.sample_stats
    assert stats["sampling_stage"].all() and stats["sampling_stage"].shape == (4, 36)
    assert stats["cycle"][0].tolist() == [0] * 12 + [1] * 12 + [2] * 12
    # the kept draws are steps 8..19 of each cycle: the last of them is the run's last state
    assert torch.equal(samples["w"][:, -1], mcmc.kernel.potential.unpack(mcmc.kernel.state.position)["w"])
    idata = to_inference_data(mcmc, observed_data=False)
    assert idata.posterior.sizes["draw"] == idata.sample_stats.sizes["draw"] == 36
    assert bool(idata.sample_stats["sampling_stage"].all()) and "cycle" in idata.sample_stats
    for group in (idata.posterior, idata.sample_stats):
        assert group.attrs["draws_kept"].startswith("sampling stages only (sampling_stage), of Cyclical(")


def test_thinning_and_the_other_chain_methods_keep_the_same_draws():
    schedule = Cyclical(num_cycles=2, num_steps=60, exploration=0.5)  # L = 30
    vectorized = _run(schedule, thinning=2, num_samples=30)
    assert vectorized.get_samples(group_by_chain=True)["w"].shape == (4, 16, 3)  # odd steps 15..29 per cycle
    sequential = _run(schedule, chain_method="sequential", thinning=2, num_samples=30)
    # the same steps kept: the same cosine factors (the peaks, adapted per chain, may differ: "auto" control
    # variates are decided over all the chains of a run)
    for run in (vectorized, sequential):
        step_size = run.sample_stats["step_size"]
        factor = torch.tensor([schedule(15 + 2 * i) / schedule.peak for i in range(8)] * 2, dtype=torch.float64)
        assert torch.allclose(step_size, step_size[:, :1] / factor[0] * factor, rtol=1e-6, atol=0)
    assert torch.equal(sequential.sample_stats["cycle"], vectorized.sample_stats["cycle"])
    parallel = _run(Cyclical(num_cycles=2, num_steps=60, exploration=0.5), chain_method="parallel", num_chains=1)
    assert parallel.get_samples(group_by_chain=True)["w"].shape == (1, 30, 3)


def test_sgnht_runs_with_a_cyclical_schedule():
    mcmc = _run(Cyclical(num_cycles=2, num_steps=60, exploration=0.5), kernel_class=SGNHT)
    assert mcmc.get_samples(group_by_chain=True)["w"].shape == (4, 30, 3)
    assert torch.isfinite(mcmc.get_samples()["w"]).all()


def test_a_schedule_with_a_peak_and_no_adaptation():
    kernel = SGLD(script.model, step_size=Cyclical(2, 60, 0.5, peak=0.02), adapt_step_size=False)
    mcmc = MCMC(kernel, num_samples=60, warmup_steps=40, num_chains=2, chain_method="vectorized", seed=1,
                disable_progbar=True)  # fmt: skip
    mcmc.run(*script.data())
    assert mcmc.sample_stats["step_size"][0, 0].item() == pytest.approx(0.02 * (math.cos(math.pi / 2) + 1) / 2)


@pytest.mark.parametrize("kernel_class,peak_factor", [(SGHMC, 1.0), (SGLD, 3.0), (SGNHT, 1.0)])
def test_resume_of_a_cyclical_run_is_bit_identical(tmp_path, kernel_class, peak_factor):
    """Resuming restores the adapted step sizes, the step counter and the streams, and the schedule is a function
    of the step: the resumed run's draws and statistics are the uninterrupted run's (reliability.rst's promise),
    for each kernel, with a peak factor too."""
    schedule = Cyclical(num_cycles=3, num_steps=60, exploration=0.4, peak_factor=peak_factor)
    reference = _run(schedule, kernel_class=kernel_class)
    path = tmp_path / "run.ckpt"

    class Interrupt(Exception):
        pass

    def interrupt(kernel, params, stage, i):
        if kernel.state.step == 73:  # sampling, cycle 1's exploration, between checkpoints
            raise Interrupt

    with pytest.raises(Interrupt):
        _run(schedule, kernel_class=kernel_class, checkpoint=CheckpointSettings(path, every=10), hook_fn=interrupt)
    resumed = _run(schedule, kernel_class=kernel_class, checkpoint=CheckpointSettings(path, every=10))
    for name, value in reference.get_samples(group_by_chain=True).items():
        assert torch.equal(value, resumed.get_samples(group_by_chain=True)[name]), name
    for name, value in reference.sample_stats.items():
        assert torch.equal(value, resumed.sample_stats[name]), name


def test_another_schedule_is_a_checkpoint_mismatch(tmp_path):
    from pyro_sgmcmc.checkpoint import CheckpointMismatch

    path = tmp_path / "run.ckpt"
    _run(Cyclical(num_cycles=3, num_steps=60, exploration=0.4), checkpoint=CheckpointSettings(path, every=50))
    with pytest.raises(CheckpointMismatch, match="step_size"):
        _run(Cyclical(num_cycles=3, num_steps=60, exploration=0.5), checkpoint=CheckpointSettings(path, every=50))
    with pytest.raises(CheckpointMismatch, match="peak_factor"):
        scaled = Cyclical(num_cycles=3, num_steps=60, exploration=0.4, peak_factor=2.0)
        _run(scaled, checkpoint=CheckpointSettings(path, every=50))


# ---------------------------------------------------------------------- moments on a Gaussian target

MU, SD, NUM_CHAINS = 1.0, 0.5, 400


def gaussian(dim=2):
    pyro.sample("z", dist.Normal(MU, SD).expand([dim]).to_event(1))


def exact_law(schedule, num_steps, start, curvature, temperature=1.0):
    """Mean and variance of every step's draw of SGLD on U = (z - MU)^2 / (2 SD^2), N = 1, full gradients:
    z' = z - eps lambda (z - MU) + sqrt(2 eps T) zeta (zeta = 0 when exploring) is linear-Gaussian, so
    m' = m - eps lambda (m - MU) and v' = (1 - eps lambda)^2 v + 2 eps T exactly."""
    mean, var, laws = start, 0.0, []
    for t in range(num_steps):
        eps = schedule(t)
        mean = mean - eps * curvature * (mean - MU)
        var = (1 - eps * curvature) ** 2 * var + (0.0 if schedule.explores(t) else 2 * eps * temperature)
        laws.append((mean, var))
    return np.array(laws)


def test_sampling_stage_draws_have_the_moments_of_the_target_up_to_the_known_bias():
    """SGLD, 400 chains from z = 3, 4 cycles of 200 steps, beta = 0.5, peak 0.1 (eps lambda <= 0.4).

    Exact oracle: the law of each draw (``exact_law``); pooled over the kept draws its mean and second central
    moment differ from the target's (MU, SD^2) by a known bias: the discretisation (the stationary variance at
    step eps is SD^2 / (1 - eps lambda / 2), up to 11 % more in the sampling stages) and the start of each
    sampling stage, which follows a noiseless exploration that leaves the chains at the mode (variance 0),
    from where the variance builds up. Statistic per chain: the mean of z and of (z - MU)^2 over the kept draws
    of both coordinates; the chains are independent, so the standard error is their sd / sqrt(400).
    """
    schedule = Cyclical(num_cycles=4, num_steps=800, exploration=0.5, peak=0.1)
    kernel = SGLD(gaussian, step_size=schedule, num_data=1, adapt_step_size=False, adapt_mass_matrix=False)
    start = torch.full((NUM_CHAINS, 2), 3.0)
    mcmc = MCMC(kernel, num_samples=800, warmup_steps=0, num_chains=NUM_CHAINS, chain_method="vectorized",
                seed=11, initial_params={"z": start}, disable_progbar=True)  # fmt: skip
    mcmc.run()
    z = mcmc.get_samples(group_by_chain=True)["z"].double()  # (C, S, 2)
    assert z.shape == (NUM_CHAINS, 400, 2)

    kept = np.array([schedule.sampling_stage(t) for t in range(800)])
    law = exact_law(schedule, 800, 3.0, curvature=1 / SD**2)[kept]
    exact_mean = law[:, 0].mean()
    exact_second = (law[:, 1] + (law[:, 0] - MU) ** 2).mean()

    per_chain_mean = z.mean(dim=(1, 2))
    per_chain_second = ((z - MU) ** 2).mean(dim=(1, 2))
    se_mean = float(per_chain_mean.std() / math.sqrt(NUM_CHAINS))
    se_second = float(per_chain_second.std() / math.sqrt(NUM_CHAINS))
    mean, second = float(per_chain_mean.mean()), float(per_chain_second.mean())

    # 1. the draws follow the exact law of the discretised chain: MC error only (4 standard errors)
    assert abs(mean - exact_mean) < 4 * se_mean, (mean, exact_mean, se_mean)
    assert abs(second - exact_second) < 4 * se_second, (second, exact_second, se_second)
    # 2. against the target: the known bias (computed, not guessed) plus 4 standard errors; the bias is small
    bias_mean, bias_second = exact_mean - MU, exact_second - SD**2
    assert abs(bias_mean) < 1e-6 and abs(bias_second) < 0.1 * SD**2, (bias_mean, bias_second)
    assert abs(mean - MU) < abs(bias_mean) + 4 * se_mean
    assert abs(second - SD**2) < abs(bias_second) + 4 * se_second
    # 3. the test can fail: the exploration draws (noise off, at the mode) would have shrunk the variance by
    #    more than the tolerance
    law_all = exact_law(schedule, 800, 3.0, curvature=1 / SD**2)
    all_second = (law_all[:, 1] + (law_all[:, 0] - MU) ** 2).mean()
    assert abs(all_second - SD**2) > abs(bias_second) + 4 * se_second
