"""The curvature probes' gradient-noise measurement (``pyro_sgmcmc/kernels/curvature_probes.py``)."""

from __future__ import annotations

import pytest
import torch

from pyro_sgmcmc.kernels.curvature_probes import EXACT_DIAGONAL_MAX_DIM, CurvatureProbes
from pyro_sgmcmc.kernels.warmup import DRIFT_NOISE_MINIBATCHES


@pytest.mark.parametrize("dim", [3, EXACT_DIAGONAL_MAX_DIM + 1])
def test_the_streamed_drift_covariance_is_the_sample_covariance_of_the_drifts(dim):
    """The covariance accumulated one minibatch at a time (about the first drift) equals the unbiased sample
    covariance of the ``DRIFT_NOISE_MINIBATCHES`` drifts stacked, to rounding: dense ``(C, D, D)`` up to
    ``EXACT_DIAGONAL_MAX_DIM``, its diagonal above. The drifts have a mean of 1e6 and an sd of 1, so a plain
    sum of squares would lose every digit in float64 (1e12 against 1)."""
    generator = torch.Generator().manual_seed(0)
    chains, num_data = 2, 50
    gradients = 1e6 + torch.randn(DRIFT_NOISE_MINIBATCHES, chains, dim, generator=generator, dtype=torch.float64)
    gradients = gradients * num_data
    calls = iter(range(DRIFT_NOISE_MINIBATCHES))

    def evaluate(position, indices):
        k = next(calls)
        return torch.zeros(chains, dtype=torch.float64), gradients[k]

    probes = CurvatureProbes(evaluate, lambda: {"data": torch.zeros(chains, 5, dtype=torch.long)}, ["data"], num_data)
    covariance, spent = probes.drift_noise_covariance(torch.zeros(chains, dim, dtype=torch.float64))
    assert spent == DRIFT_NOISE_MINIBATCHES
    drifts = gradients / num_data
    expected = torch.stack([torch.cov(drifts[:, c].T) for c in range(chains)])
    if dim > EXACT_DIAGONAL_MAX_DIM:
        expected = expected.diagonal(dim1=-2, dim2=-1)
    assert covariance.shape == expected.shape
    assert torch.allclose(covariance, expected, rtol=1e-9, atol=1e-12)


def test_a_full_batch_has_no_drift_noise():
    probes = CurvatureProbes(None, None, [], 10)
    covariance, spent = probes.drift_noise_covariance(torch.zeros(3, 4))
    assert spent == 0 and covariance.shape == (3, 4, 4) and not covariance.any()
