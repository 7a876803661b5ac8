"""The machinery of :class:`pyro_sgmcmc.MCMC`'s own chain methods ("vectorized", "sequential").

* :mod:`~pyro_sgmcmc.run.length`: which steps a run keeps (warmup, thinning, ``keep_last``).
* :mod:`~pyro_sgmcmc.run.loop`: the run loop of vectorised chains (:class:`ChainRun`).
* :mod:`~pyro_sgmcmc.run.checkpoint`: what a run writes to its checkpoint and how it resumes.
* :mod:`~pyro_sgmcmc.run.checkpoint_settings`: where and how often it writes it (:class:`CheckpointSettings`).
* :mod:`~pyro_sgmcmc.run.partial`: what is left of an interrupted run.
* :mod:`~pyro_sgmcmc.run.pyro_chains`: what an interrupted ``"parallel"`` run (Pyro's own) keeps, in worker
  processes or not.
* :mod:`~pyro_sgmcmc.run.readers`: a run's draws and Pyro's readers of them (:class:`Draws`).
* :mod:`~pyro_sgmcmc.run.starts`: every chain's starting point, as a vectorised run draws it.
"""

from .checkpoint_settings import CheckpointSettings
from .length import RunLength
from .loop import ChainRun, Chains, RunResult
from .partial import PartialRun, PartialRunWarning, RunNotFinished
from .readers import Draws

__all__ = [
    "ChainRun",
    "Chains",
    "CheckpointSettings",
    "Draws",
    "RunLength",
    "RunResult",
    "PartialRun",
    "PartialRunWarning",
    "RunNotFinished",
]
