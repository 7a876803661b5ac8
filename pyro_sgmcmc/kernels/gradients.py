"""Gradient estimators: the potential and its gradient at the chains' positions for one step.

An estimator is a value with one signature (as BlackJAX's ``grad_estimator``),

.. math:: \\texttt{estimator}(z, S) = \\big(\\hat U_S(z_c),\\ \\nabla \\hat U_S(z_c)\\big)_{c = 1..C},

called with the ``(C, D)`` positions and the step's minibatch ``indices`` ``S`` (``{plate name: (C, B)
indices}``, each chain its own rows, drawn by :class:`~pyro_sgmcmc.chains.minibatch.MinibatchSampler`), returning
``U`` of shape ``(C,)`` and its gradient ``(C, D)``. Every estimator here is unbiased for the full-data
:math:`U = -\\log \\pi`, :math:`\\mathbb{E}_S[\\hat U_S(z)] = U(z)` and :math:`\\mathbb{E}_S[\\nabla \\hat U_S(z)] =
\\nabla U(z)` over the uniformly drawn minibatch; they differ in variance and cost, and they compose:

* :class:`MinibatchGradient`: the plain estimate, each subsampled plate's log-likelihood scaled by :math:`N / B`,
  :math:`\\hat U_S(z) = -\\log p(z) - \\tfrac{N}{B} \\sum_{n \\in S} \\log p(y_n \\mid z)`; one model evaluation
  per chain and step;
* :class:`~pyro_sgmcmc.kernels.control_variates.ControlVariate`: centred at a fixed :math:`\\hat z` with known
  full-data values, :math:`\\nabla U(\\hat z) + \\nabla \\hat U_S(z) - \\nabla \\hat U_S(\\hat z)`: unbiased because
  the two minibatch terms share :math:`S`; two evaluations per chain and step;
* :func:`all_reduced`: wraps any estimator whose value on rank :math:`r` is an unbiased estimate
  :math:`\\hat U^{(r)}` of the same :math:`U` (each rank its own shard's minibatch, the shard's likelihood scaled
  by the number of ranks :math:`P`) and returns the average :math:`P^{-1} \\sum_r \\hat U^{(r)}`, unbiased too,
  with :math:`1/P` of the variance of independent ranks: one all-reduce of :math:`C (D + 1)` numbers. With one
  rank it is the identity;
* :func:`~pyro_sgmcmc.distributed.sharded.sharded`: wraps any estimator, replacing the indices of the sharded
  data plate by the rank's own minibatch of its shard. ``sharded(all_reduced(MinibatchGradient(scaled)))`` is
  data parallelism (:func:`~pyro_sgmcmc.distributed.data_parallel`).

The kernels call ``estimator.potential_and_grad`` (the same function; ``__call__`` for a plain callable) and read
these attributes where present: ``potential`` (the :class:`~pyro_sgmcmc.ModelPotential` whose layout the positions
follow); ``replayable``: the value is a function of ``(positions, indices)`` alone and calling it changes
nothing, so the sampling phase may call it again to name a divergence (``kernels/sampling.py``); an estimator
without it is read after every step; ``num_data``: the :math:`N` of the estimate when it is not the potential's
(data parallelism: the sum of the shards' sizes), which the kernel's drift and noise are normalised by; and
``use_streams(generators)``: an estimator that draws minibatches of its own is handed the chains' streams
(:class:`~pyro_sgmcmc.chains.streams.ChainGenerators`) whenever the kernel makes them (a new run, a restore);
``control_variate_potential``: the potential ``control_variate="auto"`` builds its control variates on instead of
the model's (data parallelism's global potential, ``distributed/sharded_potential.py``; the control variate chosen
replaces the estimator). :func:`as_estimator` turns a plain function into such a value.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Protocol, Tuple, runtime_checkable

import torch

__all__ = [
    "GradientEstimator", "MinibatchGradient", "FunctionEstimator", "as_estimator", "all_reduced",
    "control_variate_potential", "user_estimator",
]  # fmt: skip


@runtime_checkable
class GradientEstimator(Protocol):
    """What a kernel needs from a gradient estimator (see the module docstring)."""

    def potential_and_grad(
        self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Estimates ``(U, dU/dz)`` of shapes ``(C,)`` and ``(C, D)`` at the ``(C, D)`` positions."""
        ...  # pragma: no cover - protocol


class MinibatchGradient:
    """The plain minibatch estimate of :math:`(U, \\nabla U)`: the model on each chain's own minibatch.

    Parameters
    ----------
    potential : ModelPotential
        Anything with ``batched_potential_and_grad(positions, indices)``.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import ModelPotential
    >>> from pyro_sgmcmc.kernels.gradients import MinibatchGradient
    >>> def model():
    ...     pyro.sample("z", dist.Normal(0., 1.))
    >>> estimator = MinibatchGradient(ModelPotential(model))
    >>> u, g = estimator(torch.tensor([[1.0], [2.0]]), {})
    >>> g.squeeze(-1)
    tensor([1., 2.])
    """

    def __init__(self, potential) -> None:
        self.potential = potential
        self.potential_and_grad = potential.batched_potential_and_grad
        self.replayable = True  # a function of (positions, indices): a replay gives the same values

    def __call__(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        return self.potential_and_grad(positions, indices)


class FunctionEstimator:
    """A function ``(positions, indices) -> (U, grad U)`` as an estimator (see :func:`as_estimator`)."""

    def __init__(self, function: Callable, potential=None, replayable: bool = False) -> None:
        if not callable(function):
            raise TypeError(f"estimator must be callable as estimator(positions, indices); got {function!r}")
        self.potential_and_grad = function
        self.potential = potential
        self.replayable = bool(replayable)

    def __call__(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        return self.potential_and_grad(positions, indices)


def as_estimator(estimator, potential=None, replayable: Optional[bool] = None):
    """``estimator`` as a value the kernels call: an object with ``potential_and_grad`` is returned as it is; a
    plain function ``(positions, indices) -> (U, grad U)`` is wrapped (``replayable``: see the module
    docstring; default False, read after every step)."""
    if hasattr(estimator, "potential_and_grad") and replayable is None:
        return estimator
    return FunctionEstimator(getattr(estimator, "potential_and_grad", estimator), potential, bool(replayable))


class _AllReduced:
    """:func:`all_reduced`'s value."""

    def __init__(self, estimator, group) -> None:
        self.inner = as_estimator(estimator)
        self.group = group
        self.potential = getattr(self.inner, "potential", None)
        self.replayable = getattr(self.inner, "replayable", False)
        self.num_data = getattr(self.inner, "num_data", None)

    def use_streams(self, generators) -> None:
        """Hand the chains' streams on to the estimator averaged, if it draws minibatches of its own."""
        use_streams = getattr(self.inner, "use_streams", None)
        if use_streams is not None:
            use_streams(generators)

    def potential_and_grad(self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]):
        import torch.distributed as dist

        potential, grad = self.inner.potential_and_grad(positions, indices)
        world_size = dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1
        if world_size == 1:
            return potential, grad
        buffer = torch.cat([potential.unsqueeze(-1), grad], dim=-1)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
        buffer = buffer / world_size
        return buffer[:, 0], buffer[:, 1:]

    __call__ = potential_and_grad


def all_reduced(estimator, group=None):
    """The average of ``estimator``'s values over the ranks of ``group`` (default: the default group), as an
    estimator: ``(U, grad U) = P^-1 sum_r estimator_r(positions, indices_r)``, one all-reduce of ``C (D + 1)``
    numbers (module docstring). Every rank must call it with the same positions, each with its own minibatch
    (its shard's). Composes with any estimator (:class:`MinibatchGradient`, a control variate, a function);
    outside a process group, or with one rank, it returns the estimator's values unchanged.

    Examples
    --------
    >>> import torch
    >>> def quadratic(z, indices):
    ...     return 0.5 * (z * z).sum(-1), z.clone()
    >>> u, g = all_reduced(quadratic)(torch.tensor([[1.0, 2.0]]), {})  # one process: the identity
    >>> u.tolist(), g.tolist()
    ([2.5], [[1.0, 2.0]])
    """
    return _AllReduced(estimator, group)


def control_variate_potential(estimator, potential):
    """The potential a control variate of a run is built on: the estimator's ``control_variate_potential`` where it
    has one (data parallelism's global potential, :mod:`pyro_sgmcmc.distributed.sharded_potential`), else the run's
    ``potential``."""
    return getattr(estimator, "control_variate_potential", None) or potential


def user_estimator(factory: Callable, potential) -> GradientEstimator:
    """The estimator of a kernel's ``gradient_estimator=factory``: ``factory(potential)``, a value with
    ``potential_and_grad`` or a plain callable (wrapped by :func:`as_estimator`; not ``replayable`` unless it says
    so); a TypeError naming the argument for anything else.

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import ModelPotential
    >>> def model():
    ...     pyro.sample("z", dist.Normal(0., 1.))
    >>> estimator = user_estimator(MinibatchGradient, ModelPotential(model))
    >>> type(estimator).__name__, estimator.replayable
    ('MinibatchGradient', True)
    """
    estimator = factory(potential)
    if not (callable(estimator) or callable(getattr(estimator, "potential_and_grad", None))):
        raise TypeError(
            "gradient_estimator(potential) must return an estimator: a callable (positions, indices) -> (U, grad U) "
            f"or an object with potential_and_grad; got {type(estimator).__name__}"
        )
    return as_estimator(estimator, potential)
