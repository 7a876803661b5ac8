"""Gaussian guides for Bayesian neural networks: scalable Laplace and tempered diagonal VI."""

__all__ = []

try:  # filled in by the guides modules as they land
    from .laplace import AutoLaplace, LaplaceApproximation  # noqa: F401

    __all__ += ["AutoLaplace", "LaplaceApproximation"]
except ImportError:  # pragma: no cover
    pass
try:
    from .vi import AutoDiagVI, TemperedELBO  # noqa: F401

    __all__ += ["AutoDiagVI", "TemperedELBO"]
except ImportError:  # pragma: no cover
    pass
