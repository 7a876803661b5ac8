"""export/pointwise.py: the full-data log-likelihood equals Pyro's own trace, draw by draw, in the data's dtype.

The reference is Pyro itself: for each posterior draw, the model is traced on the *full* data (its plate not
subsampled) with the draw's latent values conditioned, ``trace.compute_log_prob()``, and the observed site's
``unscaled_log_prob`` read. The export evaluates the same quantity over chunks of the subsampled plate, many
draws and chunks per vectorised call; both are float64 here, so they agree to round-off: the latent values
make a round trip through the unconstrained space (``exp(log sigma)``) and the matrix products sum in another
order, each ~1e-16 relative, hence ``rtol=1e-12`` (an error in the assembly, a datum at the wrong place or a
draw of another chain, is O(1)).
"""

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch

from pyro_sgmcmc import MCMC, SGLD, to_inference_data
from pyro_sgmcmc.export import pointwise

az = pytest.importorskip("arviz")

N = 45  # not a multiple of the subsample size: the last chunk overlaps the one before


def model(x, y, pair, subsample_size=10):
    """Two observed sites in one subsampled plate, one of them with an event dim (its log-likelihood is
    ``(N,)``, its value ``(N, 2)``)."""
    w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0).expand([3]).to_event(1))  # in the data's dtype
    sigma = pyro.sample("sigma", dist.HalfNormal(x.new_ones(())))
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        loc = x[idx] @ w
        pyro.sample("y", dist.Normal(loc, sigma), obs=y[idx])
        pyro.sample("pair", dist.Normal(loc.unsqueeze(-1).expand(-1, 2), 1.0).to_event(1), obs=pair[idx])


def _data(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=g, dtype=dtype)
    y = x @ torch.tensor([0.5, -1.0, 0.2], dtype=dtype) + 0.5 * torch.randn(N, generator=g, dtype=dtype)
    pair = y.unsqueeze(-1) + torch.randn(N, 2, generator=g, dtype=dtype)
    return x, y, pair


def _run(data, model=model, num_chains=3, num_samples=6):
    mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=num_samples, warmup_steps=5, num_chains=num_chains,
                chain_method="vectorized", seed=1, disable_progbar=True)  # fmt: skip
    mcmc.run(*data)
    return mcmc


def _pyro_log_likelihood(mcmc, data, site, **kwargs):
    """``(chains, draws, ...)``: Pyro's ``unscaled_log_prob`` of ``site`` on the full data, one trace per draw."""
    samples = mcmc.get_samples(group_by_chain=True)
    num_chains, num_draws = samples["sigma"].shape[:2]
    out = []
    for c in range(num_chains):
        for d in range(num_draws):
            values = {name: value[c, d] for name, value in samples.items()}
            trace = poutine.trace(poutine.condition(model, values)).get_trace(*data, subsample_size=None, **kwargs)
            trace.compute_log_prob()
            out.append(trace.nodes[site]["unscaled_log_prob"].detach().numpy())
    return np.stack(out).reshape(num_chains, num_draws, *out[0].shape)


@pytest.fixture(scope="module")
def run64():
    data = _data()
    return _run(data), data


# 2**19: the default (one call for all draws and chunks); 200: a few chunks per call, so that blocks of whole
# chunks (a slice) and the block with the overlapping last chunk (an index) are both written; 20: one draw
# and one chunk per call
@pytest.mark.parametrize("elements", [2**19, 200, 20])
def test_log_likelihood_equals_pyro_trace_of_every_draw(run64, monkeypatch, elements):
    mcmc, data = run64
    monkeypatch.setattr(pointwise, "ELEMENTS_PER_CALL", elements)
    idata = to_inference_data(mcmc, log_likelihood=True, chunk_size=4)  # draw blocks that split chains
    for site in ("y", "pair"):
        expected = _pyro_log_likelihood(mcmc, data, site)
        got = idata.log_likelihood[site]
        assert got.shape == expected.shape == (3, 6, N)
        np.testing.assert_allclose(got.values, expected, rtol=1e-12, atol=0)
    assert idata.log_likelihood["pair"].dims == ("chain", "draw", "data")
    assert idata.observed_data["pair"].dims == ("data", "pair_dim_1")
    np.testing.assert_array_equal(idata.observed_data["pair"].values, data[2].numpy())


def _replayed_and_direct(mcmc, monkeypatch, elements_per_call: int, chunk_size: int):
    """The log-likelihood exported with the replay (checked to have replayed, refusing nothing) and with the model
    called at every block, with blocks small enough that each block shape comes back."""
    monkeypatch.setattr(pointwise, "ELEMENTS_PER_CALL", elements_per_call)
    made = []

    class Spied(pointwise.ReplayedCalls):
        def __init__(self, evaluate):
            super().__init__(evaluate)
            made.append(self)

    monkeypatch.setattr(pointwise, "ReplayedCalls", Spied)
    replayed = to_inference_data(mcmc, log_likelihood=True, chunk_size=chunk_size)
    assert made and any(callable(r) for r in made[0].replays.values()) and not made[0].why_not
    monkeypatch.setattr(pointwise, "ReplayedCalls", lambda evaluate: evaluate)  # the model at every block
    direct = to_inference_data(mcmc, log_likelihood=True, chunk_size=chunk_size)
    return replayed, direct


def test_replayed_blocks_give_the_model_s_own_values_bit_for_bit(run64, monkeypatch):
    # 200 values a call: 45 data in chunks of 10 (5 chunks, the last overlapping) and 4 draws a call, so each shape
    # of block comes back and is replayed (export/replay.py) after its recording and its check
    mcmc, _ = run64
    replayed, direct = _replayed_and_direct(mcmc, monkeypatch, elements_per_call=200, chunk_size=4)
    for site in ("y", "pair"):
        np.testing.assert_array_equal(replayed.log_likelihood[site].values, direct.log_likelihood[site].values)


def _categorical(x, labels):
    W = pyro.sample("W", dist.Normal(x.new_zeros(3, 4), 1.0).to_event(2))
    with pyro.plate("data", x.shape[0], subsample_size=10) as i:
        pyro.sample("y", dist.Categorical(logits=x[i] @ W), obs=labels[i])


def _hierarchical_student(x, group, y):
    a = pyro.sample("a", dist.Normal(x.new_zeros(5), 1.0).to_event(1))
    nu = pyro.sample("nu", dist.Gamma(x.new_tensor(2.0), 0.1))
    with pyro.plate("data", x.shape[0], subsample_size=10) as i:
        with poutine.scale(scale=2.0):  # a scale and a mask: the log-likelihood is unscaled, unmasked
            pyro.sample("y", dist.StudentT(nu, a[group[i]] + x[i, 0], 1.0).mask(i % 3 > 0), obs=y[i])


def _two_plates(ratings):
    U = pyro.sample("U", dist.Normal(ratings.new_zeros(9, 2), 1.0).to_event(2))
    V = pyro.sample("V", dist.Normal(ratings.new_zeros(7, 2), 1.0).to_event(2))
    with pyro.plate("rows", 9, subsample_size=4, dim=-2) as r, pyro.plate("cols", 7, subsample_size=3, dim=-1) as c:
        pyro.sample("y", dist.Normal(U[r] @ V[c].T, 0.5), obs=ratings[r][:, c])


def _families():
    x, y, _ = _data()
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 4, (N,), generator=g)
    group = torch.randint(0, 5, (N,), generator=g)
    return {
        "categorical": (_categorical, (x, labels)),
        "hierarchical-student-t-masked-scaled": (_hierarchical_student, (x, group, y)),
        "two-subsampled-plates": (_two_plates, (torch.randn(9, 7, generator=g, dtype=torch.float64),)),
    }


@pytest.mark.parametrize("family", list(_families()))
def test_other_likelihoods_are_replayed_and_equal_the_model_bit_for_bit(family, monkeypatch):
    # the replay is a general mechanism: a softmax likelihood (log_softmax and a gather), a hierarchical Student-t
    # indexing a latent vector by the data, under a mask and a scale, and two subsampled plates (overlapping last
    # chunks of both, placed by index) are all recorded, trusted and replayed, with the model's own values
    model_, data = _families()[family]
    mcmc = _run(data, model_, num_chains=2, num_samples=8)
    replayed, direct = _replayed_and_direct(mcmc, monkeypatch, elements_per_call=60, chunk_size=3)
    np.testing.assert_array_equal(replayed.log_likelihood["y"].values, direct.log_likelihood["y"].values)


def test_float32_data_give_a_float32_log_likelihood_unless_asked():
    data = _data(torch.float32)
    mcmc = _run(data)
    idata = to_inference_data(mcmc, log_likelihood=True, posterior_predictive=True)
    for group in ("log_likelihood", "observed_data", "posterior_predictive"):
        assert {v.dtype for v in getattr(idata, group).data_vars.values()} == {np.dtype("float32")}, group
    # float32 against Pyro's float32 trace: round-off of float32 (6e-8 relative) on terms of size ~10
    expected = _pyro_log_likelihood(mcmc, data, "y")
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-5, atol=1e-5)
    wide = to_inference_data(mcmc, log_likelihood=True, log_likelihood_dtype=torch.float64)
    assert wide.log_likelihood["y"].dtype == np.float64  # asked for: computed in float32, stored in float64
    np.testing.assert_array_equal(wide.log_likelihood["y"].values, idata.log_likelihood["y"].values)


def unvectorisable(x, y, pair, subsample_size=10):
    """The same model, with a Python float read from a latent value: it cannot run under vmap."""
    w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0).expand([3]).to_event(1))  # in the data's dtype
    sigma = pyro.sample("sigma", dist.HalfNormal(x.new_ones(())))
    scale = float(sigma)
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        loc = x[idx] @ w
        pyro.sample("y", dist.Normal(loc, scale), obs=y[idx])
        pyro.sample("pair", dist.Normal(loc.unsqueeze(-1).expand(-1, 2), 1.0).to_event(1), obs=pair[idx])


def test_a_model_that_cannot_run_under_vmap_is_evaluated_draw_by_draw_alike():
    data = _data()
    with pytest.warns(RuntimeWarning, match="vmap"):
        mcmc = _run(data, unvectorisable, num_chains=2, num_samples=3)
    with pytest.warns(RuntimeWarning, match="log_likelihood is evaluated draw by draw"):
        idata = to_inference_data(mcmc, log_likelihood=True)
    expected = _pyro_log_likelihood(mcmc, data, "y")
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-12, atol=0)


def test_a_model_without_a_subsampled_plate():
    x, y, _ = _data()

    def full(x, y):
        w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0).expand([3]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)

    mcmc = _run((x, y), full, num_chains=2, num_samples=3)
    idata = to_inference_data(mcmc, log_likelihood=True)
    w = mcmc.get_samples(group_by_chain=True)["w"]
    expected = dist.Normal(torch.einsum("nk,cdk->cdn", x, w), 0.5).log_prob(y).numpy()
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-12, atol=0)


def test_a_call_holds_a_fixed_share_of_values_per_torch_thread(monkeypatch):
    # each thread's share of a block stays cache-sized whatever the threads; a set ELEMENTS_PER_CALL is used as is
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            assert pointwise.elements_per_call() == count * pointwise.ELEMENTS_PER_THREAD
        monkeypatch.setattr(pointwise, "ELEMENTS_PER_CALL", 200)
        assert pointwise.elements_per_call() == 200
    finally:
        torch.set_num_threads(threads)
