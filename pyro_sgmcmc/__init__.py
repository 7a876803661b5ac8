"""pyro_sgmcmc: scalable Bayesian learning in Pyro.

Stochastic-gradient MCMC kernels (:class:`SGLD`, :class:`SGHMC`, :class:`SGNHT`) that run
inside :class:`pyro.infer.MCMC` on models with subsampled plates, :class:`MCMC`, a drop-in
:class:`pyro.infer.MCMC` that also runs many chains vectorised, and Gaussian guides for networks
(:class:`AutoLaplace`, :class:`AutoDiagVI`), importable from here as from :mod:`pyro_sgmcmc.guides`.
"""

from .allocation import retain_freed_cpu_memory
from .diagnostics import UncertaintyDecomposition, decompose_uncertainty, nested_rhat, nested_rhat_threshold
from .export import to_inference_data
from .guides import AutoDiagVI, AutoLaplace, LaplaceApproximation, ModuleLaplace, TemperedELBO
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
from .mcmc import MCMC, CheckpointSettings, PartialRun, PartialRunWarning, RunNotFinished
from .model.potential import ModelError, ModelPotential
from .schedules import Constant, Cyclical, RobbinsMonro, Schedule, make_schedule

__version__ = "0.1.0"

# grouped by room: the run, its diagnostics and export; the kernels; the model; the guides; the rest
__all__ = [
    "MCMC", "CheckpointSettings", "PartialRun", "PartialRunWarning", "RunNotFinished",
    "to_inference_data", "nested_rhat", "nested_rhat_threshold", "decompose_uncertainty", "UncertaintyDecomposition",
    "SGLD", "SGHMC", "SGNHT", "SGMCMCKernel", "SGMCMCState", "DivergenceError", "DivergenceWarning",
    "SlowMixingWarning",
    "ModelPotential", "ModelError",
    "AutoLaplace", "LaplaceApproximation", "AutoDiagVI", "TemperedELBO", "ModuleLaplace",
    "Schedule", "Constant", "RobbinsMonro", "Cyclical", "make_schedule", "retain_freed_cpu_memory",
]  # fmt: skip
