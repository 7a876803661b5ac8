"""pyro_sgmcmc.MCMC: vectorised chains, superchains, thinning, last-state runs."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import NUTS

from pyro_sgmcmc import MCMC, SGHMC, SGLD, SGNHT, DivergenceWarning
from pyro_sgmcmc.run.readers import Draws


def regression_model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=16) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def _data(n=200):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x @ torch.tensor([1.0, -1.0, 0.5]) + 0.3 * torch.randn(n, generator=g)


@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC, SGNHT])
def test_vectorised_chain_equals_single_chain_run_from_the_same_state(float64, kernel_cls):
    """Chain c of a vectorised run == a one-chain run with the same stream (seed, c) and start.

    Both evaluate the same model with the same minibatch indices and noise; the vectorised side goes
    through torch.func.vmap (batched kernels), so they agree to float64 rounding, not bit for bit.
    """
    x, y = _data()
    x, y = x.double(), y.double()
    pyro.set_rng_seed(0)
    num_chains, num_steps = 6, 60
    batch = kernel_cls(regression_model, step_size=0.01)
    batch.setup_chains(0, (x, y), num_chains=num_chains, seed=123)
    starts = batch.state.position.clone()
    batch_path = torch.stack([batch.step().position.clone() for _ in range(num_steps)], dim=1)
    for chain in (0, 4):
        single = kernel_cls(regression_model, step_size=0.01)
        start = single.ensure_potential((x, y), {}).unpack(starts[chain : chain + 1])
        single.setup_chains(0, (x, y), num_chains=1, seed=123, chain_ids=[chain], initial_params=start)
        path = torch.stack([single.step().position[0].clone() for _ in range(num_steps)])
        assert torch.allclose(path, batch_path[chain], rtol=0, atol=1e-10), (path - batch_path[chain]).abs().max()
    # different chains really are different (own noise and minibatches)
    assert not torch.allclose(batch_path[0], batch_path[1])


def test_vectorised_run_get_samples_summary_diagnostics(capsys):
    x, y = _data()
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(regression_model, step_size=0.02), num_samples=50, warmup_steps=50, num_chains=8,
                num_superchains=2, chain_method="vectorized", seed=1, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["w"].shape == (8, 50, 3) and grouped["sigma"].shape == (8, 50)
    assert (grouped["sigma"] > 0).all()
    assert mcmc.get_samples()["w"].shape == (400, 3)
    diagnostics = mcmc.diagnostics()
    assert set(diagnostics["divergences"]) == {f"chain {c}" for c in range(8)}
    assert diagnostics["w"]["r_hat"].shape == (3,)
    mcmc.summary()
    assert "sigma" in capsys.readouterr().out
    assert mcmc.sample_stats["lp"].shape == (8, 50) and mcmc.sample_stats["diverging"].dtype == torch.bool
    assert set(mcmc.sample_stats) == {
        "lp",
        "step_size",
        "diverging",
        "temperature",
        "num_divergences",
        "kinetic_energy",
    }
    assert mcmc.superchain_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_superchains_share_their_starting_point():
    x, y = _data()
    kernel = SGLD(regression_model, step_size=0.01)
    pyro.set_rng_seed(0)
    kernel.setup_chains(0, (x, y), num_chains=6, num_superchains=3, seed=0)
    start = kernel.state.position
    for k in range(3):
        assert torch.equal(start[2 * k], start[2 * k + 1])
    assert not torch.equal(start[0], start[2]) and not torch.equal(start[2], start[4])
    # given per-superchain initial params are repeated within the superchain
    init = {"w": torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]), "sigma": torch.zeros(2)}
    kernel.setup_chains(0, (x, y), num_chains=4, num_superchains=2, initial_params=init, seed=0)
    # sites in sorted order: sigma (1 value), then w (3)
    assert kernel.state.position[:, 1:].tolist() == [[0.0] * 3, [0.0] * 3, [1.0] * 3, [1.0] * 3]


def _run(**kwargs):
    x, y = _data()
    options = dict(num_chains=4, chain_method="vectorized", seed=7, disable_progbar=True)
    options.update(kwargs)
    mcmc = MCMC(
        SGHMC(regression_model, step_size=0.02),
        initial_params={"w": torch.zeros(4, 3), "sigma": torch.zeros(4)},
        **options,
    )
    mcmc.run(x, y)
    return mcmc.get_samples(group_by_chain=True)["w"]


def test_thinning_and_keep_last_select_from_the_same_trajectory():
    full = _run(num_samples=30, warmup_steps=10)
    thinned = _run(num_samples=10, warmup_steps=10, thinning=3)
    assert torch.equal(thinned, full[:, 2::3])  # same seed: bit-identical trajectory, every third draw
    last = _run(num_samples=30, warmup_steps=10, keep_last=5)
    assert torch.equal(last, full[:, -5:])


def test_deep_ensemble_at_zero_temperature():
    """keep_last=1 at T = 0: each chain's final state is an SGD-with-momentum fit from its own start."""
    x, y = _data()
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGHMC(regression_model, step_size=0.05, temperature=0.0), num_samples=1, warmup_steps=1500,
                num_chains=5, keep_last=1, chain_method="vectorized", seed=0, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    w = mcmc.get_samples(group_by_chain=True)["w"][:, 0]
    ls = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1)
    # minibatch noise keeps the members apart, but all sit near the (prior-shrunk) optimum
    assert torch.allclose(w, ls.expand_as(w), atol=0.05)
    assert w.std(0).max() > 0


def test_bad_arguments():
    kernel = SGLD(regression_model)
    with pytest.raises(ValueError, match=r"chain_method must be one of \('parallel', 'sequential', 'vectorized'\)"):
        MCMC(kernel, num_samples=5, chain_method="parallel-ish")
    with pytest.raises(ValueError, match="num_chains=6 must be a multiple of num_superchains=4"):
        MCMC(kernel, num_samples=5, num_chains=6, num_superchains=4, chain_method="vectorized")
    with pytest.raises(ValueError, match="thinning must be a positive integer"):
        MCMC(kernel, num_samples=5, thinning=0, chain_method="vectorized")
    with pytest.raises(ValueError, match="need chain_method='vectorized'"):
        MCMC(kernel, num_samples=5, keep_last=2)
    with pytest.raises(ValueError, match="needs a pyro_sgmcmc kernel"):
        MCMC(NUTS(regression_model), num_samples=5, chain_method="vectorized")
    x, y = _data()
    with pytest.raises(ValueError, match="leading axis of num_chains=4 or num_superchains=2"):
        MCMC(kernel, num_samples=5, num_chains=4, num_superchains=2, chain_method="vectorized",
             initial_params={"w": torch.zeros(3, 3), "sigma": torch.zeros(3)}).run(x, y)  # fmt: skip


def two_wall_model():
    """x is pulled to 5 by its prior; the density is zero past a wall at 0.4 (if s < 0) or 100 (if s > 0).

    s has a flat (improper) density, so its gradient is zero and each chain keeps its own s, hence its wall.
    """
    s = pyro.sample("s", dist.ImproperUniform(dist.constraints.real, (), ()))
    x = pyro.sample("x", dist.Normal(5.0, 1.0))
    wall = torch.where(s > 0, torch.tensor(100.0), torch.tensor(0.4))
    pyro.factor("wall", torch.where(x > wall, torch.tensor(-float("inf")), torch.tensor(0.0)))


@pytest.mark.parametrize("policy", ["restart", "freeze"])
def test_divergence_policies_touch_only_the_failing_chain(policy):
    """T = 0, step 0.1: x_t = 5 - 5 * 0.9^t from x_0 = 0 (gradient descent on (x - 5)^2 / 2).

    Chain 0 (wall 0.4) crosses its wall on its first step; chain 1 (wall 100) never diverges and must
    follow the gradient-descent path exactly, whatever happens to chain 0."""
    kernel = SGLD(two_wall_model, step_size=0.1, temperature=0.0, on_divergence=policy)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, num_chains=2, chain_method="vectorized", seed=0,
                initial_params={"x": torch.zeros(2), "s": torch.tensor([-1.0, 1.0])}, disable_progbar=True)  # fmt: skip
    with pytest.warns(DivergenceWarning, match="divergent step"):  # a run with divergences warns at its end
        mcmc.run()
    x = mcmc.get_samples(group_by_chain=True)["x"]
    stats = mcmc.sample_stats
    assert stats["num_divergences"][1].max() == 0
    expected = 5 - 5 * 0.9 ** torch.arange(1, 21, dtype=torch.float32)
    assert torch.allclose(x[1], expected, atol=1e-5)
    assert torch.all(x[0] == 0.0)  # every move of chain 0 crosses its wall: it stays at its last finite state
    assert stats["diverging"][0, 0] and not stats["diverging"][1].any()
    if policy == "freeze":
        assert stats["num_divergences"][0].tolist() == [1] * 20  # diverged once, then frozen
    else:
        assert stats["num_divergences"][0].tolist() == list(range(1, 21))  # retries from x = 0 every step
    chain, step, phase, sites = kernel.divergence_log[0]
    assert (chain, step, phase) == (0, 0, "sampling") and sites == (
        "non-finite potential energy (observed site 'wall': log-density 1 -inf (1 of 1 values))"
    )  # the site whose log-density is -inf, named


def test_raise_names_the_step_chain_and_sites():
    from pyro_sgmcmc import DivergenceError

    kernel = SGLD(two_wall_model, step_size=0.1, temperature=0.0, on_divergence="raise")
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=2, num_chains=2, chain_method="vectorized", seed=0,
                initial_params={"x": torch.zeros(2), "s": torch.tensor([1.0, -1.0])}, disable_progbar=True)  # fmt: skip
    with pytest.raises(
        DivergenceError,
        match=r"non-finite potential energy \(observed site .wall.: log-density 1 -inf.*\) "
        r"at step 0 \(warmup\) in chain\(s\) \[1\]",
    ):
        mcmc.run()


def test_non_finite_gradient_names_the_site():
    def model():
        a = pyro.sample("a", dist.Normal(0.0, 1.0))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        # finite potential, but d/db sqrt(|b|) is infinite at b = 0
        pyro.factor("kink", -torch.sqrt(b.abs()) + 0 * a)

    kernel = SGLD(model, step_size=0.1, temperature=0.0, on_divergence="raise")
    with pytest.raises(ValueError, match="non-finite"):  # the start itself is rejected, naming the problem
        MCMC(kernel, num_samples=2, warmup_steps=0, num_chains=2, chain_method="vectorized",
             initial_params={"a": torch.zeros(2), "b": torch.zeros(2)}, disable_progbar=True).run()  # fmt: skip
    from pyro_sgmcmc.kernels.divergences import nonfinite_sites

    where = nonfinite_sites(kernel.potential, torch.tensor(1.0), torch.tensor([0.0, float("inf")]), torch.zeros(2))
    assert where == (
        "gradient of site 'b'"
    )


def test_summary_and_diagnostics_use_linear_memory_and_give_pyros_numbers(capsys):
    """``n_eff`` equals Pyro's own (same formula, running minimum by ``torch.cummin``) on a short
    run, and a 100,000-draw run's diagnostics complete: Pyro's ``(n, n)`` mask for it would be
    100,000^2 / 2 lags * 4 bytes = 20 GB, which this process would fail to allocate (it warns and
    returns NaN in that case, so NaN is what the assertion would see)."""
    from pyro.infer.mcmc.util import diagnostics as pyro_diagnostics

    x, y = _data()
    mcmc = MCMC(SGHMC(regression_model, step_size=0.02), num_samples=300, warmup_steps=50, num_chains=4,
                chain_method="vectorized", seed=2, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    ours = mcmc.diagnostics()
    theirs = pyro_diagnostics(mcmc.get_samples(group_by_chain=True))
    for site in ("w", "sigma"):
        assert torch.allclose(ours[site]["n_eff"], theirs[site]["n_eff"], rtol=1e-6), site
        assert torch.allclose(ours[site]["r_hat"], theirs[site]["r_hat"], rtol=1e-6), site

    long = MCMC(SGLD(regression_model, step_size=0.01), num_samples=100_000, warmup_steps=0, num_chains=1,
                chain_method="vectorized", seed=3, disable_progbar=True)  # fmt: skip
    iid = torch.randn(1, 100_000, 3, generator=torch.Generator().manual_seed(0))
    long.draws = Draws({"w": iid}, [{"divergences": []}])
    n_eff = long.diagnostics()["w"]["n_eff"]
    assert torch.all((n_eff > 0.8e5) & (n_eff < 1.2e5)), n_eff  # iid draws: ESS ~ n (sd of the estimate ~ 1%)


# ====================================================================== chain methods and hook_fn (#19)
@pytest.mark.parametrize("kernel_cls", [SGLD, SGHMC])
def test_sequential_chains_equal_the_vectorised_run(float64, kernel_cls):
    """chain_method="sequential": each chain alone, from the start and streams it has in the vectorised run
    (same seed, same pyro.set_rng_seed), so the same draws up to float64 rounding of the batched arithmetic."""
    x, y = _data()
    x, y = x.double(), y.double()
    runs = {}
    for method in ("vectorized", "sequential"):
        pyro.set_rng_seed(4)
        mcmc = MCMC(kernel_cls(regression_model, step_size=0.01), num_samples=15, warmup_steps=10, num_chains=4,
                    num_superchains=2, thinning=2, chain_method=method, seed=9, disable_progbar=True)  # fmt: skip
        mcmc.run(x, y)
        runs[method] = mcmc
    vectorized, sequential = runs["vectorized"], runs["sequential"]
    for name, draws in vectorized.get_samples(group_by_chain=True).items():
        other = sequential.get_samples(group_by_chain=True)[name]
        assert draws.shape == other.shape == (4, 15, *draws.shape[2:])
        assert torch.allclose(draws, other, rtol=0, atol=1e-9), (name, (draws - other).abs().max())
    assert set(vectorized.sample_stats) == set(sequential.sample_stats)
    assert torch.equal(sequential.superchain_ids, torch.tensor([0, 0, 1, 1]))
    assert len(sequential.diagnostics()["divergences"]) == 4
    assert not torch.allclose(vectorized.get_samples()["w"][0], vectorized.get_samples()["w"][15])


def test_sequential_needs_an_sgmcmc_kernel_and_no_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="chain_method='sequential' needs a pyro_sgmcmc kernel"):
        MCMC(NUTS(regression_model), num_samples=5, chain_method="sequential")
    with pytest.raises(ValueError, match="checkpoint_path needs chain_method='vectorized'"):
        MCMC(SGLD(regression_model), 5, chain_method="sequential", checkpoint_path=tmp_path / "run.ckpt")


def test_chain_method_default_is_parallel_with_a_future_warning():
    kernel = SGLD(regression_model)
    with pytest.warns(FutureWarning, match="chain_method='parallel'"):
        old = MCMC(kernel, num_samples=5, chain_method="default")
    assert old.chain_method == "parallel" == MCMC(kernel, num_samples=5).chain_method


@pytest.mark.parametrize("method", ["vectorized", "sequential"])
def test_hook_fn_gets_pyros_stage_and_index_within_the_stage(method):
    """Pyro calls hook_fn(kernel, samples, stage, i) with i counting from 0 in each stage (warmup, then sampling);
    a sequential run names the chain in the stage as Pyro's one-after-another chains do."""
    x, y = _data()
    calls = []

    def hook(kernel, params, stage, i):
        calls.append((stage, i, kernel.state.step))

    MCMC(SGLD(regression_model, step_size=0.01), num_samples=3, warmup_steps=4, num_chains=2, thinning=2,
         chain_method=method, seed=0, hook_fn=hook, disable_progbar=True).run(x, y)  # fmt: skip
    one_chain = [("Warmup", i, i + 1) for i in range(4)] + [("Sample", i, 5 + i) for i in range(6)]
    if method == "vectorized":
        assert calls == one_chain
    else:
        assert calls == [(f"{s} [{c}]", i, step) for c in range(2) for s, i, step in one_chain]


def test_summary_and_diagnostics_leave_pyro_untouched(capsys, monkeypatch):
    """No process-wide patch: pyro.ops.stats keeps its own functions while the summary runs."""
    import pyro.ops.stats as stats

    seen = []
    original = stats.effective_sample_size
    monkeypatch.setattr(stats, "effective_sample_size", lambda *a, **k: seen.append(1) or original(*a, **k))
    members = dict(vars(stats))
    x, y = _data()
    mcmc = MCMC(SGLD(regression_model, step_size=0.01), num_samples=20, warmup_steps=5, num_chains=2,
                chain_method="vectorized", seed=0, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    mcmc.summary()
    out = capsys.readouterr().out
    assert "n_eff" in out and "r_hat" in out and "w[2]" in out
    mcmc.diagnostics()
    assert dict(vars(stats)) == members and seen == []  # nothing replaced; Pyro's quadratic ESS never called


# ====================================================================== Pyro's MCMC held, not inherited (#25)
@pytest.mark.parametrize("method", ["parallel", "vectorized", "sequential"])
def test_every_chain_method_keeps_its_draws_for_pyros_readers_and_arviz(method, capsys):
    """Whatever the chain method, the draws end in ``mcmc.draws`` (no member of ``pyro.infer.MCMC`` is written:
    the class holds one for ``"parallel"`` and reads its public ``get_samples``), and ``get_samples``,
    ``diagnostics``, ``summary`` and ``arviz.from_pyro`` (which reads ``_args`` / ``_kwargs``) read them as Pyro's
    own run would be read."""
    az = pytest.importorskip("arviz")
    x, y = _data()
    pyro.set_rng_seed(0)
    options = {} if method == "parallel" else {"seed": 0}
    mcmc = MCMC(SGLD(regression_model, step_size=0.01), num_samples=20, warmup_steps=5, num_chains=1,
                chain_method=method, disable_progbar=True, **options)  # fmt: skip
    assert not isinstance(mcmc, pyro.infer.MCMC)
    assert (mcmc.pyro_mcmc is not None) == (method == "parallel")
    mcmc.run(x, y)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["w"].shape == (1, 20, 3) and mcmc.get_samples()["w"].shape == (20, 3)
    assert torch.equal(mcmc.draws.samples["w"], grouped["w"])
    if method == "parallel":  # exactly what Pyro's own object holds
        assert torch.equal(grouped["w"], mcmc.pyro_mcmc.get_samples(group_by_chain=True)["w"])
        assert mcmc.diagnostics()["divergences"] == mcmc.pyro_mcmc.diagnostics()["divergences"]
        assert mcmc.transforms is mcmc.pyro_mcmc.transforms
    torch.manual_seed(1)
    resampled = mcmc.get_samples(7)["w"]
    torch.manual_seed(1)
    index = torch.randint(0, 20, (7,))  # Pyro's select_samples: uniform with replacement over the flat draws
    assert torch.equal(resampled, mcmc.get_samples()["w"][index])
    mcmc.summary()
    assert "Number of divergences: 0" in capsys.readouterr().out
    assert mcmc._args == (x, y) and mcmc._kwargs == {}
    idata = az.from_pyro(mcmc, log_likelihood=False)
    assert idata.posterior["w"].shape == (1, 20, 3) and "observed_data" in idata.groups()
