"""MAP steps under a Gaussian prior of changing precision, on the package's compiled potential.

:func:`~pyro_sgmcmc.guides.marglik.marglik_training` minimises, one minibatch at a time,

.. math::
    U_\\lambda(z) = -\\frac{N}{B}\\sum_{n\\in\\mathcal B}\\log p(y_n \\mid z)
    + \\tfrac12 \\sum_i \\lambda_i (z_i - m_i)^2 ,

with :math:`\\lambda` changed by the evidence steps. ``SVI`` with a custom loss runs Pyro's traces
and handlers for the model and the guide at every step. :class:`GaussianPriorSteps` instead builds
one :class:`~pyro_sgmcmc.ModelPotential` of the model with every latent site's prior replaced by
:math:`\\mathcal N(m_s, 1)` (:class:`UnitNormalPriors`), whose potential is
:math:`U_1(z) = -\\frac NB\\sum\\log p(y_n\\mid z) + \\frac12\\|z - m\\|^2 + c`, so that

.. math:: \\nabla U_\\lambda(z) = \\nabla U_1(z) + (\\lambda - 1) \\circ (z - m)

exactly, for any :math:`\\lambda`: the compiled potential (``jit_compile="auto"``, as
:meth:`~pyro_sgmcmc.guides.AutoLaplace.fit_map`) never has to be rebuilt when :math:`\\lambda`
moves. It applies when every latent site has real support (the prior is on the site's value
itself; a constrained site's Gaussian prior is on its unconstrained value and would need the
log-Jacobian taken back out) and the optimiser's arguments are one dict; otherwise
``marglik_training`` keeps ``SVI``.
"""

from __future__ import annotations

from typing import Dict

import pyro
import pyro.distributions as dist
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch.distributions import biject_to

from ..model.potential import ModelPotential
from .fit import EpochMinibatches
from .sites import is_identity_transform, potential_permutation, site_slices, unconstrained_shapes

__all__ = ["GaussianPriorSteps", "UnitNormalPriors"]


class UnitNormalPriors(Messenger):
    """Replace the prior of each latent site ``s`` in ``means`` by ``Normal(means[s], 1)`` of the same shape."""

    def __init__(self, means: Dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.means = means

    def _pyro_sample(self, msg) -> None:
        if msg["is_observed"] or site_is_subsample(msg) or msg["name"] not in self.means:
            return
        event_dim = len(msg["fn"].event_shape)
        mean = self.means[msg["name"]]
        msg["fn"] = dist.Normal(mean, torch.ones((), dtype=mean.dtype, device=mean.device)).to_event(event_dim)


class GaussianPriorSteps:
    """Optimiser steps on :math:`U_\\lambda` for the MAP of ``guide`` (an AutoLaplace over all its sites).

    Parameters
    ----------
    guide : AutoLaplace
        Set up (its ``prototype_trace`` and ``loc``); :meth:`write_back` copies the point into ``loc``.
    args, kwargs :
        The model's arguments.
    prior_mean : Tensor ``(d,)``
        :math:`m` in the guide's order.
    optim : pyro.optim.PyroOptim
        Its torch optimiser class and arguments are used on the flat point.
    seed : int
        Seed of the minibatch generator (minibatches in epochs: :class:`~pyro_sgmcmc.guides.fit.EpochMinibatches`,
        as laplace-torch's ``DataLoader`` gives them).
    """

    def __init__(self, guide, args, kwargs, prior_mean: torch.Tensor, optim: pyro.optim.PyroOptim, seed: int = 0):
        trace = guide.prototype_trace
        shapes = unconstrained_shapes(trace)
        slices = site_slices(trace, shapes)
        means = {name: prior_mean[where].detach().reshape(shapes[name]) for name, where in slices.items()}
        model = guide.raw_model

        def unit_prior_model(*model_args, **model_kwargs):
            with UnitNormalPriors(means):
                return model(*model_args, **model_kwargs)

        self.potential = ModelPotential(unit_prior_model, args, kwargs, jit_compile="auto")
        self.perm = potential_permutation(list(slices), shapes, self.potential)  # guide = potential[perm]
        start = torch.empty_like(guide.loc.detach())
        start[self.perm] = guide.loc.detach()
        self.mean = torch.empty_like(start)
        self.mean[self.perm] = prior_mean.detach().to(start.dtype)
        self.position = torch.nn.Parameter(start)
        self.optimizer = optim.pt_optim_constructor([self.position], **optim.pt_optim_args)
        generator = torch.Generator(device=start.device).manual_seed(seed)
        self.minibatches = EpochMinibatches(self.potential, generator, start.device)

    @staticmethod
    def applies(guide, optim) -> bool:
        """Every latent site of real support, and the optimiser's arguments one dict."""
        sites = guide.prototype_trace.iter_stochastic_nodes()
        real = all(is_identity_transform(biject_to(site["fn"].support)) for _, site in sites)
        return real and isinstance(getattr(optim, "pt_optim_args", None), dict)

    def step(self, precision: torch.Tensor) -> None:
        """One optimiser step on a fresh minibatch at the ``(d,)`` precisions (guide order)."""
        indices = self.minibatches()
        _, grad = self.potential.potential_and_grad(self.position.detach(), indices)
        extra = torch.empty_like(grad)
        extra[self.perm] = precision.detach().to(grad.dtype) - 1
        self.position.grad = grad + extra * (self.position.detach() - self.mean)
        self.optimizer.step()

    def write_back(self, guide) -> None:
        """Copy the point into ``guide.loc``."""
        with torch.no_grad():
            guide.loc.copy_(self.position.detach()[self.perm])
