"""Gaussian guides for Bayesian neural networks: scalable Laplace and tempered diagonal VI."""

from .laplace import AutoLaplace, LaplaceApproximation
from .vi import AutoDiagVI, TemperedELBO

__all__ = ["AutoLaplace", "LaplaceApproximation", "AutoDiagVI", "TemperedELBO"]
