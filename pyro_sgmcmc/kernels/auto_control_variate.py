"""``control_variate="auto"``: propose a control variate after the approach, keep it only if it pays.

At the end of the approach (:mod:`~pyro_sgmcmc.kernels.warmup`), with one subsampled plate whose epoch is at least
``AUTO_CONTROL_VARIATE_EPOCH`` minibatches, a *candidate* is centred where ``PRELIMINARY_MAP_ITERATIONS`` L-BFGS
iterations on the full data take the approach's best point (a few full-data passes). At the end of the initial
buffer it is measured (:func:`auto_decide`) and kept if it divides the largest per-coordinate
gradient variance by more than ``1 / CONTROL_VARIATE_GAIN`` for the median chain: the noise-limited step grows in
proportion, and a step with it costs two minibatch evaluations. (Far from its centre, in a posterior that is not
concentrated, such as a small network's, it is *noisier* than plain minibatches.) Every ratio is measured on paired
minibatches with its error, on more minibatches while the decision is unclear (:class:`_PairedMeasurement`).

The decision is a value, :class:`AutoControlVariateState`, in the shape of the adaptations of
:mod:`~pyro_sgmcmc.kernels.adapt`: :func:`auto_init` makes a run's, :func:`auto_propose` and :func:`auto_decide`
return new ones (the latter with the control variate chosen), :func:`auto_fields` and :func:`auto_restore` carry it
through a checkpoint. The warmup driver holds the state; nothing assigns its fields.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

from .control_variates import ControlVariate
from .gradients import MinibatchGradient
from .warmup import (
    ARRIVAL_Z,
    AUTO_CONTROL_VARIATE_EPOCH,
    AUTO_MAP_ITERATIONS,
    CENTRE_TOLERANCE,
    CONTROL_VARIATE_GAIN,
    MAX_MINIBATCHES,
    NOISE_MINIBATCHES,
    NOISE_Z,
    PRELIMINARY_MAP_ITERATIONS,
    STAGE_IMPROVEMENT,
)

__all__ = [
    "AutoControlVariateState",
    "auto_init",
    "auto_propose",
    "auto_decide",
    "auto_fields",
    "auto_restore",
]


class AutoControlVariateState(NamedTuple):
    """The decision of ``control_variate="auto"`` as a value: made by :func:`auto_init`, advanced by
    :func:`auto_propose` (end of the approach) and :func:`auto_decide` (end of the initial buffer), each returning
    a new state; nothing changes one in place.

    Attributes
    ----------
    candidate : ControlVariate or None
        Proposed at the end of the approach, measured at the end of the initial buffer (then ``None`` again).
    refined : ControlVariate or None
        A candidate kept at the mode: later sequential chains on the same data reuse it as it is.
    rejected : bool
        The candidate was measured and did not lower the noise.
    arrival : Tensor ``(C, D)`` or None
        Where the decision measured the chains that had not reached the typical set (:func:`auto_decide`); a kept
        control variate's warmup moves them there.
    """

    candidate: Optional[ControlVariate] = None
    refined: Optional[ControlVariate] = None
    rejected: bool = False
    arrival: Optional[torch.Tensor] = None

    def replace(self, **changes) -> "AutoControlVariateState":
        """A copy with the named fields replaced (the others shared, not copied)."""
        return self._replace(**changes)


def auto_init(previous: Optional[AutoControlVariateState] = None) -> AutoControlVariateState:
    """A new run's decision: no candidate, nothing rejected; the ``refined`` control variate of ``previous`` (a
    run before on the same data, or not) is kept, :func:`auto_propose` reuses it only for the same potential."""
    return AutoControlVariateState(refined=None if previous is None else previous.refined)


def auto_propose(state: AutoControlVariateState, potential, plates, chains) -> AutoControlVariateState:
    """At the end of the approach: ``state`` with a candidate centred near the MAP, from the best point of the
    ``chains`` (an :class:`~pyro_sgmcmc.kernels.state.SGMCMCState`); unchanged for a model with other than one
    subsampled plate, an epoch shorter than ``AUTO_CONTROL_VARIATE_EPOCH`` minibatches, or a full-data potential
    that is not finite there. A potential with ``global_plates`` (data parallelism's global potential) is judged by
    those: ``N`` and the minibatch size of all the ranks together, the same on every rank."""
    plates = getattr(potential, "global_plates", plates)
    if len(plates) != 1 or plates[0].size < AUTO_CONTROL_VARIATE_EPOCH * plates[0].subsample_size:
        return state
    if state.refined is not None and state.refined.potential is potential:
        return state.replace(candidate=state.refined)
    finite = torch.isfinite(chains.potential)
    best = int(torch.where(finite, chains.potential, torch.full_like(chains.potential, math.inf)).argmin())
    try:
        candidate = ControlVariate(
            potential, "map", chains.position[best], max_iter=PRELIMINARY_MAP_ITERATIONS, rounds=1
        )
    except ValueError:  # the full-data potential is not finite there: plain minibatches
        return state
    return state.replace(candidate=candidate)


def auto_decide(
    state: AutoControlVariateState, potential, position: torch.Tensor, minibatches, temperature: float, hessian=None
) -> Tuple[Optional[ControlVariate], AutoControlVariateState]:
    """The control variate to use from now on, or ``None`` (plain minibatches), and the decided state.

    A preliminary candidate is measured first. If its ratio is between ``CONTROL_VARIATE_GAIN`` and 1, its
    centre moves on towards the full-data MAP in stages of twice as many iterations (10, 20, 40, 80), each
    measured again, while each lowers the ratio by more than 10 % plus twice the error of that (paired)
    change, and while the ratio is not below ``CONTROL_VARIATE_GAIN`` by more than twice its error. For a
    concentrated posterior the variance at a chain's point ``z`` grows as ``|z - c|^2``, which on average
    over the chains is smallest at the mode, so the stages lower it; for a posterior that is not
    concentrated (a network's), the mode can be far from where the chains are and moving towards it makes
    the control variate worse: the search stops there instead of spending hundreds of full-data passes. A
    candidate below ``CONTROL_VARIATE_GAIN`` by more than twice its error (a close call is not worth the
    search: rejected) is then centred at the mode (L-BFGS to within ``CENTRE_TOLERANCE`` of the chains'
    ``T d / 2`` nats) and measured again: kept if still below (and reused by later sequential chains on the
    same data); a mode far from where the chains are (a network's) is rejected there.

    Where the ratios are measured: at the chains' points, except for chains that have not reached the typical
    set (the approach's sign-based steps freeze anywhere in the ball where the minibatch gradient's sign is
    noise, ``sqrt(N / B)`` posterior sds wide for a Gaussian mean): measured there, a control variate looks
    useless exactly when the chain needs it to move. Such a chain (:meth:`_PairedMeasurement.arrival_scale`)
    is measured where it would be had it arrived, on its line to the centre of one stage towards the MAP,
    provided that stage finds the posterior concentrated (the potential lower by at most a chi^2 tail of
    ``T d / 2`` nats); a kept control variate's warmup then moves it there (:attr:`arrival`). Measured on a
    raw-covariate regression (N = 2,000, B = 10; seeds 0-11): without this, seed 0 ended 23 posterior sds off
    (loudly); with it, every seed keeps the control variate and mixes.
    """
    candidate, state = state.candidate, state.replace(candidate=None)
    dim = position.shape[-1]
    tolerance = CENTRE_TOLERANCE * temperature * dim / 2  # of the chains' T d / 2
    stages: dict = {}

    def stage(start: ControlVariate, iterations: int) -> Optional[ControlVariate]:
        """``iterations`` L-BFGS iterations towards the MAP from ``start``'s centre (computed once)."""
        key = (id(start), iterations)
        if key not in stages:
            try:
                stages[key] = ControlVariate(
                    potential, "map", start.centre, max_iter=iterations, rounds=1, potential_tolerance=tolerance
                )
            except ValueError:
                stages[key] = None
        return stages[key]

    measure = _PairedMeasurement(potential, position, minibatches)
    scale = None if hessian is None else measure.arrival_scale(candidate, hessian, temperature)
    target = candidate
    if scale is not None and candidate is not state.refined:
        # arrival assumes a concentrated posterior, its mode near the candidate's centre: one stage towards the
        # MAP must not find the potential lower by more than a chi^2 tail of T d / 2 nats (a network's mode,
        # away from where its chains are, is hundreds of nats lower); the stage's centre is then the target
        target = stage(candidate, 2 * PRELIMINARY_MAP_ITERATIONS)
        drop = math.inf if target is None else float(candidate.centre_potential - target.centre_potential)
        if not drop <= temperature * (dim / 2 + ARRIVAL_Z * math.sqrt(dim / 2)):
            scale = None
    if scale is not None:
        position = target.centre + scale.unsqueeze(-1) * (position - target.centre)
        state = state.replace(arrival=position)
        measure = _PairedMeasurement(potential, position, minibatches)
    log_gain = math.log(CONTROL_VARIATE_GAIN)
    best, error = measure.resolve(lambda: measure.log_ratio(candidate), log_gain, [candidate])
    if candidate is not state.refined:  # preliminary: does a centre nearer the MAP help?
        iterations = PRELIMINARY_MAP_ITERATIONS
        if best >= log_gain:  # is it below 1 at all (else a stage cannot help)?
            best, error = measure.resolve(lambda: measure.log_ratio(candidate), 0.0, [candidate])
        # stages while the ratio is not below the gain by more than its error: a full MAP search (hundreds
        # of full-data passes for a network) is paid only for a candidate that clearly helps
        while not best + NOISE_Z * error < log_gain and best < 0.0 and 2 * iterations <= AUTO_MAP_ITERATIONS:
            iterations *= 2
            moved = stage(candidate, iterations)
            if moved is None:
                break
            # paired: both centres on the same minibatches, so the noise common to both cancels
            change, noise = measure.resolve(
                lambda: measure.log_ratio(moved, candidate), STAGE_IMPROVEMENT, [candidate, moved]
            )
            improved = change + NOISE_Z * noise < STAGE_IMPROVEMENT  # by more than 10 % and its noise
            if change < 0.0:
                measure.forget(candidate)
                candidate = moved
                best, error = measure.resolve(lambda: measure.log_ratio(candidate), log_gain, [candidate])
            else:
                measure.forget(moved)
            if not improved:
                break
        if best + NOISE_Z * error < log_gain:  # centred at the mode (up to the tolerance), measured there
            measure.forget(candidate)
            try:
                candidate = ControlVariate(potential, "map", candidate.centre, potential_tolerance=tolerance)
            except ValueError:
                best = math.inf
            else:  # a mode far from where the chains are is rejected here
                best, _ = measure.resolve(lambda: measure.log_ratio(candidate), log_gain, [candidate])
        else:
            best = math.inf  # not below the gain by more than its error: a close call, not worth a search
    if not best < log_gain:
        return None, state.replace(rejected=True)
    return candidate, state.replace(refined=candidate)  # sequential chains on the same data reuse it


def auto_fields(state: AutoControlVariateState) -> dict:
    """The state in a checkpoint (the keys of the format before it was a value): whether the candidate was
    rejected and, between the approach and the decision, the candidate and whether it is the refined one."""
    out = {"control_variate_rejected": state.rejected}
    if state.candidate is not None:  # between the approach and the decision
        out["control_variate_candidate"] = state.candidate.state_dict()
        out["control_variate_candidate_refined"] = state.candidate is state.refined
    return out


def auto_restore(state: AutoControlVariateState, saved: dict, potential, device) -> AutoControlVariateState:
    """:func:`auto_fields` back onto ``state`` (a new run's, :func:`auto_init`), the candidate on ``potential``."""
    state = state.replace(rejected=saved.get("control_variate_rejected", False))
    if "control_variate_candidate" in saved:
        candidate = ControlVariate.from_state_dict(potential, saved["control_variate_candidate"], device)
        refined = candidate if saved["control_variate_candidate_refined"] else state.refined
        state = state.replace(candidate=candidate, refined=refined)
    return state


class _PairedMeasurement:
    """The gradient-noise ratios of :func:`auto_decide`, measured on one shared pool of minibatches.

    Why. The decision compares variances estimated from a few minibatches: with 8, a variance has a relative
    error near ``sqrt(2 / 7) = 0.53`` (more for the heavy-tailed per-datum gradients of raw covariates), so a
    ratio of two independent estimates often errs by a factor of 2 to 3, against thresholds of 0.4 (keep) and
    10 % (a stage goes on). Two remedies, both here:

    * paired minibatches: the plain gradient and every candidate's control-variate gradient are measured on the
      *same* minibatches (the pool), so a ratio's two estimates share their sampling noise, and two centres
      compared in a stage share nearly all of it (their difference is what is measured);
    * an error computed and compared: each statistic (a log ratio, the median over the chains of the largest
      per-coordinate variance's log) comes with its jackknife standard error over the pool's minibatches.
      :meth:`resolve` doubles the pool (8, 16, 32, 64 minibatches) while the statistic is within ``NOISE_Z``
      errors of its threshold; at ``MAX_MINIBATCHES`` the point estimate decides (a close call either way).

    Cost. A clear case (most) costs 8 plain and 8 centre evaluations per candidate; the pool grows only for an
    unclear one, at most ``MAX_MINIBATCHES`` evaluations per candidate (6.4 full-data passes at ``N = 10 B``,
    the smallest epoch ``"auto"`` measures). The centre's gradients are evaluated alone (not the control
    variate's two-call estimate: the plain gradients at the chains' points are already in the pool).
    """

    def __init__(self, potential, position: torch.Tensor, minibatches) -> None:
        self.evaluate = MinibatchGradient(potential).potential_and_grad
        self.draw = minibatches.next
        if hasattr(potential, "own_indices"):  # it draws its minibatches itself (data parallelism's potential):
            # each pool minibatch is drawn once, then evaluated at every centre as it is
            self.evaluate = potential.own_potential_and_grad
            self.draw = lambda: potential.own_indices(position, minibatches.next())
        self.position = position
        self.indices: list = []
        self.plain: list = []  # (C, D) plain gradient at the chains' points, one per minibatch of the pool
        self.centres: dict = {}  # control variate -> (C, D) minibatch gradients at its centre, one per minibatch

    def extend(self, count: int, candidates) -> None:
        """The pool to ``count`` minibatches, with the plain and each candidate's centre gradients on all."""
        while len(self.indices) < count:
            self.indices.append(self.draw())
            self.plain.append(self.evaluate(self.position, self.indices[-1])[1])
        for candidate in candidates:
            done = self.centres.setdefault(candidate, [])
            rows = candidate.centre.expand_as(self.position).contiguous()
            done.extend(self.evaluate(rows, index)[1] for index in self.indices[len(done) :])

    def arrival_scale(self, candidate, hessian, temperature: float) -> Optional[torch.Tensor]:
        r"""``(C,)``: how far each chain would be from the mode, as a fraction of how far it is, if it had reached
        the typical set (1 for a chain that has); ``None`` when all have.

        At the posterior :math:`\pi \propto e^{-U / T}`, integration by parts gives
        :math:`E_\pi[(\partial_i U)^2] = T\, E_\pi[\partial_{ii} U]`, for any posterior, so
        :math:`S = \sum_i (\partial_i U)^2 / (T |\partial_{ii} U|)` is about ``d`` (a :math:`\chi^2_d` for a
        Gaussian) at a chain that has arrived. A chain out at ``k`` posterior sds of a Gaussian has
        :math:`S \approx k^2`, so ``S`` above ``d`` by more than ``ARRIVAL_Z`` sds of a :math:`\chi^2_d` means it
        has not arrived, and :math:`\sqrt{d / S}` of its offset from the mode puts it where one that has would be.
        The gradient is the control variate's on the pool's minibatches (low noise), its square corrected for that
        noise; the curvature is the probed Hessian's diagonal at the chain's point.
        """
        self.extend(NOISE_MINIBATCHES, [candidate])
        samples = candidate.centre_grad + torch.stack(self.plain) - torch.stack(self.centres[candidate])
        samples = samples.to(torch.float64)  # (K, C, D) the control variate's gradients at the chains' points
        k = samples.shape[0]
        squared = samples.mean(0) ** 2 - samples.var(0) / k  # unbiased for the squared mean gradient
        curvature = hessian(self.position)
        if curvature.dim() == 3:
            curvature = curvature.diagonal(dim1=-2, dim2=-1)
        curvature = curvature.to(torch.float64).abs().clamp_min(torch.finfo(torch.float64).tiny)
        statistic = (squared / (temperature * curvature)).sum(-1)  # (C,): about d at the posterior
        dim = self.position.shape[-1]
        far = torch.isfinite(statistic) & (statistic > dim + ARRIVAL_Z * math.sqrt(2 * dim))
        if not bool(far.any()):
            return None
        return torch.where(far, (dim / statistic).sqrt(), torch.ones_like(statistic)).to(self.position.dtype)

    def forget(self, candidate) -> None:
        self.centres.pop(candidate, None)

    def log_variance(self, candidate=None):
        """``(C,)`` log of the largest per-coordinate variance and its ``(K, C)`` leave-one-out values."""
        samples = torch.stack(self.plain)
        if candidate is not None:  # the control variate's gradient, up to its constant centre_grad
            samples = samples - torch.stack(self.centres[candidate])
        samples = samples.to(torch.float64)
        samples = torch.where(torch.isfinite(samples), samples, torch.zeros_like(samples))
        k = samples.shape[0]
        worst = samples.var(0).argmax(-1)  # (C,) the noisiest coordinate of each chain (kept fixed)
        x = samples.gather(-1, worst.expand(k, -1).unsqueeze(-1)).squeeze(-1)  # (K, C)
        x = x - x.mean(0)
        s1, s2 = x.sum(0), (x * x).sum(0)
        leave_one_out = (s2 - x * x - (s1 - x) ** 2 / (k - 1)) / (k - 2)
        tiny = torch.finfo(torch.float64).tiny
        return (s2 / (k - 1)).clamp_min(tiny).log(), leave_one_out.clamp_min(tiny).log()

    def log_ratio(self, candidate, reference=None):
        """Median over the chains of log(candidate's variance / reference's): plain minibatches by default."""
        top, top_loo = self.log_variance(candidate)
        bottom, bottom_loo = self.log_variance(reference)
        return float((top - bottom).median()), (top_loo - bottom_loo).median(-1).values

    def resolve(self, statistic, threshold: float, candidates) -> Tuple[float, float]:
        """``statistic()`` (value, leave-one-out values) and its jackknife error, measured on more minibatches
        while it is within ``NOISE_Z`` errors of ``threshold``."""
        self.extend(NOISE_MINIBATCHES, candidates)
        while True:
            value, leave_one_out = statistic()
            k = leave_one_out.shape[0]
            error = float(((k - 1) / k * ((leave_one_out - leave_one_out.mean()) ** 2).sum()).sqrt())
            if not math.isfinite(value) or abs(value - threshold) > NOISE_Z * error or k >= MAX_MINIBATCHES:
                return value, error
            self.extend(min(2 * k, MAX_MINIBATCHES), candidates)
