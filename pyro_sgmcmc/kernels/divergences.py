"""Divergence bookkeeping: which chain diverged at which step, why, and what happens to it.

A step *diverges* for a chain when the new point's potential or gradient is not finite, or (in sampling, and in
adaptation against a running threshold) when its minibatch potential jumps up past the chain's threshold
(:mod:`~pyro_sgmcmc.kernels.warmup`). Every divergence is recorded: per chain the indices of the divergent
*draws* (sampling), a count of warmup divergences, and a log entry ``(chain, step, phase, what)`` naming the sites
at fault. Then, by ``on_divergence``: ``"restart"`` puts the chain back at its last finite state with zero
momentum; ``"freeze"`` stops it for the rest of the run (its draws repeat its last finite state); ``"raise"``
raises :class:`~pyro_sgmcmc.DivergenceError` naming the step, the chains and the sites. Other chains are
unaffected.
"""

from __future__ import annotations

import math
import warnings
from typing import Dict, List, Mapping, Optional

import torch

from .state import DivergenceError, DivergenceWarning, SGMCMCState

__all__ = ["ON_DIVERGENCE", "DivergenceRecord", "describe_divergence", "nonfinite_sites"]

ON_DIVERGENCE = ("restart", "freeze", "raise")


class DivergenceRecord:
    """The divergences of ``num_chains`` chains in one run.

    Attributes
    ----------
    divergences : list of list of int
        Per chain, the indices of its divergent draws (sampling phase).
    num_warmup_divergences, num_divergences : Tensor ``(C,)``
        Per chain, divergences in warmup, and in all.
    count : int
        All divergences so far (a Python int: the progress bar reads it every step).
    frozen : Tensor ``(C,)`` bool or None
        Chains stopped by ``on_divergence="freeze"``.
    last : Tensor ``(C,)`` bool
        The chains that diverged at the last step (never modified in place).
    log : list of tuple
        ``(chain, step, phase, what)`` for every divergence.
    """

    def __init__(self, num_chains: int, device: torch.device, on_divergence: str, kernel_name: str) -> None:
        self.on_divergence = on_divergence
        self.kernel_name = kernel_name
        self.divergences: List[List[int]] = [[] for _ in range(num_chains)]
        self.num_warmup_divergences = torch.zeros(num_chains, dtype=torch.long, device=device)
        self.num_divergences = torch.zeros(num_chains, dtype=torch.long, device=device)
        self.frozen: Optional[torch.Tensor] = None
        self.log: List[tuple] = []
        # no chain diverged (shared by every step without a divergence: nothing is allocated)
        self.none = torch.zeros(num_chains, dtype=torch.bool, device=device)
        self.last = self.none
        self.count = 0

    def finite_mask(
        self, energy: torch.Tensor, grad: torch.Tensor, previous: torch.Tensor, threshold: Optional[torch.Tensor]
    ) -> Optional[torch.Tensor]:
        """``None`` when every chain's new point is fine (the usual case: one reduction and one read), else the
        ``(C,)`` mask of the chains whose new point is finite and within the jump ``threshold``."""
        # A sum is finite only if every term is; a sum that overflows, or a non-finite term, takes the exact check.
        if (
            self.frozen is None
            and math.isfinite(float(grad.sum() + (energy if energy.numel() == 1 else energy.sum())))
            and (threshold is None or not float((energy - previous - threshold).max()) > 0)
        ):
            return None
        finite = torch.isfinite(energy) & torch.isfinite(grad).all(-1)
        if threshold is not None:
            finite = finite & ~(energy - previous > threshold)
        if self.frozen is None and bool(finite.all()):
            return None
        return finite

    def reject(
        self,
        state: SGMCMCState,
        proposed: SGMCMCState,
        finite: torch.Tensor,
        sampling_step: Optional[int],
        potential,
        threshold: Optional[torch.Tensor] = None,
        indices: Optional[Mapping[str, torch.Tensor]] = None,
    ) -> SGMCMCState:
        """Record the chains whose ``proposed`` point is not ``finite`` (and keep frozen chains), and return the
        new state: ``proposed`` where kept, ``state`` elsewhere (a restarted chain at rest). ``sampling_step`` is
        the draw's index (``None`` in warmup); ``indices`` (the step's minibatch) let the log name the sites whose
        log-density is not finite."""
        diverging = ~finite
        if self.frozen is not None:
            diverging = diverging & ~self.frozen  # a frozen chain does not diverge again
        self.last = diverging
        chains = diverging.nonzero().flatten().tolist()
        phase = "warmup" if sampling_step is None else "sampling"
        for chain in chains:
            what = describe_divergence(potential, state, proposed, chain, indices, threshold)
            self.log.append((chain, state.step, phase, what))
        if chains and self.on_divergence == "raise":
            self._raise(chains)
        if sampling_step is not None:
            for chain in chains:
                self.divergences[chain].append(sampling_step)
        else:
            self.num_warmup_divergences = self.num_warmup_divergences + diverging
        self.num_divergences = self.num_divergences + diverging
        self.count += len(chains)
        if self.on_divergence == "freeze" and chains:
            self.frozen = diverging if self.frozen is None else self.frozen | diverging
        keep = finite if self.frozen is None else finite & ~self.frozen  # chains that keep the new point
        row = keep.unsqueeze(-1)
        momentum = proposed.momentum
        if momentum is not None:  # a restarted chain restarts at rest; a frozen one keeps its (unused) momentum
            reset = torch.zeros_like(momentum) if self.on_divergence == "restart" else state.momentum
            momentum = torch.where(row, momentum, reset)
        thermostat = proposed.thermostat
        if thermostat is not None:
            thermostat = torch.where(keep, thermostat, state.thermostat)
        return SGMCMCState(
            torch.where(row, proposed.position, state.position),
            momentum,
            thermostat,
            torch.where(keep, proposed.potential, state.potential),
            torch.where(row, proposed.grad, state.grad),
            state.step + 1,
        )

    def note(self, diverging: torch.Tensor) -> None:
        """A sampling step's ``(C,)`` mask, on the device (no read): the last step's mask and the per-chain counts;
        :meth:`add_sampling` records the step on the host later (``kernels/sampling.py``)."""
        self.last = diverging
        self.num_divergences = self.num_divergences + diverging

    def add_sampling(self, step: int, draw: int, named: List[tuple]) -> None:
        """Record that the sampling step from state ``step`` (draw ``draw``) diverged in the chains of ``named``,
        ``[(chain, what), ...]``, counted on the device already by :meth:`note`; raises for ``"raise"``."""
        for chain, what in named:
            self.log.append((chain, step, "sampling", what))
        if self.on_divergence == "raise":
            self._raise([chain for chain, _ in named])
        for chain, _ in named:
            self.divergences[chain].append(draw)
        self.count += len(named)

    def _raise(self, chains: List[int]) -> None:
        chain, step, phase, what = self.log[-len(chains)]
        data = (
            "the data at these indices may be outside the distribution's support or not finite (check them); "
            "if they are valid, "
            if "data indices" in what
            else ""
        )
        raise DivergenceError(
            f"{self.kernel_name}: {what} at step {step} ({phase}) in chain(s) {chains}; {data}reduce "
            "step_size (or leave adapt_step_size=True), or pass on_divergence='restart' or 'freeze' to record "
            "it and continue"
        )

    def warn(self, adapted: bool) -> None:
        """Warn, naming the counts, if any step of the run diverged (``adapted``: the warmup halved steps)."""
        if self.count == 0:
            return
        sampling = sum(len(d) for d in self.divergences)
        warmup = int(self.num_warmup_divergences.sum())
        kinds = sorted({record[3].split(" (")[0].split(" of site")[0].split(" by ")[0] for record in self.log})
        if sampling:
            consequence = "the draws may not represent the posterior; a longer warmup or a smaller step_size may help"
        else:  # warmup only: the adaptation halved the step of the chains concerned, sampling was clean
            consequence = "none while sampling" + (" (each halved that chain's adapted step size)" if adapted else "")
        chain, step, _, first = self.log[0]
        warnings.warn(
            f"{self.kernel_name}: {sampling} divergent step(s) while sampling and {warmup} in warmup "
            f"({'; '.join(kinds[:3])}; the first, chain {chain} at step {step}: {first}): {consequence}. "
            "See diagnostics() and divergence_log.",
            DivergenceWarning,
            stacklevel=3,
        )

    def state_dict(self) -> Dict[str, object]:
        return {
            "divergences": [list(d) for d in self.divergences],
            "num_warmup_divergences": self.num_warmup_divergences.clone(),
            "num_divergences": self.num_divergences.clone(),
            "frozen": None if self.frozen is None else self.frozen.clone(),
            "divergence_log": list(self.log),
            "last_diverging": self.last.clone(),
        }

    def load_state_dict(self, saved: Mapping[str, object], device: torch.device) -> None:
        self.divergences = [list(d) for d in saved["divergences"]]
        self.num_warmup_divergences = saved["num_warmup_divergences"].to(device)
        self.num_divergences = saved["num_divergences"].to(device)
        self.count = int(self.num_divergences.sum())
        self.frozen = None if saved["frozen"] is None else saved["frozen"].to(device)
        self.log = list(saved["divergence_log"])
        self.last = saved["last_diverging"].to(device)


def describe_divergence(
    potential, state: SGMCMCState, proposed: SGMCMCState, chain: int, indices=None, threshold=None
) -> str:
    """What went wrong with chain ``chain``'s step from ``state`` to ``proposed``: the non-finite quantities and
    sites (:func:`nonfinite_sites`, with the data at fault when the minibatch ``indices`` are given), or the jump
    of the potential past ``threshold``."""
    chain_indices = None if indices is None else {k: v[chain] for k, v in indices.items()}
    what = nonfinite_sites(
        potential, proposed.potential[chain], proposed.grad[chain], proposed.position[chain], chain_indices
    )
    if what is not None:
        return "non-finite " + what
    for name in ("momentum", "thermostat"):  # a family's own stability rule (SGNHT's thermostat)
        value = getattr(proposed, name)
        if value is not None and not bool(torch.isfinite(value[chain]).all()):
            return f"non-finite {name}"
    if threshold is None:
        return "the kernel's stability rule"
    # finite: the potential jumped past the chain's threshold (kernels/warmup.py)
    jump = float(proposed.potential[chain] - state.potential[chain])
    return f"a jump of the potential by {jump:.4g} (threshold {float(threshold[chain]):.4g})"


def nonfinite_sites(
    potential, energy: torch.Tensor, grad: torch.Tensor, position: torch.Tensor, indices=None
) -> Optional[str]:
    """Name what is not finite at one chain's point: 'potential energy' (with the sites whose log-density is not
    finite, when the position is finite and the minibatch ``indices`` are known) and/or the sites with non-finite
    position or gradient (``None`` if everything is finite)."""
    parts = []
    if not bool(torch.isfinite(energy)):
        culprits = []
        if indices is not None and bool(torch.isfinite(position).all()):
            culprits = potential.nonfinite_log_densities(position, indices)
        parts.append("potential energy" + (f" ({'; '.join(culprits)})" if culprits else ""))
    for site in potential.sites:
        bad = []
        if not bool(torch.isfinite(position[site.slice]).all()):
            bad.append("value")
        if not bool(torch.isfinite(grad[site.slice]).all()):
            bad.append("gradient")
        if bad:
            parts.append(f"{' and '.join(bad)} of site {site.name!r}")
    return ", ".join(parts) or None
