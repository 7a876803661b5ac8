"""``chain_method="parallel"``: Pyro's own :class:`pyro.infer.MCMC` runs the chains; what an interrupted run keeps.

:class:`pyro.infer.MCMC` collects its draws inside ``run`` and loses them all when an exception
(``KeyboardInterrupt`` included) stops it. With one chain it runs in this process, so its
``hook_fn`` is wrapped by a :class:`SampleRecorder` that keeps a copy of every sampling-stage draw
(``params``, the unconstrained values Pyro's run stores, at the cost of a second copy of one
chain's draws while it runs); a stopped run gives those draws back through the transforms Pyro
would apply (the given ``transforms``, else the kernel's), as the first draws of an uninterrupted
run. With several chains Pyro runs them in worker processes, whose draws cannot be read back: the
stopped run keeps none, and its :class:`PartialRun` says so and names the chain methods that keep them.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from .partial import PartialRun

__all__ = ["SampleRecorder", "stopped_parallel_run"]

_NOT_RECOVERABLE = (
    "Pyro's parallel worker processes, whose draws are lost "
    "(chain_method='vectorized' or 'sequential' keeps an interrupted run's draws)"
)


class SampleRecorder:
    """``hook_fn(kernel, params, stage, i)`` of a one-chain Pyro run: copy each sampling draw, then call ``hook_fn``."""

    def __init__(self, hook_fn: Optional[Callable]) -> None:
        self.hook_fn = hook_fn
        self.draws: List[Dict[str, torch.Tensor]] = []
        self.steps_done = 0

    def start(self) -> None:
        """Forget a previous run's draws."""
        self.draws, self.steps_done = [], 0

    def __call__(self, kernel, params: Dict[str, torch.Tensor], stage: str, i: int) -> None:
        self.steps_done += 1
        if stage.startswith("Sample"):  # the draw is kept before the user's hook runs, as a vectorised run does
            self.draws.append({name: value.detach().clone() for name, value in params.items()})
        if self.hook_fn is not None:
            self.hook_fn(kernel, params, stage, i)

    def samples(self, kernel, transforms: Optional[dict]) -> Optional[Dict[str, torch.Tensor]]:
        """The recorded draws ``{site: (1, draws, ...)}``, constrained as Pyro's run does; ``None`` if none."""
        if not self.draws:
            return None
        transforms = transforms if transforms is not None else (getattr(kernel, "transforms", None) or {})
        names = getattr(kernel, "save_params", None) or sorted(self.draws[0])
        samples = {}
        for name in names:
            stacked = torch.stack([draw[name] for draw in self.draws]).unsqueeze(0)
            samples[name] = transforms[name].inv(stacked) if name in transforms else stacked
        return samples


def stopped_parallel_run(
    recorder: Optional[SampleRecorder], error: BaseException, warmup_steps: int, num_samples: int
) -> PartialRun:
    """Where a ``"parallel"`` run stopped by ``error`` is: the recorder's count, or nothing known (several chains)."""
    steps_done = 0 if recorder is None else recorder.steps_done
    if recorder is None:
        phase = _NOT_RECOVERABLE
    elif steps_done == 0:
        phase = "set-up"
    else:
        phase = "sampling" if steps_done >= warmup_steps and num_samples else "warmup"
    return PartialRun(
        steps_done=steps_done,
        total_steps=warmup_steps + num_samples,
        num_draws=0 if recorder is None else len(recorder.draws),
        num_samples=num_samples,
        error=f"{type(error).__name__}: {error}".rstrip(": "),
        checkpoint_path=None,
        phase=phase,
    )
