"""Fingerprints of what a run's draws depend on: data, code and settings, by content (see :mod:`.content`)."""

from .arguments import model_fingerprint
from .content import ContentHasher, Unfingerprintable, content_digest
from .schedules import check_schedule_state, describe_schedule

__all__ = [
    "ContentHasher",
    "Unfingerprintable",
    "check_schedule_state",
    "content_digest",
    "describe_schedule",
    "model_fingerprint",
]
