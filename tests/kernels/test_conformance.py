"""Kernel conformance suite (issue #19): a new kernel gets every test here by adding one line to :data:`CASES`.

Stationary Gaussian moments against the exact posterior plus the kernel's exact bias at its step size; at
``temperature=0`` the kernel is its ``torch.optim`` optimiser; vectorised chains = chains run one by one;
``state_dict`` and checkpoint round trips; dtype/device; hostile inputs. Public API only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.linalg
import torch
from pyro.ops.stats import effective_sample_size

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT, ModelError


# ---------------------------------------------------------------------------------------------- references
class ThermostatSGD(torch.optim.SGD):
    """SGD with momentum ``1 - eps xi / sigma^2`` where ``xi += eps |buffer|^2 / (sigma^2 d)`` after each step."""

    def __init__(self, params, eps: float, mass: float, xi: float) -> None:
        self.eps, self.mass, self.xi = eps, mass, xi
        super().__init__(params, lr=eps / mass, momentum=1 - eps * xi / mass, dampening=1 - eps)

    def step(self, closure=None):
        super().step(closure)
        group = self.param_groups[0]
        buffers = [self.state[p]["momentum_buffer"] for p in group["params"]]
        self.xi += self.eps * sum(float((b * b).sum()) / (self.mass * b.numel()) for b in buffers)
        group["momentum"] = 1 - self.eps * self.xi / self.mass


def sgd(w, eps, o):
    return torch.optim.SGD([w], lr=eps)


def sgd_momentum(w, eps, o):
    """SGHMC at T = 0 (see its docstring); PyTorch's buffer is -m, pre-seeded with -m_0 = 0 (else its first step
    copies the gradient undamped)."""
    momentum = 1 - eps * o["friction"] / o["mass"]
    optimiser = torch.optim.SGD([w], lr=eps / o["mass"], momentum=momentum, dampening=1 - eps)
    optimiser.state[w]["momentum_buffer"] = torch.zeros_like(w)
    return optimiser


def thermostat_sgd(w, eps, o):
    """SGNHT at T = 0: SGHMC's SGD whose friction is a thermostat starting at ``diffusion``, fed by |m|^2."""
    optimiser = ThermostatSGD([w], eps, o["mass"], o["diffusion"])
    optimiser.state[w]["momentum_buffer"] = torch.zeros_like(w)
    return optimiser


def langevin(eps, lam, o, stats):
    """x' = (1 - eps lam) x + sqrt(2 eps T/N) zeta - eps e  (e: the minibatch error of the normalised gradient)."""
    return [(np.array([[1 - eps * lam]]), np.array([[math.sqrt(2 * eps)]]), np.array([[-eps]]))]


def underdamped(eps, lam, o, stats, frictions=None):
    """Kick then move: m' = a m - eps lam x + c zeta - eps e, x' = x + g m' (state (x, m)); decay a from the
    friction, noise c from the friction (SGHMC) or the diffusion alpha (SGNHT, whose friction is xi)."""
    out = []
    for friction in frictions or [o["friction"]]:
        a, g, b = 1 - eps * friction / o["mass"], eps / o["mass"], eps * lam
        c = math.sqrt(2 * eps * o.get("diffusion", friction))
        out.append((np.array([[1 - g * b, g * a], [-b, a]]), np.array([[g * c], [c]]), np.array([[-g * eps], [-eps]])))
    return out


def nose_hoover(eps, lam, o, stats):
    """SGNHT is SGHMC whose friction xi adapts (to alpha plus what absorbs the heat of the minibatch noise and of
    the discretisation). xi moves by steps of eps T / N, so slowly (hundreds of steps; the position forgets in
    about ten) that the position sees it frozen: its variance is the average, over the run's thermostats, of
    SGHMC's with that friction and the noise of alpha. 20 quantiles of the thermostats stand for the average."""
    thermostats = np.quantile(stats["thermostat"].double(), np.linspace(0.025, 0.975, 20))
    return underdamped(eps, lam, o, stats, frictions=list(thermostats))


# ---------------------------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class KernelCase:
    """One kernel under test.

    kernel, options : the class and its own constructor arguments for a small problem.
    step_size : a fixed step at which the stationary test knows the kernel's bias exactly.
    optimiser : ``(w, step_size, options) -> torch.optim.Optimizer``, the kernel at temperature 0.
    dynamics : ``(step_size, normalised curvature, options, sample_stats) -> [(A, q, r)]``: on a Gaussian target
        the kernel is ``v' = A v + sqrt(T/N) q zeta + r e`` with ``v[0]`` the position, ``zeta`` the injected
        noise and ``e`` the minibatch error of the normalised gradient; a kernel whose coefficients move slowly
        (SGNHT) gives several, read from the run's statistics, whose stationary variances average to its own.
    hyperparameters : constructor arguments that must be finite and > 0 or >= 0.
    burn_in : steps from the default init to stationarity on the Gaussian problem.
    """

    kernel: type
    options: Dict[str, float] = field(default_factory=dict)
    step_size: float = 0.2
    optimiser: Callable = sgd
    dynamics: Callable = langevin
    hyperparameters: Tuple[str, ...] = ()
    burn_in: int = 500

    def __repr__(self) -> str:
        return self.kernel.__name__

    def make(self, model, **kwargs):
        return self.kernel(model, **{**self.options, **kwargs})


CASES: List[KernelCase] = [
    KernelCase(SGLD),
    KernelCase(SGHMC, {"friction": 2.0, "mass": 1.5}, 0.2, sgd_momentum, underdamped, ("friction", "mass")),
    # SGNHT's thermostat heats up on the way in from a far start and cools by eps T / N a step (its docstring
    # warns of this transient): 3000 steps bring it near its equilibrium, the check reads it from the draws.
    KernelCase(SGNHT, {"diffusion": 1.0, "mass": 1.5}, 0.2, thermostat_sgd, nose_hoover, ("diffusion", "mass"), 3000),
]
cases = pytest.mark.parametrize("case", CASES, ids=repr)
FIXED = dict(adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)  # the kernel's own update only
pytestmark = pytest.mark.filterwarnings("ignore::pyro_sgmcmc.SlowMixingWarning")  # short warmups, on purpose


# ---------------------------------------------------------------------------------------------- the problem
# y_i ~ N(mu, SIGMA^2 I) with mu ~ N(0, PRIOR^2 I) in DIM dimensions: the posterior is N(mean, 1 / (N lam) I)
# with lam = (1 / PRIOR^2 + N / SIGMA^2) / N the normalised curvature the kernels see.
# BATCH > NUM_DATA / 2: every step's minibatch is a fresh uniform subset (an epoch holds one), so the minibatch
# errors are independent across steps and their effect on the stationary variance is known exactly.
DIM, NUM_DATA, BATCH, SIGMA, PRIOR = 2, 200, 120, 1.0, 10.0


def gaussian_data(dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(0)
    return (1.0 + SIGMA * torch.randn(NUM_DATA, DIM, generator=g, dtype=torch.float64)).to(dtype=dtype, device=device)


def gaussian_model(y):
    mu = pyro.sample("mu", dist.Normal(y.new_zeros(DIM), PRIOR).to_event(1))
    with pyro.plate("data", NUM_DATA, subsample_size=BATCH) as idx:
        pyro.sample("obs", dist.Normal(mu, SIGMA).to_event(1), obs=y[idx])


def exact_posterior(y):
    precision = 1 / PRIOR**2 + NUM_DATA / SIGMA**2
    return (y.sum(0) / SIGMA**2 / precision).numpy(), 1 / precision


# ---------------------------------------------------------------------------------------------- stationary
def stationary_check(case: KernelCase, temperature: float = 1.0, checked_temperature: float = 1.0) -> List[str]:
    """Run ``case`` at ``temperature`` and return the moment checks that fail against the exact tempered
    posterior at ``checked_temperature`` (empty when the kernel conforms). 8 chains x 6000 draws."""
    y = gaussian_data()
    pyro.set_rng_seed(0)  # the default init draws from the global generator
    kernel = case.make(gaussian_model, step_size=case.step_size, temperature=temperature, **FIXED)
    mcmc = MCMC(kernel, num_samples=6000, warmup_steps=case.burn_in, num_chains=8, chain_method="vectorized",
                seed=1, disable_progbar=True)  # fmt: skip
    mcmc.run(y)
    draws = mcmc.get_samples(group_by_chain=True)["mu"].double()  # (8, 6000, DIM)
    mean, variance = exact_posterior(y)
    lam = variance**-1 / NUM_DATA
    # Known bias: the linear kernel's exact stationary variance (discrete Lyapunov equation) at this step:
    # T/N times the injected-noise part plus the minibatch-error part. The minibatch error of the normalised
    # gradient, e = (ybar - ybar_batch) / SIGMA^2, does not depend on mu (the likelihood is Gaussian); a
    # uniform B-subset of N has variance s^2 (N - B) / (B (N - 1)) / SIGMA^4 per coordinate (s^2 the data's
    # variance), independent across steps (see BATCH). Exact for SGLD and SGHMC; for SGNHT see nose_hoover.
    error_variance = float(y.var(0, unbiased=False).mean()) * (NUM_DATA - BATCH) / (BATCH * (NUM_DATA - 1)) / SIGMA**4
    injected, minibatch = [], []
    for A, q, r in case.dynamics(case.step_size, lam, case.options, mcmc.sample_stats):
        injected.append(checked_temperature / NUM_DATA * scipy.linalg.solve_discrete_lyapunov(A, q @ q.T)[0, 0])
        minibatch.append(error_variance * scipy.linalg.solve_discrete_lyapunov(A, r @ r.T)[0, 0])
    exact = float(np.mean(injected) + np.mean(minibatch))
    failures = []
    for d in range(DIM):
        x = draws[..., d]
        # Monte Carlo error from the draws' own autocorrelation: Pyro's ESS over the 8 chains (Geyer's initial
        # monotone sequence), of the draws (mean) and of the squared deviations (variance). 4.5 standard
        # errors: a false alarm about once in 10^5 per check.
        se_mean = math.sqrt(exact / float(effective_sample_size(x, chain_dim=0, sample_dim=1)))
        if not abs(float(x.mean()) - mean[d]) < 4.5 * se_mean:
            failures.append(f"mean[{d}] = {float(x.mean()):.5f}, exact {mean[d]:.5f}, se {se_mean:.2g}")
        square = (x - mean[d]) ** 2
        se_var = float(square.std()) / math.sqrt(float(effective_sample_size(square, chain_dim=0, sample_dim=1)))
        estimate = float(square.mean())
        if not abs(estimate - exact) < 4.5 * se_var:
            failures.append(f"var[{d}] = {estimate:.4g}, exact {exact:.4g}, se {se_var:.2g}")
        # precise enough to tell the exact value from one 15 % off (a noise scale 7 % off, a temperature 1.15)
        if not 4.5 * se_var < 0.15 * exact:
            failures.append(f"var[{d}]: tolerance {4.5 * se_var:.2g} too wide")
    return failures


@cases
def test_stationary_gaussian_moments(case, float64):
    assert stationary_check(case) == []


# ---------------------------------------------------------------------------------------------- T = 0
@cases
def test_zero_temperature_is_its_optimiser(case, float64):
    """Step for step, ``torch.optim``'s trajectory on the normalised potential U/N of the same minibatches.

    The model records its minibatch (``jit_compile=False``: it runs at every evaluation). The kernel evaluates
    the gradient at its starting point at set-up, then once per step at the new point: the last minibatch seen
    after set-up / after step t is the one the optimiser's step t + 1 uses. Tolerance 1e-10 in float64: both
    sides compute the same expressions in another order (rounding ~1e-15 a step)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=g, dtype=torch.float64)
    y, seen = torch.bernoulli(torch.sigmoid(x @ torch.tensor([1.0, -2.0, 0.5])), generator=g), []

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 2.0).to_event(1))
        with pyro.plate("data", len(y), subsample_size=12) as idx:
            seen.append(idx.clone())  # a copy: the sampler may refill its table in place
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    eps, w0, num_steps = case.step_size, torch.tensor([0.3, -0.2, 0.1]), 200
    kernel = case.make(model, step_size=eps, temperature=0.0, jit_compile=False)  # defaults: nothing adapts at T=0
    kernel.initial_params = {"w": w0.clone()}
    kernel.setup(0, x, y)
    params, ours, batches = kernel.initial_params, [], [seen[-1]]
    for _ in range(num_steps):
        params = kernel.sample(params)
        ours.append(params["w"].clone())
        batches.append(seen[-1])
    assert len({tuple(b.tolist()) for b in batches}) > 5  # the minibatches change

    w = w0.clone().requires_grad_(True)
    optimiser = case.optimiser(w, eps, case.options)
    theirs = []
    for idx in batches[:num_steps]:
        optimiser.zero_grad()
        prior = torch.distributions.Normal(0.0, 2.0).log_prob(w).sum()
        likelihood = torch.distributions.Bernoulli(logits=x[idx] @ w).log_prob(y[idx]).sum() * len(y) / len(idx)
        (-(prior + likelihood) / len(y)).backward()
        optimiser.step()
        theirs.append(w.detach().clone())
    ours, theirs = torch.stack(ours), torch.stack(theirs)
    assert (theirs[-1] - w0).abs().max() > 0.1  # it moves: not two constant sequences
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-10), (ours - theirs).abs().max()


# ---------------------------------------------------------------------------------------------- chains
STARTS = {"mu": torch.tensor([[0.5, -0.5], [0.1, 0.2], [1.0, 1.0]])}


def _vectorized(case, chains, kernel_options, initial_params=None, chain_ids=None, **mcmc):
    pyro.set_rng_seed(len(chains) + 10)  # a different global state for every run: only seed= may matter
    mcmc = MCMC(case.make(gaussian_model, step_size=case.step_size, **kernel_options), num_samples=30,
                warmup_steps=50, num_chains=len(chains), chain_method="vectorized", seed=3, chain_ids=chain_ids,
                initial_params=initial_params, disable_progbar=True, **mcmc)  # fmt: skip
    mcmc.run(gaussian_data(torch.float32))
    return mcmc


@cases
@pytest.mark.parametrize(
    "kernel_options, starts, bitwise",
    [
        pytest.param(FIXED, STARTS, True, id="fixed-step-given-starts"),
        pytest.param({}, STARTS, False, id="defaults-given-starts"),
        pytest.param({}, None, False, id="defaults-seed-only"),
    ],
)
def test_vectorized_equals_one_by_one(case, kernel_options, starts, bitwise):
    """Chain c of a 3-chain vectorised run draws what chain c run alone (``chain_ids=[c]``, same seed) draws: its
    noise and minibatches depend only on (seed, c). Bit for bit with a fixed step; with the defaults the warmup's
    adaptation reduces over the chain axis, so to float tolerance (SGHMC differs by 1 ulp in float32 today)."""
    together = _vectorized(case, range(3), kernel_options, starts).get_samples(group_by_chain=True)["mu"]
    for c in range(3):
        alone_starts = None if starts is None else {k: v[c : c + 1] for k, v in starts.items()}
        alone = _vectorized(case, [c], kernel_options, alone_starts, chain_ids=[c]).get_samples(group_by_chain=True)
        if bitwise:
            difference = (alone["mu"][0] - together[c]).abs().max()
            assert difference == 0, f"chain {c}: draws differ by up to {float(difference):.3g}"
        else:
            torch.testing.assert_close(alone["mu"][0], together[c], msg=lambda m: f"chain {c}: {m}")


def _trajectory(kernel, steps):
    states = [kernel.step() for _ in range(steps)]  # a kernel never writes into a state it has returned
    return [[t for t in (s.position, s.momentum, s.thermostat) if t is not None] for s in states]


@cases
@pytest.mark.parametrize("kernel_options, stop", [(FIXED, 15), ({}, 15), ({}, 45)], ids=["fixed", "warmup", "after"])
def test_state_dict_round_trip_continues_bit_identically(case, kernel_options, stop, tmp_path):
    """Save after ``stop`` steps (15: inside the default warmup's approach/adaptation; 45: after it), load into a
    fresh kernel set up on the same model (other seed, other starts), continue: the same states, bit for bit."""
    y = gaussian_data(torch.float32)
    kernel = case.make(gaussian_model, step_size=case.step_size, **kernel_options)
    kernel.setup_chains(40, (y,), num_chains=3, seed=3, initial_params=STARTS)
    _trajectory(kernel, stop)
    torch.save(kernel.state_dict(), tmp_path / "kernel.pt")
    expected = _trajectory(kernel, 20)

    fresh = case.make(gaussian_model, step_size=case.step_size, **kernel_options)
    fresh.setup_chains(40, (y,), num_chains=3, seed=99, initial_params={"mu": torch.zeros(3, DIM)})
    fresh.load_state_dict(torch.load(tmp_path / "kernel.pt", weights_only=True))
    for t, (a, b) in enumerate(zip(expected, _trajectory(fresh, 20))):
        assert all(torch.equal(u, v) for u, v in zip(a, b)), f"step {stop + t + 1} differs"


@cases
def test_checkpoint_resume_is_bit_identical(case, tmp_path):
    """``MCMC(checkpoint_path=...)`` interrupted between checkpoints, then run again with the same settings,
    resumes from the last checkpoint: draws and statistics equal an uninterrupted run's (docs/reliability.rst)."""
    reference = _vectorized(case, range(3), {})

    def interrupt(kernel, params, stage, t):
        if stage == "Sample" and t == 13:  # step 63 of the run (50 warmup steps), 3 after the checkpoint at 60
            raise InterruptedError

    path = tmp_path / "run.ckpt"
    with pytest.raises(InterruptedError):
        _vectorized(case, range(3), {}, checkpoint_path=path, checkpoint_every=10, hook_fn=interrupt)
    resumed = _vectorized(case, range(3), {}, checkpoint_path=path, checkpoint_every=10)
    assert torch.equal(reference.get_samples(group_by_chain=True)["mu"], resumed.get_samples(group_by_chain=True)["mu"])
    for name, value in reference.sample_stats.items():
        assert torch.equal(value, resumed.sample_stats[name]), name


# ---------------------------------------------------------------------------------------------- dtype/device
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@cases
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_draws_follow_the_model_dtype_and_device(case, dtype, device):
    """Under the float32 default, a model on float64 (or float32) data on ``device`` gives draws, state and
    potential of that dtype on that device, with the kernel's defaults (warmup adaptation included)."""
    y = gaussian_data(dtype, device)
    kernel = case.make(gaussian_model, step_size=case.step_size)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=20, num_chains=2, chain_method="vectorized", seed=0,
                disable_progbar=True)  # fmt: skip
    mcmc.run(y)
    draws = mcmc.get_samples(group_by_chain=True)["mu"]
    assert draws.dtype == dtype and draws.shape == (2, 5, DIM) and bool(torch.isfinite(draws).all())
    for tensor in (kernel.state.position, kernel.state.momentum, kernel.state.grad, kernel.state.potential):
        assert tensor is None or (tensor.dtype == dtype and tensor.device.type == torch.device(device).type)


# ---------------------------------------------------------------------------------------------- hostile inputs
def _sample(kernel, *args, **mcmc):
    MCMC(kernel, num_samples=2, warmup_steps=0, num_chains=2, chain_method="vectorized", seed=0,
         disable_progbar=True, **mcmc).run(*args)  # fmt: skip


@cases
@pytest.mark.parametrize("value", [0.0, -1e-3, math.nan, math.inf, True])
def test_bad_numbers_are_named(case, value):
    """A ValueError (TypeError for a bool) that starts with the argument's name and says what is accepted."""
    accepted = "a positive float, a Schedule" if value is True else "positive and finite"
    with pytest.raises(ValueError, match=f"^step_size must be {accepted}"):
        case.make(gaussian_model, step_size=value)
    for name in ("temperature",) + case.hyperparameters if value != 0.0 else ():
        error, accepted = (TypeError, "a real number") if value is True else (ValueError, "a finite float >=? 0")
        with pytest.raises(error, match=f"^{name} must be {accepted}"):
            case.make(gaussian_model, **{name: value})
    with pytest.raises(TypeError, match=rf"{case.kernel.__name__}: target_accept_prob is an argument of Pyro's"):
        case.make(gaussian_model, target_accept_prob=0.8)


@cases
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_data_names_argument_site_and_indices(case, value):
    y = gaussian_data(torch.float32)
    y[[7, 42], 1] = value
    with pytest.raises(ModelError, match=r"\('y'\).*observed site 'obs' has 2 of 200 data points.*\[7, 42\]"):
        _sample(case.make(gaussian_model), y)


@cases
def test_wrong_initial_params_are_named(case):
    y = gaussian_data(torch.float32)
    with pytest.raises(
        ValueError, match=r"initial_params\['mu'\] must have the unconstrained shape \(2, 2\); got \(2, 3\)"
    ):
        _sample(case.make(gaussian_model), y, initial_params={"mu": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"missing \['mu'\], unknown \['nu'\]"):
        _sample(case.make(gaussian_model), y, initial_params={"nu": torch.zeros(2, DIM)})


@cases
def test_discrete_latent_sites_are_named(case):
    def discrete(y):
        pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.sample("k", dist.Poisson(3.0))
        pyro.sample("c", dist.Bernoulli(0.5))

    with pytest.raises(ModelError, match=r"discrete latent sites \['k', 'c'\]"):
        _sample(case.make(discrete), gaussian_data(torch.float32))
