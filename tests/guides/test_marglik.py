"""Online marginal-likelihood training: ``AutoLaplace.marglik_training``.

Oracle: Bayesian linear regression with a known noise scale and one prior precision. There the
log-likelihood is quadratic, so at the fixed point of the alternation (theta the MAP of the
prior lambda, lambda the maximiser of the standard evidence at that MAP) lambda maximises the
exact evidence log N(y; 0, sigma^2 I + X X^T / lambda) (type-II maximum likelihood; scipy finds it
from the closed form), and theta is the exact posterior mean at that lambda. Full-batch steps,
so the iteration is deterministic and converges geometrically; the tolerances below are what
the run reaches with a margin (the alternation's own error after 800 steps is ~1e-8).
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import scipy.optimize
import torch
from pyro.nn import PyroModule

from pyro_sgmcmc.guides import AutoLaplace, LaplaceApproximation

N, D, SIGMA = 40, 3, 0.5


@pytest.fixture(autouse=True)
def clear_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.7 + SIGMA * torch.randn(N, generator=g)
    return x, y


def model(x, y):
    b = pyro.sample("b", dist.Normal(0.0, 2.0))
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([D]).to_event(1))
    with pyro.plate("data", len(y)):
        pyro.sample("y", dist.Normal(x @ w + b, SIGMA), obs=y)


def test_marglik_training_reaches_type_two_maximum_likelihood(float64):
    """lambda to relative 1e-5 of scipy's maximiser of the exact evidence, theta to 1e-5 of the
    exact posterior mean at that lambda (the run's error is ~1e-8; scipy's BFGS stops at 1e-12
    in gradient). The returned approximation uses the tuned precision."""
    x, y = _data()
    design = torch.cat([torch.ones(N, 1), x], dim=1)

    def negative_exact(log_lam):
        covariance = SIGMA**2 * torch.eye(N) + design @ design.T / math.exp(log_lam[0])
        return -dist.MultivariateNormal(torch.zeros(N), covariance).log_prob(y).item()

    reference = math.exp(scipy.optimize.minimize(negative_exact, [0.0], method="BFGS", tol=1e-12).x[0])
    pyro.set_rng_seed(0)
    guide = AutoLaplace(model, curvature="full", disable_progbar=True)
    laplace = guide.marglik_training(
        x, y, num_steps=800, optim=pyro.optim.Adam({"lr": 0.1}), mode="scalar", hyper_every=10, hyper_steps=20
    )
    assert isinstance(laplace, LaplaceApproximation)
    tuned = laplace.prior_precision["w"].item()
    assert abs(tuned / reference - 1) < 1e-5, (tuned, reference)
    assert laplace.prior_precision["b"].item() == tuned
    precision = design.T @ design / SIGMA**2 + reference * torch.eye(D + 1)
    mean = torch.linalg.solve(precision, design.T @ y / SIGMA**2)
    assert (laplace.loc - mean).abs().max() / mean.abs().max() < 1e-5, (laplace.loc, mean)
    assert (laplace.precision - precision).abs().max() / precision.abs().max() < 1e-5
    assert guide.prior_precision["w"].item() == tuned  # the guide keeps it for later approximations


def test_marglik_training_bad_arguments(float64):
    x, y = _data()
    guide = AutoLaplace(model, curvature="full", disable_progbar=True)
    with pytest.raises(ValueError, match="mode"):
        guide.marglik_training(x, y, num_steps=2, mode="layer")
    with pytest.raises(TypeError, match="num_steps"):
        guide.marglik_training(x, y, num_steps=2.5)
    with pytest.raises(ValueError, match="hyper_lr"):
        guide.marglik_training(x, y, num_steps=2, hyper_lr=0.0)
    with pytest.raises(TypeError, match="optim"):
        guide.marglik_training(x, y, num_steps=2, optim=torch.optim.Adam)
    subset = AutoLaplace(model, curvature="full", disable_progbar=True, subset_of_weights=["w"])
    with pytest.raises(ValueError, match="subset_of_weights='all'"):
        subset.marglik_training(x, y, num_steps=2)


def test_marglik_training_of_a_network_tunes_each_layer(float64):
    """A tanh network, kron curvature, one precision per site: every tuned precision is finite,
    far from the bounds (the standard evidence has a finite optimum) and the returned approximation's evidence beats
    the starting precision's at the same final point (hyper steps ascend the evidence)."""
    from tests.guides.test_evidence import Mlp, _classification

    x, y = _classification(n=60)
    pyro.set_rng_seed(0)
    guide = AutoLaplace(Mlp(), curvature="kron", disable_progbar=True)
    laplace = guide.marglik_training(x, y, num_steps=300, optim=pyro.optim.Adam({"lr": 0.05}), hyper_every=25)
    assert sorted(laplace.prior_precision) == ["hidden.bias", "hidden.weight", "out.bias", "out.weight"]
    for name, value in laplace.prior_precision.items():
        assert 1e-4 < value.item() < 1e4, (name, value)  # (the small hidden biases get ~2e3)
    assert laplace.log_marginal_likelihood() > laplace.log_marginal_likelihood(1.0) + 0.1


def test_marglik_training_per_parameter_is_the_coordinatewise_type_two_optimum(float64):
    """One precision per coordinate with a diagonal curvature on an orthogonal design (X^T X
    diagonal, so the diagonal Laplace is exact): at the fixed point each lambda_i maximises the
    exact evidence, whose coordinates separate: lambda_i = 1 / (m_i^2 + 1 / (h_i + lambda_i)) with
    m_i the posterior mean, h_i = x_i^T x_i / sigma^2 (the EM / MacKay fixed point, where the
    derivative of the exact evidence in lambda_i vanishes). Checked at relative 1e-4 (the run's
    own error is ~1e-7)."""
    q, _ = torch.linalg.qr(torch.randn(N, D + 1, generator=torch.Generator().manual_seed(3)))
    x = q[:, 1:] - q[:, 1:].mean(0)
    x, _ = torch.linalg.qr(x)
    x = x * torch.tensor([3.0, 5.0, 4.0])
    noise = torch.randn(N, generator=torch.Generator().manual_seed(4))
    y = x @ torch.tensor([0.6, -0.4, 0.3]) + 0.7 + SIGMA * noise  # every weight away from 0
    pyro.set_rng_seed(0)
    guide = AutoLaplace(model, curvature="diag_ggn", disable_progbar=True)
    laplace = guide.marglik_training(
        x, y, num_steps=1500, optim=pyro.optim.Adam({"lr": 0.05}), mode="parameter", hyper_every=10, hyper_steps=20
    )
    lam = torch.cat([laplace.prior_precision["b"].reshape(-1), laplace.prior_precision["w"].reshape(-1)])
    h = torch.cat([torch.tensor([float(N)]), (x**2).sum(0)]) / SIGMA**2
    fixed_point = 1 / (laplace.loc**2 + 1 / (h + lam))
    assert ((lam - fixed_point).abs() / fixed_point).max() < 1e-4, (lam, fixed_point)
    design = torch.cat([torch.ones(N, 1), x], dim=1)
    mean = torch.linalg.solve(design.T @ design / SIGMA**2 + torch.diag(lam), design.T @ y / SIGMA**2)
    assert (laplace.loc - mean).abs().max() / mean.abs().max() < 1e-5


def test_the_compiled_steps_follow_the_svi_steps(float64):
    """Full-batch steps are deterministic, so the compiled-potential route (a dict of optimiser
    arguments) and the SVI route (per-parameter arguments, a callable) take the same steps: the
    tuned precision and the point agree to float64 rounding (1e-10 relative after 200 steps)."""
    x, y = _data()
    results = []
    for optim in (pyro.optim.Adam({"lr": 0.1}), pyro.optim.Adam(lambda module, name: {"lr": 0.1})):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        guide = AutoLaplace(model, curvature="full", disable_progbar=True)
        laplace = guide.marglik_training(x, y, num_steps=200, optim=optim, mode="site", hyper_every=10)
        results.append((laplace.loc, torch.stack([v for v in laplace.prior_precision.values()])))
    (loc_fast, lam_fast), (loc_svi, lam_svi) = results
    assert torch.allclose(loc_fast, loc_svi, rtol=1e-10, atol=0), (loc_fast, loc_svi)
    assert torch.allclose(lam_fast, lam_svi, rtol=1e-10, atol=0), (lam_fast, lam_svi)


def test_keep_best_returns_the_best_evidence_of_the_run(float64):
    """``keep_best`` does not change the run (same seed, same steps: the same evidence history), only
    which point is returned: the approximation's evidence is the history's maximum with it and the last
    entry without it (both rebuilt at the kept point and precision: equal to 1e-9 relative)."""
    from tests.guides.test_evidence import _classification

    x, y = _classification(n=60)
    evidences = {}
    for keep_best in (True, False):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        guide = AutoLaplace(SubsampledMlp(), curvature="kron", disable_progbar=True)
        laplace = guide.marglik_training(
            x, y, num_steps=200, optim=pyro.optim.Adam({"lr": 0.1}), hyper_every=10, keep_best=keep_best
        )
        evidences[keep_best] = (laplace.log_marginal_likelihood().item(), guide.evidence_history)
    (best, history), (last, same_history) = evidences[True], evidences[False]
    assert history == same_history and len(history) == 20
    assert best == pytest.approx(max(history), rel=1e-9) and last == pytest.approx(history[-1], rel=1e-9)
    assert history.index(max(history)) < len(history) - 1  # this run's best (17th of 20) is not its last


class SubsampledMlp(PyroModule):
    """The tanh network of test_evidence with minibatches of 20 (noisy steps)."""

    def __init__(self):
        from tests.guides.test_evidence import Mlp

        super().__init__()
        self.net = Mlp()

    def forward(self, x, y):
        plate = pyro.plate("data", len(x), subsample_size=20)
        logits = self.net.logits(x[plate.indices])
        with plate:
            pyro.sample("y", dist.Categorical(logits=logits), obs=y[plate.indices])
