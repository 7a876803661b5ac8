"""Keyed integrity of a checkpoint (``CheckpointSettings(key=...)``), for checkpoints that cross a trust boundary.

The SHA-256 checksums of :mod:`pyro_sgmcmc.checkpoint` detect damage, not a deliberate edit: whoever can write the
file can recompute them. With a key, the index also carries ``signature``, the HMAC-SHA256 (keyed by the user's
secret) of the checksums of all its records, which cover every record and, through the last chunk's SHA-256 and
the hash chain, every draw chunk. A resume with the key refuses an unsigned file, one signed with another key and
one edited by anyone without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Dict, Optional

from .checkpoint_errors import CheckpointMismatch

__all__ = ["signature", "check_signature"]


def signature(key: bytes, records: Dict[str, str]) -> str:
    """HMAC-SHA256, keyed by ``key``, of the checksums of every record (sorted by path): it covers the whole index,
    and through the last chunk's SHA-256 and the hash chain every draw chunk. Without the key it cannot be made."""
    text = json.dumps(sorted(records.items()))  # unambiguous whatever the names hold
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def check_signature(path, payload: dict, key: Optional[bytes]) -> None:
    """With a ``key``: the index must carry the signature that key makes of its checksums (compared in constant
    time); an unsigned file, or one signed with another key or edited, is a :class:`CheckpointMismatch`."""
    if key is None:
        return
    saved, records = payload.get("signature"), payload.get("checksums")
    if not isinstance(saved, str) or not isinstance(records, dict):
        raise CheckpointMismatch(
            f"checkpoint {path} is not signed, and this run's CheckpointSettings has a key: refused (a checkpoint "
            "written without the key cannot be told from a forged one)"
        )
    if not hmac.compare_digest(saved, signature(key, records)):
        raise CheckpointMismatch(
            f"checkpoint {path}: its signature does not match this run's key: it was signed with another key, or "
            "edited by someone without the key"
        )
