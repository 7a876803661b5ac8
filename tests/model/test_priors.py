"""The Normal priors in standard form: equal to Pyro's log_prob, checked at every call without reading a value."""


import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch

from pyro_sgmcmc import ModelPotential


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


def test_a_prior_built_anew_reuses_its_stand_in_while_a_step_is_recorded_without_reading_values():
    """While a step is recorded for ``cuda_graph=True`` (``trusted_prior_constants``) a prior built anew at every
    call from fresh device tensors (``Normal(torch.zeros(3, device=...), 1.0)``) must reuse the stand-in made in
    the eager steps: building a new one compares the constants with 0 and 1, a host read that a CUDA graph cannot
    record (found on an H100: the recorded one-chain step fell back to eager). The ``meta`` device stands in for
    the GPU: any value read there raises."""
    from pyro_sgmcmc.model.priors import FastNormalPriors, StandardNormalForm, trusted_prior_constants

    def prior(device):
        with pyro.validation_enabled(False):  # as while recording: Pyro's checks read values
            return dist.Normal(torch.zeros(3, device=device), 1.0).to_event(1)

    def swap(messenger, fn):
        msg = {"name": "w", "fn": fn, "args": (), "kwargs": {}}
        messenger.swap(msg)
        return msg["fn"]

    messenger = FastNormalPriors(["w"])
    eager = swap(messenger, prior("cpu"))  # the eager steps: the constants checked and a stand-in made
    assert isinstance(eager, StandardNormalForm)
    with trusted_prior_constants():
        assert swap(messenger, prior("meta")) is eager
    # outside a recording a fresh prior with unreadable constants is not trusted: its values are compared
    try:
        swap(messenger, prior("meta"))
    except (RuntimeError, NotImplementedError):
        pass
    else:
        raise AssertionError("an untrusted prior's constants must be read and compared")
