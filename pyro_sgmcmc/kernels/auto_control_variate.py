"""``control_variate="auto"``: propose a control variate after the approach, keep it only if it pays.

At the end of the approach (:mod:`~pyro_sgmcmc.kernels.warmup`), with one subsampled plate whose epoch is at least
``AUTO_CONTROL_VARIATE_EPOCH`` minibatches, a *candidate* is centred where ``PRELIMINARY_MAP_ITERATIONS`` L-BFGS
iterations on the full data take the approach's best point (a few full-data passes). At the end of the initial
buffer it is measured (:meth:`AutoControlVariate.decide`) and kept if it divides the largest per-coordinate
gradient variance by more than ``1 / CONTROL_VARIATE_GAIN`` for the median chain: the noise-limited step grows in
proportion, and a step with it costs two minibatch evaluations. (Far from its centre, in a posterior that is not
concentrated, such as a small network's, it is *noisier* than plain minibatches.)
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .control_variates import ControlVariate
from .gradients import MinibatchGradient
from .warmup import (
    AUTO_CONTROL_VARIATE_EPOCH,
    AUTO_MAP_ITERATIONS,
    CENTRE_TOLERANCE,
    CONTROL_VARIATE_GAIN,
    PRELIMINARY_MAP_ITERATIONS,
    gradient_variance,
)

__all__ = ["AutoControlVariate"]


class AutoControlVariate:
    """The candidate of ``control_variate="auto"`` between the approach and the decision, and the decision.

    Attributes
    ----------
    candidate : ControlVariate or None
        Proposed at the end of the approach, measured at the end of the initial buffer.
    refined : ControlVariate or None
        A candidate kept at the mode: later sequential chains on the same data reuse it as it is.
    rejected : bool
        The candidate was measured and did not lower the noise.
    """

    def __init__(self) -> None:
        self.candidate: Optional[ControlVariate] = None
        self.refined: Optional[ControlVariate] = None
        self.rejected = False

    def reset(self) -> None:
        """A new run: no candidate, nothing rejected (a refined one is kept for the same data)."""
        self.candidate, self.rejected = None, False

    def propose(self, potential, plates, state) -> None:
        """At the end of the approach: a candidate centred near the MAP, from the chains' best point."""
        if len(plates) != 1 or plates[0].size < AUTO_CONTROL_VARIATE_EPOCH * plates[0].subsample_size:
            return
        if self.refined is not None and self.refined.potential is potential:
            self.candidate = self.refined
            return
        finite = torch.isfinite(state.potential)
        best = int(torch.where(finite, state.potential, torch.full_like(state.potential, math.inf)).argmin())
        try:
            self.candidate = ControlVariate(
                potential, "map", state.position[best], max_iter=PRELIMINARY_MAP_ITERATIONS, rounds=1
            )
        except ValueError:  # the full-data potential is not finite there: plain minibatches
            pass

    def decide(self, potential, position: torch.Tensor, minibatches, temperature: float) -> Optional[ControlVariate]:
        """The control variate to use from now on, or ``None`` (plain minibatches).

        A preliminary candidate is measured first. If its ratio is between ``CONTROL_VARIATE_GAIN`` and 1, its
        centre moves on towards the full-data MAP in stages of twice as many iterations (10, 20, 40, 80), each
        measured again, while each lowers the ratio by more than 10 %. For a concentrated posterior the variance
        at a chain's point ``z`` grows as ``|z - c|^2``, which on average over the chains is smallest at the
        mode, so the stages lower it; for a posterior that is not concentrated (a network's), the mode can be far
        from where the chains are and moving towards it makes the control variate worse: the search stops there
        instead of spending hundreds of full-data passes. A candidate below ``CONTROL_VARIATE_GAIN`` is then
        centred at the mode (L-BFGS to within ``CENTRE_TOLERANCE`` of the chains' ``T d / 2`` nats) and measured
        again: kept if still below (and reused by later sequential chains on the same data); a mode far from
        where the chains are (a network's) is rejected there.
        """
        candidate, self.candidate = self.candidate, None
        plain = gradient_variance(MinibatchGradient(potential).potential_and_grad, position, minibatches).amax(-1)
        plain = plain.clamp_min(torch.finfo(plain.dtype).tiny)

        def ratio(control_variate: ControlVariate) -> float:
            centred = gradient_variance(control_variate.potential_and_grad, position, minibatches).amax(-1)
            return float((centred / plain).median())

        best = ratio(candidate)
        if candidate is not self.refined:  # preliminary: does a centre nearer the MAP help?
            tolerance = CENTRE_TOLERANCE * temperature * position.shape[-1] / 2  # of the chains' T d / 2
            iterations = PRELIMINARY_MAP_ITERATIONS
            while CONTROL_VARIATE_GAIN <= best < 1.0 and 2 * iterations <= AUTO_MAP_ITERATIONS:
                iterations *= 2
                try:
                    moved = ControlVariate(
                        potential, "map", candidate.centre, max_iter=iterations, rounds=1,
                        potential_tolerance=tolerance,
                    )  # fmt: skip
                except ValueError:
                    break
                measured = ratio(moved)
                improved = measured < 0.9 * best
                if measured < best:
                    candidate, best = moved, measured
                if not improved:
                    break
            if best < CONTROL_VARIATE_GAIN:  # centred at the mode (up to the tolerance), and measured there
                try:
                    candidate = ControlVariate(potential, "map", candidate.centre, potential_tolerance=tolerance)
                except ValueError:
                    best = math.inf
                else:
                    best = ratio(candidate)  # a mode far from where the chains are is rejected here
        if not best < CONTROL_VARIATE_GAIN:
            self.rejected = True
            return None
        self.refined = candidate  # sequential chains on the same data reuse it
        return candidate

    def state_dict(self) -> dict:
        out = {"control_variate_rejected": self.rejected}
        if self.candidate is not None:  # between the approach and the decision
            out["control_variate_candidate"] = self.candidate.state_dict()
            out["control_variate_candidate_refined"] = self.candidate is self.refined
        return out

    def load_state_dict(self, saved: dict, potential, device) -> None:
        self.rejected = saved.get("control_variate_rejected", False)
        if "control_variate_candidate" in saved:
            candidate = ControlVariate.from_state_dict(potential, saved["control_variate_candidate"], device)
            if saved["control_variate_candidate_refined"]:
                self.refined = candidate
            self.candidate = candidate
