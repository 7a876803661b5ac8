"""The SG-MCMC kernels reproduce real posteriors from posteriordb.

Posteriors (``../shared/reference/posteriordb``, reference draws from long Stan NUTS runs):

* ``sblri-blr`` and ``sblrc-blr``: Bayesian linear regression, N = 100, sampled with minibatches
  of B = 50; ``sigma ~ HalfNormal(10)`` is constrained > 0.
* ``earnings-logearn_interaction_z``: regression of log earnings, N = 1192, minibatches of
  B = 100; flat prior on ``sigma > 0``.
* ``eight_schools-eight_schools_noncentered``: hierarchical model, J = 8 (full batch);
  ``tau ~ HalfCauchy(5)`` is constrained > 0.

The models, the exact linear reparametrisations (``beta = M u`` with ``M`` from the design matrix
alone; ``mu = 5 mu_raw``) and the starting points (least squares / weighted mean, computed from
the data, never from the reference) are in ``tests/posteriordb_models.py``.

How each comparison is judged
=============================
For every parameter ``f`` in ``reference.json`` we compare our mean and sd with the reference:

.. math::
    |\\bar f - m_{ref}| &\\le Z \\sqrt{\\mathrm{mcse}_{mean}^2 + \\mathrm{mcse}_{mean,ref}^2} + b_{mean} \\\\
    |s_f - s_{ref}|    &\\le Z \\sqrt{\\mathrm{mcse}_{sd}^2 + \\mathrm{mcse}_{sd,ref}^2} + b_{sd}

1. **Monte Carlo error of our run.** Four independent chains (vectorised in one run, each with its own
   noise and minibatch streams; same data-derived start, warmup at least 4 relaxation times of the
   slowest direction from a start within about one posterior sd, so the start is forgotten to better
   than 2 % of an sd).
   ``mcse_mean = s / sqrt(ESS(f))`` and ``mcse_sd = sd((f - mean)^2) / sqrt(ESS((f - mean)^2)) / (2 s)``
   (delta method for the sd), ESS from :func:`pyro.ops.stats.effective_sample_size` over the
   chains. The reference's own ``mcse_mean_arviz`` / ``mcse_sd_arviz`` are added in quadrature.
2. **Z = 4.** A test makes 10 to 20 comparisons; two-sided P(|N(0,1)| > 4) = 6e-5, so the
   family-wise false-alarm rate is about 0.1 % if the ESS is right, and about 1 % if the ESS is
   overestimated by 30 % (effective Z = 3.5), the usual accuracy of ESS from a few thousand
   draws. The seeds are fixed, so a run is reproducible, but Z was fixed before looking at them.
3. **The O(step size) bias of constant-step SG-MCMC, including gradient-noise inflation**
   (``b_mean``, ``b_sd``), predicted, not fitted. At a point ``z`` of our own draws we linearise
   the kernel's update rule, with its step size ``eps``, friction, mass and temperature, around
   the full-data Hessian ``H = nabla^2 U / N`` (normalised, like the drift) and with the
   covariance ``C`` of the minibatch drift, computed exactly from the per-datum gradients
   ``g_n`` for sampling B of N without replacement: ``C = Cov_n(g_n) (N - B) / (B (N - 1))``.
   Solving the discrete Lyapunov equation of that linear recursion gives the stationary
   covariance ``Sigma_eps``; the exact (Laplace) covariance is ``Sigma = T (N H)^{-1}``. The
   generalised eigenvalues ``1 + rho_i`` of ``(Sigma_eps, Sigma)`` are the relative variance
   biases along the principal directions. For SGLD in one dimension this is the textbook
   ``rho = eps a / 2 + eps N C / 2 ~ eps a / 2 + eps (N / B) F / 2`` (discretisation plus gradient
   noise, ``F`` the per-datum Fisher information); for SGHMC the gradient-noise part is
   ``eps N C / (2 alpha)`` and the discretisation part is O(eps^2); for SGNHT the friction is the
   thermostat's fixed point ``xi`` at which the kinetic temperature equals ``T / N``.
   ``r = ||rho||_2`` is averaged over 8 of our draws (points with an indefinite Hessian, which
   have no local Gaussian, are skipped).

   To first order the stationary density is ``pi_eps = pi (1 + h)``; for the Gaussian above
   ``h = sum_i (rho_i / 2) (w_i^2 - 1)`` (``w`` whitened), so ``sd_pi(h) = r / sqrt(2)``. By
   Cauchy-Schwarz ``|E_eps f - E f| = |Cov_pi(f, h)| <= s_f r / sqrt(2)``, hence
   ``b_mean = r / sqrt(2) * s_ref``; and ``|Var_eps f - Var f| <= sd_pi((f - m)^2) sd_pi(h) = s^2 r``
   for Gaussian ``f``, hence ``b_sd = (sqrt(1 + r) - 1) * s_ref``. For a linear-Gaussian
   posterior the mean is in fact unbiased; ``b_mean`` covers the non-Gaussian parts (``sigma``,
   ``tau``, the hierarchy).

Step sizes were chosen to balance ``Z / sqrt(ESS)`` against ``r`` for the step budget, from the
predicted ``r`` and the ESS of pilot runs: precision and bias trade off as
``ESS * r ~ n B / N`` for ``n`` steps, so the subsampled earnings model gets looser fast
tolerances than the others, and a tighter slow test.

That the comparison can fail is itself tested: a chain run at temperature 2 (posterior sd
inflated by sqrt 2) is rejected (:func:`test_comparison_rejects_a_tempered_posterior`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pyro
import pytest
import scipy.linalg
import scipy.optimize
import torch
from pyro.infer.autoguide.initialization import init_to_value
from pyro.ops.stats import effective_sample_size

import pyro_sgmcmc
from pyro_sgmcmc import SGHMC, SGLD, SGNHT, ModelPotential

try:  # tests/ is a package
    from .posteriordb_models import BUILDERS, POSTERIORDB, Problem, load_reference
except ImportError:  # run as a plain module
    from posteriordb_models import BUILDERS, POSTERIORDB, Problem, load_reference

pytestmark = pytest.mark.skipif(
    not (POSTERIORDB / "README.md").exists(),
    reason=f"posteriordb reference posteriors not found at {POSTERIORDB} (expected ../shared beside the repository)",
)

Z = 4.0  # see the module docstring, point 2
NUM_CHAINS = 4
NUM_BIAS_POINTS = 8  # draws at which the step-size bias is predicted (2 per chain)


@pytest.fixture(autouse=True)
def _default_float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# ---------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Setting:
    posterior: str
    kernel: str  # "SGLD", "SGHMC", "SGNHT"
    step_size: float
    friction: float = 1.0  # SGHMC friction alpha, SGNHT diffusion alpha; unused by SGLD
    subsample_size: Optional[int] = None  # None: full batch
    warmup: int = 300
    num_samples: int = 2700
    temperature: float = 1.0
    seed: int = 0

    def problem(self) -> Problem:
        if self.subsample_size is None:
            return BUILDERS[self.posterior]()
        return BUILDERS[self.posterior](subsample_size=self.subsample_size)

    def kernel_for(self, problem: Problem):
        init = init_to_value(values=problem.init_values)
        # the fixed step whose O(eps) bias the tolerances predict (module docstring): no warmup adaptation
        # (the defaults are tested from Pyro's default init in tests/test_posteriordb_defaults.py)
        common = dict(
            step_size=self.step_size,
            temperature=self.temperature,
            init_strategy=init,
            adapt_step_size=False,
            adapt_mass_matrix=False,
            control_variate=None,
        )
        if self.kernel == "SGLD":
            return SGLD(problem.model, **common)
        if self.kernel == "SGHMC":
            return SGHMC(problem.model, friction=self.friction, **common)
        if self.kernel == "SGNHT":
            return SGNHT(problem.model, diffusion=self.friction, **common)
        raise ValueError(self.kernel)


@dataclass
class Run:
    setting: Setting
    problem: Problem
    chains: List[Dict[str, torch.Tensor]]  # per chain: sampled (constrained) sites, (num_samples, ...)
    divergences: int

    def reference_draws(self) -> Dict[str, torch.Tensor]:
        """``{reference name: (chains, draws)}``."""
        per_chain = [self.problem.to_reference(c) for c in self.chains]
        return {k: torch.stack([c[k] for c in per_chain]) for k in per_chain[0]}


def run_chains(setting: Setting, num_chains: int = NUM_CHAINS) -> Run:
    """``num_chains`` chains, vectorised in one process (one kernel step moves them all; each chain's noise and
    minibatches are its own, from ``(seed, chain)``, so a chain's draws do not depend on its neighbours, as
    ``tests/kernels/test_conformance.py::test_vectorized_equals_one_by_one`` checks). The same draws on any
    machine, and about half the time of four one-chain runs."""
    problem = setting.problem()
    pyro.set_rng_seed(setting.seed)
    kernel = setting.kernel_for(problem)
    mcmc = pyro_sgmcmc.MCMC(
        kernel, num_samples=setting.num_samples, warmup_steps=setting.warmup, num_chains=num_chains,
        chain_method="vectorized", seed=setting.seed, disable_progbar=True,
    )  # fmt: skip
    mcmc.run()
    by_chain = mcmc.get_samples(group_by_chain=True)
    chains = [{k: v[chain].detach() for k, v in by_chain.items()} for chain in range(num_chains)]
    divergences = sum(len(kernel.chain_diagnostics(chain)["divergences"]) for chain in range(num_chains))
    return Run(setting, problem, chains, divergences)


# ---------------------------------------------------------------------------- bias prediction
def _stationary_position_cov(
    kernel: str,
    eps: float,
    H,
    C,
    num_data: int,
    temperature: float,
    alpha: float,
    xi: Optional[float] = None,
    mass: float = 1.0,
):
    """Stationary covariance of ``z`` (and kinetic temperature) of the kernel's update linearised at ``H``."""
    d = H.shape[0]
    eye = np.eye(d)
    tau = temperature / num_data
    # The drift is -H z + g with g ~ (0, C) the minibatch gradient noise; zeta ~ N(0, I).
    if kernel == "SGLD":  # z' = z + eps (-H z + g) + sqrt(2 eps tau) zeta
        A = eye - eps * H
        _check_stable(A)
        return scipy.linalg.solve_discrete_lyapunov(A, eps**2 * C + 2 * eps * tau * eye), None
    # m' = (1 - eps xi / mass) m + eps (-H z + g) + sqrt(2 eps tau alpha) zeta;  z' = z + eps m' / mass
    xi = alpha if xi is None else xi
    a = 1.0 - eps * xi / mass
    A = np.block([[eye - eps**2 / mass * H, eps / mass * a * eye], [-eps * H, a * eye]])
    _check_stable(A)
    G = np.vstack([eps / mass * eye, eye])
    W = eps**2 * C + 2 * eps * tau * alpha * eye
    S = scipy.linalg.solve_discrete_lyapunov(A, G @ W @ G.T)
    return S[:d, :d], np.trace(S[d:, d:]) / (mass * d)


def _check_stable(A) -> None:
    radius = float(np.abs(np.linalg.eigvals(A)).max())
    assert radius < 1.0, f"the linearised update is unstable here (spectral radius {radius:.3f}): step size too large"


def predicted_relative_variance_bias(
    kernel: str, eps: float, H, C, num_data: int, temperature: float = 1.0, alpha: float = 1.0
) -> np.ndarray:
    """``rho_i``: generalised eigenvalues of (Sigma_eps, Sigma_exact) minus one."""
    xi = None
    if kernel == "SGNHT":
        # The thermostat settles where the kinetic temperature m.m / (mass d) equals T / N.
        tau = temperature / num_data

        def excess(x):
            return _stationary_position_cov(kernel, eps, H, C, num_data, temperature, alpha, xi=x)[1] / tau - 1.0

        xi = scipy.optimize.brentq(excess, 1e-6, 1.0 / eps)
    sigma_eps, _ = _stationary_position_cov(kernel, eps, H, C, num_data, temperature, alpha, xi=xi)
    sigma_exact = temperature * np.linalg.inv(num_data * H)
    return scipy.linalg.eigh(sigma_eps, sigma_exact, eigvals_only=True) - 1.0


def local_curvature_and_noise(problem: Problem, full: ModelPotential, position: torch.Tensor, batch: int):
    """Normalised full-data Hessian ``H`` and covariance ``C`` of the minibatch drift at ``position``."""
    N = full.num_data
    H = torch.autograd.functional.hessian(lambda z: -full.log_density(z), position) / N
    if batch >= N:
        return H.numpy(), np.zeros_like(H.numpy())
    grads = torch.autograd.functional.jacobian(
        lambda z: problem.per_datum_log_likelihood(full.constrain(z)), position, vectorize=True
    )  # (N, dim): the gradient of each datum's log likelihood
    C = torch.cov(grads.T, correction=0) * (N - batch) / (batch * (N - 1))
    return H.numpy(), C.numpy()


def step_size_bias(run: Run) -> float:
    """``r = ||rho||_2`` averaged over draws of the run (module docstring, point 3)."""
    s, problem = run.setting, run.problem
    full = ModelPotential(problem.model, (None,), {}, init_strategy=init_to_value(values=problem.init_values))
    batch = s.subsample_size or full.num_data
    per_chain = max(1, NUM_BIAS_POINTS // len(run.chains))
    norms = []
    for chain in run.chains:
        for i in np.linspace(s.num_samples // 4, s.num_samples - 1, per_chain).astype(int):
            position = full.pack({name: full.transforms[name](chain[name][i]) for name in full.site_names})
            H, C = local_curvature_and_noise(problem, full, position, batch)
            if np.linalg.eigvalsh(H).min() <= 0:
                continue
            rho = predicted_relative_variance_bias(
                s.kernel, s.step_size, H, C, full.num_data, s.temperature, s.friction
            )
            norms.append(float(np.linalg.norm(rho)))
    assert len(norms) >= NUM_BIAS_POINTS // 2, "too few draws with a positive-definite Hessian to predict the bias"
    return float(np.mean(norms))


# ---------------------------------------------------------------------------- comparison
@dataclass
class Check:
    name: str
    stat: str
    value: float
    reference: float
    tolerance: float
    mc_part: float
    bias_part: float
    ess: float

    @property
    def ok(self) -> bool:
        return abs(self.value - self.reference) <= self.tolerance

    def __str__(self) -> str:
        flag = "ok " if self.ok else "BAD"
        return (
            f"{flag} {self.name:>9s} {self.stat:4s} ours {self.value:.6g} ref {self.reference:.6g} "
            f"|diff| {abs(self.value - self.reference):.3g} <= tol {self.tolerance:.3g} "
            f"(= {Z:g} x mcse {self.mc_part:.3g} + bias {self.bias_part:.3g}; ESS {self.ess:.0f})"
        )


def compare(run: Run, r: float) -> List[Check]:
    reference = load_reference(run.problem.folder)
    draws = run.reference_draws()
    assert set(draws) == set(reference), f"parameters differ from the reference: {sorted(draws)} vs {sorted(reference)}"
    checks = []
    for name, ref in reference.items():
        x = draws[name]  # (chains, draws)
        mean, sd = x.mean(), x.std()
        ess = float(effective_sample_size(x, chain_dim=0, sample_dim=1))
        sq = (x - mean) ** 2
        ess_sq = float(effective_sample_size(sq, chain_dim=0, sample_dim=1))
        mcse_mean = math.hypot(float(sd) / math.sqrt(ess), ref["mcse_mean_arviz"])
        mcse_sd = math.hypot(float(sq.std()) / math.sqrt(ess_sq) / (2 * float(sd)), ref["mcse_sd_arviz"])
        # Tolerances: Z x combined Monte Carlo error + predicted O(eps) bias (module docstring).
        b_mean = r / math.sqrt(2.0) * ref["sd"]
        b_sd = (math.sqrt(1.0 + r) - 1.0) * ref["sd"]
        checks.append(Check(name, "mean", float(mean), ref["mean"], Z * mcse_mean + b_mean, mcse_mean, b_mean, ess))
        checks.append(Check(name, "sd", float(sd), ref["sd"], Z * mcse_sd + b_sd, mcse_sd, b_sd, ess_sq))
    return checks


def assert_matches_reference(run: Run) -> List[Check]:
    # Constrained sites come back in their support, and no step diverged.
    for chain in run.chains:
        for site in run.problem.positive_sites:
            assert torch.isfinite(chain[site]).all() and (chain[site] > 0).all(), f"{site} left its support (> 0)"
    assert run.divergences == 0, f"{run.divergences} divergent steps"
    r = step_size_bias(run)
    checks = compare(run, r)
    report = "\n".join(str(c) for c in checks)
    print(f"\n{run.setting}\npredicted relative variance bias ||rho|| = {r:.4f}\n{report}")
    assert all(c.ok for c in checks), f"{run.setting.posterior} / {run.setting.kernel}:\n{report}"
    return checks


# ---------------------------------------------------------------------------- settings
# Each fast setting: 4 chains x 2,500 steps = 10,000 chain-steps (2,500 vectorised steps of about 2.5 ms).
# Normalised curvatures in the sampled coordinates: about 1 (u, = 1 / sigma^2) and 2 (log sigma) for the regressions,
# 0.01 to 0.3 for eight schools. Warmup: at least 4 relaxation times of the slowest direction
# (alpha / (eps a) steps for SGHMC, 1 / (eps a) for SGLD) from a start within about one posterior
# sd of the bulk, so what is left of the start is below 2 % of an sd.
FAST = {
    # N = 100, B = 50: N C ~ (N / B)(N - B) / (N - 1) F ~ F; eps / alpha = 0.1 gives ||rho|| ~ 0.15.
    "sblri-SGHMC": Setting("sblri-blr", "SGHMC", 0.1, friction=1.0, subsample_size=50, warmup=250, num_samples=2250),
    "sblri-SGLD": Setting("sblri-blr", "SGLD", 0.05, subsample_size=50, warmup=250, num_samples=2250),
    "sblri-SGNHT": Setting("sblri-blr", "SGNHT", 0.1, friction=1.0, subsample_size=50, warmup=250, num_samples=2250),
    "sblrc-SGHMC": Setting("sblrc-blr", "SGHMC", 0.1, friction=1.0, subsample_size=50, warmup=250, num_samples=2250),
    # N = 1192, B = 100: N C ~ 11 F, and the log-earnings residuals are heavy tailed (F ~ 2.5 a for
    # log sigma), so at the same bias the step must be ~8x smaller than for sblri and the ESS is
    # small: this fast test is coarse (mean tolerance ~0.75 sd, sd ~45 %); the slow one is ~1.8x tighter.
    "earnings-SGHMC": Setting(
        "earnings-logearn_interaction_z",
        "SGHMC",
        0.0125,
        friction=1.0,
        subsample_size=100,
        warmup=400,
        num_samples=2100,
    ),
    # Full batch: no gradient noise. SGHMC's position bias is O(eps^2), so a large step with light
    # friction (underdamped) mixes fast. SGNHT's thermostat holds the kinetic temperature of the
    # discrete momentum, which symplectic Euler inflates by 1 / (1 - eps xi / 2): it over-damps and
    # the position variance shrinks by O(eps) (~8 % here), which the prediction includes.
    "eight_schools-SGHMC": Setting(
        "eight_schools-eight_schools_noncentered", "SGHMC", 0.5, friction=0.3, warmup=250, num_samples=2250
    ),
    "eight_schools-SGNHT": Setting(
        "eight_schools-eight_schools_noncentered", "SGNHT", 0.5, friction=0.3, warmup=250, num_samples=2250
    ),
}

# Each slow setting: 4 chains x 15,000 steps = 60,000 steps (6x the fast budget).
SLOW = {
    "earnings-SGHMC": Setting(
        "earnings-logearn_interaction_z",
        "SGHMC",
        0.007,
        friction=1.0,
        subsample_size=100,
        warmup=1000,
        num_samples=14000,
        seed=1,
    ),
    "sblri-SGHMC": Setting(
        "sblri-blr", "SGHMC", 0.05, friction=1.0, subsample_size=50, warmup=1000, num_samples=14000, seed=1
    ),
    "eight_schools-SGHMC": Setting(
        "eight_schools-eight_schools_noncentered", "SGHMC", 0.3, friction=0.3, warmup=1000, num_samples=14000, seed=1
    ),
}


@pytest.mark.parametrize("key", list(FAST))
def test_matches_reference(key):
    assert_matches_reference(run_chains(FAST[key]))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(SLOW))
def test_matches_reference_long(key):
    assert_matches_reference(run_chains(SLOW[key]))


def test_comparison_rejects_a_tempered_posterior():
    """The comparison has power: at T = 2 the sd of every parameter is sqrt(2) too large and must be flagged.

    The bias prediction is made for T = 1 (as if the kernel were meant to sample the posterior), so
    this is exactly what the assertions above would see if the noise were sqrt(2) too large.
    """
    setting = Setting(
        "sblri-blr",
        "SGHMC",
        0.1,
        friction=1.0,
        subsample_size=50,
        warmup=250,
        num_samples=2250,
        temperature=2.0,
        seed=2,
    )
    run = run_chains(setting)
    r = step_size_bias(Run(dataclasses.replace(setting, temperature=1.0), run.problem, run.chains, 0))
    checks = compare(run, r)
    sd_checks = [c for c in checks if c.stat == "sd"]
    print("\nat T = 2 (every sd should be flagged BAD):\n" + "\n".join(map(str, sd_checks)))
    assert all(not c.ok for c in sd_checks), "\n".join(map(str, sd_checks))
