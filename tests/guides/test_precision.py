"""The precision classes answer the same questions the same way (one interface, three representations).

Oracle: the dense matrix and plain ``torch.linalg``. A block-diagonal Kronecker precision and a
diagonal one are each written out as a dense matrix; every method of :class:`DiagPrecision`,
:class:`DensePrecision` and :class:`KronPrecision` must then agree with :class:`DensePrecision`
of that matrix and with direct linear algebra (float64, to 1e-10).
"""

from __future__ import annotations

import pytest
import torch

from pyro_sgmcmc.guides.approximation import make_precision
from pyro_sgmcmc.guides.kron import KroneckerPrecision, KronPrecision
from pyro_sgmcmc.guides.precision import DensePrecision, DiagPrecision

SLICES = {"w": slice(0, 6), "b": slice(6, 8)}  # a weight (2, 3) and its bias (2,)


def _spd(n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return a @ a.T + 0.1 * torch.eye(n, dtype=torch.float64)


def _kron_and_dense():
    g, a = _spd(2, 0), _spd(3, 1)
    kron = KronPrecision({"w": (g, a), "b": (g,)}, SLICES)
    dense = torch.block_diag(torch.kron(g, a), g)
    return kron, dense


def _close(a, b):
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), (a, b)


@pytest.mark.parametrize("representation", ["diag", "kron"])
def test_every_method_agrees_with_the_dense_precision(representation):
    if representation == "kron":
        likelihood, matrix = _kron_and_dense()
        prior = torch.tensor([0.5] * 6 + [2.0] * 2, dtype=torch.float64)  # one number per site
    else:
        diagonal = torch.linspace(0.5, 3.0, 8, dtype=torch.float64)
        likelihood, matrix = DiagPrecision(diagonal, SLICES), torch.diag(diagonal)
        prior = torch.linspace(0.1, 0.8, 8, dtype=torch.float64)
    scale = 0.7
    ours = likelihood.with_prior(prior, scale)
    dense = DensePrecision(matrix, SLICES).with_prior(prior, scale)
    precision = scale * matrix + torch.diag(prior)
    covariance = torch.linalg.inv(precision)
    b = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)
    jac = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    loc = torch.zeros(8, dtype=torch.float64)
    points = torch.randn(4, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for candidate in (ours, dense):
        candidate.check()
        _close(candidate.logdet(), torch.logdet(precision))
        _close(candidate.quadratic(b), b @ covariance @ b)
        _close(candidate.solve(b), covariance @ b)
        _close(candidate.variances(), covariance.diagonal())
        whitened = candidate.whiten(jac)
        _close(whitened @ whitened.transpose(-1, -2), jac @ covariance @ jac.transpose(-1, -2))
        reference = torch.distributions.MultivariateNormal(loc, covariance_matrix=covariance)
        _close(candidate.distribution(loc).log_prob(points), reference.log_prob(points))
    expected_covariance = covariance.diagonal() if representation == "diag" else covariance
    _close(ours.covariance(), expected_covariance)
    assert ours.dim == dense.dim == 8


def test_a_site_marginal_is_the_block_of_the_covariance():
    kron, matrix = _kron_and_dense()
    prior = torch.tensor([0.5] * 6 + [2.0] * 2, dtype=torch.float64)
    covariance = torch.linalg.inv(matrix + torch.diag(prior))
    loc = torch.arange(8, dtype=torch.float64)
    for precision in (kron.with_prior(prior), DensePrecision(matrix, SLICES).with_prior(prior)):
        site = precision.site_distribution(loc, "w", torch.Size([2, 3]), 2)
        draws = torch.randn(5, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        reference = torch.distributions.MultivariateNormal(loc[:6], covariance_matrix=covariance[:6, :6])
        _close(site.log_prob(draws.reshape(5, 2, 3)), reference.log_prob(draws))


def test_not_positive_definite_is_a_named_error():
    diagonal = torch.tensor([1.0, -2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"sites \['w'\]"):
        DiagPrecision(diagonal, SLICES).with_prior(torch.zeros(8, dtype=torch.float64)).check()
    with pytest.raises(ValueError, match="not positive definite"):
        DensePrecision(torch.diag(diagonal), SLICES).with_prior(torch.zeros(8, dtype=torch.float64)).check()
    kron, _ = _kron_and_dense()
    with pytest.raises(ValueError, match="one prior precision per site"):
        kron.with_prior(torch.linspace(0.1, 0.8, 8, dtype=torch.float64))


def test_make_precision_picks_the_representation_and_the_old_name_still_works():
    assert isinstance(make_precision(torch.ones(8), SLICES), DiagPrecision)
    assert isinstance(make_precision(torch.eye(8), SLICES), DensePrecision)
    g, a = _spd(2, 0), _spd(3, 1)
    assert isinstance(make_precision(torch.ones(8), SLICES, {"w": (g, a), "b": (g,)}), KronPrecision)
    assert KroneckerPrecision is KronPrecision


def test_kron_with_prior_still_takes_one_number_per_site_with_a_warning():
    kron, matrix = _kron_and_dense()
    with pytest.warns(FutureWarning, match=r"\(d,\) prior diagonal"):
        old = kron.with_prior(torch.tensor([0.5, 2.0], dtype=torch.float64))
    new = kron.with_prior(torch.tensor([0.5] * 6 + [2.0] * 2, dtype=torch.float64))
    _close(old.dense(), new.dense())
