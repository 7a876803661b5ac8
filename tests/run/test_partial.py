"""A run stopped by KeyboardInterrupt or any exception: its draws so far, marked partial, or a clear error.

The oracle is an uninterrupted run with the same seed: a run stopped after ``n`` kept draws must
give exactly (bit for bit) its first ``n`` draws and statistics, with a :class:`PartialRunWarning`
from every reader, and ``partial`` saying where it stopped and how to resume.
"""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_sgmcmc import MCMC, SGLD, PartialRunWarning, RunNotFinished, to_inference_data

from .. import reliability_script as script

WARMUP, SAMPLES = script.SETTINGS["warmup_steps"], script.SETTINGS["num_samples"]


@pytest.fixture(scope="module")
def reference():
    return script.run()


def _interrupted(step, error=KeyboardInterrupt, checkpoint=None, every=None):
    """The MCMC object of the reliability script's run, stopped by ``error`` in the hook of step ``step``."""
    import pyro

    def hook(kernel, params, stage, i):  # i counts within the stage (Pyro's hook_fn); state.step is the run's
        if kernel.state.step - 1 == step:
            raise error("stopped by the test")

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(script.model, step_size=0.02), checkpoint_path=checkpoint, checkpoint_every=every,
                hook_fn=hook, disable_progbar=True, **script.SETTINGS)  # fmt: skip
    with pytest.raises(error):
        mcmc.run(*script.data())
    return mcmc


@pytest.fixture(scope="module")
def sgld_reference():
    import pyro

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(script.model, step_size=0.02), disable_progbar=True, **script.SETTINGS)
    mcmc.run(*script.data())
    return mcmc


@settings(max_examples=8, deadline=None)
@given(step=st.integers(WARMUP, WARMUP + SAMPLES - 2), error=st.sampled_from([KeyboardInterrupt, RuntimeError]))
def test_a_run_stopped_while_sampling_gives_its_draws_so_far_marked_partial(sgld_reference, step, error):
    mcmc = _interrupted(step, error)
    kept = step + 1 - WARMUP  # the draw of step `step` is kept before the hook runs
    assert mcmc.partial is not None
    assert (mcmc.partial.steps_done, mcmc.partial.num_draws) == (step + 1, kept)
    assert error.__name__ in mcmc.partial.error
    with pytest.warns(PartialRunWarning, match=f"stopped at step {step + 1} of {WARMUP + SAMPLES}"):
        samples = mcmc.get_samples(group_by_chain=True)
    expected = sgld_reference.get_samples(group_by_chain=True)
    for name, draws in samples.items():
        assert draws.shape[1] == kept
        assert torch.equal(draws, expected[name][:, :kept]), name  # the same stream: bit for bit
    for name, stat in mcmc.sample_stats.items():
        assert torch.equal(stat, sgld_reference.sample_stats[name][:, :kept]), name


def test_every_reader_of_a_partial_run_warns_and_says_how_to_resume(tmp_path, capsys):
    path = tmp_path / "run.ckpt"
    mcmc = _interrupted(WARMUP + 20, checkpoint=path, every=10)
    for reader in (mcmc.get_samples, mcmc.diagnostics, mcmc.summary):
        with pytest.warns(PartialRunWarning, match="checkpoint=.*resume"):
            reader()
    assert "PARTIAL RUN" in capsys.readouterr().out  # the summary table says so too
    with pytest.warns(PartialRunWarning):
        idata = to_inference_data(mcmc)
    assert idata.posterior.sizes["draw"] == 21
    assert "stopped at step" in idata.posterior.attrs["partial_run"]
    assert "stopped at step" in idata.sample_stats.attrs["partial_run"]


def test_a_run_stopped_in_warmup_has_no_draws_and_says_so(tmp_path):
    mcmc = _interrupted(5, checkpoint=tmp_path / "run.ckpt", every=2)
    for reader in (mcmc.get_samples, mcmc.diagnostics, mcmc.summary):
        with pytest.raises(RunNotFinished, match="stopped at step 6 of 100 .*0 of 60 draws.*checkpoint="):
            reader()
    with pytest.raises(ValueError, match="none were kept: the run stopped at step 6"):
        to_inference_data(mcmc)


def test_a_run_never_started_or_failed_in_set_up_is_a_clear_error():
    mcmc = MCMC(SGLD(script.model, step_size=0.02), disable_progbar=True, **script.SETTINGS)
    with pytest.raises(RunNotFinished, match=r"call run\(...\) first"):
        mcmc.get_samples()
    with pytest.raises(Exception):
        mcmc.run("not data", None)  # the model fails while traced at set-up
    assert mcmc.partial is not None and mcmc.partial.steps_done == 0
    with pytest.raises(RunNotFinished, match="stopped at step 0 of 100"):
        mcmc.summary()


def test_a_complete_run_is_not_partial_and_does_not_warn(sgld_reference):
    assert sgld_reference.partial is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartialRunWarning)
        sgld_reference.get_samples()


def test_resuming_a_partial_run_from_its_checkpoint_completes_it(sgld_reference, tmp_path):
    path = tmp_path / "run.ckpt"
    mcmc = _interrupted(WARMUP + 25, checkpoint=path, every=10)
    mcmc.hook_fn = None
    mcmc.run(*script.data())  # the same object, run again: resumes from step WARMUP + 20
    assert mcmc.partial is None
    for name, draws in sgld_reference.get_samples(group_by_chain=True).items():
        assert torch.equal(draws, mcmc.get_samples(group_by_chain=True)[name]), name


# Every chain_method keeps an interrupted run's draws (issue 26.9). The run is stopped by Ctrl-C
# (KeyboardInterrupt) raised from the hook of sampling step `k - 1` (its draw is kept before the
# hook runs), of the chain `stop_chain` for a sequential run ("Sample [c]"); the oracle is the
# uninterrupted run of the same settings and seed, whose first draws must come back bit for bit.
# "parallel" is Pyro's MCMC, which runs several chains in worker processes when the machine has a core for
# each and in this process one after another otherwise: both are run here, whatever the machine, by telling
# Pyro how many cores there are ("parallel-processes": 64, "parallel": 1). In worker processes the hook runs
# in the worker: there each chain waits at its draw K for the others (a barrier: every chain has then sent
# exactly K draws to this process), and one of them sends SIGINT to this process, a real Ctrl-C.
K = 17


def _parallel_processes(monkeypatch, processes):
    """Make Pyro see 64 cores (chains in worker processes) or 1 (chains in this process), on any machine."""
    import torch.multiprocessing

    monkeypatch.setattr(torch.multiprocessing, "cpu_count", lambda: 64 if processes else 1)


def _sigint_from_the_workers(num_chains, error=None):
    """A hook for Pyro's forked workers: at draw K every chain waits for the others, then one sends SIGINT to this
    process (or, with ``error``, every chain raises it)."""
    import multiprocessing
    import os
    import signal
    import time

    barrier, parent = multiprocessing.get_context("fork").Barrier(num_chains), os.getpid()

    def hook(kernel, params, stage, i):
        if stage.startswith("Sample") and i == K:
            first = barrier.wait(timeout=120) == 0
            if error is not None:
                raise error("stopped by the test")
            if first:
                os.kill(parent, signal.SIGINT)
            time.sleep(120)  # until Pyro's run, interrupted, terminates the workers

    return hook


def _run_of(chain_method, num_chains, stop_at=None, stop_chain=0, hook=None):
    import pyro

    def stop(kernel, params, stage, i):
        chain = int(stage[stage.index("[") + 1 : -1]) if "[" in stage else 0
        if stage.startswith("Sample") and (chain, i) == (stop_chain, stop_at - 1):
            raise KeyboardInterrupt

    options = {"mp_context": "fork"} if chain_method == "parallel" else {"seed": 5}
    options["hook_fn"] = hook or (None if stop_at is None else stop)
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(script.model, step_size=0.02), num_samples=SAMPLES, warmup_steps=WARMUP, num_chains=num_chains,
                chain_method=chain_method, disable_progbar=True, **options)  # fmt: skip
    if options["hook_fn"] is None:
        mcmc.run(*script.data())
    else:
        with pytest.raises(KeyboardInterrupt):
            mcmc.run(*script.data())
    return mcmc


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) while the test runs, as in an interactive session."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("num_chains", [1, 3])
@pytest.mark.parametrize("chain_method", ["vectorized", "sequential", "parallel", "parallel-processes"])
def test_ctrl_c_keeps_the_draws_so_far_on_every_chain_method(chain_method, num_chains, monkeypatch, default_sigint):
    processes = chain_method == "parallel-processes"
    if processes and num_chains == 1:
        pytest.skip("Pyro runs one chain in this process: the 'parallel' case")
    chain_method = chain_method.split("-")[0]
    if chain_method == "parallel":
        _parallel_processes(monkeypatch, processes)
    reference = _run_of(chain_method, num_chains).get_samples(group_by_chain=True)
    if processes:
        mcmc = _run_of(chain_method, num_chains, hook=_sigint_from_the_workers(num_chains))
    else:
        mcmc = _run_of(chain_method, num_chains, stop_at=K)
    kept_chains = num_chains if chain_method == "vectorized" or processes else 1  # stopped in the first chain
    partial = mcmc.partial
    assert (partial.num_draws, partial.num_samples, partial.steps_done) == (K, SAMPLES, WARMUP + K)
    assert "KeyboardInterrupt" in partial.error
    with pytest.warns(PartialRunWarning, match=f"{K} of {SAMPLES} draws per chain"):
        samples = mcmc.get_samples(group_by_chain=True)
    assert set(samples) == set(reference)
    for name, draws in samples.items():
        assert draws.shape[:2] == (kept_chains, K), name
        assert torch.equal(draws, reference[name][:kept_chains, :K]), name  # the same streams: bit for bit
    assert partial.phase == "sampling"  # where it stopped, and how many chains the draws hold
    assert partial.num_chains_kept == (None if kept_chains == num_chains else kept_chains)
    with pytest.warns(PartialRunWarning):  # the other readers read the same draws
        assert mcmc.diagnostics()["w"]["n_eff"].shape == (3,)
        assert to_inference_data(mcmc).posterior.sizes["chain"] == kept_chains
        assert to_inference_data(mcmc).posterior.sizes["draw"] == K
    assert mcmc.superchain_ids.shape == (kept_chains,)


@pytest.mark.parametrize("chain_method", ["sequential", "parallel"])
def test_ctrl_c_in_a_later_chain_run_one_after_another_keeps_the_finished_chains(chain_method, monkeypatch):
    """Stopped at draw K of chain 2: chains 0 and 1, complete (120 draws), rather than 3 chains of K (51)."""
    _parallel_processes(monkeypatch, False)  # "parallel": Pyro runs the chains in this process, one after another
    reference = _run_of(chain_method, 3).get_samples(group_by_chain=True)
    mcmc = _run_of(chain_method, 3, stop_at=K, stop_chain=2)
    partial = mcmc.partial
    assert (partial.num_draws, partial.num_chains_kept) == (SAMPLES, 2)
    steps = 2 * (WARMUP + SAMPLES) + WARMUP + K if chain_method == "sequential" else WARMUP + SAMPLES  # per chain
    assert partial.steps_done == steps
    with pytest.warns(PartialRunWarning, match="first 2 chain"):
        samples = mcmc.get_samples(group_by_chain=True)
    for name, draws in samples.items():
        assert torch.equal(draws, reference[name][:2]), name  # chains 0 and 1, complete
    with pytest.warns(PartialRunWarning):
        assert to_inference_data(mcmc).posterior.sizes["chain"] == 2
    mcmc.hook_fn = None
    if mcmc.recorder is not None:  # "parallel": Pyro's run calls the recorder, which calls the hook
        mcmc.recorder.hook_fn = None
    mcmc.run(*script.data())  # the same object, run again: complete, all its chains
    assert mcmc.partial is None and mcmc.superchain_ids.shape == (3,)


def test_ctrl_c_in_sequential_warmup_keeps_nothing_and_says_so():
    import pyro

    def hook(kernel, params, stage, i):
        if stage == "Warmup [0]" and i == 3:
            raise KeyboardInterrupt

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(script.model, step_size=0.02), num_samples=SAMPLES, warmup_steps=WARMUP, num_chains=3,
                chain_method="sequential", seed=5, hook_fn=hook, disable_progbar=True)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        mcmc.run(*script.data())
    with pytest.raises(RunNotFinished, match=f"stopped at step 4 of {3 * (WARMUP + SAMPLES)} in warmup"):
        mcmc.get_samples()


def test_a_sequential_run_failed_in_set_up_says_so():
    mcmc = MCMC(SGLD(script.model, step_size=0.02), num_samples=SAMPLES, warmup_steps=WARMUP, num_chains=3,
                chain_method="sequential", seed=5, disable_progbar=True)  # fmt: skip
    with pytest.raises(Exception):
        mcmc.run("not data", None)  # the model fails while traced at set-up
    assert (mcmc.partial.steps_done, mcmc.partial.phase) == (0, "set-up")
    with pytest.raises(RunNotFinished, match=f"stopped at step 0 of {3 * (WARMUP + SAMPLES)} in set-up"):
        mcmc.get_samples()


def test_an_error_in_a_parallel_worker_keeps_the_draws_received(monkeypatch):
    """Pyro sends a worker's exception to this process, which re-raises it: the draws every chain had sent are
    kept (here K each: the chains wait for each other at draw K, then raise), bit for bit the first K draws."""
    _parallel_processes(monkeypatch, True)
    reference = _run_of("parallel", 2).get_samples(group_by_chain=True)
    import pyro

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(script.model, step_size=0.02), num_samples=SAMPLES, warmup_steps=WARMUP, num_chains=2,
                hook_fn=_sigint_from_the_workers(2, RuntimeError), mp_context="fork", disable_progbar=True)  # fmt: skip
    with pytest.raises(RuntimeError, match="stopped by the test"):
        mcmc.run(*script.data())
    assert (mcmc.partial.num_draws, mcmc.partial.num_chains_kept) == (K, None)
    assert "RuntimeError" in mcmc.partial.error
    with pytest.warns(PartialRunWarning, match=f"{K} of {SAMPLES} draws per chain"):
        samples = mcmc.get_samples(group_by_chain=True)
    for name, draws in samples.items():
        assert torch.equal(draws, reference[name][:, :K]), name
