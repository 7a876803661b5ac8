"""Stochastic-gradient MCMC kernels for :class:`pyro.infer.MCMC`.

Where things live: the pure update rules in ``diffusions``; one module per kernel (``sgld``, ``sghmc``,
``sgnht``); the Pyro protocol in ``base`` and the vectorised chains in ``batched``; the gradient estimators in
``gradients`` and ``control_variates``; the warmup in ``adaptation`` (driver), ``adapt`` (the adaptations as
pure ``(init, update, final)`` over named tuples: approach, jump thresholds, step size, metric, windows), ``warmup``
(phases and constants), ``preconditioning``, ``metric`` and ``curvature_probes``; the chain state, divergences, starting
points and argument checks in ``state``, ``divergences``, ``initialisation`` and ``arguments``.
"""

from .base import SGMCMCKernel
from .control_variates import ControlVariate
from .gradients import GradientEstimator, MinibatchGradient
from .sghmc import SGHMC
from .sgld import SGLD
from .sgnht import SGNHT
from .state import DivergenceError, DivergenceWarning, SGMCMCState, SlowMixingWarning

__all__ = [
    "SGLD",
    "SGHMC",
    "SGNHT",
    "SGMCMCKernel",
    "SGMCMCState",
    "GradientEstimator",
    "MinibatchGradient",
    "ControlVariate",
    "DivergenceError",
    "DivergenceWarning",
    "SlowMixingWarning",
]
