"""Where and how often a run writes its checkpoint: the ``checkpoint=`` argument of :class:`pyro_sgmcmc.MCMC`.

``checkpoint=`` takes a file path (the defaults below) or a :class:`CheckpointSettings`. The previous
release's four keywords, ``checkpoint_path``, ``checkpoint_every``, ``resume`` and ``checkpoint_sync``,
keep working for one release with a :class:`FutureWarning` naming the new spelling
(:func:`accepts_deprecated_checkpoint_keywords`); giving them together with ``checkpoint=`` is a
``TypeError``.
"""

from __future__ import annotations

import functools
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from .checks import check_checkpoint_path, check_positive_int

__all__ = [
    "CheckpointSettings",
    "DEFAULT_EVERY",
    "DEPRECATED_KEYWORDS",
    "accepts_deprecated_checkpoint_keywords",
    "as_checkpoint_settings",
    "deprecated_checkpoint_attribute",
]

#: The shortest key accepted for signing a checkpoint (HMAC-SHA256): 128 bits.
MIN_KEY_BYTES = 16

#: Steps between two checkpoints unless told otherwise.
DEFAULT_EVERY = 1000

#: The previous release's keywords, each with the field of :class:`CheckpointSettings` it became.
DEPRECATED_KEYWORDS = {
    "checkpoint_path": "path",
    "checkpoint_every": "every",
    "resume": "resume",
    "checkpoint_sync": "sync",
}

#: What the deprecated attributes read when the run has no checkpoint (the previous release's values).
_WITHOUT_CHECKPOINT = {"path": None, "every": None, "resume": True, "sync": True}


@dataclass(frozen=True)
class CheckpointSettings:
    """Where and how often a run writes its checkpoint: ``MCMC(..., checkpoint=CheckpointSettings(path, ...))``.

    ``checkpoint="run.ckpt"`` is short for ``checkpoint=CheckpointSettings("run.ckpt")``. Each field is
    checked when the settings are made, with an error naming it.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint file (stored as a :class:`~pathlib.Path`). Every ``every`` steps the run writes
        its complete state (positions, momenta, thermostats, step counter, every chain's
        random-generator state and minibatch cursor, divergence records) to it, atomically, and the
        draws kept since the previous write to a new chunk file in ``<path>.draws/`` (a write costs
        O(k) in the draws since the last one, see :mod:`pyro_sgmcmc.checkpoint`). The final checkpoint
        is kept. One run writes a path at a time: while a run holds it (its lock, ``<path>.lock``),
        another is refused with :class:`~pyro_sgmcmc.checkpoint.CheckpointInUse` naming its process
        and host. The directory is checked when the run starts (a probe file is written and
        removed): one that cannot be written is a :class:`~pyro_sgmcmc.checkpoint.CheckpointWriteError`
        naming the path before any step; so is a later write that fails (a full disk), which leaves
        the last complete checkpoint as it was and the draws so far in memory.
    every : int, default 1000
        Steps between checkpoints, a positive integer: a process killed at any moment loses at most
        this many steps.
    resume : bool, default True
        If ``path`` exists when :meth:`pyro_sgmcmc.MCMC.run` starts (an interrupted run with the same
        settings), continue from it: the draws are then bit-identical to those of an uninterrupted
        run. A file from a run with other settings, or one that is damaged or edited, raises
        :class:`~pyro_sgmcmc.checkpoint.CheckpointMismatch` naming what differs. ``False`` starts
        afresh: a checkpoint found at ``path`` is moved aside, whole, to ``<path>.replaced-<UTC
        time>`` (with its chunks, ``<path>.replaced-<UTC time>.draws``; ``checkpoint=`` that path
        resumes it) just before the first step.
    sync : bool, default True
        ``fsync`` each checkpoint file before it replaces the previous one, so that it survives a power
        failure or an operating-system crash too. ``False`` skips it: a write then costs no disk
        latency (about 7 ms per file here) and is still atomic for a process that is killed, but not
        for a machine that stops.
    key : bytes, optional
        A secret (at least 16 bytes, e.g. ``os.urandom(32)``) for checkpoints that cross a trust boundary
        (a shared or network directory, a file received from elsewhere). The index is then signed with
        HMAC-SHA256 of its records' checksums, which cover every record and, through the hash chain, every
        draw chunk; resuming with a key refuses, with :class:`~pyro_sgmcmc.checkpoint.CheckpointMismatch`, a
        file that is unsigned, signed with another key, or edited by anyone without the key. Without a key
        the SHA-256 checksums detect damage but not a deliberate edit (whose fields are still each checked
        against the run: :mod:`pyro_sgmcmc.run.restore_checks`). The key is not shown in the ``repr``,
        not written anywhere and not part of the run's fingerprint.

    Examples
    --------
    >>> from pyro_sgmcmc import CheckpointSettings
    >>> CheckpointSettings("run.ckpt", every=100)
    CheckpointSettings(path=PosixPath('run.ckpt'), every=100, resume=True, sync=True)
    >>> CheckpointSettings("run.ckpt", every=0)
    Traceback (most recent call last):
    ...
    ValueError: CheckpointSettings: every must be a positive integer (steps between checkpoints); got 0
    """

    path: Path
    every: int = DEFAULT_EVERY
    resume: bool = True
    sync: bool = True
    key: Optional[bytes] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        path = self.path
        if isinstance(path, (str, os.PathLike)) and not isinstance(os.fspath(path), bytes) and os.fspath(path):
            object.__setattr__(self, "path", Path(path))
        else:
            raise TypeError(
                f"CheckpointSettings: path must be a non-empty file path (str or os.PathLike); got {path!r}"
            )
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(
                f"CheckpointSettings: every must be a positive integer (steps between checkpoints); got {self.every!r}"
            )
        for name in ("resume", "sync"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"CheckpointSettings: {name} must be True or False; got {getattr(self, name)!r}")
        key = self.key
        if key is not None and (not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES):
            shown = type(key).__name__ + (f" of length {len(key)}" if isinstance(key, (bytes, str)) else "")
            raise TypeError(
                f"CheckpointSettings: key must be None or a secret of at least {MIN_KEY_BYTES} bytes (bytes, e.g. "
                f"os.urandom(32)); got a {shown}"
            )


def as_checkpoint_settings(value, name: str = "checkpoint") -> Optional[CheckpointSettings]:
    """The settings that ``name=value`` asks for (``None``: no checkpoint), with the path's directory checked."""
    if value is None:
        return None
    if isinstance(value, CheckpointSettings):
        check_checkpoint_path(value.path, f"{name}.path")
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be None, a file path (str or os.PathLike) or a CheckpointSettings; got {value!r}")
    check_checkpoint_path(value, name)
    return CheckpointSettings(value)


def accepts_deprecated_checkpoint_keywords(init):
    """Let ``init`` (an ``__init__`` with a ``checkpoint=`` keyword) take the previous release's keywords.

    They become one :class:`CheckpointSettings` passed as ``checkpoint=``, with a :class:`FutureWarning`
    naming the new spelling; an error ``init`` then raises names ``checkpoint_path`` where it named
    ``checkpoint``, as the caller wrote it. The signature shown stays ``init``'s.
    """

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        old = {name: kwargs.pop(name) for name in list(kwargs) if name in DEPRECATED_KEYWORDS}
        if not old:
            return init(self, *args, **kwargs)
        owner = type(self).__name__
        kwargs["checkpoint"] = _from_deprecated(owner, old, kwargs.get("checkpoint"))
        try:
            return init(self, *args, **kwargs)
        except (TypeError, ValueError) as error:
            if "checkpoint_path" not in old or type(error) not in (TypeError, ValueError):
                raise
            raise type(error)(re.sub(r"\bcheckpoint\b(?![.=])", "checkpoint_path", str(error))) from None

    return wrapper


def _from_deprecated(owner: str, old: Dict[str, object], checkpoint) -> Optional[CheckpointSettings]:
    """The settings the previous release's keywords ``old`` ask for (warned about, checked by their names)."""
    given = ", ".join(f"{name}=" for name in old)
    if checkpoint is not None:
        raise TypeError(
            f"{owner}() got both checkpoint= and the deprecated {given}: pass only "
            "checkpoint=CheckpointSettings(path, every=..., resume=..., sync=...)"
        )
    path, every = old.get("checkpoint_path"), old.get("checkpoint_every")
    resume, sync = old.get("resume", True), old.get("checkpoint_sync", True)
    fields = [repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else "path"]
    fields += [f"every={every!r}"] if every is not None else []
    fields += [f"resume={bool(resume)!r}"] if not resume else []
    fields += [f"sync={sync!r}"] if sync is not True else []
    new = f"checkpoint={fields[0]}" if len(fields) == 1 else f"checkpoint=CheckpointSettings({', '.join(fields)})"
    warnings.warn(
        f"{owner}: {given} {'is' if len(old) == 1 else 'are'} deprecated (removed in the next release); pass {new}",
        FutureWarning,
        stacklevel=3,
    )
    if path is not None:
        check_checkpoint_path(path, "checkpoint_path")
    if every is not None:
        check_positive_int(every, "checkpoint_every")
        if path is None:
            raise ValueError("checkpoint_every needs checkpoint_path")
    if not isinstance(sync, bool):
        raise TypeError(f"checkpoint_sync must be True or False; got {sync!r}")
    if path is None:
        return None
    return CheckpointSettings(path, DEFAULT_EVERY if every is None else every, bool(resume), sync)


def deprecated_checkpoint_attribute(old: str) -> property:
    """A read-only attribute ``old`` (``checkpoint_path``...): ``checkpoint``'s field, with a FutureWarning."""
    field = DEPRECATED_KEYWORDS[old]

    def read(run):
        warnings.warn(f"{old} is deprecated: read checkpoint.{field}", FutureWarning, stacklevel=2)
        return _WITHOUT_CHECKPOINT[field] if run.checkpoint is None else getattr(run.checkpoint, field)

    return property(read, doc=f"Deprecated spelling of ``checkpoint.{field}`` (a :class:`FutureWarning`).")
