"""Control-variate gradient estimates (SGLD-CV, Baker, Fearnhead, Fox and Nemeth, 2019).

With a fixed centre :math:`\\hat z` (typically the MAP) and the full-data potential
:math:`U(\\hat z)` and gradient :math:`\\nabla U(\\hat z)` computed once, every step estimates

.. math:: \\widetilde{\\nabla U}(z) = \\nabla U(\\hat z) + \\widehat{\\nabla U}_S(z) - \\widehat{\\nabla U}_S(\\hat z)

with the *same* minibatch :math:`S` in both minibatch terms (and likewise for :math:`U`, which
gives the reported ``lp``). The estimate is unbiased for any centre, so the sampler targets the
same posterior; its variance is that of the minibatch estimate of
:math:`\\nabla U(z) - \\nabla U(\\hat z)`, which is :math:`O(\\|z - \\hat z\\|^2)`: near the centre
(within a posterior sd, :math:`O(N^{-1/2})`) the gradient noise is :math:`O(N / B)` times smaller
than plain subsampling's :math:`O(N^2 / B)`. The cost is a second minibatch evaluation per step
(at the centre; both run in one vectorised call) and one full-data pass at set-up. It helps
when the posterior is concentrated (large ``N``) and the chains stay near the centre; far from
it (multimodal posteriors, a bad centre, early burn-in from a distant start) it can be worse
than plain subsampling.

The full-data quantities are computed in chunks of exactly ``B`` data (the model's plate fixes
the minibatch size): the chunks are the cyclic windows ``{(kB + j) mod N : j < B}``,
``k = 0 .. N / gcd(N, B) - 1``, which cover every datum equally often, so the mean of the chunk
estimates is exactly the full-data value.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Tuple, Union

import torch

from .._compat import eager_lbfgs
from ..model.potential import ModelPotential

__all__ = ["ControlVariate", "full_data_potential_and_grad"]

#: data per vectorised call of a full-data pass (``2^18 / B`` minibatches): large enough that the model's
#: per-call overhead is negligible, small enough that its intermediates stay in the tens of MB
_DATA_PER_CALL = 2**18


def _single_plate(potential: ModelPotential):
    plates = [p for p in potential.subsample_plates if not p.user_indices]
    if len(plates) != 1:
        raise ValueError(
            "control_variate needs a model with exactly one subsampled pyro.plate (subsample_size=B) whose "
            f"minibatches the kernel draws; this model has {len(plates)}"
        )
    return plates[0]


def full_data_potential_and_grad(
    potential: ModelPotential, position: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Full-data ``(U, dU/dz)`` at one point ``(dim,)``, in chunks of the plate's minibatch size; a potential with
    a ``full_data_potential_and_grad`` method of its own (data parallelism's global potential,
    ``distributed/sharded_potential.py``) computes them itself."""
    own = getattr(potential, "full_data_potential_and_grad", None)
    if own is not None:
        return own(position)
    plate = _single_plate(potential)
    n, b = plate.size, plate.subsample_size
    num_chunks = n // math.gcd(n, b)
    total_u = position.new_zeros(())
    total_g = torch.zeros_like(position)
    arange = torch.arange(b, device=position.device)
    rows_per_call = max(1, _DATA_PER_CALL // b)
    summed = getattr(potential, "summed_potential_and_grad", None)  # a potential may have none
    for start in range(0, num_chunks, rows_per_call):
        ks = torch.arange(start, min(num_chunks, start + rows_per_call), device=position.device)
        chunks = (ks.unsqueeze(-1) * b + arange) % n
        result = summed(position, {plate.name: chunks}) if summed is not None else None
        if result is None:  # the model cannot share z across the chunks: one copy of z per chunk
            rows = position.detach().unsqueeze(0).expand(len(ks), -1).contiguous()
            u, g = potential.batched_potential_and_grad(rows, {plate.name: chunks})
            result = u.sum(), g.sum(0)
        total_u = total_u + result[0]
        total_g = total_g + result[1]
    return total_u / num_chunks, total_g / num_chunks


def _map_estimate(
    potential: ModelPotential,
    start: torch.Tensor,
    rounds: int = 10,
    max_iter: int = 100,
    potential_tolerance: float = 0.0,
) -> torch.Tensor:
    """Minimise the full-data potential with L-BFGS (strong Wolfe line search) from ``start``.

    L-BFGS keeps its iterate and curvature memory in float64 (the curvature of a concentrated
    posterior spans many orders of magnitude); the model is evaluated in its own dtype (``start``'s:
    a float32 model's data cannot meet float64 values). Returns the best point evaluated.

    Stopping. The gradient is computed in the model's dtype, so it cannot be resolved below its
    rounding error, about ``eps`` times the sum of the per-datum gradients' sizes; the search stops
    at the first point evaluated (line-search trials included) with
    ``max |grad U| <= 64 eps max |grad U(start)|`` (with the gradient at the start as the scale
    of the per-datum sum). In float64 that is ~1e-14 relative: the mode to full precision. In float32
    it is ~1e-5 relative, where further line searches on a 10^6-datum sum only chase rounding noise,
    at a full-data pass per try. A round that stops at ``max_iter`` without converging is restarted
    (fresh curvature memory), up to ``rounds`` times, while it still lowers the potential.

    ``potential_tolerance`` (nats) also stops the search once the last ``STALL_EVALUATIONS`` evaluations
    together lowered the best potential by less than it: a centre for a control variate needs the mode
    only to within a fraction of the posterior's spread, i.e. a potential within a fraction of ``T d / 2``
    of the minimum (the chains' average excess), not to rounding precision.
    """
    z = start.detach().to(torch.float64).clone().requires_grad_(True)
    first = full_data_potential_and_grad(potential, start.detach())
    best = {"u": math.inf, "z": start.detach().clone()}
    pending = [first]  # the first closure call is at ``start``: reuse this evaluation
    history = []  # the best potential after each evaluation

    def closure():
        z.grad = None
        point = z.detach().to(start.dtype)
        u, g = pending.pop() if pending else full_data_potential_and_grad(potential, point)
        if not (bool(torch.isfinite(u)) and bool(torch.isfinite(g).all())):
            # outside the model's domain: a huge loss makes the line search step back
            u, g = torch.full_like(u, torch.finfo(u.dtype).max / 4), torch.zeros_like(g)
        elif float(g.abs().max()) <= tolerance_grad:
            best.update(u=float(u), z=point)
            raise _Converged  # at any trial point, even inside a line search
        elif float(u) < best["u"]:
            best.update(u=float(u), z=point)
        history.append(best["u"])
        if len(history) > STALL_EVALUATIONS and history[-STALL_EVALUATIONS - 1] - best["u"] < potential_tolerance:
            raise _Converged
        z.grad = g.to(z.dtype)
        return u.to(z.dtype)

    scale = float(first[1].abs().max()) if bool(torch.isfinite(first[1]).all()) else 0.0
    tolerance_grad = max(1e-12, 64 * torch.finfo(start.dtype).eps * scale)
    for _ in range(rounds):
        before = best["u"]
        optimizer = eager_lbfgs(
            [z], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
            tolerance_grad=tolerance_grad, tolerance_change=1e-15, history_size=20,
        )  # fmt: skip
        try:
            optimizer.step(closure)
        except _Converged:
            break
        iterations = optimizer.state[z].get("n_iter", 0)
        if iterations < max_iter or not best["u"] < before:
            break  # converged (or stuck): a restart would only re-search the same point
    return best["z"]


#: Window (full-data evaluations) of the ``potential_tolerance`` stopping rule of :func:`_map_estimate`.
STALL_EVALUATIONS = 10


class _Converged(Exception):
    """Raised by the MAP search's closure at a point where the gradient is within its rounding error."""


class ControlVariate:
    """A fixed centre and the full-data potential and gradient there: the control-variate gradient estimator.

    Parameters
    ----------
    potential : ModelPotential
        Or anything with its interface (``batched_potential_and_grad``, ``potential_and_grad``, ``pack``, ...), e.g.
        data parallelism's global potential; one with ``own_indices(positions, indices)`` (it draws its own
        minibatches) is evaluated by ``own_potential_and_grad`` on one draw for the chains' points and the centre.
    centre : "map" or dict
        ``"map"``: found by L-BFGS on the full-data potential (in chunks) from ``start``; a dict:
        *constrained* values ``{site: tensor}`` of every latent site (e.g. a MAP from
        ``AutoDelta``).
    start : Tensor ``(dim,)``
        Starting point of the MAP search (the chains' first initial point).
    max_iter, rounds : int
        L-BFGS iterations per round and rounds of the MAP search (``"auto"``'s preliminary centre: 5 and 1).
    potential_tolerance : float
        Stop the search when 10 full-data evaluations lower the potential by less than this (nats).
    """

    def __init__(
        self,
        potential: ModelPotential,
        centre: Union[str, Mapping[str, torch.Tensor]],
        start: torch.Tensor,
        *,
        max_iter: int = 100,
        rounds: int = 10,
        potential_tolerance: float = 0.0,
    ):
        _single_plate(potential)
        if isinstance(centre, str):
            if centre != "map":
                raise ValueError(
                    f"control_variate must be None, 'map' or a dict of constrained site values; got {centre!r}"
                )
            position = _map_estimate(potential, start, rounds, max_iter, potential_tolerance)
        else:
            position = _pack_constrained(potential, centre, start)
        potential_value, grad = full_data_potential_and_grad(potential, position)
        if not (bool(torch.isfinite(potential_value)) and bool(torch.isfinite(grad).all())):
            raise ValueError("control_variate: the full-data potential or gradient at the centre is not finite")
        self._use(potential)
        self.centre = position
        self.centre_potential = potential_value
        self.centre_grad = grad

    @classmethod
    def from_state_dict(cls, potential: ModelPotential, saved: dict, device: torch.device) -> "ControlVariate":
        """The control variate a checkpoint saved (no full-data pass)."""
        self = cls.__new__(cls)
        self._use(potential)
        self.load_state_dict(saved, device)
        return self

    def _use(self, potential) -> None:
        """Evaluate the minibatch terms on ``potential``: replayable if it is; through its ``own_indices`` and
        ``own_potential_and_grad`` if it draws its minibatches itself (data parallelism's global potential)."""
        self.potential = potential
        self.replayable = getattr(potential, "replayable", True)
        self._own_indices = getattr(potential, "own_indices", None)

    def state_dict(self) -> dict:
        return {"centre": self.centre.cpu(), "potential": self.centre_potential.cpu(), "grad": self.centre_grad.cpu()}

    def load_state_dict(self, saved: dict, device: torch.device) -> None:
        self.centre = saved["centre"].to(device)
        self.centre_potential = saved["potential"].to(device)
        self.centre_grad = saved["grad"].to(device)

    def potential_and_grad(
        self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """CV estimates ``(U, dU/dz)`` for ``(C, D)`` positions, each chain with its own minibatch (the
        :class:`~pyro_sgmcmc.kernels.gradients.GradientEstimator` protocol)."""
        C = positions.shape[0]
        if C == 1 and self.replayable:  # one chain: two calls of the (compiled) one-chain potential beat one
            index = {k: v[0] for k, v in indices.items()}  # vectorised call
            u, g = self.potential.potential_and_grad(positions[0], index)
            u0, g0 = self.potential.potential_and_grad(self.centre, index)
            return (u - u0 + self.centre_potential).unsqueeze(0), (g - g0 + self.centre_grad).unsqueeze(0)
        evaluate = self.potential.batched_potential_and_grad
        if self._own_indices is not None:  # a potential that draws the minibatches itself (data parallelism's):
            indices = self._own_indices(positions, indices)  # one draw, for the chains' points and the centre
            evaluate = self.potential.own_potential_and_grad
        rows = torch.cat([positions, self.centre.expand(C, -1)])
        both: Dict[str, torch.Tensor] = {k: torch.cat([v, v]) for k, v in indices.items()}
        u, g = evaluate(rows, both)
        return u[:C] - u[C:] + self.centre_potential, g[:C] - g[C:] + self.centre_grad

    __call__ = potential_and_grad


def _pack_constrained(potential: ModelPotential, centre, start: torch.Tensor) -> torch.Tensor:
    if not isinstance(centre, Mapping):
        raise TypeError(
            f"control_variate must be None, 'map' or a dict {{site: constrained value}}; got {type(centre).__name__}"
        )
    missing = [name for name in potential.site_names if name not in centre]
    unknown = [name for name in centre if name not in potential.site_names]
    if missing or unknown:
        raise ValueError(
            f"control_variate dict must give every latent site ({potential.site_names}); "
            f"missing {missing}, unknown {unknown}"
        )
    unconstrained = {}
    for name in potential.site_names:
        value = torch.as_tensor(centre[name], dtype=start.dtype, device=start.device)
        unconstrained[name] = potential.transforms[name].inv(value) if name in potential.transforms else value
    position = potential.pack(unconstrained)
    if not bool(torch.isfinite(position).all()):
        raise ValueError("control_variate dict has values outside the sites' supports (non-finite unconstrained)")
    return position
