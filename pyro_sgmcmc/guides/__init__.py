"""Gaussian guides for Bayesian neural networks: scalable Laplace and tempered diagonal VI."""

from .laplace import AutoLaplace, LaplaceApproximation
from .module_laplace import ModuleLaplace, is_lora_parameter
from .tempering import TemperedELBO
from .vi import AutoDiagVI

__all__ = ["AutoLaplace", "LaplaceApproximation", "AutoDiagVI", "TemperedELBO", "ModuleLaplace", "is_lora_parameter"]
