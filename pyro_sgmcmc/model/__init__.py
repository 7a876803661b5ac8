"""The model room: a Pyro model traced into a flat layout and a potential energy.

A model is traced once (:mod:`pyro_sgmcmc.model.potential`), its latent sites laid out in one
flat unconstrained vector, and evaluated as ``U(theta) = -log p(theta) - (N / B) sum log p(x_i | theta)``
on a minibatch, or on the full data in chunks.
"""

from .potential import JitMode, ModelError, ModelPotential, SubsamplePlate, check_jit_compile

__all__ = ["JitMode", "ModelError", "ModelPotential", "SubsamplePlate", "check_jit_compile"]
