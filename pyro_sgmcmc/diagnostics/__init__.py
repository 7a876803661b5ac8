"""Diagnostics of a run: convergence (nested R-hat, Pyro's summary in linear memory) and predictive uncertainty.

* :mod:`pyro_sgmcmc.diagnostics.rhat`: nested R-hat for many short chains in superchains.
* :mod:`pyro_sgmcmc.diagnostics.summary`: Pyro's ``n_eff``/``r_hat`` summary in ``O(n)`` memory.
* :mod:`pyro_sgmcmc.diagnostics.uncertainty`: total = aleatoric + epistemic entropy, and AUROC.
"""

from .rhat import nested_rhat, nested_rhat_threshold
from .summary import effective_sample_size
from .uncertainty import UncertaintyDecomposition, auroc, decompose_uncertainty

__all__ = [
    "nested_rhat",
    "nested_rhat_threshold",
    "effective_sample_size",
    "decompose_uncertainty",
    "UncertaintyDecomposition",
    "auroc",
]
