"""Snapshots signed with the job's key: a snapshot embeds the recipe, and ``msd restore`` runs
its ``trainer.command``, so a checkpoint file must not become code that runs.

The Planner (and ``msd restore``, for the snapshot a new job starts from) adds an HMAC-SHA256
of the body, keyed by a secret derived from the job's key file (``JOB/job.key``, 0600), as the
document's ``hmac``. A snapshot read with that key is *verified* when the HMAC matches, refused
when it does not ("changed after it was written"), and unverified when it has none (written
before signing) or no key is at hand (copied away from its job folder): ``msd restore`` then
takes the command from the recipe given with ``--recipe``, never from the file.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

from msd.errors import MsdError
from msd.wire.keys import KEY_FILE, JobKeys, load_keys

_CONTEXT = b"msd checkpoint signature v1"


def signing_key(keys: JobKeys) -> bytes:
    """The secret snapshots are signed with, derived from the job's CURVE secrets."""
    return hmac.new(keys.server_secret + keys.client_secret, _CONTEXT, hashlib.sha256).digest()


def signature(key: bytes, canonical_body: bytes) -> str:
    return hmac.new(key, canonical_body, hashlib.sha256).hexdigest()


def signed_by(doc: dict[str, Any], canonical_body: bytes, key: bytes) -> bool | None:
    """Whether the document's ``hmac`` matches ``key``; None when it has none."""
    mac = doc.get("hmac")
    if mac is None:
        return None
    return isinstance(mac, str) and hmac.compare_digest(mac, signature(key, canonical_body))


def job_key_file(path: Path) -> Path:
    """Where the job key of a checkpoint path lives: ``JOB/job.key`` for ``JOB``,
    ``JOB/checkpoints`` or ``JOB/checkpoints/step-N.json``."""
    folder = path.parent if path.is_file() else path
    if folder.name == "checkpoints":
        folder = folder.parent
    return folder / KEY_FILE


def key_for(path: Path) -> bytes | None:
    """The signing key of the job a checkpoint path belongs to; None if its key file is
    missing or unreadable (then nothing from the file can be verified)."""
    key_file = job_key_file(path)
    if not key_file.is_file():
        return None
    try:
        return signing_key(load_keys(key_file))
    except MsdError:
        return None
