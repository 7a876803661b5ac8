"""The global potential of a data-parallel run, as a control variate sees it.

A :class:`~pyro_sgmcmc.kernels.control_variates.ControlVariate` needs three things of its potential: the full-data
:math:`(U, \\nabla U)` at a point (its centre, and the MAP search that finds it), the minibatch estimate at a
point on a given minibatch (its two paired terms), and the layout of the positions. Under
:func:`~pyro_sgmcmc.distributed.data_parallel` rank :math:`r` holds its shard's potential with the shard's
likelihood scaled by the number of ranks :math:`P` (:class:`~pyro_sgmcmc.distributed.sharded.ShardScale`),

.. math:: U^{(r)}(z) = -\\log p(z) - P \\sum_{n \\in \\text{shard } r} \\log p(y_n \\mid z), \\qquad
          U(z) = \\frac{1}{P} \\sum_r U^{(r)}(z),

so every quantity of the global :math:`U` is the average over the ranks of the rank's own, one all-reduce:

* :meth:`ShardedPotential.full_data_potential_and_grad`: each rank's full-shard pass, averaged. Every rank then
  holds the same :math:`(U, \\nabla U)`, so the L-BFGS search for the MAP runs the same iterations on every rank
  and ends at the same centre;
* :meth:`ShardedPotential.batched_potential_and_grad`: each rank's minibatch estimate on its own minibatch of its
  shard (the kernel's indices replaced by the rank's own, :meth:`ShardedMinibatches.own_indices
  <pyro_sgmcmc.distributed.sharded.ShardedMinibatches.own_indices>`, once per call, so that the rows of one call,
  a chain's point and the centre, share the minibatch), averaged: unbiased for :math:`U` as
  :func:`~pyro_sgmcmc.kernels.gradients.all_reduced` is. A control variate on this potential is therefore the
  average over the ranks of the ranks' control-variate estimates on their own minibatches,

  .. math:: \\nabla U(\\hat z) + \\frac{1}{P} \\sum_r \\big(\\nabla \\hat U^{(r)}_{S_r}(z) -
            \\nabla \\hat U^{(r)}_{S_r}(\\hat z)\\big),

  unbiased for :math:`\\nabla U(z)` because :math:`\\mathbb{E}\\, \\hat U^{(r)}_{S_r} = U^{(r)}` and the
  :math:`U^{(r)}` average to :math:`U`;
* :meth:`ShardedPotential.own_potential_and_grad` with :meth:`ShardedPotential.own_indices`: the same on indices
  already the rank's own, for ``control_variate="auto"``'s measurement, which evaluates one minibatch at several
  centres in separate calls.

With one rank every average is the identity and rank 0's minibatch is the kernel's own: a control variate on this
potential gives the one-process control variate's values bit for bit.
"""

from __future__ import annotations

from typing import List, Mapping, Tuple

import torch
import torch.distributed as dist

from ..kernels.control_variates import full_data_potential_and_grad
from ..model.potential import ModelPotential, SubsamplePlate

__all__ = ["ShardedPotential"]


class ShardedPotential:
    """The global potential of a data-parallel run (module docstring), for control variates.

    Parameters
    ----------
    scaled : ModelPotential
        The rank's potential with its shard's likelihood scaled by ``P``.
    estimator : ShardedMinibatches
        The rank's data-parallel estimator, whose minibatch streams give the rank's own minibatches.
    group : ProcessGroup or None
        The process group.
    global_plates : list of SubsamplePlate
        The sharded plates as one process would see them: ``N = sum_r N_r`` data, minibatches of ``sum_r B_r``
        (what ``control_variate="auto"`` reads to decide whether an epoch is long enough to try one).

    Attributes
    ----------
    replayable : bool
        True with one rank only: with more, a call draws the rank's next minibatch (``kernels/gradients.py``).
    """

    def __init__(self, scaled: ModelPotential, estimator, group, global_plates: List[SubsamplePlate]) -> None:
        self.scaled = scaled
        self.estimator = estimator
        self.group = group
        self.world_size = estimator.world_size
        self.global_plates = list(global_plates)
        self.replayable = self.world_size == 1

    # the layout of the positions: the rank's (every rank has the same latent sites)
    @property
    def subsample_plates(self) -> List[SubsamplePlate]:
        return self.scaled.subsample_plates

    @property
    def site_names(self):
        return self.scaled.site_names

    @property
    def transforms(self):
        return self.scaled.transforms

    @property
    def dim(self) -> int:
        return self.scaled.dim

    @property
    def device(self) -> torch.device:
        return self.scaled.device

    def pack(self, values):
        return self.scaled.pack(values)

    def _average(self, potential: torch.Tensor, grad: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(U, grad U)`` averaged over the ranks (one all-reduce); unchanged with one rank."""
        if self.world_size == 1:
            return potential, grad
        buffer = torch.cat([potential.unsqueeze(-1), grad], dim=-1)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
        buffer = buffer / self.world_size
        return buffer[..., 0], buffer[..., 1:]

    def full_data_potential_and_grad(self, position: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The global full-data ``(U, dU/dz)`` at one point ``(D,)``: the ranks' full-shard values averaged. The
        ranks must ask at the same point (a centre given as a dict must be the same on every rank): checked, one
        all-reduce of ``2 D`` numbers, small beside a full-data pass."""
        if self.world_size > 1:
            spread = torch.cat([position.reshape(-1), -position.reshape(-1)])
            dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=self.group)
            if not torch.equal(spread[: position.numel()], -spread[position.numel() :]):
                raise ValueError(
                    "data_parallel: the ranks evaluate the full-data potential at different points; a "
                    "control_variate given as a dict must be the same on every rank"
                )
        return self._average(*full_data_potential_and_grad(self.scaled, position))

    def own_indices(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        """The kernel's ``indices`` for ``positions`` with the sharded plates' replaced by the rank's next own
        minibatch (rank 0's own is the kernel's)."""
        return self.estimator.own_indices(positions, indices)

    def own_potential_and_grad(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        """The averaged minibatch estimate at ``(C, D)`` positions on indices that are already the rank's own."""
        return self._average(*self.scaled.batched_potential_and_grad(positions, indices))

    def batched_potential_and_grad(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        """The averaged minibatch estimate at ``(C, D)`` positions, each rank on its own minibatch (one draw)."""
        return self.own_potential_and_grad(positions, self.own_indices(positions, indices))

    def potential_and_grad(self, position: torch.Tensor, index: Mapping[str, torch.Tensor]):
        """One point ``(D,)`` on one minibatch; with one rank the rank's one-point call, as one process makes. With
        several ranks (where a control variate does not call it: it is not replayable) it is a one-chain run's."""
        if self.world_size == 1:
            return self.scaled.potential_and_grad(position, index)
        potential, grad = self.batched_potential_and_grad(
            position.unsqueeze(0), {name: rows.unsqueeze(0) for name, rows in index.items()}
        )
        return potential[0], grad[0]
