"""Checks of a run's settings, each raising an error that names the argument and what it must be."""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["check_positive_int", "check_non_negative_int", "check_chains", "check_checkpoint_path", "check_chain_ids"]


def check_positive_int(value, name: str) -> None:
    """``value`` is an ``int`` (not a ``bool``) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")


def check_non_negative_int(value, name: str) -> None:
    """``value`` is an ``int`` (not a ``bool``) of at least 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer; got {value!r}")


def check_chains(num_chains: int, num_superchains: Optional[int]) -> None:
    """``num_chains`` positive, and a positive multiple of ``num_superchains`` when that is given."""
    check_positive_int(num_chains, "num_chains")
    if num_superchains is not None:
        check_positive_int(num_superchains, "num_superchains")
        if num_chains % num_superchains:
            raise ValueError(f"num_chains={num_chains} must be a multiple of num_superchains={num_superchains}")


def check_checkpoint_path(path, name: str = "checkpoint_path") -> None:
    """``None``, or a file path whose directory exists (``name``: the argument, for the errors)."""
    if path is None:
        return
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(f"{name} must be a file path (str or os.PathLike); got {path!r}")
    if Path(path).is_dir():
        raise ValueError(f"{name} {str(path)!r} is a directory; give a file path")
    if not Path(path).parent.is_dir():
        raise ValueError(f"{name}: the directory {str(Path(path).parent)!r} does not exist")


def check_chain_ids(chain_ids, num_chains: int) -> Optional[list]:
    """``None``, or ``num_chains`` distinct non-negative integers (returned as a list of ``int``)."""
    if chain_ids is None:
        return None
    if not isinstance(chain_ids, Sequence) or not all(
        isinstance(c, numbers.Integral) and not isinstance(c, bool) and c >= 0 for c in list(chain_ids)
    ):
        raise ValueError(f"chain_ids must be a sequence of non-negative integers; got {chain_ids!r}")
    if len(chain_ids) != num_chains or len(set(chain_ids)) != num_chains:
        raise ValueError(f"chain_ids must hold num_chains={num_chains} distinct ids; got {list(chain_ids)}")
    return [int(c) for c in chain_ids]
