"""What a finished run leaves for Pyro's readers: :class:`Draws`, with ``get_samples``, ``summary`` and ``diagnostics``.

:class:`pyro_sgmcmc.MCMC` keeps the draws of its last run in one :class:`Draws` value, whatever its
``chain_method``: for ``"vectorized"`` and ``"sequential"`` the run loop's result, for ``"parallel"``
what :class:`pyro.infer.MCMC` returns through its public ``get_samples(group_by_chain=True)``. The
three readers give Pyro's numbers with Pyro's conventions:

* :meth:`Draws.get_samples` is :func:`pyro.infer.mcmc.util.select_samples`, the function behind
  :meth:`pyro.infer.MCMC.get_samples`: ``{site: (C * S, ...)}`` (chains flattened, chain by chain)
  or, with ``group_by_chain``, ``{site: (C, S, ...)}``; with ``num_samples``, that many draws drawn
  uniformly with replacement (``torch.randint``, so ``pyro.set_rng_seed`` applies);
* :meth:`Draws.diagnostics` is :meth:`pyro.infer.MCMC.diagnostics`: ``n_eff`` and split ``r_hat``
  per site, then each of the kernel's diagnostics as ``{name: {"chain c": value}}``;
* :meth:`Draws.summary` prints :meth:`pyro.infer.MCMC.summary`'s table and its divergence count.

``n_eff`` comes from :mod:`pyro_sgmcmc.diagnostics.summary` (Pyro's estimator in memory linear in
the draws), so the readers work on runs far longer than Pyro's own ``(n, n)`` mask allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from pyro.infer.mcmc.util import select_samples

from ..diagnostics.summary import diagnostics as site_diagnostics
from ..diagnostics.summary import print_summary

__all__ = ["Draws"]


@dataclass(frozen=True)
class Draws:
    """The draws of one run and the per-chain diagnostics of its kernel.

    Attributes
    ----------
    samples : dict
        ``{site: (num_chains, num_draws, *site_shape)}``, constrained.
    chain_diagnostics : list of dict
        Per chain, the kernel's diagnostics (``{"divergences": [...], ...}``, as Pyro's kernels return them).
    args, kwargs :
        The model arguments the run was given.

    Examples
    --------
    >>> import torch
    >>> draws = Draws({"x": torch.arange(8.0).reshape(2, 4)}, [{"divergences": []}, {"divergences": [1]}])
    >>> draws.get_samples()["x"].tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    >>> draws.get_samples(group_by_chain=True)["x"].shape, draws.num_chains
    (torch.Size([2, 4]), 2)
    >>> draws.diagnostics()["divergences"]
    {'chain 0': [], 'chain 1': [1]}
    """

    samples: Dict[str, torch.Tensor]
    chain_diagnostics: List[Dict[str, Any]]
    args: tuple = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)

    @property
    def num_chains(self) -> int:
        return len(self.chain_diagnostics)

    def get_samples(self, num_samples: Optional[int] = None, group_by_chain: bool = False) -> Dict[str, torch.Tensor]:
        """The draws as :meth:`pyro.infer.MCMC.get_samples` returns them (see the module docstring)."""
        return select_samples(self.samples, num_samples, group_by_chain)

    def diagnostics(self) -> dict:
        """``{site: {"n_eff", "r_hat"}}`` and ``{name: {"chain c": value}}`` of every kernel diagnostic."""
        out = site_diagnostics(self.samples)
        first = self.chain_diagnostics[0] if self.chain_diagnostics else None
        for name in first or {}:
            out[name] = {f"chain {c}": chain[name] for c, chain in enumerate(self.chain_diagnostics)}
        return out

    def summary(self, prob: float = 0.9) -> None:
        """Print Pyro's summary table (mean, std, median, ``prob`` interval, ``n_eff``, ``r_hat``) and divergences."""
        print_summary(self.samples, prob=prob)
        first = self.chain_diagnostics[0] if self.chain_diagnostics else None
        if first and "divergences" in first:
            print(f"Number of divergences: {sum(len(chain['divergences']) for chain in self.chain_diagnostics)}")
