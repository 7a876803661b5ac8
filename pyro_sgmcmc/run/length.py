r"""How long a run is and which of its steps it keeps.

A run of ``W`` warmup steps, ``S`` requested draws and thinning ``k`` takes :math:`W + k S` steps;
step ``t`` (0-based) gives draw :math:`j = (t - W + 1) / k` when :math:`t \ge W` and ``k``
divides :math:`t - W + 1`. With ``keep_last = L`` only the draws :math:`j > S - L` are stored, so a
chain holds :math:`\min(S, L)` draws.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from ..checkpoint import expected_draws

__all__ = ["RunLength"]


class RunLength(NamedTuple):
    """Warmup, draws, thinning and ``keep_last`` of a run (see the module docstring)."""

    warmup_steps: int
    num_samples: int
    thinning: int = 1
    keep_last: Optional[int] = None

    @property
    def total_steps(self) -> int:
        """Steps of a complete run: warmup plus ``num_samples * thinning``."""
        return self.warmup_steps + self.num_samples * self.thinning

    @property
    def num_kept(self) -> int:
        """Draws a complete run stores per chain: ``min(num_samples, keep_last)``."""
        return self.num_samples if self.keep_last is None else min(self.num_samples, self.keep_last)

    def keeps(self, step: int) -> bool:
        """Whether step ``step`` (0-based) gives a stored draw."""
        after = step - self.warmup_steps + 1
        return after > 0 and after % self.thinning == 0 and after // self.thinning > self.num_samples - self.num_kept

    def draws_after(self, steps_done: int) -> int:
        """Draws stored per chain after the first ``steps_done`` steps."""
        return expected_draws(steps_done, self.warmup_steps, self.thinning, self.num_samples, self.num_kept)
