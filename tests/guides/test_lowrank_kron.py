"""LowRankKronPrecision against dense linear algebra (float64, tolerances at rounding: 1e-10 relative)."""

import math

import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc.guides.kron import KronPrecision
from pyro_sgmcmc.guides.lowrank_kron import LowRankKronPrecision, top_eigenpairs


def _psd(size, seed, rank=None):
    generator = torch.Generator().manual_seed(seed)
    root = torch.randn(size, rank or size + 2, generator=generator, dtype=torch.float64)
    return root @ root.T


def _factors():
    """A LoRA-like pair: A (2 x 7) with a large input factor, B (6 x 2) with a large output factor, a bias (6,)."""
    factors = {"A": (_psd(2, 0), _psd(7, 1)), "B": (_psd(6, 2), _psd(2, 3)), "b": (_psd(6, 4),)}
    slices = {"A": slice(0, 14), "B": slice(14, 26), "b": slice(26, 32)}
    return factors, slices


def _dense_block(parts, rank):
    truncated = []
    for factor in parts:
        values, vectors = top_eigenpairs(factor, rank)
        truncated.append(vectors @ torch.diag(values) @ vectors.T)
    return torch.kron(*truncated) if len(truncated) == 2 else truncated[0]


@pytest.mark.parametrize("rank", [None, 3, 1])
def test_operations_match_the_dense_precision(rank):
    factors, slices = _factors()
    prior = torch.tensor([0.7, 1.3, 2.0], dtype=torch.float64)
    precision = LowRankKronPrecision(factors, slices, rank=rank, prior_precision=prior)
    eye = lambda size: torch.eye(size, dtype=torch.float64)  # noqa: E731
    dense = torch.block_diag(*[_dense_block(factors[n], rank) + prior[i] * eye(w.stop - w.start)
                               for i, (n, w) in enumerate(slices.items())])  # fmt: skip
    torch.testing.assert_close(precision.dense(), dense, rtol=1e-10, atol=1e-10)
    covariance = torch.linalg.inv(dense)
    torch.testing.assert_close(precision.covariance(), covariance, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(precision.variances(), covariance.diagonal(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(precision.logdet(), torch.logdet(dense), rtol=1e-10, atol=1e-10)
    v = torch.randn(4, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.testing.assert_close(precision.solve(v), v @ covariance, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(precision.quadratic(v[0]), v[0] @ covariance @ v[0], rtol=1e-10, atol=1e-12)
    root = precision.whiten(v)
    torch.testing.assert_close(root @ root.T, v @ covariance @ v.T, rtol=1e-10, atol=1e-12)
    loc = torch.zeros(32, dtype=torch.float64)
    reference = dist.MultivariateNormal(loc, precision_matrix=dense)
    torch.testing.assert_close(precision.distribution(loc).log_prob(v), reference.log_prob(v), rtol=1e-10, atol=1e-10)


def test_full_rank_equals_kron_precision():
    factors, slices = _factors()
    prior = torch.tensor([0.7, 1.3, 2.0], dtype=torch.float64)
    ours = LowRankKronPrecision(factors, slices, prior_precision=prior)
    theirs = KronPrecision(factors, slices, prior_precision=prior)
    torch.testing.assert_close(ours.dense(), theirs.dense(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.logdet(), theirs.logdet(), rtol=1e-12, atol=1e-12)


def test_truncation_error_against_rank():
    """||G (x) A - G (x) A_k||_F = ||G||_F (sum_{i>k} s_i^2)^(1/2): the Eckart-Young error, zero at full rank
    and strictly decreasing in k for a factor with distinct positive eigenvalues (k >= 2 leaves the 2 x 2 G whole)."""
    g, a = _psd(2, 0), _psd(7, 1)
    values = torch.linalg.eigvalsh(a).flip(0)
    errors = []
    for rank in range(2, 8):
        block = _dense_block((g, a), rank)
        error = torch.linalg.norm(torch.kron(g, a) - block)
        predicted = torch.linalg.norm(g) * values[rank:].pow(2).sum().sqrt()
        torch.testing.assert_close(error, predicted, rtol=1e-9, atol=1e-9)
        errors.append(float(error))
    assert all(later < earlier for earlier, later in zip(errors, errors[1:-1]))
    assert errors[-1] < 1e-9 * float(torch.linalg.norm(torch.kron(g, a)))


def test_per_site_prior_from_a_vector_and_refusal_of_zero_prior_with_truncation():
    factors, slices = _factors()
    precision = LowRankKronPrecision(factors, slices, rank=2)
    vector = torch.cat([torch.full((14,), 0.5), torch.full((12,), 2.0), torch.full((6,), 3.0)]).double()
    other = precision.with_prior(vector)
    torch.testing.assert_close(other.prior_precision, torch.tensor([0.5, 2.0, 3.0], dtype=torch.float64))
    flat = precision.with_prior(torch.zeros(32, dtype=torch.float64))
    with pytest.raises(ValueError, match="positive prior precision"):
        flat.check()
    assert math.isfinite(float(other.logdet()))


def test_repr_shows_the_rank_and_the_kept_eigenvectors_shapes():
    """A truncated Kronecker posterior prints what it keeps (issue 29.5: a bare ``KroneckerNormal()`` said
    nothing): the rank, and per site the kept eigenvectors, ``(out, k) x (in, k)`` for a weight."""
    factors, slices = _factors()
    precision = LowRankKronPrecision(factors, slices, rank=1, prior_precision=1.0)
    kept = "A: (2, 1) x (7, 1), B: (6, 1) x (2, 1), b: (6, 1)"
    assert repr(precision) == f"LowRankKronPrecision(rank=1, factors: {{{kept}}})"
    loc = torch.zeros(32, dtype=torch.float64)
    assert repr(precision.distribution(loc)) == f"KroneckerNormal(loc: torch.Size([32]), factors: {{{kept}}})"


def test_truncation_lowers_the_log_determinant_so_raises_the_evidence():
    """docs/module_laplace.rst: G (x) A_k <= G (x) A_{k+1} in the PSD order (A_{k+1} - A_k = s_{k+1} u u^T), so at a
    fixed prior log det(Lambda_k) rises with k to the untruncated value, and the evidence's -1/2 log det falls:
    the evidence prefers the truncated model. Each step adds log(1 + s_{k+1} g_j / (lambda + ...)) > 0 for every
    eigenvalue g_j of G; the smallest step here is far above rounding (checked against 1e-6)."""
    factors, slices = _factors()
    prior = torch.tensor([0.7, 1.3, 2.0], dtype=torch.float64)
    logdets = [float(LowRankKronPrecision(factors, slices, rank=rank, prior_precision=prior).logdet())
               for rank in range(1, 8)]  # fmt: skip
    full = float(LowRankKronPrecision(factors, slices, prior_precision=prior).logdet())
    assert all(later - earlier > 1e-6 for earlier, later in zip(logdets, logdets[1:])), logdets
    assert math.isclose(logdets[-1], full, rel_tol=1e-12)  # rank 7 keeps every factor whole
