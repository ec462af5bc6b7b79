"""The checkpoint file formats: a snapshot (JSON, its body's sha256 inside) and the lines of
the per-step log (JSON, a CRC32 each). Plain numbers and names only: nothing is pickled."""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from msd.checkpoint.signing import signature, signed_by
from msd.checkpoint.snapshot import Counters, Snapshot, Totals
from msd.checkpoint.validate import check_body
from msd.errors import CheckpointError
from msd.plan.step import PlannerState

FORMAT = "msd-checkpoint"
VERSION = 1


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def encode_snapshot(snap: Snapshot, key: bytes | None = None) -> bytes:
    """The snapshot's file; with the job's signing ``key``, signed (``msd.checkpoint.signing``)."""
    body = {
        "step": snap.state.step,
        "cursors": list(snap.state.cursors),
        "carry": [list(c) for c in snap.state.carry],
        "fingerprint": snap.fingerprint,
        "recipe": snap.recipe,
        "num_rows": list(snap.num_rows),
        "mix_history": list(snap.mix_history),
        "totals": {
            "tokens": snap.totals.tokens,
            "source_samples": list(snap.totals.source_samples),
            "source_tokens": list(snap.totals.source_tokens),
        },
        "created": snap.created,
        "counters": snap.counters.as_json(),
    }
    canonical = _canonical(body)  # the bulk of the file (a cursor per source): encoded once
    rest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "sha256": hashlib.sha256(canonical).hexdigest(),
    }
    if key is not None:
        rest["hmac"] = signature(key, canonical)
    # The document's keys sorted put "body" first: the same bytes as dumping it whole.
    return b'{"body":' + canonical + b"," + _canonical(rest)[1:] + b"\n"


def verified(data: bytes, key: bytes | None) -> bool:
    """Whether the snapshot in ``data`` carries a signature by ``key`` that matches."""
    if key is None:
        return False
    try:
        doc = json.loads(data)
        return signed_by(doc, _canonical(doc["body"]), key) is True
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return False


def decode_snapshot(data: bytes, where: Path, key: bytes | None = None) -> Snapshot:
    """A snapshot from its bytes; a ``CheckpointError`` naming ``where`` if it is truncated,
    corrupt, of another format or of a version this msd does not read, if a field is not of
    its type or out of range, or, given its job's signing ``key``, if it is signed and the
    signature does not match."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(
            f"{where} is not a complete checkpoint (truncated or not JSON)"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not an msd checkpoint")
    if doc.get("version") != VERSION:
        raise CheckpointError(
            f"{where} has checkpoint version {doc.get('version')!r}; this msd reads {VERSION}"
        )
    body = doc.get("body")
    if not isinstance(body, dict) or hashlib.sha256(_canonical(body)).hexdigest() != doc.get(
        "sha256"
    ):
        raise CheckpointError(f"{where} is corrupt: its content does not match its sha256")
    if key is not None and signed_by(doc, _canonical(body), key) is False:
        raise CheckpointError(
            f"{where} was changed after it was written: its signature does not match its "
            "job's key; restore an untouched copy"
        )
    check_body(body, where)
    try:
        totals = body["totals"]
        return Snapshot(
            state=PlannerState(
                int(body["step"]),
                tuple(int(c) for c in body["cursors"]),
                tuple((int(s), int(g)) for s, g in body["carry"]),
            ),
            fingerprint=str(body["fingerprint"]),
            recipe=dict(body["recipe"]),
            num_rows=tuple(int(n) for n in body["num_rows"]),
            mix_history=tuple(body["mix_history"]),
            totals=Totals(
                int(totals["tokens"]),
                tuple(int(x) for x in totals["source_samples"]),
                tuple(int(x) for x in totals["source_tokens"]),
            ),
            created=float(body["created"]),
            counters=Counters.from_json(body.get("counters")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{where} is malformed ({exc})") from None


@dataclass(frozen=True)
class Delta:
    """One consumed step in the log: the state at ``step`` is the state at ``step - 1`` with
    ``moved`` added to the cursors (source, how many) and ``carry`` as the carry. What the
    consumed step delivered: ``tokens``, ``sources`` (source, samples, tokens; sources with
    none left out) and ``counters``."""

    step: int
    moved: tuple[tuple[int, int], ...]
    carry: tuple[tuple[int, int], ...]
    tokens: int = 0
    sources: tuple[tuple[int, int, int], ...] = ()
    counters: Counters = field(default_factory=Counters)

    @staticmethod
    def between(
        before: PlannerState,
        after: PlannerState,
        tokens: int = 0,
        sources: tuple[tuple[int, int, int], ...] = (),
        counters: Counters | None = None,
    ) -> Delta:
        old, new = np.array(before.cursors, dtype=np.int64), np.array(after.cursors, dtype=np.int64)
        if old.shape != new.shape:
            raise ValueError("the states before and after a step have different sources")
        drawn = np.flatnonzero(old != new)  # the few sources a step drew from
        moved = tuple(zip(drawn.tolist(), (new[drawn] - old[drawn]).tolist(), strict=True))
        return Delta(after.step, moved, after.carry, tokens, sources, counters or Counters())

    def apply(self, state: PlannerState) -> PlannerState:
        if self.step != state.step + 1:
            raise CheckpointError(f"log step {self.step} does not follow step {state.step}")
        cursors = list(state.cursors)
        for s, n in self.moved:
            cursors[s] += n
        return PlannerState(self.step, tuple(cursors), self.carry)


def encode_delta(delta: Delta) -> bytes:
    body = {
        "step": delta.step,
        "moved": [list(m) for m in delta.moved],
        "carry": [list(c) for c in delta.carry],
        "tokens": delta.tokens,
    }
    if delta.sources:  # absent from lines written before it: they read as none
        body["sources"] = [list(s) for s in delta.sources]
    if delta.counters:
        body["counters"] = delta.counters.as_json()
    crc = zlib.crc32(_canonical(body))
    return json.dumps({**body, "crc": crc}, separators=(",", ":")).encode() + b"\n"


def decode_delta(line: bytes) -> Delta | None:
    """A log line's delta; None if the line is incomplete or does not match its CRC."""
    try:
        doc = json.loads(line)
        crc = doc.pop("crc")
        if zlib.crc32(_canonical(doc)) != crc:
            return None
        return Delta(
            int(doc["step"]),
            tuple((int(s), int(n)) for s, n in doc["moved"]),
            tuple((int(s), int(g)) for s, g in doc["carry"]),
            int(doc["tokens"]),
            tuple((int(s), int(n), int(t)) for s, n, t in doc.get("sources", ())),
            Counters.from_json(doc.get("counters")),
        )
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None
