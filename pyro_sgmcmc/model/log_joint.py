"""The log joint of a conditioned model, summed while the model runs (the potential's hot path).

For latent values :math:`\\theta` and plate indices fixed in a dict, :class:`LogJoint` gives

.. math:: \\log p(\\theta) + \\sum_{\\text{observed } o} \\frac{N_o}{B_o}
          \\sum_{n \\in \\mathcal{B}} \\log p(y_{o,n} \\mid \\theta)

exactly as ``poutine.trace(poutine.condition(model, values)).get_trace(...).log_prob_sum()`` (Pyro applies
each plate's scale :math:`N_o / B_o`), without building the trace, with the Normal priors of
:mod:`pyro_sgmcmc.model.priors`.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import is_validation_enabled, site_is_subsample
from pyro.util import warn_if_inf, warn_if_nan

from .priors import FastNormalPriors, StandardPriors

__all__ = ["LogJoint"]


class LogJoint(Messenger):
    """Condition, swap the Normal priors and sum the sites' log-probabilities while the model runs.

    Equal to ``poutine.trace(poutine.condition(model, values)).get_trace(...).log_prob_sum()`` with
    :class:`FastNormalPriors`, without building the trace: each sample site adds
    ``scale_and_mask(fn.log_prob(value), scale, mask).sum()`` once the plates have set its scale (the
    same terms in the trace's order). Subsample sites are skipped (their ``log_prob`` is zero). The
    latent sites found in set-up to have a constant zero-mean ``Normal`` prior on an unconstrained
    value (:class:`StandardPriors`) are not evaluated one by one: when the model builds the same
    prior (checked for all of them at once after the run), their terms are added together in one
    product of the flat position with itself.
    """

    def __init__(self, values: Dict[str, torch.Tensor], priors: FastNormalPriors, standard) -> None:
        super().__init__()
        self.values = values
        self.priors = priors
        self.standard: Optional[StandardPriors] = standard
        self._standard_names = standard.sites if standard is not None else frozenset()
        # per call: the log-probability terms in the trace's order (a deferred site holds its name),
        # and the deferred sites' (fn, value) and constants for the check after the run
        self._terms: List = []
        self._deferred: Dict[str, tuple] = {}
        self._scalars: List[torch.Tensor] = []

    def run(self, model: Callable, args: tuple, kwargs: dict, position: Optional[torch.Tensor] = None):
        terms, deferred, scalars = self._terms, self._deferred, self._scalars
        try:
            with self:
                model(*args, **kwargs)
            if not deferred:
                return _sum_terms(terms, 0.0)
            matched = self.standard.verify(deferred, scalars)
            if matched is None:  # the usual case: every deferred site built its set-up prior
                return self.standard.log_prob(position, self.values, deferred) + _sum_terms(terms, 0.0)
            return self._fallback(terms, deferred, matched, position)
        finally:  # do not keep the graph alive between calls
            terms.clear()
            deferred.clear()
            scalars.clear()

    def _fallback(self, terms: List, deferred: Dict[str, tuple], matched, position: torch.Tensor):
        """Some deferred site built another prior at this call: evaluate it in its place, as a site that
        was not deferred would have been (same stand-in, same order of the sum)."""
        for i, term in enumerate(terms):
            if isinstance(term, str) and term not in matched:
                fn, value = deferred[term]
                msg = {"name": term, "fn": fn, "args": (), "kwargs": {}}
                self.priors.swap(msg)
                terms[i] = self._site_log_prob(term, msg["fn"], value, (), {}, 1.0, None)
        total = _sum_terms(terms, 0.0)
        if not matched:
            return total
        return self.standard.log_prob(position, self.values, matched) + total

    # Pyro's Messenger looks the handler method up by name at every message; only sample sites matter here
    def _process_message(self, msg) -> None:
        if msg["type"] == "sample":
            self._pyro_sample(msg)

    def _postprocess_message(self, msg) -> None:
        if msg["type"] == "sample":
            self._pyro_post_sample(msg)

    def _pyro_sample(self, msg) -> None:
        name = msg["name"]
        if name in self.values:  # as poutine.condition
            msg["value"] = self.values[name]
            msg["is_observed"] = msg["value"] is not None
            # the last handler to see the site: its scale and mask are final here
            if name in self._standard_names:
                pair = self.standard.scalars(msg)
                if pair is not None:
                    self._deferred[name] = (msg["fn"], msg["value"])
                    self._scalars += pair
                    self._terms.append(name)
                    return
        self.priors.swap(msg)

    def _pyro_post_sample(self, msg) -> None:
        fn = msg["fn"]
        name = msg["name"]
        if site_is_subsample(msg) or name in self._deferred:
            return
        self._terms.append(
            self._site_log_prob(name, fn, msg["value"], msg["args"], msg["kwargs"], msg["scale"], msg["mask"])
        )

    @staticmethod
    def _site_log_prob(name: str, fn, value, args, kwargs, scale, mask) -> torch.Tensor:
        try:
            log_p = fn.log_prob(value, *args, **kwargs)
        except ValueError as error:
            raise ValueError(f"Error while computing log_prob at site {name!r}:\n{error}") from error
        log_p = scale_and_mask(log_p, scale, mask).sum()
        if is_validation_enabled():
            warn_if_nan(log_p, f"log_prob_sum at site '{name}'")
            warn_if_inf(log_p, f"log_prob_sum at site '{name}'", allow_neginf=True)
        return log_p


def _sum_terms(terms: List, total):
    """``total + t_1 + t_2 + ...`` over the tensor terms, left to right (the trace's order); a leading
    ``0.0`` is not added (``0.0 + t`` is ``t``: one operation and one backward node fewer)."""
    for term in terms:
        if isinstance(term, str):  # a deferred site, summed apart
            continue
        total = term if isinstance(total, float) and total == 0.0 else total + term
    return total
