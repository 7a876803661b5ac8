"""ModelPotential: sites, transforms, plates, minibatch scaling, initialisation."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
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
def _reference_potential(potential, model, args, z, indices):
    """U(z) the plain Pyro way: condition the constrained values and indices, sum the trace."""
    values, log_det = dict(indices), 0.0
    for site, u in zip(potential.sites, potential.unpack(z).values()):
        x = site.transform(u)
        values[site.name] = x
        if site.has_jacobian:
            log_det = log_det + site.transform.log_abs_det_jacobian(u, x).sum()
    trace = poutine.trace(poutine.condition(model, data=values)).get_trace(*args)
    return -(trace.log_prob_sum() + log_det)


def test_fast_normal_priors_equal_pyro_log_prob():
    """The latent sites' Normal priors are evaluated in a cheaper form (StandardNormalForm); it must
    give Pyro's value and gradient (to float32 round-off) for constant zero/unit parameters, constant
    other parameters, and parameters that depend on other latents (batched under vmap)."""
    from pyro_sgmcmc.model.priors import StandardNormalForm

    torch.manual_seed(0)
    x = torch.randn(200, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + torch.randn(200)

    def model(x, y):
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        m = pyro.sample("m", dist.Normal(1.0, 2.0))  # constant, non-standard
        w = pyro.sample("w", dist.Normal(m * torch.ones(3), s).to_event(1))  # depends on latents
        v = pyro.sample("v", dist.Normal(torch.zeros(2, 2), 1.0).to_event(2))  # standard
        with pyro.plate("data", 200, subsample_size=20) as i:
            pyro.sample("y", dist.Normal(x[i] @ w + v.sum(), 1.0), obs=y[i])

    potential = ModelPotential(model, (x, y))
    positions = torch.randn(4, potential.dim)
    indices = {"data": torch.stack([torch.randperm(200)[:20] for _ in range(4)])}
    energy, grad = potential.batched_potential_and_grad(positions, indices)
    for c in range(4):
        z = positions[c].clone().requires_grad_(True)
        expected = _reference_potential(potential, model, (x, y), z, {"data": indices["data"][c]})
        (expected_grad,) = torch.autograd.grad(expected, z)
        # float32 sums of ~20 terms of size ~100: round-off ~1e-5 relative
        assert torch.allclose(energy[c], expected.detach(), rtol=1e-5), (c, energy[c], expected)
        assert torch.allclose(grad[c], expected_grad, rtol=1e-5, atol=1e-4), c
    single_energy, single_grad = potential.batched_potential_and_grad(positions[:1], {"data": indices["data"][:1]})
    assert torch.allclose(single_energy, energy[:1], rtol=1e-6)
    assert torch.allclose(single_grad, grad[:1], rtol=1e-6, atol=1e-6)
    # the stand-in really is used for the three Normal sites (otherwise this test checks nothing)
    trace = poutine.trace(potential._conditioned_model).get_trace(x, y)
    swapped = {name for name, node in trace.nodes.items() if isinstance(node.get("fn"), StandardNormalForm)}
    assert swapped == {"m", "w", "v"}


# ---------------------------------------------------------------------- jit_compile
def test_jit_compile_matches_the_plain_potential():
    """The traced potential replays the same operations: same value and gradient (float32 round-off)
    at points and minibatches other than the one it was traced with."""
    torch.manual_seed(1)
    x = torch.randn(100, 2)
    y = x @ torch.tensor([0.5, -1.0]) + 0.3 * torch.randn(100)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        with pyro.plate("data", 100, subsample_size=10) as i:
            pyro.sample("y", dist.Normal(x[i] @ w, sigma), obs=y[i])

    plain = ModelPotential(model, (x, y), jit_compile=False)
    compiled = ModelPotential(model, (x, y), jit_compile=True)
    for trial in range(4):
        z = torch.randn(plain.dim)
        indices = {"data": torch.randperm(100)[:10]}
        expected, got = plain.potential_and_grad(z, indices), compiled.potential_and_grad(z, indices)
        assert compiled._jitted is not None  # really compiled
        assert torch.allclose(got[0], expected[0], rtol=1e-5)
        assert torch.allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)


def test_jit_compile_falls_back_with_a_warning_on_value_dependent_control_flow():
    """A model that branches on a latent value cannot be traced faithfully: the check at a second
    point (which crosses the branch here) catches it, warns, and the plain potential is used."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        shift = 1.0 if float(mu) > 0 else -1.0  # Python branch on a latent value
        with pyro.plate("data", len(y), subsample_size=2) as i:
            pyro.sample("y", dist.Normal(mu + shift, 1.0), obs=y[i])

    y = torch.tensor([0.0, 1.0, 2.0, 3.0])
    compiled = ModelPotential(model, (y,), jit_compile=True)
    plain = ModelPotential(model, (y,), jit_compile=False)
    indices = {"data": torch.tensor([0, 1])}
    with pytest.warns(RuntimeWarning, match="jit_compile"):
        got = compiled.potential_and_grad(torch.tensor([0.004]), indices)
    assert compiled._jitted is None
    assert torch.allclose(got[0], plain.potential_and_grad(torch.tensor([0.004]), indices)[0])
    below = torch.tensor([-0.5])  # the other branch: must use the plain potential
    assert torch.allclose(compiled.potential_and_grad(below, indices)[0], plain.potential_and_grad(below, indices)[0])


def test_jit_compile_must_be_a_bool_or_auto():
    with pytest.raises(TypeError, match='jit_compile must be True, False or "auto"'):
        ModelPotential(lambda: None, jit_compile="yes")


def _linear(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=10) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, 0.5), obs=y[i])


def _linear_data():
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(100, 2, generator=generator)
    return x, x @ torch.tensor([0.5, -1.0]) + 0.5 * torch.randn(100, generator=generator)


def test_auto_compiles_only_while_validation_is_off():
    """The default ``"auto"``: with Pyro's validation on (Pyro's default; a compiled function would
    check only the traced minibatch) the model runs every time; switched off (as ``MCMC`` does) the
    next evaluation compiles, and the compiled potential gives the plain one's values (float32
    round-off of the same operations: relative 1e-5)."""
    x, y = _linear_data()
    auto, plain = ModelPotential(_linear, (x, y)), ModelPotential(_linear, (x, y), jit_compile=False)
    assert auto.jit_compile == "auto"
    indices = {"data": torch.arange(10)}
    z = torch.tensor([0.3, -0.2])
    with pyro.validation_enabled(True):
        auto.potential_and_grad(z, indices)
    assert not auto.compiled and auto.jit_failure is None  # not given up: decided again next time
    with pyro.validation_enabled(False):
        for trial in range(3):
            z = torch.randn(2, generator=torch.Generator().manual_seed(trial))
            indices = {"data": torch.randperm(100, generator=torch.Generator().manual_seed(trial))[:10]}
            got, expected = auto.potential_and_grad(z, indices), plain.potential_and_grad(z, indices)
            assert auto.compiled
            assert torch.allclose(got[0], expected[0], rtol=1e-5)
            assert torch.allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)
    assert not plain.compiled


@pytest.mark.parametrize("source", ["python", "torch"])
def test_auto_leaves_a_model_with_random_numbers_uncompiled_without_a_warning(source):
    """A model that draws random numbers of its own gives different results on the same point and
    minibatch. Tracing would freeze Python's random numbers, so ``"auto"`` does not compile it (nor
    one with torch's, which it cannot tell apart), silently: the model then runs at every evaluation,
    which the changing values show."""
    import random

    def noisy(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        jitter = random.gauss(0.0, 1.0) if source == "python" else torch.randn(())
        with pyro.plate("data", x.shape[0], subsample_size=10) as i:
            pyro.sample("y", dist.Normal(x[i] @ w + jitter, 0.5), obs=y[i])

    x, y = _linear_data()
    potential = ModelPotential(noisy, (x, y))
    indices, z = {"data": torch.arange(10)}, torch.zeros(2)
    with pyro.validation_enabled(False), warnings.catch_warnings():
        warnings.simplefilter("error")
        values = [float(potential.potential_and_grad(z, indices)[0]) for _ in range(3)]
    assert not potential.compiled
    assert "different results on the same point" in potential.jit_failure
    assert len(set(values)) == 3


def test_auto_leaves_value_dependent_control_flow_uncompiled_without_a_warning():
    """The two-point check catches a branch on a latent value (as with ``jit_compile=True``, which
    warns); ``"auto"`` falls back silently and gives the plain potential on both branches."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        shift = 1.0 if float(mu) > 0 else -1.0
        with pyro.plate("data", len(y), subsample_size=2) as i:
            pyro.sample("y", dist.Normal(mu + shift, 1.0), obs=y[i])

    y = torch.tensor([0.0, 1.0, 2.0, 3.0])
    auto, plain = ModelPotential(model, (y,)), ModelPotential(model, (y,), jit_compile=False)
    indices = {"data": torch.tensor([0, 1])}
    with pyro.validation_enabled(False), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the model's own float(mu) warns (UserWarning)
        for z in (torch.tensor([0.004]), torch.tensor([-0.5])):
            assert torch.equal(auto.potential_and_grad(z, indices)[0], plain.potential_and_grad(z, indices)[0])
    assert not auto.compiled and "disagrees" in auto.jit_failure


# ---------------------------------------------------------------------- standard Normal priors in one product
def test_standard_priors_summed_in_one_product_equal_pyro_log_prob():
    """Latent sites with a constant zero-mean Normal prior on a real value are summed in one dot product of
    the flat position (StandardPriors). Against Pyro's own trace sum (value and gradient, float32 round-off)
    for: all sites standard with one sigma, mixed sigmas next to a constrained site, a prior whose constant
    changes between calls (then evaluated the ordinary way, so the value follows the model), a prior under
    poutine.scale (not deferred: its scale must apply), and vmapped chains."""
    from pyro_sgmcmc.model.priors import StandardPriors

    torch.manual_seed(0)
    x = torch.randn(100, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + torch.randn(100)
    prior_scale = {"w": 1.0}

    def same_sigma(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 100, subsample_size=10) as i:
            pyro.sample("y", dist.Normal(x[i] @ w + b, 1.0), obs=y[i])

    def mixed(x, y):
        w = pyro.sample("w", dist.Normal(0.0, prior_scale["w"]).expand([3]).to_event(1))
        b = pyro.sample("b", dist.Normal(torch.zeros(2), 3.0).to_event(1))
        s = pyro.sample("s", dist.HalfNormal(1.0))
        with poutine.scale(scale=0.5):
            c = pyro.sample("c", dist.Normal(0.0, 2.0))
        with pyro.plate("data", 100, subsample_size=10) as i:
            pyro.sample("y", dist.Normal(x[i] @ w + b.sum() + c, s), obs=y[i])

    # mixed: b's loc is a stored tensor of zeros, not a broadcast constant: not deferred (checked as it is)
    for model, deferred in ((same_sigma, {"b", "w"}), (mixed, {"c", "w"})):
        prior_scale["w"] = 1.0
        potential = ModelPotential(model, (x, y))
        assert potential._log_joint.standard.sites == deferred  # found in set-up (c: scale applied at run time)
        for trial in range(3):
            if trial == 2:
                prior_scale["w"] = 0.3  # the model now builds another prior for w: evaluated the ordinary way
            positions = torch.randn(4, potential.dim)
            indices = {"data": torch.stack([torch.randperm(100)[:10] for _ in range(4)])}
            energy, grad = potential.batched_potential_and_grad(positions, indices)
            for c in range(4):
                z = positions[c].clone().requires_grad_(True)
                expected = _reference_potential(potential, model, (x, y), z, {"data": indices["data"][c]})
                (expected_grad,) = torch.autograd.grad(expected, z)
                # float32 sums of ~20 terms of size ~100: round-off ~1e-5 relative
                assert torch.allclose(energy[c], expected.detach(), rtol=1e-5), (model.__name__, trial, c)
                assert torch.allclose(grad[c], expected_grad, rtol=1e-5, atol=1e-4), (model.__name__, trial, c)
                one = potential.potential_and_grad(positions[c], {"data": indices["data"][c]})
                assert torch.allclose(one[0], expected.detach(), rtol=1e-5)
                assert torch.allclose(one[1], expected_grad, rtol=1e-5, atol=1e-4)
    assert isinstance(potential._log_joint.standard, StandardPriors)


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


def test_constant_scalar_finds_the_one_value_of_a_broadcast_constant_without_reading_it():
    from pyro_sgmcmc.model.priors import constant_scalar

    expanded = dist.Normal(0.5, 2.0).expand([3, 4]).scale  # a view of the 0-d tensor made from 2.0
    found = constant_scalar(expanded)
    assert found.dim() == 0 and found.data_ptr() == expanded.data_ptr()  # shares the storage: no copy
    assert float(constant_scalar(expanded)) == 2.0
    assert float(constant_scalar(torch.tensor(1.5))) == 1.5  # a 0-d tensor itself
    picked = torch.tensor([1.0, 7.0, 3.0])[1:2].expand(5)  # a view of a 3-element tensor: the general path
    assert constant_scalar(picked).dim() == 0 and float(constant_scalar(picked)) == 7.0
    assert constant_scalar(torch.tensor([1.0, 2.0])) is None  # varies
    assert constant_scalar(torch.tensor(1.0, requires_grad=True).expand(3)) is None  # differentiated
    assert constant_scalar(torch.zeros(0)) is None  # no element


def test_standard_priors_checked_after_the_run_fall_back_when_the_model_changes_at_a_step():
    """The deferred sites' constants are compared all at once after the run; a site whose prior changed at
    this call (its loc, its scale, its dtype, its batch and event shapes or its distribution) is evaluated
    the ordinary way, in its place, and the value and gradient are Pyro's (trace sum). The next call with
    the set-up prior takes the fast path again."""
    torch.manual_seed(0)
    x = torch.randn(50, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + torch.randn(50)
    change = {}

    def model(x, y):
        w_prior = dist.Normal(change.get("loc", 0.0), change.get("scale", 1.0)).expand([3]).to_event(1)
        if "dtype" in change:
            w_prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0).expand([3]).to_event(1)
        if "shape" in change:  # batch shape (3,), event shape (): another form
            w_prior = dist.Normal(0.0, 1.0).expand([3])
        if "laplace" in change:
            w_prior = dist.Laplace(0.0, 1.0).expand([3]).to_event(1)
        w = pyro.sample("w", w_prior)
        b = pyro.sample("b", dist.Normal(0.0, 2.0))
        with pyro.plate("data", 50, subsample_size=10) as i:
            pyro.sample("y", dist.Normal(x[i] @ w.float() + b, 1.0), obs=y[i])

    potential = ModelPotential(model, (x, y))
    standard = potential._log_joint.standard
    assert standard.sites == {"w", "b"}
    calls = []
    verify = standard.verify
    standard.verify = lambda deferred, scalars: calls.append(verify(deferred, scalars)) or calls[-1]
    for case in [{}, {"loc": 0.5}, {"scale": 0.3}, {"dtype": 1}, {"shape": 1}, {"laplace": 1}, {}]:
        change.clear()
        change.update(case)
        z = torch.randn(potential.dim)
        indices = {"data": torch.randperm(50)[:10]}
        value, grad = potential.potential_and_grad(z, indices)
        z_ = z.clone().requires_grad_(True)
        expected = _reference_potential(potential, model, (x, y), z_, indices)
        (expected_grad,) = torch.autograd.grad(expected, z_)
        assert torch.allclose(value, expected.detach().to(value.dtype), rtol=1e-5), case
        assert torch.allclose(grad, expected_grad.to(grad.dtype), rtol=1e-5, atol=1e-5), case
    # loc and scale pass the structural check and fail the comparison of the constants (b alone stays
    # deferred); dtype, shape and distribution fail the structural check (b alone is checked)
    assert calls == [None, {"b"}, {"b"}, None, None, None, None]


def test_standard_priors_one_tensor_comparison_off_the_cpu():
    """Constants off the CPU are compared in one tensor operation (one device sync per call): exercised on
    the CPU by marking the expected constants as living on a (CPU) device object."""
    from pyro_sgmcmc.model.priors import StandardPriors

    def model():
        pyro.sample("a", dist.Normal(0.0, 1.0))
        pyro.sample("b", dist.Normal(0.0, 3.0).expand([2]).to_event(1))

    potential = ModelPotential(model)
    standard: StandardPriors = potential._log_joint.standard
    names = ("a", "b")
    values, _ = standard._expected_constants(names)
    standard._expected[names] = (values, torch.device("cpu"))
    deferred = dict.fromkeys(names)
    zero, one, three = torch.tensor(0.0), torch.tensor(1.0), torch.tensor(3.0)
    assert standard.verify(deferred, [zero, one, zero, three]) is None
    assert standard.verify(deferred, [zero, one, zero, one]) == {"a"}


def test_auto_waits_for_a_finite_point_before_compiling():
    """A starting point being tried may give a non-finite potential (NaN is not equal to itself, so the
    repeat check would fail on it): ``"auto"`` then decides at the next, finite evaluation."""
    x, y = _linear_data()
    potential = ModelPotential(_linear, (x, y))
    indices = {"data": torch.arange(10)}
    with pyro.validation_enabled(False):
        energy, _ = potential.potential_and_grad(torch.tensor([math.inf, 0.0]), indices)
        assert not torch.isfinite(energy) and not potential.compiled and potential.jit_failure is None
        potential.potential_and_grad(torch.zeros(2), indices)
    assert potential.compiled


@pytest.mark.parametrize(
    "error", [torch.OutOfMemoryError("CUDA out of memory"), RuntimeError("DefaultCPUAllocator: can't allocate memory")]
)
def test_out_of_memory_reaches_the_user_and_keeps_vmap(error, monkeypatch):
    """Running out of memory says nothing about whether the model can run under vmap: it is raised, and
    the vectorised path stays on (a model that cannot run under vmap still falls back, with a warning)."""

    def model():
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 10, subsample_size=5):
            pyro.sample("y", dist.Normal(w, 1.0), obs=torch.zeros(5))

    potential = ModelPotential(model)
    positions = torch.zeros(3, 1)
    indices = {"data": torch.arange(5).expand(3, 5)}
    potential.batched_potential_and_grad(positions, indices)  # builds the vectorised function

    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(potential.vectorized, "_over_chains", out_of_memory)
    with pytest.raises(type(error)):
        potential.batched_potential_and_grad(positions, indices)
    with pytest.raises(type(error)):  # still tried vectorised (no silent switch to one chain at a time)
        potential.batched_potential_and_grad(positions, indices)
    monkeypatch.setattr(potential.vectorized, "_over_minibatches", out_of_memory)
    monkeypatch.setattr(potential.vectorized, "summable", True)
    with pytest.raises(type(error)):
        potential.summed_potential_and_grad(positions[0], indices)
