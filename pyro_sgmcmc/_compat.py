"""Every use of a private torch or Pyro member, in one place.

The rest of the package reads only public names. Each entry here says which private member it
reads, what the public alternative is, and the measured gain that keeps it (or why no public
alternative exists). Nothing here changes a process-wide state: no monkeypatch, no allocator
settings; each function reads or calls, and returns.

Sections, one a room, so that a change to one room's needs touches one block.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------- model room
# (pyro_sgmcmc.model)


# ---------------------------------------------------------------------------- kernels room
# (pyro_sgmcmc.kernels)


# ---------------------------------------------------------------------------- guides room
# (pyro_sgmcmc.guides)
#
# 1. ``MaskedDistribution._mask``. ``dist.mask(mask)`` keeps its mask in a private attribute and
#    offers no public accessor; the GGN rows of a masked likelihood must zero the masked
#    elements of the whitened outputs (not only of ``log_prob``). Public alternative: none that
#    recovers the mask (``log_prob == 0`` confuses masked elements with zero densities). Gain:
#    the exact GGN of ``poutine.mask``/``.mask()`` likelihoods, tested in tests/guides.


def distribution_mask(fn):
    """The mask of a :class:`pyro.distributions.MaskedDistribution` (a bool or a bool tensor)."""
    return fn._mask


# ---------------------------------------------------------------------------- run room
# (pyro_sgmcmc.mcmc, pyro_sgmcmc.export, pyro_sgmcmc.distributed, pyro_sgmcmc.diagnostics)
