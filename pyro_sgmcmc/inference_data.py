"""Deprecated path: use :mod:`pyro_sgmcmc.export` (this module goes in the next release)."""

import warnings

from .export.inference_data import to_inference_data

__all__ = ["to_inference_data"]

warnings.warn(
    "pyro_sgmcmc.inference_data is deprecated; import from pyro_sgmcmc.export "
    "(from pyro_sgmcmc.export import to_inference_data) or from pyro_sgmcmc",
    FutureWarning,
    stacklevel=2,
)
