"""The export's pointwise log-densities (``pyro_sgmcmc/export/log_prob.py``): the Bernoulli-logits formula equals
Pyro's ``log_prob`` to rounding and is at least as accurate, and only the distributions it knows are touched."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGLD, to_inference_data
from pyro_sgmcmc.export.log_prob import bernoulli_logits_log_prob, pointwise_log_prob


def _grid(dtype):
    """Logits over the range a classifier produces, with the sign changes and the large magnitudes where a
    careless formula cancels, each with the labels 0 and 1 and a relaxed label."""
    logits = torch.cat([torch.linspace(-40, 40, 4001), torch.tensor([0.0, 1e-6, -1e-6, 88.0, -88.0])]).to(dtype)
    labels = torch.tensor([0.0, 1.0, 0.3], dtype=dtype)
    return logits.unsqueeze(0), labels.unsqueeze(1)


def _exact(logits, labels):
    """float64 reference: y l - softplus(l), softplus through log1p (accurate to a few float64 ulp)."""
    logits, labels = logits.double(), labels.double()
    return labels * logits - logits.clamp_min(0) - torch.log1p(torch.exp(-logits.abs()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bernoulli_formula_equals_pyro_s_log_prob_to_rounding(dtype):
    logits, labels = _grid(dtype)
    ours = bernoulli_logits_log_prob(logits, labels)
    pyro_s = dist.Bernoulli(logits=logits, validate_args=False).log_prob(labels)
    assert ours.shape == pyro_s.shape and ours.dtype == dtype
    # both are y l - softplus(l); they round differently: a few ulp of the largest term (|l| <= 88)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(ours, pyro_s, rtol=4 * eps, atol=4 * eps * 88)


def test_bernoulli_formula_is_at_least_as_accurate_as_pyro_s_in_float32():
    # where the answer is tiny (y = 1, l >> 0, or y = 0, l << 0: log p ~ -exp(-|l|)) PyTorch's form takes the log
    # of 1 + exp(-|l|) rounded to float32 (absolute error ~ 6e-8) and a form y l - softplus(l) cancels (error ~
    # ulp(|l|), up to 4e-6 at |l| = 40); ours is within a few ulp of the answer itself
    logits, labels = _grid(torch.float32)
    exact = _exact(logits, labels)
    ours = (bernoulli_logits_log_prob(logits, labels).double() - exact).abs()
    pyro_s = (dist.Bernoulli(logits=logits, validate_args=False).log_prob(labels).double() - exact).abs()
    cancelling = ((labels * logits - torch.nn.functional.softplus(logits)).double() - exact).abs()
    assert bool((ours <= pyro_s + 4 * torch.finfo(torch.float32).eps * exact.abs()).all())
    binary = labels.squeeze(1) != 0.3
    relative = (ours / exact.abs().clamp_min(1e-30))[binary]
    assert relative.max() < 4 * torch.finfo(torch.float32).eps  # a few ulp of the answer, however small
    assert (cancelling / exact.abs().clamp_min(1e-30))[binary].max() > 1e-2  # what the test would catch


def test_only_the_distributions_it_knows_are_evaluated_by_another_formula():
    logits = torch.randn(4, 3, dtype=torch.float64)
    y = torch.bernoulli(torch.full((4, 3), 0.5, dtype=torch.float64))
    independent = dist.Bernoulli(logits=logits).to_event(1)
    torch.testing.assert_close(pointwise_log_prob(independent, y), independent.log_prob(y), rtol=1e-14, atol=1e-14)
    assert pointwise_log_prob(independent, y).shape == (4,)

    class Tempered(dist.Bernoulli):  # a user's subclass with its own log_prob is asked for it
        def log_prob(self, value):
            return 0.5 * super().log_prob(value)

    tempered = Tempered(logits=logits)
    assert torch.equal(pointwise_log_prob(tempered, y), tempered.log_prob(y))
    by_probs = dist.Bernoulli(probs=torch.sigmoid(logits))  # parametrised by probabilities: its own log_prob
    assert torch.equal(pointwise_log_prob(by_probs, y), by_probs.log_prob(y))
    normal = dist.Normal(logits, 1.0)
    assert torch.equal(pointwise_log_prob(normal, y), normal.log_prob(y))


@pytest.mark.filterwarnings("ignore:.*adapted step size")  # a short run: its draws only need to differ
def test_a_logistic_regression_s_exported_log_likelihood_is_pyro_s():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 3, generator=g)
    y = torch.bernoulli(torch.sigmoid(3 * x[:, 0] - 1), generator=g)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0], subsample_size=50) as i:
            pyro.sample("y", dist.Bernoulli(logits=x[i] @ w + b), obs=y[i])

    mcmc = MCMC(SGLD(model), num_samples=20, warmup_steps=20, num_chains=3, chain_method="vectorized", seed=0,
                disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    idata = to_inference_data(mcmc, log_likelihood=True)
    samples = mcmc.get_samples(group_by_chain=True)
    logits = torch.einsum("nk,cdk->cdn", x, samples["w"]) + samples["b"].unsqueeze(-1)
    expected = dist.Bernoulli(logits=logits).log_prob(y).numpy()
    got = idata.log_likelihood["y"].values
    assert got.shape == (3, 20, 300) and got.dtype == np.float32
    # float32 round-off on terms of size |l| <= ~10 (the logits' matrix product summed in another order)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)
