"""Stationary moments on a Gaussian target against their exact discrete-time values.

Target: ``x ~ Normal(0, s^2 I)`` in d = 4 dimensions with ``num_data = N`` given explicitly, so the
normalised drift is ``-x / (N s^2)``. With full-batch gradients the kernels are linear (SGLD, SGHMC)
and their stationary covariance at a finite step size is known exactly:

* SGLD: ``x' = (1 - h) x + sqrt(2 eps T / N) zeta`` with ``h = eps / (N s^2)``, so
  ``Var = T s^2 / (1 - h / 2)``. We pick h = 0.5: the discrete value is 4/3 of the continuous T s^2,
  so the test separates "the update equation as written" from "roughly the right distribution".
* SGHMC: ``(x, m)`` follows ``v' = A v + q zeta`` and the stationary covariance solves the discrete
  Lyapunov equation ``S = A S A^T + q q^T`` (scipy.linalg.solve_discrete_lyapunov).
* SGNHT: the thermostat increment has mean zero at stationarity, so ``E[m.m / (sigma^2 d)] = T / N``
  exactly, whatever the step size.

Tolerance: 4 Monte Carlo standard errors, estimated by batch means (50 batches, each much longer than
the autocorrelation time) over the d independent coordinates; the test also checks that the exact
discrete value is distinguishable from the continuous-time value at this precision where they differ.
"""

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.linalg
import torch

from pyro_sgmcmc import SGHMC, SGLD, SGNHT

DIM, SCALE, NUM_DATA, TEMPERATURE = 4, 1.5, 10, 0.5
NUM_STEPS, BURN_IN = 15000, 500


def gaussian_model():
    pyro.sample("x", dist.Normal(torch.zeros(DIM), SCALE).to_event(1))


def _run(kernel, collect):
    pyro.set_rng_seed(2024)
    kernel.initial_params = {"x": torch.zeros(DIM)}
    kernel.setup(0)
    params, values = kernel.initial_params, []
    for t in range(NUM_STEPS):
        params = kernel.sample(params)
        if t >= BURN_IN:
            values.append(collect(kernel.state))
    return torch.stack(values).numpy()


def _mean_and_se(series, num_batches=50):
    """Mean of ``series`` (steps x independent coordinates) and its batch-means standard error."""
    series = np.asarray(series).reshape(len(series), -1)
    usable = len(series) // num_batches * num_batches
    batches = series[:usable].reshape(num_batches, -1, series.shape[1]).mean(axis=1).mean(axis=1)
    return series.mean(), batches.std(ddof=1) / math.sqrt(num_batches)


def test_sgld_stationary_variance(float64):
    eps = 0.5 * NUM_DATA * SCALE**2  # h = eps / (N s^2) = 0.5
    h = eps / (NUM_DATA * SCALE**2)
    exact = TEMPERATURE * SCALE**2 / (1 - h / 2)
    continuous = TEMPERATURE * SCALE**2
    x = _run(SGLD(gaussian_model, step_size=eps, temperature=TEMPERATURE, num_data=NUM_DATA), lambda s: s.position[0])
    estimate, se = _mean_and_se(x**2)
    assert abs(estimate - exact) < 4 * se, (estimate, exact, se)
    assert abs(continuous - exact) > 8 * se  # the test can tell the discrete value from the continuous one


@pytest.mark.parametrize("eps,friction,mass", [(3.0, 0.3, 1.0), (5.0, 0.15, 1.5)])
def test_sghmc_stationary_covariance(float64, eps, friction, mass):
    b = eps / (NUM_DATA * SCALE**2)  # drift coefficient on x
    a = 1 - eps * friction / mass  # momentum decay
    g = eps / mass
    c = math.sqrt(2 * eps * TEMPERATURE / NUM_DATA * friction)
    # m' = a m - b x + c zeta ; x' = x + g m' = (1 - g b) x + g a m + g c zeta
    A = np.array([[1 - g * b, g * a], [-b, a]])
    q = np.array([[g * c], [c]])
    exact = scipy.linalg.solve_discrete_lyapunov(A, q @ q.T)
    kernel = SGHMC(
        gaussian_model, step_size=eps, temperature=TEMPERATURE, num_data=NUM_DATA, friction=friction, mass=mass
    )
    states = _run(kernel, lambda s: torch.stack([s.position[0], s.momentum[0]]))
    x, m = states[:, 0], states[:, 1]
    for series, target in [(x**2, exact[0, 0]), (m**2, exact[1, 1]), (x * m, exact[0, 1])]:
        estimate, se = _mean_and_se(series)
        assert abs(estimate - target) < 4 * se, (estimate, target, se)
    _, se = _mean_and_se(x**2)
    assert abs(TEMPERATURE * SCALE**2 - exact[0, 0]) > 8 * se  # discrete != continuous, visibly


def test_sgnht_kinetic_temperature_is_exact(float64):
    mass = 2.0
    kernel = SGNHT(gaussian_model, step_size=0.5, temperature=TEMPERATURE, num_data=NUM_DATA, diffusion=1.0, mass=mass)
    kinetic = _run(kernel, lambda s: (s.momentum[0] * s.momentum[0]).sum() / (mass * DIM))
    estimate, se = _mean_and_se(kinetic)
    assert abs(estimate - TEMPERATURE / NUM_DATA) < 4 * se, (estimate, TEMPERATURE / NUM_DATA, se)
    assert se < 0.05 * TEMPERATURE / NUM_DATA  # precise enough to mean something
