"""A resumed run skips the set-up its checkpoint restores (issue #19).

Resuming traces the model (the potential, its layout and the run's fingerprint need it) and opens the checkpoint
before anything else: the starting points are not drawn again (no ``init_strategy`` call beyond the trace's),
the control variate's centre is not searched again (no full-data pass: ``control_variate="map"`` restores the
centre and the full-data potential and gradient there from the checkpoint), and a checkpoint of other settings
is refused before any of that work. The draws still equal an uninterrupted run's bit for bit.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_uniform

from pyro_sgmcmc import MCMC, SGHMC, ModelPotential
from pyro_sgmcmc.checkpoint import CheckpointMismatch

SETTINGS = dict(num_samples=30, warmup_steps=40, num_chains=4, num_superchains=2, chain_method="vectorized", seed=3)
INIT_CALLS = []


class Interrupt(Exception):
    pass


def counting_init(site=None):
    """``init_to_uniform``, counting its calls (one per latent site and model run it initialises)."""
    INIT_CALLS.append(1)
    return init_to_uniform(site)


def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=50) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1_000, 2, generator=g)
    return x, x @ torch.tensor([0.7, -1.2]) + 0.5 * torch.randn(1_000, generator=g)


#: the control variate's settings: a MAP search, or a given centre (one full-data pass there) the chains start at
CENTRES = {
    "map": {"control_variate": "map"},
    "dict": {"control_variate": {"w": torch.tensor([0.7, -1.2]), "sigma": torch.tensor(0.5)}, "init_to_centre": True},
}


def run(checkpoint=None, hook=None, centre="map", **overrides):
    pyro.set_rng_seed(0)
    kernel = SGHMC(model, step_size=0.02, init_strategy=counting_init, **CENTRES[centre])
    every = None if checkpoint is None else 10
    mcmc = MCMC(kernel, checkpoint_path=checkpoint, checkpoint_every=every, hook_fn=hook, disable_progbar=True,
                **{**SETTINGS, **overrides})  # fmt: skip
    mcmc.run(*data())
    return mcmc


def interrupted(path, step, centre="map"):
    def hook(kernel, params, stage, i):
        if kernel.state.step == step:
            raise Interrupt

    INIT_CALLS.clear()  # counting_init reads INIT_CALLS, so the fingerprint holds it: as the resumed run will
    with pytest.raises(Interrupt):
        run(path, hook, centre)


def trace_calls() -> int:
    """The init-strategy calls of tracing the model once (what any run, resumed or not, does)."""
    INIT_CALLS.clear()
    ModelPotential(model, data(), init_strategy=counting_init)
    return len(INIT_CALLS)


@pytest.mark.parametrize("centre, stop", [("map", 25), ("map", 57), ("dict", 25)])  # 25: adaptation, 57: sampling
def test_a_resumed_run_draws_no_starting_points_and_searches_no_centre(tmp_path, full_data_passes, centre, stop):
    reference = run(centre=centre)
    assert len(full_data_passes) > 0  # the fresh run's MAP search and centre
    interrupted(tmp_path / "run.ckpt", stop, centre)
    traced = trace_calls()
    full_data_passes.clear()
    INIT_CALLS.clear()
    resumed = run(tmp_path / "run.ckpt", centre=centre)
    assert full_data_passes == []  # no MAP search, no full-data pass at the centre: restored
    assert len(INIT_CALLS) == traced  # the model's trace only: no starting point drawn
    for name, value in reference.get_samples(group_by_chain=True).items():
        assert torch.equal(value, resumed.get_samples(group_by_chain=True)[name]), name
    for name, value in reference.sample_stats.items():
        assert torch.equal(value, resumed.sample_stats[name]), name
    assert reference.diagnostics()["divergences"] == resumed.diagnostics()["divergences"]


def test_a_checkpoint_of_other_settings_is_refused_before_the_set_up(tmp_path, full_data_passes):
    interrupted(tmp_path / "run.ckpt", 25)
    traced = trace_calls()
    full_data_passes.clear()
    INIT_CALLS.clear()
    with pytest.raises(CheckpointMismatch, match="num_samples"):
        run(tmp_path / "run.ckpt", num_samples=31)
    assert full_data_passes == [] and len(INIT_CALLS) == traced
