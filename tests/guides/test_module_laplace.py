"""ModuleLaplace: the evidence against the exact Laplace evidence on a grid, the linearised predictive against
brute-force Jacobians, the frozen base untouched, dict inputs, the memory refusal and bad arguments.

float64 throughout: closed-form comparisons hold to rounding (1e-9 relative).
"""

import math
import re

import pytest
import torch
from torch import nn

from pyro_sgmcmc.guides import ModuleLaplace, is_lora_parameter

from .tiny_lora import TinyLoRAClassifier, batches, exact_ggn, exact_jacobian, flat_logits, lora_names, tiny_data


@pytest.fixture(autouse=True)
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _setup():
    model = TinyLoRAClassifier().double()
    inputs, labels = tiny_data()
    return model, inputs, labels


def _exact_log_evidence(model, names, inputs, labels, prior):
    """log p(y | theta*) - prior/2 |theta*|^2 + d/2 log prior - 1/2 log det(H + prior I), H the exact GGN."""
    logits, theta = flat_logits(model, names, inputs)
    log_lik = torch.distributions.Categorical(logits=logits(theta)).log_prob(labels).sum()
    eigenvalues = torch.linalg.eigvalsh(exact_ggn(model, names, inputs))
    d = theta.shape[0]
    return (log_lik - 0.5 * prior * (theta @ theta) + 0.5 * d * torch.log(prior)
            - 0.5 * torch.log(eigenvalues.unsqueeze(0) + prior.unsqueeze(1)).sum(1))  # fmt: skip


def test_evidence_optimum_against_a_grid_of_the_exact_log_evidence():
    model, inputs, labels = _setup()
    names = lora_names(model)
    laplace = ModuleLaplace(model, names, curvature="full_ggn").fit(batches(inputs, labels, 8))
    grid = torch.logspace(-3, 3, 3001)  # spacing 0.002 in log10
    exact = _exact_log_evidence(model, names, inputs, labels, grid)
    for prior in (grid[500], grid[1500], grid[2500]):
        torch.testing.assert_close(laplace.log_marginal_likelihood(prior), exact[grid == prior][0], rtol=1e-10,
                                   atol=1e-9)  # fmt: skip
    best = grid[exact.argmax()]
    assert 0 < exact.argmax() < grid.shape[0] - 1  # an interior optimum: the test can see the optimiser miss
    optimum = laplace.optimize_prior_precision()
    assert abs(math.log10(float(optimum)) - math.log10(float(best))) <= 0.002
    assert float(laplace.log_marginal_likelihood()) >= float(exact.max()) - 1e-9


@pytest.mark.parametrize("curvature", ["diag_ggn", "kron"])
def test_evidence_is_the_formula_of_its_own_precision(curvature):
    """log p(y|theta*) - 1/2 sum lambda_i theta_i^2 + 1/2 sum log lambda_i - 1/2 log det Lambda, per parameter."""
    model, inputs, labels = _setup()
    names = lora_names(model)
    laplace = ModuleLaplace(model, names, curvature=curvature, kron_rank=2).fit(batches(inputs, labels, 8))
    prior = {name: 0.5 + number for number, name in enumerate(names)}
    laplace.set_prior_precision(prior)
    vector = laplace.prior_precision
    posterior = laplace.posterior_precision
    dense = posterior.dense() if curvature == "kron" else torch.diag(posterior.as_tensor())
    logits, theta = flat_logits(model, names, inputs)
    log_lik = torch.distributions.Categorical(logits=logits(theta)).log_prob(labels).sum()
    expected = log_lik - 0.5 * (vector * theta**2).sum() + 0.5 * vector.log().sum() - 0.5 * torch.logdet(dense)
    torch.testing.assert_close(laplace.log_marginal_likelihood(), expected.detach(), rtol=1e-10, atol=1e-9)


def test_per_parameter_optimum_is_a_stationary_point():
    model, inputs, labels = _setup()
    laplace = ModuleLaplace(model, is_lora_parameter, curvature="kron").fit(batches(inputs, labels, 8))
    optimum = laplace.optimize_prior_precision(mode="parameter")
    x = optimum.log().detach().requires_grad_(True)
    value = laplace.log_marginal_likelihood(x.exp())
    (gradient,) = torch.autograd.grad(value, x)
    assert float(gradient.abs().max()) < 1e-5 * abs(float(value.detach()))  # L-BFGS tolerance, relative to the evidence
    assert float(value.detach()) >= float(laplace.log_marginal_likelihood(1.0))


@pytest.mark.parametrize("curvature", ["diag_ggn", "kron", "full_ggn"])
def test_linearised_predictive_against_brute_force_jacobians(curvature):
    model, inputs, labels = _setup()
    names = lora_names(model)
    laplace = ModuleLaplace(model, names, curvature=curvature, kron_rank=2).fit(batches(inputs, labels, 8))
    laplace.set_prior_precision(0.8)
    prediction = laplace.predict(inputs, batch_size=6)
    jacobian = exact_jacobian(model, names, inputs)  # (n, K, d)
    posterior = laplace.posterior_precision
    covariance = torch.diag(posterior.variances()) if curvature == "diag_ggn" else posterior.covariance()
    expected = jacobian @ covariance @ jacobian.transpose(1, 2)
    torch.testing.assert_close(prediction.mean, model(**inputs).detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(prediction.covariance, expected, rtol=1e-9, atol=1e-12)
    probs = laplace.predict(inputs, link="probit", batch_size=20)
    scaled = prediction.mean / torch.sqrt(1 + math.pi / 8 * expected.diagonal(dim1=1, dim2=2))
    torch.testing.assert_close(probs, torch.softmax(scaled, -1), rtol=1e-9, atol=1e-12)


def test_monte_carlo_link_within_its_error():
    """E[softmax(f)], f ~ N(mu, S): two independent 20000-draw estimates differ by at most 5 standard errors
    (each probability has variance <= 1/4, so the difference has sd <= sqrt(2 / 4 / 20000) = 0.005)."""
    model, inputs, labels = _setup()
    laplace = ModuleLaplace(model, is_lora_parameter, curvature="diag_ggn").fit(batches(inputs, labels, 8))
    laplace.set_prior_precision(0.3)
    probs = laplace.predict(inputs, link="mc", num_samples=20000, generator=torch.Generator().manual_seed(0))
    prediction = laplace.predict(inputs)
    draws = torch.distributions.MultivariateNormal(prediction.mean, prediction.covariance).sample((20000,))
    assert float((probs - torch.softmax(draws, -1).mean(0)).abs().max()) < 0.025


def test_frozen_base_is_unchanged_bit_for_bit():
    model, inputs, labels = _setup()
    model.train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    laplace = ModuleLaplace(model, is_lora_parameter, curvature="kron", kron_rank=2).fit(batches(inputs, labels, 8))
    laplace.optimize_prior_precision(mode="parameter")
    laplace.predict(inputs, link="probit")
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert flags == {name: p.requires_grad for name, p in model.named_parameters()}
    assert all(p.grad is None for p in model.parameters())
    assert model.training


def test_dict_inputs_pass_through():
    model, inputs, labels = _setup()
    laplace = ModuleLaplace(model, is_lora_parameter, curvature="diag_ggn").fit(batches(inputs, labels, 8))
    model.seen.clear()
    padded = laplace.predict(inputs, batch_size=7)
    assert model.seen == [{"input_ids": torch.int64, "attention_mask": torch.int64}] * 3
    unmasked = laplace.predict({**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])})
    assert not torch.allclose(padded.mean, unmasked.mean)  # the mask reached the module


def _stated_bytes(message):
    return int(re.search(r"\((\d+) numbers of (\d+) bytes\)", message).group(1)) * 8


@pytest.mark.parametrize("curvature", ["diag_ggn", "kron", "full_ggn"])
def test_memory_refusal_names_the_size_and_the_stated_size_suffices(curvature):
    model, inputs, labels = _setup()
    with pytest.raises(ValueError, match=r"MiB .* over max_memory=100 bytes") as info:
        ModuleLaplace(model, is_lora_parameter, curvature=curvature, max_memory=100).fit(batches(inputs, labels, 8))
    needed = _stated_bytes(str(info.value))
    laplace = ModuleLaplace(model, is_lora_parameter, curvature=curvature, max_memory=needed)
    laplace.fit(batches(inputs, labels, 8))
    laplace.max_memory = 100
    with pytest.raises(ValueError, match="the linearised predictive with a batch of 20") as info:
        laplace.predict(inputs, batch_size=20)
    laplace.max_memory = _stated_bytes(str(info.value))
    laplace.predict(inputs, batch_size=20)
    doubled = {key: torch.cat([value, value]) for key, value in inputs.items()}
    assert laplace.predict(doubled, batch_size=20).mean.shape[0] == 40  # bounded: 20 examples per step
    with pytest.raises(ValueError, match="linearised predictive with a batch of 40"):
        laplace.predict(doubled, batch_size=40)


def test_regression_last_layer_diag_is_the_exact_ggn():
    """Gaussian likelihood: H = sum_n J_n^T J_n / sigma^2 on the last layer of an MLP."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    x, y = torch.randn(9, 3), torch.randn(9, 2)
    names = ["2.weight", "2.bias"]
    laplace = ModuleLaplace(model, names, likelihood="regression", sigma_noise=0.5, curvature="diag_ggn")
    laplace.fit([(x, y)])
    logits, theta = flat_logits(model, names, x)
    jacobian = torch.func.jacrev(lambda t: torch.func.functional_call(model, {
        names[0]: t[:10].reshape(2, 5), names[1]: t[10:]}, (x,)))(theta)  # fmt: skip
    exact = torch.einsum("nkd,nke->de", jacobian, jacobian) / 0.25
    torch.testing.assert_close(laplace.precision.curvature, exact.diagonal(), rtol=1e-10, atol=1e-12)
    expected = torch.distributions.Normal(model(x), 0.5).log_prob(y).sum()
    torch.testing.assert_close(laplace.log_likelihood, expected.detach(), rtol=1e-12, atol=1e-12)


def test_bad_arguments_are_named():
    model, inputs, labels = _setup()
    with pytest.raises(ValueError, match="'embedding.weight' is not the weight or bias of an nn.Linear"):
        ModuleLaplace(model, ["embedding.weight"])
    with pytest.raises(ValueError, match="'nope' is not a parameter"):
        ModuleLaplace(model, ["nope"])
    with pytest.raises(ValueError, match="selects no parameter"):
        ModuleLaplace(model, lambda name, p: False)
    with pytest.raises(ValueError, match="curvature must be one of"):
        ModuleLaplace(model, is_lora_parameter, curvature="full")
    with pytest.raises(ValueError, match="kron_rank"):
        ModuleLaplace(model, is_lora_parameter, kron_rank=0)
    with pytest.raises(TypeError, match="max_memory"):
        ModuleLaplace(model, is_lora_parameter, max_memory=1.5)
    with pytest.raises(ValueError, match="not called by the module's forward pass"):
        unused = ModuleLaplace(nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 3)), ["1.weight"],
                               output_fn=lambda module, x: module[0](x))  # fmt: skip
        unused.fit([(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))])
    with pytest.raises(ValueError, match="position_mask='nope' is not a key of the inputs"):
        ModuleLaplace(model, is_lora_parameter, position_mask="nope").fit(batches(inputs, labels, 8))
    laplace = ModuleLaplace(model, is_lora_parameter)
    with pytest.raises(RuntimeError, match="fit"):
        laplace.predict(inputs)
    laplace.fit(batches(inputs, labels, 8))
    with pytest.raises(ValueError, match="link"):
        laplace.predict(inputs, link="sigmoid")
    with pytest.raises(ValueError, match="prior_precision must be positive"):
        laplace.set_prior_precision(-1.0)
    with pytest.raises(ValueError, match="unknown parameters"):
        laplace.set_prior_precision({"nope": 1.0})
