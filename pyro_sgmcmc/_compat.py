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


# ---------------------------------------------------------------------------- run room
# (pyro_sgmcmc.mcmc, pyro_sgmcmc.export, pyro_sgmcmc.distributed, pyro_sgmcmc.diagnostics)
