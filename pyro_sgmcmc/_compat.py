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
# Nothing: the kernels read no private torch or Pyro member. The buffer reuse of large chains (a step's position
# and momentum written into the memory of the state of two steps back, once torch._C._storage_Use_Count said no
# one else held it, and tensor._base said it was no view) was removed: re-measured with
# benchmarks/kernel_steps.py (small MLP, 256 chains, float32 positions of about 3 MB, interleaved runs of the previous
# and this version on the shared machine) a step took 31.5-34.5 ms with it and 32.9-33.1 ms without (SGLD; SGHMC
# 33.2-34.9 vs 31.2-35.4): no gain above the noise of the measurement, for two private reads.


# ---------------------------------------------------------------------------- guides room
# (pyro_sgmcmc.guides)


# ---------------------------------------------------------------------------- run room
# (pyro_sgmcmc.mcmc, pyro_sgmcmc.export, pyro_sgmcmc.distributed, pyro_sgmcmc.diagnostics)
