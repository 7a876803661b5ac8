"""Pointwise log-densities of observed sites for the export: the distribution's own ``log_prob``, or, for a
likelihood whose own is needlessly slow, an equal formula that is cheaper and at least as accurate.

The full-data log-likelihood evaluates one observed site's density at every (draw, datum) pair: ``10^8`` to
``10^9`` values, where every elementwise pass counts. Pyro's ``Bernoulli(logits=l).log_prob(y)`` is PyTorch's
``-binary_cross_entropy_with_logits(l, y)``, which takes thirteen passes over the block and two exponentials
and a logarithm per value. The same quantity is

.. math::

    \\log p(y \\mid l) = y\\, l - \\operatorname{softplus}(l)
                       = y\\, l - \\max(l, 0) - \\log\\!\\left(1 + e^{-|l|}\\right),

evaluated here in eight passes with one exponential and one ``log1p``. Written this way nothing cancels: for
:math:`y \\in \\{0, 1\\}`, :math:`y l - \\max(l, 0)` is exactly :math:`0` or :math:`-|l|`, and the last term,
of the same sign, is computed to a few ulp by ``log1p``; PyTorch's form takes the logarithm of
:math:`1 + e^{-|l|}` rounded first, which loses :math:`e^{-|l|}` below the precision of one. Any real ``y``
gives the same function as PyTorch's (``y l - softplus(l)``), so relaxed labels in :math:`[0, 1]` stay as
they were. ``tests/export/test_log_prob.py`` compares both forms against float64.

A distribution is recognised by its class's ``log_prob`` being the library's own (a subclass that overrides
it is left alone), through ``Independent`` (``.to_event``); anything else is asked for its ``log_prob``.
"""

from __future__ import annotations

import torch
from torch.distributions import Bernoulli, Independent

__all__ = ["bernoulli_logits_log_prob", "pointwise_log_prob"]


def pointwise_log_prob(fn: torch.distributions.Distribution, value: torch.Tensor) -> torch.Tensor:
    """``fn.log_prob(value)``, by :func:`bernoulli_logits_log_prob` for a logits-parametrised Bernoulli
    (module docstring), summed over the event dims of an ``Independent``."""
    if type(fn).log_prob is Independent.log_prob:
        inner = pointwise_log_prob(fn.base_dist, value)
        dims = fn.reinterpreted_batch_ndims
        return inner.sum(tuple(range(-dims, 0))) if dims else inner
    if type(fn).log_prob is Bernoulli.log_prob and "logits" in vars(fn):
        return bernoulli_logits_log_prob(fn.logits, value)
    return fn.log_prob(value)


def bernoulli_logits_log_prob(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """:math:`y\\, l - \\max(l, 0) - \\log(1 + e^{-|l|})`, broadcast over ``logits`` and ``value``: the log
    mass of ``value`` under ``Bernoulli(logits=logits)``.

    Examples
    --------
    >>> import torch
    >>> from pyro_sgmcmc.export.log_prob import bernoulli_logits_log_prob
    >>> l, y = torch.tensor([-30.0, 0.0, 30.0]), torch.tensor([0.0, 1.0, 1.0])
    >>> bernoulli_logits_log_prob(l, y)  # -log1p(e^-30) ~ -9.4e-14 both ends (PyTorch gives -0 at the first)
    tensor([-9.3576e-14, -6.9315e-01, -9.3576e-14])
    """
    tail = torch.log1p(torch.exp(logits.abs().neg_()))
    result = value * logits
    return result.sub_(logits.clamp_min(0)).sub_(tail)
