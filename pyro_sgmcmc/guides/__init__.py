"""Gaussian guides for Bayesian neural networks: scalable Laplace and tempered diagonal VI."""

from .laplace import AutoLaplace, LaplaceApproximation
from .tempering import TemperedELBO
from .vi import AutoDiagVI

__all__ = ["AutoLaplace", "LaplaceApproximation", "AutoDiagVI", "TemperedELBO"]
