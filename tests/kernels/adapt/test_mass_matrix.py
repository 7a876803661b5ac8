"""The metric's running statistics (``kernels/adapt/mass_matrix.py``) against torch's own estimators."""

from __future__ import annotations

import torch

from pyro_sgmcmc.kernels.adapt.mass_matrix import (
    draw_covariance,
    gradient_curvature,
    metric_accumulate,
    metric_final,
    metric_init,
    metric_record,
    metric_update,
)


def test_draw_and_gradient_statistics_are_the_sample_covariances(float64):
    """Over 50 recorded draws of 2 chains: the spread is the (biased) sample covariance times N / T, the
    gradients' curvature their covariance less the noise, over N T; exact to rounding."""
    generator = torch.Generator().manual_seed(0)
    draws = torch.randn(50, 2, 3, generator=generator)
    grads = torch.randn(50, 2, 3, generator=generator)
    state = metric_init(draws[0], preconditioned=True)
    for draw, grad in zip(draws, grads):
        state = metric_record(state, draw, grad)
    num_data, temperature = 200, 0.5
    noise_sum = torch.eye(3).expand(2, 3, 3) * 1e-4 * 4  # four measurements of a drift covariance 1e-4 I
    for chain in range(2):
        spread = torch.cov(draws[:, chain].T, correction=0) * num_data / temperature
        assert torch.allclose(draw_covariance(state, num_data, temperature)[chain], spread, rtol=1e-12)
        noise = 1e-4 * num_data**2 * torch.eye(3)
        seen = (torch.cov(grads[:, chain].T, correction=0) - noise) / (num_data * temperature)
        fisher = gradient_curvature(state, noise_sum, 4, num_data, temperature)
        assert torch.allclose(fisher[chain], seen, rtol=1e-12, atol=1e-15)


def test_the_metric_is_the_inverse_square_root_of_the_mean_curvature(float64):
    """Two slow-phase probes of a diagonal curvature, N times (4, 1) and N times (4, 9): the mean is (4, 5) and
    the factor L = (1/2, 1/sqrt(5))."""
    state = metric_init(torch.zeros(1, 2), preconditioned=True)
    state, mean = metric_accumulate(state, 10 * torch.tensor([[4.0, 1.0]]))
    state, mean = metric_accumulate(state, 10 * torch.tensor([[4.0, 9.0]]))
    state = metric_update(state, mean, full_mass=False, num_data=10)
    assert torch.allclose(metric_final(state), torch.tensor([[0.5, 5**-0.5]]), rtol=1e-14) and state.count == 2
    assert torch.equal(metric_final(metric_init(torch.zeros(1, 2), preconditioned=False)), torch.ones(1, 2))
