"""Data-parallel gradients: every rank one shard of the data, the same chains (see :mod:`pyro_sgmcmc.distributed`).

:func:`data_parallel` sets a kernel's gradient estimator, nothing else of it: its ``estimator_factory``
becomes a :class:`DataParallel` value, which makes, for the rank's potential,

.. code-block:: text

    sharded(all_reduced(inner(potential of the model with the sharded plate's likelihood scaled by P)))

(:func:`~pyro_sgmcmc.distributed.sharded.sharded`, :func:`~pyro_sgmcmc.kernels.gradients.all_reduced`; ``inner``
is the kernel's own estimator factory, plain minibatches by default): each rank draws its shard's minibatch, one
all-reduce averages the ranks' estimates. The estimate's ``num_data`` is the global ``N`` (the sum of the shards'
sizes, unless the kernel was given ``num_data``), which the kernel's noise and drift are normalised by.

The estimate also carries the run's global potential (``control_variate_potential``, a
:class:`~pyro_sgmcmc.distributed.sharded_potential.ShardedPotential`): ``control_variate="auto"`` builds its
candidates on it, so that their centre is the MAP of the global potential, their full-data values are the
ranks' all-reduced, and their estimate is the ranks' control-variate estimates on their own minibatches,
averaged (``distributed/sharded_potential.py``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist

from ..kernels.gradients import MinibatchGradient, all_reduced, user_estimator
from ..model.potential import ModelPotential, SubsamplePlate
from .process import rank_and_size
from .sharded import ShardedMinibatches, ShardScale, sharded
from .sharded_potential import ShardedPotential

__all__ = ["data_parallel", "DataParallel"]


class DataParallel:
    """The estimator factory :func:`data_parallel` gives a kernel: ``DataParallel(...)(potential)`` is the rank's
    estimator (module docstring), a :class:`~pyro_sgmcmc.distributed.sharded.ShardedMinibatches` whose
    ``num_data`` is the global ``N``.

    Parameters
    ----------
    plate : str, optional
        The sharded data plate (default: the model's only subsampled plate).
    group : ProcessGroup, optional
        The process group (default: the default group).
    num_data : int, optional
        The global ``N`` if the kernel was given it; default the sum of the ranks' ``num_data``.
    inner : callable, optional
        The kernel's estimator factory ``potential -> estimator`` (its ``gradient_estimator=``), applied to the
        scaled potential; default :class:`~pyro_sgmcmc.kernels.gradients.MinibatchGradient`.
    """

    def __init__(
        self, plate: Optional[str] = None, group=None, num_data: Optional[int] = None, inner: Optional[Callable] = None
    ) -> None:
        self.plate = plate
        self.group = group
        self.num_data = num_data
        self.inner = inner

    def __repr__(self) -> str:  # address-free: a checkpoint's fingerprint may fall back on it (a group's has none)
        inner = None if self.inner is None else getattr(self.inner, "__qualname__", type(self.inner).__qualname__)
        group = "default" if self.group is None else "given"
        return f"DataParallel(plate={self.plate!r}, group={group}, num_data={self.num_data!r}, inner={inner})"

    def __call__(self, potential: ModelPotential) -> ShardedMinibatches:
        """The rank's estimator on its shard; ``potential`` is the rank's :class:`~pyro_sgmcmc.ModelPotential`."""
        _, world_size = rank_and_size(self.group)
        plates = [p.name for p in potential.subsample_plates if not p.user_indices]
        if self.plate is None and len(plates) != 1:
            raise ValueError(
                f"data_parallel: the model has {len(plates)} subsampled plates {plates}; name the sharded data "
                "plate with data_parallel(kernel, plate=...)"
            )
        scale = ShardScale(float(world_size), self.plate if self.plate is not None else plates[0])
        scaled = ModelPotential(
            scale(potential.model), potential.model_args, potential.model_kwargs,
            init_strategy=potential.init_strategy, num_data=potential.num_data, jit_compile=potential.jit_compile,
        )  # fmt: skip
        inner = MinibatchGradient(scaled) if self.inner is None else user_estimator(self.inner, scaled)
        shards = [p for p in scaled.subsample_plates if not p.user_indices]
        totals = self._totals(potential, shards)
        num_data = self.num_data if self.num_data is not None else totals[0]
        # the positions follow the rank's potential's layout (the scaled potential has the same sites)
        averaged = all_reduced(inner, self.group)
        estimator = sharded(averaged, shards, scale, self.group, potential=potential, num_data=num_data)
        global_plates = [
            SubsamplePlate(p.name, size, subsample_size)
            for p, size, subsample_size in zip(shards, totals[1::2], totals[2::2])
        ]  # fmt: skip
        estimator.control_variate_potential = ShardedPotential(scaled, estimator, self.group, global_plates)
        return estimator

    def _totals(self, potential: ModelPotential, shards) -> list:
        """``[N, N_1, B_1, N_2, B_2, ...]`` summed over the ranks (one all-reduce): the global ``N`` (the ranks'
        ``num_data``) and each sharded plate's global size and minibatch size."""
        sizes = [potential.num_data] + [n for p in shards for n in (p.size, p.subsample_size)]
        total = torch.tensor(sizes, dtype=torch.int64, device=potential.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return [int(n) for n in total]


def data_parallel(kernel, plate: Optional[str] = None, group=None):
    """Make ``kernel`` (SGLD, SGHMC, SGNHT) average its gradients over the ranks; returns the kernel.

    Run the same chains on every rank with the same ``seed`` and give each rank its shard of the
    data (e.g. ``pyro_sgmcmc.distributed.shard(x)``): the model's data plate then has the shard's
    size ``N_r`` and a per-rank ``subsample_size`` ``B_r``. Each step is the step of a one-process
    run on all ``N`` data with a minibatch of ``sum_r B_r`` (drawn stratified by shard); every rank
    holds the same draws. What it sets is the kernel's gradient estimator (:class:`DataParallel`, module
    docstring), composed with the kernel's own ``gradient_estimator=`` if it has one. ``control_variate="auto"``
    (the default) works as in one process, on the global potential: the centre is the MAP of the prior plus all
    the shards' likelihoods, the decision is made from all-reduced measurements (the same on every rank), and a
    one-rank run is the one-process run draw for draw. So do ``"map"`` (the global MAP) and a dict (a centre
    given in constrained values, the same on every rank).

    Parameters
    ----------
    kernel : SGMCMCKernel
        The kernel; its ``num_data`` (if given) is the *global* ``N``.
    plate : str, optional
        The name of the sharded data plate (default: the model's only subsampled plate). Observed
        sites inside it are the data; everything outside it (priors, other observed sites) must
        be the same on every rank and is counted once.
    group : ProcessGroup, optional
        The process group (default: the default group).

    Notes
    -----
    The starting points, given or drawn (from the same ``seed``), must be the same on every rank, and so must
    the seed: both are checked at the first evaluation of each run. Checkpoints resume these runs exactly
    except for the minibatch streams of the ranks ``r > 0``, which restart. :func:`~pyro_sgmcmc.to_inference_data`
    on a rank gives the posterior draws and that rank's shard of the data (``observed_data``, ``log_likelihood``).

    Examples
    --------
    One rank here (a gloo group in this process); under ``torchrun`` or :func:`launch` every rank runs the same
    lines with its own ``shard`` of the data.

    >>> import pyro, pyro.distributions as dist, torch, torch.distributed
    >>> from pyro_sgmcmc import MCMC, SGLD
    >>> from pyro_sgmcmc.distributed import data_parallel, free_port, shard
    >>> torch.distributed.init_process_group(
    ...     "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pyro.plate("data", y.shape[0], subsample_size=20) as idx:
    ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = shard(1.0 + torch.randn(200, generator=torch.Generator().manual_seed(0)))
    >>> mcmc = MCMC(data_parallel(SGLD(model)), num_samples=50, warmup_steps=300, num_chains=4, seed=0,
    ...             chain_method="vectorized", disable_progbar=True)
    >>> mcmc.run(y)
    >>> mcmc.get_samples(group_by_chain=True)["mu"].shape
    torch.Size([4, 50])
    >>> torch.distributed.destroy_process_group()
    """
    from ..kernels.base import SGMCMCKernel

    if not isinstance(kernel, SGMCMCKernel):
        raise TypeError(f"data_parallel needs a pyro_sgmcmc kernel (SGLD, SGHMC, SGNHT); got {type(kernel).__name__}")
    if plate is not None and not isinstance(plate, str):
        raise TypeError(f"plate must be the name (str) of the sharded data plate; got {plate!r}")
    rank_and_size(group)
    inner = kernel.estimator_factory
    if isinstance(inner, DataParallel):  # made data-parallel again: the new plate and group replace the old
        inner = inner.inner
    kernel.estimator_factory = DataParallel(plate, group, kernel.num_data, inner)
    return kernel
