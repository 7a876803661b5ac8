"""Prior-precision tuning that reaches its optimum, or says it did not.

Oracles: the closed-form maximiser of the separable evidence (diagonal curvature, one precision per
coordinate) has a vanishing gradient and is at least as high as a long L-BFGS run; an L-BFGS run
cut at ``max_iter`` before its gradient vanished warns with :class:`ConvergenceWarning`, and one
that converged does not.
"""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch

from pyro_sgmcmc.guides import AutoLaplace
from pyro_sgmcmc.guides.evidence import CONVERGED_GRADIENT, ConvergenceWarning, diagonal_evidence_optimum
from tests.guides.test_evidence import Mlp, _classification


@pytest.fixture(autouse=True)
def clear_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _approximation(curvature: str):
    x, y = _classification()
    pyro.set_rng_seed(0)
    guide = AutoLaplace(Mlp(), curvature=curvature, disable_progbar=True)
    with pyro.validation_enabled(False):
        guide.fit_map(x, y, num_steps=300, lr=0.05)
    return guide.laplace_approximation(x, y)


def _evidence_gradient(laplace, precision: torch.Tensor) -> torch.Tensor:
    """d log evidence / d log precision, per coordinate."""
    log_precision = precision.detach().log().requires_grad_(True)
    with torch.enable_grad():
        laplace.log_evidence(log_precision.exp()).backward()
    return log_precision.grad


def test_the_closed_form_is_a_stationary_point_of_each_coordinate():
    """Against a brute-force maximisation of one coordinate's evidence on a fine grid in log lambda."""
    h = torch.tensor([0.3, 5.0, 200.0, 1e-3], dtype=torch.float64)
    o = torch.tensor([0.8, 0.1, 0.02, 2.0], dtype=torch.float64)
    optimum = diagonal_evidence_optimum(h, o)
    grid = torch.linspace(-12, 12, 240001, dtype=torch.float64).exp()
    for i in range(4):
        values = -0.5 * grid * o[i] ** 2 + 0.5 * grid.log() - 0.5 * (h[i] + grid).log()
        best = grid[values.argmax()]
        assert abs(best.log() - optimum[i].log()) < 1e-3, (i, best, optimum[i])  # the grid's step is 1e-4 in log


def test_the_closed_form_at_its_edges():
    h = torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64)
    o = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    optimum = diagonal_evidence_optimum(h, o)
    assert optimum[0] == float("inf") and optimum[1] == 0 and torch.isnan(optimum[2])


def test_per_parameter_tuning_of_a_diagonal_laplace_reaches_the_optimum(float64):
    """The closed-form start: no warning, a gradient at rounding level, and an evidence at least that of
    L-BFGS from the usual start with 20 times the iterations."""
    laplace = _approximation("diag_ggn")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        optimum = laplace.optimize_prior_precision("parameter")
    closed = torch.cat([value.reshape(-1) for value in optimum.values()])
    inside = (closed > 1.001e-8) & (closed < 0.999e8)  # a coordinate at a bound has a one-sided gradient
    assert _evidence_gradient(laplace, closed)[inside].abs().max() < 1e-8
    evidence = laplace.log_marginal_likelihood().item()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        laplace.optimize_prior_precision("parameter", init=1.0, max_iter=4000)
    assert evidence >= laplace.log_marginal_likelihood().item() - 1e-9


def test_an_iteration_budget_that_stops_short_warns(float64):
    """A dense curvature, one precision per coordinate (not separable): L-BFGS cut at 3 iterations
    warns, names max_iter, and the default budget converges without a warning."""
    laplace = _approximation("full_ggn")
    with pytest.warns(ConvergenceWarning, match="max_iter=3"):
        laplace.optimize_prior_precision("parameter", max_iter=3)
    short = laplace.log_marginal_likelihood().item()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        optimum = laplace.optimize_prior_precision("parameter")
    assert laplace.log_marginal_likelihood().item() > short
    values = torch.cat([value.reshape(-1) for value in optimum.values()])
    inside = (values > 1.001e-8) & (values < 0.999e8)
    assert _evidence_gradient(laplace, values)[inside].abs().max() <= CONVERGED_GRADIENT
