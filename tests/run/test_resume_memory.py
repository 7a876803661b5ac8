"""A resume streams the checkpoint's draws into the preallocated store: its peak memory is at most 1.3 times the
draws' bytes.

The run: 200 chains of a 2,000-dimensional model, 25 kept draws, float32: 40 MB of positions, written as one chunk
(the worst case for a reader that holds whole chunks). The resume's :meth:`RunCheckpoint.restore` is measured alone
(not the steps after it) by the process's *anonymous* resident memory (``RssAnon`` of ``/proc/self/status``: the
heap and the anonymous mappings behind every tensor and Python object), sampled every 0.2 ms by a thread while it
runs. The measure is its peak above the value just before the store was allocated (``torch.empty``, untouched:
filling it counts 1.0x), once the memory freed before is given back (``malloc_trim``), so that none is reused
unseen. The rest is the restored chains' state (four ``(200, 2000)`` tensors: 0.16x). A copy of the draws held at
once (the previous reader held each chunk's bytes, then its tensors: 3.8x in all) lives for the tens of
milliseconds of its copy at least, far longer than the sampling interval.

A chunk is memory-mapped (``torch.load(mmap=True)``): its pages are the file's, in the page cache, which the kernel
can drop and read again under memory pressure (they count in ``RssFile``, not here); that is the point of mapping it.
(PyTorch's profiler reports that mapping as an allocation of the file's size, which is why it is not the measure.)
"""

import ctypes
import gc
import sys
import threading
import time

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGLD, CheckpointSettings
from pyro_sgmcmc.draws import DrawStore
from pyro_sgmcmc.run import loop
from pyro_sgmcmc.run.checkpoint import RunCheckpoint

CHAINS, DIM, DRAWS = 200, 2_000, 25


class Measured(Exception):
    """Stops the resumed run once its restore has been measured."""


def model(y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([DIM]).to_event(1))
    with pyro.plate("data", y.shape[0], subsample_size=5) as idx:
        pyro.sample("y", dist.Normal(w, 1.0).to_event(1), obs=y[idx])


def _run(path):
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(model, step_size=1e-3, adapt_step_size=False), num_samples=DRAWS, warmup_steps=0,
                num_chains=CHAINS, chain_method="vectorized", seed=0, disable_progbar=True,
                checkpoint=CheckpointSettings(path, every=DRAWS, sync=False))  # fmt: skip
    mcmc.run(torch.zeros(20, DIM))
    return mcmc


def _anonymous_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))


class PeakSampler(threading.Thread):
    """The peak of :func:`_anonymous_bytes` while it runs (sampled every 0.2 ms)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.done = _anonymous_bytes(), threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, _anonymous_bytes())
            time.sleep(2e-4)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, _anonymous_bytes())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
def test_a_resume_holds_the_draws_once_plus_a_bounded_overhead(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    _run(path)  # complete: its checkpoint (one chunk of all the draws) is resumed with no step left
    measured = {}
    restore = RunCheckpoint.restore

    def fresh_store(*args, **kwargs):  # the resume's store, allocated with nothing freed left resident before it
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory goes back: none is reused by the store unseen
        measured["before"] = _anonymous_bytes()
        return DrawStore(*args, **kwargs)

    def measuring(self, kernel, store, *rest):
        sampler = PeakSampler()
        sampler.start()
        try:
            restore(self, kernel, store, *rest)
        finally:
            measured["peak"] = sampler.stop() - measured["before"]
        positions, stats = store.filled()
        measured["draws"] = positions.nbytes + sum(value.nbytes for value in stats.values())
        measured["count"] = store.count
        raise Measured

    monkeypatch.setattr(loop, "DrawStore", fresh_store)
    monkeypatch.setattr(RunCheckpoint, "restore", measuring)
    with pytest.raises(Measured):
        _run(path)
    assert measured["count"] == DRAWS and measured["draws"] >= 40e6
    # the store filled (1.0x) and a few MB (the kernel's state, the index, the interpreter's own): a second copy
    # of the draws at any moment would add 1.0x, far beyond the sampling's resolution (one 0.2 ms interval)
    print(f"resume peak: {measured['peak'] / measured['draws']:.3f} x the draws' {measured['draws']} bytes")
    assert measured["peak"] <= 1.3 * measured["draws"], measured
