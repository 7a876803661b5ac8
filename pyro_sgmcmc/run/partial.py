"""What is left of a run that stopped early: where it stopped, and the warning and error its readers raise."""

from __future__ import annotations

from typing import NamedTuple, Optional

__all__ = ["PartialRun", "PartialRunWarning", "RunNotFinished"]


class PartialRunWarning(UserWarning):
    """The draws read come from a run that stopped before its end (see :attr:`pyro_sgmcmc.MCMC.partial`)."""


class RunNotFinished(RuntimeError):
    """There are no draws to read: the run was not started, or stopped before its first kept draw."""


class PartialRun(NamedTuple):
    """Where an interrupted run stopped (:attr:`pyro_sgmcmc.MCMC.partial`).

    Attributes
    ----------
    steps_done, total_steps : int
        Steps completed (warmup included) and the steps of the complete run: per chain, but for a
        ``"sequential"`` run, which counts the steps of all its chains; for ``"parallel"``, the steps of the
        draws kept.
    num_draws, num_samples : int
        Draws kept per chain so far, and those a complete run keeps.
    error : str
        The exception that stopped the run (type and message).
    checkpoint_path : str or None
        The run's checkpoint, from which :meth:`pyro_sgmcmc.MCMC.run` with the same settings resumes.
    phase : str
        What the run was doing: ``"set-up"`` (tracing the model, opening the checkpoint, drawing the
        starting points), ``"restore"`` (reading a checkpoint to resume: ``steps_done`` is then the
        checkpoint's, which is intact, and no draw is in memory), ``"warmup"`` or ``"sampling"``.
    num_chains_kept : int or None
        How many chains the draws hold when fewer than the run's (``None``: all of them). A
        ``"sequential"`` run stopped in chain ``c > 0`` keeps its ``c`` finished chains; one
        stopped in its first chain keeps that chain's draws so far; a ``"parallel"`` run keeps the leading
        chains and draws that hold the most draws (:mod:`pyro_sgmcmc.run.pyro_chains`).
    """

    steps_done: int
    total_steps: int
    num_draws: int
    num_samples: int
    error: str
    checkpoint_path: Optional[str]
    phase: str = "sampling"
    num_chains_kept: Optional[int] = None

    def describe(self) -> str:
        """One sentence: where the run stopped, what is kept, how to continue."""
        if self.checkpoint_path is not None:
            resume = (
                f"call run() again with the same settings and checkpoint={self.checkpoint_path!r} "
                "to resume from its last checkpoint"
            )
        else:
            resume = "run it again (pass checkpoint= to be able to resume an interrupted run)"
        chains = "" if self.num_chains_kept is None else f" of its first {self.num_chains_kept} chain(s) only"
        return (
            f"the run stopped at step {self.steps_done} of {self.total_steps} in {self.phase} ({self.error}) with "
            f"{self.num_draws} of {self.num_samples} draws per chain{chains}; {resume}"
        )
