"""pyro_sgmcmc: scalable Bayesian learning in Pyro.

Stochastic-gradient MCMC kernels (:class:`SGLD`, :class:`SGHMC`, :class:`SGNHT`) that run
inside :class:`pyro.infer.MCMC` on models with subsampled plates, :class:`MCMC`, a drop-in
:class:`pyro.infer.MCMC` that also runs many chains vectorised, and Gaussian guides for networks
(:class:`AutoLaplace`, :class:`AutoDiagVI`), importable from here as from :mod:`pyro_sgmcmc.guides`.
"""

from .allocation import retain_freed_cpu_memory
from .diagnostics import nested_rhat, nested_rhat_threshold
from .guides import AutoDiagVI, AutoLaplace, LaplaceApproximation, TemperedELBO
from .inference_data import to_inference_data
from .kernels import (
    SGHMC,
    SGLD,
    SGNHT,
    DivergenceError,
    DivergenceWarning,
    SGMCMCKernel,
    SGMCMCState,
    SlowMixingWarning,
)
from .mcmc import MCMC, PartialRun, PartialRunWarning, RunNotFinished
from .model.potential import ModelError, ModelPotential
from .schedules import Constant, RobbinsMonro, Schedule, make_schedule
from .uncertainty import UncertaintyDecomposition, decompose_uncertainty

__version__ = "0.1.0"

__all__ = [
    "MCMC",
    "AutoLaplace",
    "LaplaceApproximation",
    "AutoDiagVI",
    "TemperedELBO",
    "PartialRun",
    "PartialRunWarning",
    "RunNotFinished",
    "to_inference_data",
    "nested_rhat",
    "nested_rhat_threshold",
    "SGLD",
    "SGHMC",
    "SGNHT",
    "SGMCMCKernel",
    "SGMCMCState",
    "DivergenceError",
    "DivergenceWarning",
    "SlowMixingWarning",
    "ModelPotential",
    "ModelError",
    "Schedule",
    "Constant",
    "RobbinsMonro",
    "make_schedule",
    "decompose_uncertainty",
    "UncertaintyDecomposition",
    "retain_freed_cpu_memory",
]
