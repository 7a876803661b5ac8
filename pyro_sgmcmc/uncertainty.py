"""Deprecated path: use :mod:`pyro_sgmcmc.diagnostics` (this module goes in the next release)."""

import warnings

from .diagnostics.uncertainty import UncertaintyDecomposition, auroc, decompose_uncertainty

__all__ = ["UncertaintyDecomposition", "decompose_uncertainty", "auroc"]

warnings.warn(
    "pyro_sgmcmc.uncertainty is deprecated; import from pyro_sgmcmc.diagnostics "
    "(e.g. from pyro_sgmcmc.diagnostics import auroc)",
    FutureWarning,
    stacklevel=2,
)
