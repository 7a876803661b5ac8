"""Scale out on :mod:`torch.distributed`: chains across processes, data-parallel gradients.

Two ways to use several processes (launched with ``torchrun``, or :func:`launch` on one machine):

* **Chains across ranks** (:class:`DistributedMCMC`). The ``num_chains`` chains of a run are split
  into contiguous blocks of global chain ids (:func:`rank_chain_ids`); each rank runs its block
  vectorised, every chain with the random stream of ``(seed, global chain id)``, from starting
  points drawn once on rank 0 and broadcast. Rank 0 then gathers the draws and statistics in
  global chain order, so :func:`~pyro_sgmcmc.to_inference_data` and
  :func:`~pyro_sgmcmc.nested_rhat` see one run with global chain and superchain ids. With the same
  seed, the draws equal those of a one-process :class:`~pyro_sgmcmc.MCMC` run of the same chains.

* **Data-parallel gradients** (:func:`data_parallel`). Every rank holds one shard of the data plate
  (``N_r`` of the ``N = sum_r N_r`` data, e.g. from :func:`shard`) and runs the *same* chains. At
  each step rank ``r`` draws its own ``B_r`` minibatch of its shard and evaluates

  .. math:: U_r(z) = -\\log p(z) - \\log|\\det J(z)| - P \\, \\frac{N_r}{B_r} \\sum_{n \\in \\mathcal{B}_r}
            \\log p(y_n \\mid z),

  i.e. the model with the likelihood terms inside the sharded plate scaled by the number of ranks
  ``P``; one all-reduce averages ``(U_r, \\nabla U_r)`` over the ranks:

  .. math:: \\frac{1}{P} \\sum_r U_r(z) = -\\log p(z) - \\log|\\det J(z)|
            - \\sum_r \\frac{N_r}{B_r} \\sum_{n \\in \\mathcal{B}_r} \\log p(y_n \\mid z),

  the prior counted once and an unbiased estimate of the full-data potential from a combined
  minibatch of ``B = sum_r B_r`` data (stratified by shard). The injected noise comes from the
  chains' streams ``(seed, chain id)``, the same on every rank, so the replicas take identical
  steps; rank 0's minibatches are the kernel's own (so that one rank is the one-process run), rank
  ``r > 0``'s come from streams of its own (``(seed, chain id + r 2^40)``), independent across ranks.
  :func:`data_parallel` sets nothing but the kernel's gradient estimator (:class:`DataParallel`):
  ``sharded(all_reduced(inner))`` on the scaled model, :func:`sharded` drawing the rank's minibatches and
  :func:`~pyro_sgmcmc.kernels.gradients.all_reduced` averaging. A control variate (``"auto"``, the default,
  ``"map"`` or a dict) is built on the run's global potential
  (:class:`~pyro_sgmcmc.distributed.sharded_potential.ShardedPotential`): all-reduced full-data values, the
  ranks' estimates on their own minibatches averaged.

Everything here uses only :mod:`torch.distributed` collectives (gloo on CPU, NCCL on GPUs); the
default process group is used unless a ``group`` is given.
"""

from .chains import DistributedMCMC
from .data_parallel import DataParallel, data_parallel
from .launch import free_port, launch
from .process import init_distributed, rank_chain_ids, shard
from .sharded import ShardedMinibatches, sharded

__all__ = [
    "init_distributed",
    "rank_chain_ids",
    "shard",
    "DistributedMCMC",
    "data_parallel",
    "DataParallel",
    "ShardedMinibatches",
    "sharded",
    "launch",
    "free_port",
]
