"""Stochastic-gradient MCMC kernels for :class:`pyro.infer.MCMC`."""

from .base import DivergenceError, DivergenceWarning, SGMCMCKernel, SGMCMCState, SlowMixingWarning
from .sghmc import SGHMC
from .sgld import SGLD
from .sgnht import SGNHT

__all__ = [
    "SGLD",
    "SGHMC",
    "SGNHT",
    "SGMCMCKernel",
    "SGMCMCState",
    "DivergenceError",
    "DivergenceWarning",
    "SlowMixingWarning",
]
