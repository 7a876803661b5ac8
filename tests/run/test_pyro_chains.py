"""The block a stopped ``"parallel"`` run keeps (:mod:`pyro_sgmcmc.run.pyro_chains`), on a stream fed by hand.

The oracle is the rule itself: the first ``n`` draws of the first ``k`` chains with ``k * n`` largest (ties: more
chains), each draw the value the stream received for that chain and index; runs of Pyro's MCMC are in
``tests/run/test_partial.py``.
"""

import torch

from pyro_sgmcmc.run.pyro_chains import SampleRecorder, SampleStream, stopped_parallel_run

SAMPLES, WARMUP = 60, 10


def _fed(draws_per_chain, finished=()):
    """A stream of 3 chains of one site ``x`` of shape (2,), draw ``j`` of chain ``c`` equal to ``[c, j]``."""

    def received():
        for chain, count in enumerate(draws_per_chain):
            yield {"x": torch.Size([2])}, chain
            for j in range(count):
                yield torch.tensor([float(chain), float(j)]), chain
            if chain in finished:
                yield {"divergences": [3, 50]}, chain

    class Sampler:
        def run(self):
            yield from received()

    stream = SampleStream(Sampler(), 3, SAMPLES)
    for _ in stream.run():
        pass
    return stream


def _stopped(stream, recorder=None):
    return stopped_parallel_run(
        stream, recorder or SampleRecorder(None), KeyboardInterrupt(), WARMUP, dict, lambda: {"divergences": []}
    )


def test_chains_run_together_keep_every_chain_with_the_draws_of_the_slowest():
    stopped = _stopped(_fed([17, 15, 16]))
    x = stopped.samples["x"]
    assert x.shape == (3, 15, 2) and stopped.partial.num_chains_kept is None
    assert torch.equal(x[:, :, 0], torch.arange(3.0).unsqueeze(1).expand(3, 15))
    assert torch.equal(x[:, :, 1], torch.arange(15.0).expand(3, 15))
    assert (stopped.partial.num_draws, stopped.partial.steps_done, stopped.partial.phase) == (
        15,
        WARMUP + 15,
        "sampling",
    )
    assert stopped.diagnostics == [{}, {}, {}]  # the workers' are lost


def test_chains_run_one_after_another_keep_the_finished_chains_or_the_larger_block():
    finished = _stopped(_fed([SAMPLES, 20, 0], finished={0}))  # 1 x 60 > 2 x 20
    assert finished.samples["x"].shape == (1, SAMPLES, 2) and finished.partial.num_chains_kept == 1
    assert finished.diagnostics == [{"divergences": [3, 50]}]
    cut = _stopped(_fed([SAMPLES, 40, 0], finished={0}))  # 2 x 40 > 1 x 60
    assert cut.samples["x"].shape == (2, 40, 2) and cut.partial.num_chains_kept == 2
    assert cut.diagnostics == [{}, {}]  # chain 1's are not known here (no recorder saw it)


def test_the_draw_the_hook_saw_last_is_kept():
    recorder = SampleRecorder(None)
    recorder(None, {"x": torch.tensor([0.0, 5.0])}, "Sample", 5)  # draw 5, computed, not yet yielded
    stopped = _stopped(_fed([5, 0, 0]), recorder)
    assert stopped.samples["x"].shape == (1, 6, 2)
    assert torch.equal(stopped.samples["x"][0, 5], torch.tensor([0.0, 5.0]))
    assert stopped.diagnostics == [{"divergences": []}]  # the chain running here: its kernel's


def test_nothing_received_is_set_up_and_no_draws():
    stopped = _stopped(SampleStream(None, 3, SAMPLES))
    assert stopped.samples is None and (stopped.partial.phase, stopped.partial.steps_done) == ("set-up", 0)
