"""Tests of :mod:`pyro_sgmcmc.uncertainty`: hand-computed cases, identities, invariances, bad input.

The decomposition is deterministic arithmetic, so the oracles are exact values computed by hand
(or by an independent formula, the mean Kullback-Leibler divergence of the draws from their mean)
and the tolerances are floating-point round-off (1e-12 in float64, 1e-6 in float32).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from pyro_sgmcmc import UncertaintyDecomposition, decompose_uncertainty
from pyro_sgmcmc.diagnostics import auroc

LOG2 = math.log(2.0)


def _dirichlet(shape, concentration=0.5, seed=0) -> torch.Tensor:
    """Random probability vectors (float64) along the last dimension of ``shape``."""
    g = torch.Generator().manual_seed(seed)
    gamma = torch._standard_gamma(torch.full(shape, concentration, dtype=torch.float64), generator=g)
    return gamma / gamma.sum(-1, keepdim=True)


def _entropy(p) -> float:
    return -sum(q * math.log(q) for q in p if q > 0)


# ------------------------------------------------------------------------------------ hand-computed cases
def test_confident_disagreeing_draws_are_all_epistemic():
    u = decompose_uncertainty(torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    assert isinstance(u, UncertaintyDecomposition)
    assert u.total.shape == u.aleatoric.shape == u.epistemic.shape == ()
    # mean predictive [1/2, 1/2]: total log 2; each draw is a point mass: aleatoric 0
    assert float(u.total) == pytest.approx(LOG2, abs=1e-12)
    assert float(u.aleatoric) == 0.0
    assert float(u.epistemic) == pytest.approx(LOG2, abs=1e-12)


def test_identical_draws_have_no_epistemic_uncertainty():
    p = [0.2, 0.3, 0.5]
    u = decompose_uncertainty(torch.tensor([p] * 4, dtype=torch.float64))
    assert float(u.total) == pytest.approx(_entropy(p), abs=1e-12)
    assert float(u.aleatoric) == pytest.approx(_entropy(p), abs=1e-12)
    assert float(u.epistemic) == 0.0


def test_mixed_case_by_hand():
    # draws [1/2, 1/2] and [1, 0]: mean [3/4, 1/4]
    u = decompose_uncertainty(torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64))
    total = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # 0.5623
    aleatoric = (LOG2 + 0.0) / 2  # 0.3466
    assert float(u.total) == pytest.approx(total, abs=1e-12)
    assert float(u.aleatoric) == pytest.approx(aleatoric, abs=1e-12)
    assert float(u.epistemic) == pytest.approx(total - aleatoric, abs=1e-12)


def test_single_draw_has_zero_epistemic():
    p = _dirichlet((1, 7, 4))
    u = decompose_uncertainty(p)
    assert u.total.shape == (7,)
    torch.testing.assert_close(u.total, u.aleatoric, rtol=0, atol=1e-12)
    assert torch.all(u.epistemic == 0)


# ------------------------------------------------------------------------------------ identities and bounds
def test_epistemic_is_mean_kl_to_the_mean_and_bounds_hold():
    # independent oracle: I(y; theta) = (1/S) sum_s KL(p_s || p_bar)
    S, K = 6, 5
    p = _dirichlet((S, 3, 4, K), seed=1)
    u = decompose_uncertainty(p)
    assert u.total.shape == (3, 4)
    p_bar = p.mean(0)
    kl = (p * (p.log() - p_bar.log())).sum(-1).mean(0)
    torch.testing.assert_close(u.epistemic, kl, rtol=0, atol=1e-12)
    torch.testing.assert_close(u.total, u.aleatoric + u.epistemic, rtol=0, atol=1e-12)
    # 0 <= aleatoric <= total <= log K and epistemic <= log S (mutual information with S equally likely draws)
    assert torch.all(u.aleatoric >= 0) and torch.all(u.total <= math.log(K) + 1e-12)
    assert torch.all(u.aleatoric <= u.total + 1e-12)
    assert torch.all(u.epistemic <= math.log(S) + 1e-12)


def test_invariances():
    p = _dirichlet((5, 8, 3), seed=2)
    u = decompose_uncertainty(p)
    # order of the draws and of the classes does not matter
    for permuted in (p[torch.randperm(5, generator=torch.Generator().manual_seed(0))], p[..., [2, 0, 1]]):
        v = decompose_uncertainty(permuted)
        for a, b in zip(u, v):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # repeating every draw leaves the empirical distribution, hence all three, unchanged
    v = decompose_uncertainty(torch.cat([p, p]))
    for a, b in zip(u, v):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # each input is handled on its own: the result for a slice equals the slice of the result
    v = decompose_uncertainty(p[:, 3:4])
    for a, b in zip(u, v):
        torch.testing.assert_close(a[3:4], b, rtol=0, atol=0)


def test_sample_dim():
    p = _dirichlet((5, 4, 3), seed=3)  # (S, N, K)
    u = decompose_uncertainty(p)
    for dim in (1, -2):
        v = decompose_uncertainty(p.transpose(0, 1), sample_dim=dim)  # (N, S, K)
        for a, b in zip(u, v):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


# ------------------------------------------------------------------------------------ logits, numpy, dtypes, autograd
def test_logits_match_probs_and_are_stable():
    g = torch.Generator().manual_seed(4)
    logits = 3 * torch.randn(6, 10, 4, generator=g, dtype=torch.float64)
    u = decompose_uncertainty(logits=logits)
    v = decompose_uncertainty(logits.softmax(-1))
    for a, b in zip(u, v):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # huge logits: softmax of [1000, 0] is a point mass to double precision; no overflow, no NaN
    w = decompose_uncertainty(logits=torch.tensor([[1000.0, 0.0], [0.0, 1000.0]], dtype=torch.float64))
    assert float(w.total) == pytest.approx(LOG2, abs=1e-12) and float(w.aleatoric) == pytest.approx(0.0, abs=1e-12)
    # -inf logits are classes of probability 0
    w = decompose_uncertainty(logits=torch.tensor([[0.0, 0.0, -math.inf]], dtype=torch.float64))
    assert float(w.total) == pytest.approx(LOG2, abs=1e-12) and float(w.epistemic) == 0.0


def test_numpy_in_numpy_out():
    p = _dirichlet((4, 5, 3), seed=5)
    u = decompose_uncertainty(p)
    v = decompose_uncertainty(p.numpy())
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == (5,) for x in v)
    for a, b in zip(u, v):
        np.testing.assert_allclose(a.numpy(), b, rtol=0, atol=0)
    w = decompose_uncertainty(logits=np.log(p.numpy()).astype(np.float32))
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in w)
    np.testing.assert_allclose(w.total, v.total, atol=1e-5)
    # integers are probabilities too (point masses)
    assert float(decompose_uncertainty(np.array([[1, 0], [0, 1]])).epistemic) == pytest.approx(LOG2, abs=1e-6)


def test_float32_softmax_output_is_accepted():
    logits = torch.randn(8, 100, 10, generator=torch.Generator().manual_seed(6))
    u = decompose_uncertainty(logits.softmax(-1))  # row sums are 1 only to float32 round-off
    assert u.total.dtype == torch.float32
    v = decompose_uncertainty(logits=logits.double())
    torch.testing.assert_close(u.total.double(), v.total, rtol=0, atol=1e-5)


def test_gradient_flows():
    logits = torch.randn(3, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(7), requires_grad=True)

    def fn(x):
        return tuple(decompose_uncertainty(logits=x))

    assert torch.autograd.gradcheck(fn, (logits,))


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, "exactly one of probs and logits"),
        ({"probs": torch.ones(1, 1), "logits": torch.zeros(1, 1)}, ValueError, "exactly one"),
        ({"probs": [[1.0, 0.0]]}, TypeError, "probs must be a torch.Tensor or a numpy.ndarray"),
        ({"probs": torch.tensor([0.5, 0.5])}, ValueError, "at least 2 dimensions"),
        ({"probs": torch.ones(0, 2) / 2}, ValueError, "at least one draw"),
        ({"probs": torch.ones(1, 0)}, ValueError, "at least one class"),
        ({"probs": torch.tensor([[1.2, -0.2]])}, ValueError, "non-negative"),
        ({"probs": torch.tensor([[0.6, 0.6]])}, ValueError, "sum to 1"),
        ({"probs": torch.tensor([[math.nan, 1.0]])}, ValueError, "finite"),
        ({"probs": torch.full((2, 3, 2), 0.5), "sample_dim": -1}, ValueError, "sample_dim"),
        ({"probs": torch.full((2, 3, 2), 0.5), "sample_dim": 2}, ValueError, "sample_dim"),
        ({"probs": torch.full((2, 3, 2), 0.5), "sample_dim": 3}, ValueError, "sample_dim"),
        ({"probs": torch.full((2, 3, 2), 0.5), "sample_dim": -4}, ValueError, "sample_dim"),
        ({"probs": torch.full((2, 2), 0.5), "sample_dim": 0.0}, TypeError, "sample_dim must be an int"),
        ({"probs": torch.full((2, 2), 0.5), "sample_dim": True}, TypeError, "sample_dim must be an int"),
        ({"probs": torch.full((2, 2), 0.5), "eps": -1.0}, ValueError, "eps"),
        ({"probs": torch.full((2, 2), 0.5), "eps": "1e-3"}, ValueError, "eps"),
        ({"probs": torch.ones(2, 2, dtype=torch.complex64) / 2}, TypeError, "real"),
        ({"logits": torch.tensor([[math.nan, 0.0]])}, ValueError, "NaN or \\+inf"),
        ({"logits": torch.tensor([[math.inf, 0.0]])}, ValueError, "NaN or \\+inf"),
        ({"logits": torch.tensor([[-math.inf, -math.inf]])}, ValueError, "one finite entry"),
    ],
)
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        decompose_uncertainty(**kwargs)


def test_eps_is_the_tolerance():
    off = torch.tensor([[0.5, 0.5 + 1e-3]], dtype=torch.float64)
    with pytest.raises(ValueError, match="sum to 1"):
        decompose_uncertainty(off)
    u = decompose_uncertainty(off, eps=2e-3)
    assert math.isfinite(float(u.total))
    # small negative round-off within eps is set to 0
    u = decompose_uncertainty(torch.tensor([[1.0, -1e-9]], dtype=torch.float64))
    assert float(u.total) == 0.0


# ------------------------------------------------------------------------------------ AUROC
def test_auroc_hand_cases():
    assert auroc([0.1, 0.2, 0.3], [0.25, 0.4]) == pytest.approx(5 / 6, abs=1e-15)
    assert auroc([0.0, 1.0], [2.0, 3.0]) == 1.0  # perfect detector
    assert auroc([2.0, 3.0], [0.0, 1.0]) == 0.0  # perfectly reversed
    assert auroc([1.0, 1.0], [1.0]) == 0.5  # all ties count one half


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    scores_in = rng.normal(0.0, 1.0, size=200).round(1)  # rounded: many ties
    scores_out = rng.normal(0.7, 1.0, size=150).round(1)
    labels = np.r_[np.zeros(200), np.ones(150)]
    expected = roc_auc_score(labels, np.r_[scores_in, scores_out])
    assert auroc(scores_in, scores_out) == pytest.approx(expected, abs=1e-12)
    assert auroc(torch.tensor(scores_in), torch.tensor(scores_out)) == pytest.approx(expected, abs=1e-12)
    # swapping the roles mirrors the area
    assert auroc(scores_out, scores_in) == pytest.approx(1 - expected, abs=1e-12)


@pytest.mark.parametrize(
    "scores_in, scores_out, error, match",
    [
        ([], [1.0], ValueError, "scores_in must be 1-D with at least one score"),
        ([1.0], np.zeros((2, 2)), ValueError, "scores_out must be 1-D"),
        ([1.0], [math.nan], ValueError, "scores_out must be finite"),
        ("abc", [1.0], TypeError, "scores_in"),
        (["a"], [1.0], TypeError, "real numbers"),
    ],
)
def test_auroc_bad_input(scores_in, scores_out, error, match):
    with pytest.raises(error, match=match):
        auroc(scores_in, scores_out)
