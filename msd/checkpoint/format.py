"""The checkpoint file formats: a snapshot (JSON, its body's sha256 inside) and the lines of
the per-step log (JSON, a CRC32 each). Plain numbers and names only: nothing is pickled."""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msd.errors import CheckpointError
from msd.plan.step import PlannerState

FORMAT = "msd-checkpoint"
VERSION = 1


@dataclass(frozen=True)
class Totals:
    """What the job had delivered by the checkpoint's step (for ``msd status`` after a restore)."""

    tokens: int = 0
    source_samples: tuple[int, ...] = ()
    source_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """The Planner's state at ``state.step`` (every rank has consumed the steps before it), with
    what it needs to be continued: the recipe (as validated, a JSON object), each source's row
    count, and the mix history (``{"step", "weights"}`` entries, by source name)."""

    state: PlannerState
    fingerprint: str
    recipe: dict[str, Any]
    num_rows: tuple[int, ...]
    mix_history: tuple[dict[str, Any], ...] = ()
    totals: Totals = field(default_factory=Totals)
    created: float = 0.0

    @property
    def step(self) -> int:
        return self.state.step


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def encode_snapshot(snap: Snapshot) -> bytes:
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
    }
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    doc = {"format": FORMAT, "version": VERSION, "sha256": digest, "body": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def decode_snapshot(data: bytes, where: Path) -> Snapshot:
    """A snapshot from its bytes; a ``CheckpointError`` naming ``where`` if it is truncated,
    corrupt, of another format or of a version this msd does not read."""
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
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where} is malformed ({exc})") from None


@dataclass(frozen=True)
class Delta:
    """One consumed step in the log: the state at ``step`` is the state at ``step - 1`` with
    ``moved`` added to the cursors (source, how many) and ``carry`` as the carry."""

    step: int
    moved: tuple[tuple[int, int], ...]
    carry: tuple[tuple[int, int], ...]
    tokens: int = 0

    @staticmethod
    def between(before: PlannerState, after: PlannerState, tokens: int = 0) -> Delta:
        moved = tuple(
            (s, a - b)
            for s, (b, a) in enumerate(zip(before.cursors, after.cursors, strict=True))
            if a != b
        )
        return Delta(after.step, moved, after.carry, tokens)

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
        )
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        return None
