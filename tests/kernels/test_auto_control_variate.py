"""``control_variate="auto"`` (kernels/auto_control_variate.py): where the gradient noise is measured.

The control variate's decision is measured at the chains' points, except for a chain the approach left outside the
typical set, which is measured where it would arrive (and moved there if the control variate is kept). The network
case, where the posterior is not concentrated and the chains' points are kept, is in test_control_variates.py.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import MCMC, SGHMC, ModelPotential
from pyro_sgmcmc.chains.minibatch import MinibatchSampler
from pyro_sgmcmc.chains.streams import ChainGenerators
from pyro_sgmcmc.kernels.auto_control_variate import (
    AutoControlVariateState,
    auto_decide,
    auto_fields,
    auto_init,
    auto_propose,
    auto_restore,
)
from pyro_sgmcmc.kernels.gradients import MinibatchGradient
from pyro_sgmcmc.kernels.state import SGMCMCState, SlowMixingWarning

from .test_warmup import _raw_regression


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_a_chain_left_outside_the_typical_set_is_measured_where_it_would_arrive(float64, seed):
    """A regression with a raw covariate (sd 100), N = 2,000 read 10 at a time. The approach's sign-based steps
    freeze anywhere in the ball where the minibatch gradient's sign is noise, about 15 posterior sds wide here;
    at these seeds (measured: 0, 3, 5, 9 and 10 of 0-11) the chain ends it far enough out that
    sum_i (d_i U)^2 / (T |d_ii U|), about d = 2 at the posterior, is 40-430. Measured where it is, the control
    variate looked useless (ratio 0.76 at seed 0) and was dropped; the chain stayed frozen and seed 0 ended 30
    sds off (loudly). Measured where it would arrive, the control variate is kept, the chain moved there, and the
    draws match the posterior: the reference is the least-squares fit (the prior N(0, 10) is negligible at
    N = 2,000), mean within 0.5 sd (500 draws, an ESS of 100 or more: about 5 Monte Carlo errors) and sd
    within 25 % (about 3.5 errors). Seeds 0-11 all gave mean errors within 0.36 sd and sds within 17 %."""
    model = _raw_regression(2000, 10)
    torch.manual_seed(1)  # _raw_regression's data
    x = 100.0 * torch.randn(2000, dtype=torch.float64)
    y = x + torch.randn(2000, dtype=torch.float64)
    w_hat = float((x @ y) / (x @ x))
    sd = float((y - w_hat * x).std() / (x @ x).sqrt())

    pyro.set_rng_seed(seed)
    kernel = SGHMC(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowMixingWarning)
        mcmc = MCMC(kernel, num_samples=500, warmup_steps=400, disable_progbar=True)
        mcmc.run()
    assert kernel.warmup.auto.arrival is not None  # the chain was measured (and moved) where it would arrive
    assert kernel.chain_diagnostics(0)["control variate"]
    w = mcmc.get_samples()["w"]
    assert abs(float(w.mean()) - w_hat) < 0.5 * sd, (float(w.mean()) - w_hat) / sd
    assert abs(float(w.std()) / sd - 1.0) < 0.25, float(w.std()) / sd


# ---------------------------------------------------------------------- the decision as a value
def _gaussian_mean(num_data: int = 2000, batch: int = 10):
    """``y_n ~ N(mu, 1)``, ``mu ~ N(0, 10)``: a concentrated posterior (sd ``N^-1/2``), where a control variate
    centred at the mode divides the gradient noise by far more than ``1 / CONTROL_VARIATE_GAIN``."""
    y = 3.0 + torch.randn(num_data, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def model():
        mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=torch.float64), 10.0))
        with pyro.plate("data", num_data, subsample_size=batch) as idx:
            pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    return ModelPotential(model)


def _chains(potential, points):
    position = torch.tensor(points, dtype=torch.float64).unsqueeze(-1)
    energy, grad = MinibatchGradient(potential)(position, {"data": torch.arange(10).expand(len(points), -1)})
    return SGMCMCState(position, None, None, energy, grad, 0)


def test_the_auto_control_variate_state_is_an_immutable_value():
    """Its fields cannot be assigned: the warmup replaces the whole value (kernels/adaptation.py)."""
    state = auto_init()
    assert isinstance(state, tuple) and state == AutoControlVariateState(None, None, False, None)
    for field in AutoControlVariateState._fields:
        with pytest.raises(AttributeError):
            setattr(state, field, None)
    # a new run keeps the refined control variate of the last (sequential chains on the same data), nothing else
    previous = AutoControlVariateState(candidate="c", refined="r", rejected=True, arrival=torch.zeros(1))
    assert auto_init(previous) == AutoControlVariateState(refined="r")


def test_propose_and_decide_return_new_states_and_leave_theirs_alone():
    """auto_propose and auto_decide are functions of their arguments: the state given is unchanged (same fields,
    same objects), the one returned carries the change; a model the decision cannot help is returned as given."""
    potential = _gaussian_mean()
    chains = _chains(potential, [2.9, 3.1, 3.05])
    start = auto_init()
    proposed = auto_propose(start, potential, potential.subsample_plates, chains)
    assert start == AutoControlVariateState() and proposed.candidate is not None
    assert proposed.refined is None and not proposed.rejected
    again = auto_propose(start, potential, potential.subsample_plates, chains)  # the same inputs, the same centre
    assert torch.equal(again.candidate.centre, proposed.candidate.centre)
    # too few minibatches per epoch (N < 10 B) or no subsampled plate: no candidate, the very same state
    short = [replace(potential.subsample_plates[0], size=50)]
    assert auto_propose(start, potential, short, chains) is start
    assert auto_propose(start, potential, [], chains) is start

    before = tuple(proposed)
    generators = ChainGenerators(0, range(3))
    chosen, decided = auto_decide(proposed, potential, chains.position, MinibatchSampler(
        potential.subsample_plates, generators), temperature=1.0)  # fmt: skip
    assert tuple(proposed) == before and all(a is b for a, b in zip(proposed, before))
    assert chosen is not None and decided.refined is chosen and decided.candidate is None and not decided.rejected
    # the same decision again from the same state and minibatch streams: the same control variate
    chosen_again, _ = auto_decide(proposed, potential, chains.position, MinibatchSampler(
        potential.subsample_plates, ChainGenerators(0, range(3))), temperature=1.0)  # fmt: skip
    assert torch.equal(chosen_again.centre, chosen.centre)
    # the refined control variate is proposed again as it is for the same potential (a sequential chain)
    assert auto_propose(auto_init(decided), potential, potential.subsample_plates, chains).candidate is chosen


def test_the_state_goes_through_a_checkpoint_in_the_format_before_it_was_a_value():
    """The keys are those the mutable AutoControlVariate wrote, so checkpoints written before still load."""
    potential = _gaussian_mean()
    chains = _chains(potential, [2.9, 3.1])
    proposed = auto_propose(auto_init(), potential, potential.subsample_plates, chains)
    saved = auto_fields(proposed)
    assert set(saved) == {"control_variate_rejected", "control_variate_candidate", "control_variate_candidate_refined"}
    assert set(saved["control_variate_candidate"]) == {"centre", "potential", "grad"}
    restored = auto_restore(auto_init(), saved, potential, "cpu")
    assert torch.equal(restored.candidate.centre, proposed.candidate.centre)
    assert restored.refined is None and not restored.rejected
    # a candidate that is the refined one (a sequential chain's) is restored as both
    refined = proposed.replace(refined=proposed.candidate)
    restored = auto_restore(auto_init(), auto_fields(refined), potential, "cpu")
    assert restored.refined is restored.candidate
    # after a rejection: only the flag
    assert auto_fields(AutoControlVariateState(rejected=True)) == {"control_variate_rejected": True}
    assert auto_restore(auto_init(), {"control_variate_rejected": True}, potential, "cpu").rejected
