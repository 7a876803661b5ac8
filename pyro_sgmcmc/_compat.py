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


def pyro_chain_diagnostics(mcmc) -> list:
    """Per chain, the kernel's diagnostics that a :class:`pyro.infer.MCMC` run kept (``divergences``, ...).

    Private member: the ``_diagnostics`` list of a :class:`pyro.infer.MCMC`. Public alternative:
    ``mcmc.diagnostics()``, which returns them as ``{"divergences": {"chain c": [...]}}`` but first
    computes ``n_eff`` with
    :func:`pyro.ops.stats.effective_sample_size`, whose ``(n, n)`` mask grows quadratically: measured
    here (torch 2.13, Pyro 1.9.2, one chain of 3 parameters) +1.9 GB peak memory at 20,000 draws, so
    about 48 GB at 100,000, against nothing for this read. Used only for runs of Pyro's own MCMC
    class (``pyro_sgmcmc.MCMC`` runs carry ``sample_stats``).
    """
    return list(mcmc._diagnostics)


def exit_without_finalisation(status: int = 0) -> None:
    """End this process at once, skipping the interpreter's finalisation (the launcher's ranks).

    Private member: the ``_exit`` function of :mod:`os`. Public alternative: returning (or
    ``sys.exit``), which runs the interpreter's finalisation; with torch 2.13 and gloo a process
    that used collectives then
    sometimes aborts (``terminate called without an active exception``, SIGABRT) after its work is
    done and its process group destroyed, and :func:`pyro_sgmcmc.distributed.launch` would report a
    failed rank. No public call skips finalisation; the gain is a launch that does not fail at
    random, not speed. Everything worth keeping must be written and flushed before the call.
    """
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
