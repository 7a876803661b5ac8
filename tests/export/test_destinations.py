"""export/destinations.py: the log-likelihood in memory at most 1.5x its bytes, refused above a cap, or
written to a netCDF file block by block with the same values."""

import gc
import math
import os
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGLD, to_inference_data
from pyro_sgmcmc.export import destinations, pointwise

az = pytest.importorskip("arviz")
pytest.importorskip("h5netcdf")

N = 45


def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", x.shape[0], subsample_size=10) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, sigma), obs=y[idx])


@pytest.fixture(scope="module")
def run():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=g)
    y = x @ torch.tensor([0.5, -1.0]) + 0.5 * torch.randn(N, generator=g)
    mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=30, warmup_steps=5, num_chains=4,
                chain_method="vectorized", seed=2, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    return mcmc


def test_netcdf_file_holds_the_same_values_written_in_blocks_across_chains(run, tmp_path, monkeypatch):
    # buffers of 7 draws (7 x 45 float32): blocks that straddle the chains' boundaries (30 draws a chain)
    monkeypatch.setattr(destinations, "FILE_BUFFER_BYTES", 7 * N * 4)
    in_memory = to_inference_data(run, log_likelihood=True, chunk_size=7)
    path = tmp_path / "loglik.nc"
    on_disk = to_inference_data(run, log_likelihood=True, chunk_size=7, log_likelihood_path=path)
    assert on_disk.log_likelihood["y"].dims == ("chain", "draw", "data")
    assert on_disk.log_likelihood["y"].dtype == np.float32
    np.testing.assert_array_equal(on_disk.log_likelihood["y"].values, in_memory.log_likelihood["y"].values)
    back = az.from_netcdf(path)  # an ArviZ file with one group
    assert back.groups() == ["log_likelihood"]
    np.testing.assert_array_equal(back.log_likelihood["y"].values, in_memory.log_likelihood["y"].values)
    assert [p.name for p in tmp_path.iterdir()] == ["loglik.nc"]  # no temporary file left


def test_a_cap_below_the_log_likelihood_is_refused_naming_the_size_unless_it_goes_to_a_file(run, tmp_path):
    size = 4 * 30 * N * 4  # chains x draws x data x float32
    with pytest.raises(MemoryError, match=r"log_likelihood 21.60 kB.*max_memory=10.00 kB.*log_likelihood_path"):
        to_inference_data(run, log_likelihood=True, max_memory=10_000)
    assert size == 21_600
    with pytest.raises(MemoryError, match=r"posterior_predictive 21.60 kB"):  # predictive draws count too
        to_inference_data(run, log_likelihood=True, posterior_predictive=True, max_memory=30_000)
    to_inference_data(run, log_likelihood=True, max_memory=size)  # exactly fits
    idata = to_inference_data(run, log_likelihood=True, max_memory=10_000, log_likelihood_path=tmp_path / "l.nc")
    assert idata.log_likelihood["y"].shape == (4, 30, N)


def test_an_interrupted_file_export_leaves_no_file(run, tmp_path, monkeypatch):
    monkeypatch.setattr(destinations, "FILE_BUFFER_BYTES", 7 * N * 4)
    calls = []

    def interrupted(self, quantity, positions, targets, chunk_size):
        calls.append(quantity)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, quantity, positions, targets, chunk_size)

    original = pointwise.FullData.evaluate
    monkeypatch.setattr(pointwise.FullData, "evaluate", interrupted)
    path = tmp_path / "loglik.nc"
    with pytest.raises(KeyboardInterrupt):
        to_inference_data(run, log_likelihood=True, observed_data=False, log_likelihood_path=path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_memory": -1}, ValueError, "max_memory"),
        ({"max_memory": True}, ValueError, "max_memory"),
        ({"log_likelihood_dtype": torch.int64}, TypeError, "log_likelihood_dtype"),
        ({"log_likelihood_dtype": "float64"}, TypeError, "log_likelihood_dtype"),
        ({"log_likelihood_path": 3}, TypeError, "log_likelihood_path"),
    ],
)
def test_bad_arguments_are_named(run, kwargs, error, match):
    with pytest.raises(error, match=match):
        to_inference_data(run, log_likelihood=True, **kwargs)


# ---------------------------------------------------------------------------------------------- peak memory
def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peak RSS reset needs Linux")
def test_peak_memory_is_at_most_one_and_a_half_times_the_log_likelihood():
    """Method: the process's peak resident set (``VmHWM``) is reset to its current size by writing 5 to
    ``/proc/self/clear_refs`` just before the export; growth = ``VmHWM`` after - ``VmRSS`` before. It counts
    every allocator (torch's, NumPy's) but can under-count by memory an allocator had already taken from the
    system and freed; the output (128 MB, larger than glibc's mmap threshold) is always fresh pages, so the
    growth must be at least its size: a check that the measurement sees it."""
    num_data, num_chains, num_draws = 20_000, 4, 400
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, 5, generator=g)
    y = torch.bernoulli(torch.sigmoid(x @ torch.ones(5)), generator=g)

    def logistic(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([5]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=100) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    mcmc = MCMC(SGLD(logistic, step_size=1e-4), num_samples=num_draws, warmup_steps=0, num_chains=num_chains,
                chain_method="vectorized", seed=0, disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    output = num_chains * num_draws * num_data * 4  # float32
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    idata = to_inference_data(mcmc, log_likelihood=True)
    growth = _status("VmHWM") - before
    assert idata.log_likelihood["y"].values.nbytes == output == 128_000_000
    assert output <= growth <= 1.5 * output, f"peak growth {growth / 1e6:.0f} MB for a {output / 1e6:.0f} MB output"
    assert math.isfinite(float(idata.log_likelihood["y"].values[-1, -1, -1]))
