"""ModelPotential: sites, transforms, plates, minibatch scaling, initialisation."""

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.initialization import init_to_mean, init_to_value

from pyro_sgmcmc import ModelPotential


def test_full_batch_log_density_matches_hand_computation(float64):
    y = torch.tensor([0.5, 1.5, 2.0])

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 2.0))
        sigma = pyro.sample("sigma", dist.HalfNormal(3.0))
        with pyro.plate("data", 3):
            pyro.sample("y", dist.Normal(mu, sigma), obs=y)

    potential = ModelPotential(model, (y,))
    assert potential.site_names == ["mu", "sigma"] and potential.num_data == 3 and potential.subsample_plates == []
    z = torch.tensor([0.3, math.log(1.7)])  # sorted site order: mu, then log(sigma)
    expected = (
        dist.Normal(0.0, 2.0).log_prob(z[0])
        + dist.HalfNormal(3.0).log_prob(z[1].exp())
        + z[1]  # log |d sigma / d log sigma|
        + dist.Normal(z[0], z[1].exp()).log_prob(y).sum()
    )
    assert torch.allclose(potential.log_density(z), expected, atol=1e-12)
    value, grad = potential.potential_and_grad(z)
    assert torch.allclose(value, -expected, atol=1e-12)
    z_ = z.clone().requires_grad_(True)
    (-potential.log_density(z_)).backward()
    assert torch.allclose(grad, z_.grad, atol=1e-12)


def _identical_terms_log_density(model, args, z):
    """With every datum identical, a minibatch estimate scaled by N/B equals the full-data value exactly."""
    potential = ModelPotential(model, args)
    return potential, potential.log_density(z)


def test_subsample_scaling_single_nested_and_several_plates(float64):
    # Every datum is identical, so each minibatch estimate must equal the full-data sum *exactly*:
    # this checks the N/B scale of each plate independently of which indices were drawn.
    obs_a = torch.full((1000,), 0.7)
    obs_b = torch.full((30, 40), -0.2)

    def model(obs_a, obs_b):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("a", 1000, subsample_size=37) as i:
            pyro.sample("ya", dist.Normal(mu, 1.0), obs=obs_a[i])
        with pyro.plate("groups", 30, subsample_size=4, dim=-2) as g:
            with pyro.plate("members", 40, subsample_size=9, dim=-1) as m:
                pyro.sample("yb", dist.Normal(mu, 2.0), obs=obs_b[g][:, m])

    z = torch.tensor([0.25])
    potential = ModelPotential(model, (obs_a, obs_b))
    expected = (
        dist.Normal(0.0, 1.0).log_prob(z[0])
        + dist.Normal(z[0], 1.0).log_prob(obs_a).sum()
        + dist.Normal(z[0], 2.0).log_prob(obs_b).sum()
    )
    for _ in range(5):
        assert torch.allclose(potential.log_density(z), expected, atol=1e-9)
    plates = {p.name: (p.size, p.subsample_size) for p in potential.subsample_plates}
    assert plates == {"a": (1000, 37), "groups": (30, 4), "members": (40, 9)}
    assert potential.num_data == 30 * 40  # the largest number of likelihood terms of one observed site


def test_minibatch_estimate_is_unbiased_and_fresh_each_call(float64):
    g = torch.Generator().manual_seed(0)
    y = torch.randn(500, generator=g) * 2 + 1

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 500, subsample_size=20) as idx:
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    potential = ModelPotential(model, (y,))
    z = torch.tensor([0.3])
    full = dist.Normal(0.0, 1.0).log_prob(z[0]) + dist.Normal(z[0], 1.0).log_prob(y).sum()
    pyro.set_rng_seed(1)
    estimates = torch.stack([potential.log_density(z) for _ in range(2000)])
    assert estimates.std() > 0  # a fresh minibatch each call
    # unbiased: the average of 2000 estimates is within 4 standard errors of the full-data value
    assert abs(estimates.mean() - full) < 4 * estimates.std() / math.sqrt(2000)


def test_num_data_override_and_no_plate_default():
    def model():
        pyro.sample("x", dist.Normal(torch.zeros(3), 1.0).to_event(1))

    assert ModelPotential(model).num_data == 1
    assert ModelPotential(model, num_data=250).num_data == 250


def test_constrained_sites_layout_and_round_trip(float64):
    def model():
        pyro.sample("scale", dist.HalfCauchy(1.0))
        pyro.sample("probs", dist.Dirichlet(torch.ones(4)))
        pyro.sample("frac", dist.Uniform(-1.0, 3.0))
        pyro.sample("corr", dist.LKJCholesky(3, 1.0))

    potential = ModelPotential(model)
    shapes = {s.name: (tuple(s.shape), tuple(s.unconstrained_shape)) for s in potential.sites}
    assert shapes == {"corr": ((3, 3), (3,)), "frac": ((), ()), "probs": ((4,), (3,)), "scale": ((), ())}
    assert potential.dim == 3 + 1 + 3 + 1
    z = torch.randn(potential.dim) * 3
    values = potential.constrain(z)
    assert values["scale"] > 0
    assert torch.allclose(values["probs"].sum(), torch.tensor(1.0)) and (values["probs"] > 0).all()
    assert -1 < values["frac"] < 3
    assert torch.allclose(potential.pack({k: potential.transforms[k](v) for k, v in values.items()}), z, atol=1e-8)


def test_init_strategies_and_initial_params_are_honoured(float64):
    def model():
        pyro.sample("a", dist.Normal(torch.tensor([1.0, 2.0]), 0.5).to_event(1))
        pyro.sample("s", dist.LogNormal(0.3, 0.1))

    mean = ModelPotential(model, init_strategy=init_to_mean).initial_position()
    # LogNormal(0.3, 0.1) has mean exp(0.3 + 0.1^2 / 2); its unconstrained value is the log of that
    assert torch.allclose(mean, torch.tensor([1.0, 2.0, 0.3 + 0.005]), atol=1e-12)
    given = ModelPotential(
        model, init_strategy=init_to_value(values={"a": torch.tensor([5.0, 6.0]), "s": torch.tensor(2.0)})
    )
    assert torch.allclose(given.initial_position(), torch.tensor([5.0, 6.0, math.log(2.0)]))
    explicit = ModelPotential(model).initial_position({"a": torch.tensor([-1.0, -2.0]), "s": torch.tensor(0.5)})
    assert torch.equal(explicit, torch.tensor([-1.0, -2.0, 0.5]))


def test_init_retries_until_the_potential_is_finite(float64):
    def model():
        x = pyro.sample("x", dist.Normal(0.0, 1.0))
        pyro.factor("cut", torch.where(x > 0, torch.tensor(0.0), torch.tensor(-math.inf)))

    pyro.set_rng_seed(3)
    potential = ModelPotential(model)
    for _ in range(5):
        assert potential.initial_position() > 0


# ---------------------------------------------------------------------- fast Normal priors
def _regression(n: int, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64) + torch.randn(n, generator=g, dtype=torch.float64)

    def model():
        w = pyro.sample("w", dist.Normal(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1))
        s = pyro.sample("s", dist.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0))
        with pyro.plate("data", n, subsample_size=batch) as idx:
            pyro.sample("y", dist.Normal(x[idx] @ w, s), obs=y[idx])

    return model


def test_summed_potential_and_grad_equals_the_sum_over_minibatches():
    """One point, K minibatches: the shared-z vectorised sum equals the sum of K per-chain evaluations
    (same terms, another summation order: float64 round-off only)."""
    potential = ModelPotential(_regression(60, 7), (), {})
    z = torch.tensor([0.3, -0.2, 0.1, 0.4], dtype=torch.float64)
    indices = torch.stack([torch.randperm(60)[:7] for _ in range(5)])
    summed_u, summed_g = potential.summed_potential_and_grad(z, {"data": indices})
    u, g = potential.batched_potential_and_grad(z.expand(5, -1).contiguous(), {"data": indices})
    assert torch.allclose(summed_u, u.sum(), rtol=1e-12, atol=0)
    assert torch.allclose(summed_g, g.sum(0), rtol=1e-12, atol=1e-12)


def test_summed_potential_and_grad_declines_a_model_that_cannot_share_z():
    """A model whose Python control flow reads the minibatch indices cannot run under vmap: the summed
    evaluation returns None (the control-variate code then uses per-chain copies), every time after."""
    n, batch = 40, 8
    y = torch.randn(n, dtype=torch.float64)

    def model():
        mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0))
        with pyro.plate("data", n, subsample_size=batch) as idx:
            if int(idx.max()) >= 0:  # data-dependent branch: .item() of a vmapped tensor
                pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    potential = ModelPotential(model, (), {})
    indices = {"data": torch.stack([torch.arange(batch), torch.arange(batch, 2 * batch)])}
    assert potential.summed_potential_and_grad(torch.zeros(1, dtype=torch.float64), indices) is None
    assert potential.summed_potential_and_grad(torch.zeros(1, dtype=torch.float64), indices) is None


def test_initial_position_does_not_draw_a_full_permutation(monkeypatch):
    """Checking a starting point evaluates one random minibatch of B indices; Pyro's plate would draw
    ``randperm(N)`` (O(N): 70 ms at N = 10^7) for every chain's start."""
    n = 1000
    potential = ModelPotential(_regression(n, 10), (), {})
    sizes = []
    randperm = torch.randperm

    def counting(size, *args, **kwargs):
        sizes.append(size)
        return randperm(size, *args, **kwargs)

    monkeypatch.setattr(torch, "randperm", counting)
    for _ in range(3):
        position = potential.initial_position()
        assert bool(torch.isfinite(position).all())
    assert n not in sizes
