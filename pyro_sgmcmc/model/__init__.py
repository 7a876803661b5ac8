"""The model room: a Pyro model traced into a flat layout and a potential energy.

The data flow, one module a step:

1. :mod:`~pyro_sgmcmc.model.trace`: the model traced once (latent sites, subsampled plates, ``N``);
2. :mod:`~pyro_sgmcmc.model.layout`: the sites in one flat unconstrained vector (pack, unpack, transforms);
3. :mod:`~pyro_sgmcmc.model.priors` and :mod:`~pyro_sgmcmc.model.log_joint`: the log joint summed as the
   model runs, the Normal priors in a cheap standard form;
4. :mod:`~pyro_sgmcmc.model.potential`: :class:`ModelPotential`,
   ``U(theta) = -log p(theta) - (N / B) sum log p(x_i | theta)`` and its gradient on a minibatch,
   batched over chains;
5. :mod:`~pyro_sgmcmc.model.compiled` (one chain by ``torch.jit.trace``, many by ``torch.func.vmap``) and
   :mod:`~pyro_sgmcmc.model.full_data` (the full data walked in chunks); :mod:`~pyro_sgmcmc.model.checks`
   names what is not finite, :mod:`~pyro_sgmcmc.model.argument_types` the list, string or NumPy array
   given where the model needs a tensor.
"""

from .compiled import JitMode, check_jit_compile
from .full_data import PlateChunks, chunk_combinations, full_data_potential_and_grad, trace_at
from .layout import Layout
from .potential import ModelPotential
from .trace import LatentSite, ModelError, SubsamplePlate, is_identity

__all__ = [
    "JitMode",
    "LatentSite",
    "Layout",
    "ModelError",
    "ModelPotential",
    "PlateChunks",
    "SubsamplePlate",
    "check_jit_compile",
    "chunk_combinations",
    "full_data_potential_and_grad",
    "is_identity",
    "trace_at",
]
