"""Gaussian guides for Bayesian neural networks: scalable Laplace and tempered diagonal VI."""

from .initialization import init_to_fan_in
from .laplace import AutoLaplace, LaplaceApproximation
from .module_laplace import ModuleLaplace, is_lora_parameter
from .tempering import TemperedELBO
from .vi import AutoDiagVI

__all__ = ["AutoLaplace", "LaplaceApproximation", "AutoDiagVI", "TemperedELBO", "ModuleLaplace", "is_lora_parameter",
           "init_to_fan_in"]
