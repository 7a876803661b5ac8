"""Incremental, checksummed, atomic checkpoints for long runs.

A checkpoint is two things:

* the **index**, ``<path>``: a small ``torch.save`` dictionary with the run's fingerprint, the step
  counter, the kernel's state (positions, momenta, random streams, minibatch cursors, adaptation,
  divergence records), the list of draw chunks, and a SHA-256 checksum of every record;
* the **draw chunks**, ``<path>.draws/<first>-<stop>.pt``: the draws (and their statistics) kept
  between two writes, each file written once and never rewritten. Each chunk holds the SHA-256 of
  the one before it (a hash chain) and the index that of the last, so the index does not grow.

The minibatch streams are keyed permutations (:mod:`pyro_sgmcmc.chains.minibatch`): their state in the
index is a few integers per chain and plate (keys, positions, cursors, epochs), not a table, so
there is no other file. (Format 2 also wrote the minibatch permutation tables, ``blob-<sha256>.pt``;
such a checkpoint is refused, naming its format; so is a format-3 checkpoint, which held a ``torch.Generator``
state per chain: the noise is now keyed Philox, whose state is the seed, the chain ids and the step.)

A write costs ``O(k)`` for the ``k`` steps since the previous one: one new chunk and the small index
(the kernel's state does not grow with the run). Each file is written to a temporary file of its own,
``<name>.<pid>-<8 random hex digits>.tmp`` (created exclusively: never another process's), flushed,
``fsync``-ed (unless ``sync=False``) and renamed over its name (``os.replace`` is atomic on POSIX
and Windows), the chunk before the index that lists it, so a process killed at any moment leaves a
complete checkpoint: the previous index with its chunks, or the new one. A chunk written but not yet
listed is written again, bit for bit the same, by the resumed run. A write that fails (a full disk)
removes its temporary files and renames nothing: the previous checkpoint stays as it was.

On resume every record is verified: a file that is not a checkpoint, a record whose bytes differ
from its checksum (a flipped byte, an edited field) and a missing or altered chunk are each a
:class:`CheckpointMismatch` that names the record. Files are read with
``torch.load(weights_only=True)``: only tensors, numbers, strings and containers are unpickled, so
a crafted file cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch

from .atomic_write import commit_files, temporary_name
from .checkpoint_errors import CheckpointError, CheckpointInUse, CheckpointMismatch, CheckpointWriteError
from .checkpoint_signature import check_signature, signature

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "write_chunk",
    "read_chunk",
    "read_chunks",
    "iter_chunks",
    "commit_files",
    "chunk_directory",
    "clear_chunks",
    "checksums",
    "signature",
    "check_serialisable",
    "expected_draws",
    "temporary_name",
    "CheckpointError",
    "CheckpointMismatch",
    "CheckpointInUse",
    "CheckpointWriteError",
]

#: 4: no generator states (the noise is keyed Philox: its state is the seed, chain ids and step); 3 held a
#: ``torch.Generator`` state per chain; 2 also wrote permutation table files (``blob-<sha256>.pt``).
FORMAT_VERSION = 4
#: Why a checkpoint of an earlier format cannot be continued, by its version.
_EARLIER_FORMATS = {
    2: "with minibatch permutation tables, whose minibatch streams this version does not continue",
    3: "with a torch.Generator state per chain, whose noise streams this version (keyed Philox) does not continue",
}
_SCALARS = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


# ---------------------------------------------------------------------- records and checksums
def records(payload: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """The leaves of a nested payload (dicts, lists, tuples) with their paths, e.g. ``kernel/state/position``."""
    if isinstance(payload, dict):
        for key, value in payload.items():
            yield from records(value, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(payload, (list, tuple)) and not isinstance(payload, torch.Size):
        yield prefix, ("list" if isinstance(payload, list) else "tuple", len(payload))
        for i, value in enumerate(payload):
            yield from records(value, f"{prefix}[{i}]")
    else:
        yield prefix, payload


def _digest(value: Any) -> str:
    """SHA-256 of a record: a tensor's dtype, shape and bytes; any other leaf's type and ``repr``."""
    h = hashlib.sha256()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        h.update(f"tensor {tensor.dtype} {tuple(tensor.shape)}".encode())
        if tensor.numel():
            h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(f"{type(value).__name__} {value!r}".encode())
    return h.hexdigest()


def checksums(payload: dict) -> Dict[str, str]:
    """``{record path: SHA-256}`` for every leaf of ``payload`` (see :func:`records`)."""
    return {path: _digest(value) for path, value in records(payload)}


def check_serialisable(payload: Any, what: str = "the checkpoint") -> None:
    """Raise ``TypeError`` naming the first record that ``torch.load(weights_only=True)`` could not read.

    Called before the first step of a checkpointed run, so that a state holding, say, a function
    fails at once with its name instead of at the first write.
    """
    for path, value in records(payload):
        if isinstance(value, tuple) and len(value) == 2 and value[0] in ("list", "tuple"):
            continue  # a container's record (its kind and length)
        if not isinstance(value, (torch.Tensor, *_SCALARS)):
            raise TypeError(
                f"{what} cannot be checkpointed: record {path!r} is a {type(value).__name__} ({value!r}); "
                "only tensors, numbers, strings and containers of them can be saved and loaded safely "
                "(a callable schedule keeps no state: pass it again to the resuming run)"
            )


# ---------------------------------------------------------------------- files
def _write_atomically(data: bytes, path: Path, sync: bool = True, pending: Optional[list] = None) -> None:
    """Write to a temporary file then rename it over ``path``: a killed process leaves the old file or the new one.

    With ``sync`` the data are ``fsync``-ed before the rename, so that after a power failure or an
    operating-system crash the renamed file is not empty or torn either (the directory entry itself is
    not synced: the previous file may then come back, which is still a complete checkpoint). With a
    ``pending`` list the file is only queued there, for :func:`commit_files`.
    """
    if pending is not None:
        pending.append((data, path))
        return
    commit_files([(data, path)], sync)


def _serialise(payload: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _load(source: Union[bytes, Path], what: str) -> Any:
    """Unpickle a checkpoint file (its bytes, or a path: then its tensors are memory-mapped, not copied) with
    ``weights_only=True``; :class:`CheckpointMismatch` naming ``what`` if it cannot be read that way."""
    try:
        if isinstance(source, Path):
            return torch.load(source, weights_only=True, map_location="cpu", mmap=True)
        return torch.load(io.BytesIO(source), weights_only=True, map_location="cpu")
    except Exception as error:  # truncated, not a torch file, a pickle of something else, ...
        raise CheckpointMismatch(f"{what} is not a readable pyro_sgmcmc checkpoint ({_reason(error)})") from error


def _reason(error: Exception) -> str:
    """Why a file could not be read, without PyTorch's advice to retry with ``weights_only=False`` (which would
    run whatever code a crafted file holds)."""
    if isinstance(error, pickle.UnpicklingError) or "weights_only" in str(error):
        return (
            "it holds objects other than tensors, numbers, strings and containers of them, which are refused "
            "unread: a checkpoint never holds them"
        )
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


def chunk_directory(path: Union[str, os.PathLike]) -> Path:
    """Where the draw chunks of checkpoint ``path`` live: ``<path>.draws``."""
    path = Path(path)
    return path.with_name(path.name + ".draws")


def clear_chunks(path: Union[str, os.PathLike]) -> None:
    """Remove the draw chunks of checkpoint ``path`` (a run that starts afresh); only this module's files
    (the table files ``blob-*`` of a format-2 checkpoint too)."""
    directory = chunk_directory(path)
    if not directory.is_dir():
        return
    for item in directory.iterdir():
        stem = item.name.split(".")[0]
        if item.suffix in (".pt", ".tmp") and (stem.replace("-", "").isdigit() or stem.startswith("blob-")):
            item.unlink()


def write_chunk(
    path: Union[str, os.PathLike],
    start: int,
    positions: torch.Tensor,
    stats: Dict[str, torch.Tensor],
    previous: Optional[dict] = None,
    sync: bool = True,
    pending: Optional[list] = None,
) -> dict:
    """Write draws ``start ..`` (``(chains, n, dim)`` and ``(chains, n)`` statistics) as one chunk file.

    The chunk holds the entry of the ``previous`` chunk (name, draw range, SHA-256): the chunks form a
    hash chain, so the index only lists the last one and stays the same size however long the run.
    Returns this chunk's entry.
    """
    directory = chunk_directory(path)
    directory.mkdir(exist_ok=True)
    stop = start + positions.shape[1]
    data = _serialise(
        {
            # copies of just these draws: a view would save the whole preallocated buffer behind it
            "positions": _own_copy(positions),
            "stats": {k: _own_copy(v) for k, v in stats.items()},
            "previous": previous,
        }
    )
    name = f"{start:012d}-{stop:012d}.pt"
    _write_atomically(data, directory / name, sync, pending)
    return {"file": name, "start": start, "stop": stop, "sha256": hashlib.sha256(data).hexdigest()}


def _own_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with its own storage (``torch.save`` writes a view's whole storage)."""
    tensor = tensor.detach()
    return tensor.to("cpu", copy=True, memory_format=torch.contiguous_format)


def read_chunk(
    path: Union[str, os.PathLike], entry: dict
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor], Optional[dict]]:
    """Read and verify one chunk: ``(positions, stats, entry of the previous chunk)``.

    A missing chunk, one whose bytes differ from the SHA-256 in ``entry`` or one that does not hold
    draws is a :class:`CheckpointMismatch` naming it. The file is hashed in blocks and its tensors are
    memory-mapped (``torch.load(mmap=True)``), so reading it allocates no copy of its draws; a file replaced
    between the hash and the load (another inode, size or modification time) is refused too.
    """
    if not isinstance(entry, dict) or not all(k in entry for k in ("file", "start", "stop", "sha256")):
        raise CheckpointMismatch(f"checkpoint {path}: a draw-chunk record is malformed ({entry!r})")
    file = chunk_directory(path) / Path(str(entry["file"])).name
    what = f"checkpoint {path}: the draw chunk {file}"
    if not file.is_file():
        raise CheckpointMismatch(f"{what} is missing")
    with open(file, "rb") as handle:
        identity, digest = _identity(os.fstat(handle.fileno())), hashlib.sha256()
        buffer = memoryview(bytearray(1 << 18))  # one buffer for all the blocks: nothing grows with the file
        while size := handle.readinto(buffer):
            digest.update(buffer[:size])
    if digest.hexdigest() != entry["sha256"]:
        raise CheckpointMismatch(
            f"{what} (draws {entry['start']}-{entry['stop']}) does not match its checksum: it was damaged or altered"
        )
    chunk = _load(file, f"the draw chunk {file}")
    if _identity(os.stat(file)) != identity:
        raise CheckpointMismatch(f"{what} was replaced while it was read: another process writes this checkpoint")
    if not isinstance(chunk, dict) or not isinstance(chunk.get("positions"), torch.Tensor):
        raise CheckpointMismatch(f"{what} does not hold draws")
    return chunk["positions"], dict(chunk.get("stats") or {}), chunk.get("previous")


def _identity(status: os.stat_result) -> Tuple[int, int, int, int]:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def iter_chunks(
    path: Union[str, os.PathLike], last: Optional[dict]
) -> Iterator[Tuple[dict, torch.Tensor, Dict[str, torch.Tensor]]]:
    """Follow the hash chain back from the ``last`` chunk, one chunk at a time: ``(entry, positions, stats)``
    from the last draws to draw 0 (each chunk verified, and checked to end where the next one starts), so
    that a reader holds one chunk at a time."""
    entry = last
    while entry is not None:
        positions, stats, previous = read_chunk(path, entry)
        if previous is not None and (not isinstance(previous, dict) or previous.get("stop") != entry["start"]):
            raise CheckpointMismatch(
                f"checkpoint {path}: the draw chunk {entry['file']} does not follow the one it names ({previous!r})"
            )
        if previous is None and entry["start"] != 0:
            raise CheckpointMismatch(f"checkpoint {path}: the first draw chunk {entry['file']} does not start at 0")
        yield entry, positions, stats
        del positions, stats
        entry = previous


def read_chunks(
    path: Union[str, os.PathLike], last: Optional[dict]
) -> List[Tuple[dict, torch.Tensor, Dict[str, torch.Tensor]]]:
    """All the chunks of :func:`iter_chunks` at once, from draw 0 (a resume streams them instead)."""
    return list(iter_chunks(path, last))[::-1]


def save_checkpoint(
    payload: dict,
    path: Union[str, os.PathLike],
    sync: bool = True,
    pending: Optional[list] = None,
    key: Optional[bytes] = None,
) -> None:
    """Write the index ``payload`` (with its format version and checksums) to ``path`` atomically
    (``fsync``-ed first with ``sync``); with a ``key``, signed (:func:`signature`)."""
    payload = {"format_version": FORMAT_VERSION, **payload}
    payload["checksums"] = checksums(payload)
    if key is not None:
        payload["signature"] = signature(key, payload["checksums"])
    _write_atomically(_serialise(payload), Path(path), sync, pending)


def load_checkpoint(path: Union[str, os.PathLike], fingerprint: Any, key: Optional[bytes] = None) -> dict:
    """Read a checkpoint's index, verify its signature (with a ``key``), every record's checksum and that it belongs
    to ``fingerprint``'s run."""
    payload = _load(Path(path).read_bytes(), str(path))
    if not isinstance(payload, dict):
        raise CheckpointMismatch(f"{path} is not a pyro_sgmcmc checkpoint (it holds a {type(payload).__name__})")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        earlier = (
            f" (written by an earlier pyro_sgmcmc, {_EARLIER_FORMATS.get(version, 'an older format')})"
            if isinstance(version, int) and not isinstance(version, bool) and version < FORMAT_VERSION
            else ""
        )
        raise CheckpointMismatch(
            f"checkpoint {path} has format {version!r}, expected {FORMAT_VERSION}{earlier}: start the run afresh "
            "(resume=False, or another checkpoint path)"
        )
    check_signature(path, payload, key)
    _verify(path, payload)
    if payload.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            f"checkpoint {path} was written by a run with different settings:\n"
            f"{_differences(payload.get('fingerprint'), fingerprint)}\n"
            "use another checkpoint path, delete the file, or pass resume=False"
        )
    return payload


def _verify(path, payload: dict) -> None:
    """Every record present, none added, each equal to its checksum."""
    saved = payload.get("checksums")
    if not isinstance(saved, dict):
        raise CheckpointMismatch(f"checkpoint {path} has no checksums")
    actual = checksums({k: v for k, v in payload.items() if k not in ("checksums", "signature")})
    for name in sorted(set(saved) | set(actual)):
        if saved.get(name) != actual.get(name):
            state = "missing" if name not in actual else "unlisted" if name not in saved else "altered or damaged"
            raise CheckpointMismatch(
                f"checkpoint {path}: record {name!r} does not match its checksum ({state}); the file was damaged or "
                "edited: delete it (and its .draws directory) or pass resume=False"
            )


def _differences(theirs: Any, ours: Any, prefix: str = "") -> str:
    """The settings that differ, one per line, each named by its full path (``kernel.step_size``): nested
    settings are compared field by field, so a line shows the field that differs, not the whole record."""
    if not (isinstance(theirs, dict) and isinstance(ours, dict)):
        return f"  {prefix or 'settings'}: theirs {theirs!r}, ours {ours!r}"
    lines = []
    for key in list(ours) + [k for k in theirs if k not in ours]:
        if theirs.get(key) != ours.get(key):
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(theirs.get(key), dict) and isinstance(ours.get(key), dict):
                lines.append(_differences(theirs[key], ours[key], name))
            else:
                lines.append(f"  {name}: theirs {theirs.get(key, '(absent)')!r}, ours {ours.get(key, '(absent)')!r}")
    return "\n".join(lines)


def expected_draws(steps_done: int, warmup_steps: int, thinning: int, num_kept_steps: int, capacity: int) -> int:
    """Draws a run keeps after ``steps_done`` steps (``capacity`` of the last ``num_kept_steps`` kept ones)."""
    kept = max(0, steps_done - warmup_steps) // thinning
    return max(0, kept - (num_kept_steps - capacity))
