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
from msd.checkpoint.validate import check_body
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
class Counters:
    """What the long-sample policy did over the steps consumed: samples split, truncated and
    dropped, and the tokens truncation cut off, per source (``(source, tokens)``, sorted, no
    zeros). Counted per step consumed, so a restart from a checkpoint counts each step once.
    ``empty``: samples delivered holding no tokens (null or empty text, or none after the
    transform): they take a position of the stream and no room in a row. ``images``: images
    delivered; ``skipped_images``: ``(source, images)`` of delivered samples left out
    (undecodable, no bytes, unpaired, past ``seq_len``), sorted, no zeros. ``trained``:
    ``(source, tokens)`` of delivered tokens the loss is taken on (a conversation's assistant
    turns; every token of other samples), sorted, no zeros."""

    split: int = 0
    truncated: int = 0
    dropped: int = 0
    truncated_tokens: tuple[tuple[int, int], ...] = ()
    empty: int = 0
    images: int = 0
    skipped_images: tuple[tuple[int, int], ...] = ()
    trained: tuple[tuple[int, int], ...] = ()

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.split + other.split,
            self.truncated + other.truncated,
            self.dropped + other.dropped,
            _add_per_source(self.truncated_tokens, other.truncated_tokens),
            self.empty + other.empty,
            self.images + other.images,
            _add_per_source(self.skipped_images, other.skipped_images),
            _add_per_source(self.trained, other.trained),
        )

    def __bool__(self) -> bool:
        kept = (self.split, self.truncated, self.dropped, self.truncated_tokens, self.empty)
        return any(kept) or bool(self.images or self.skipped_images or self.trained)

    def per_source(self, num_sources: int) -> tuple[int, ...]:
        """The tokens truncation cut off, one entry per source."""
        lost = dict(self.truncated_tokens)
        return tuple(lost.get(s, 0) for s in range(num_sources))

    def skipped_per_source(self, num_sources: int) -> tuple[int, ...]:
        """The images left out of delivered samples, one entry per source."""
        skipped = dict(self.skipped_images)
        return tuple(skipped.get(s, 0) for s in range(num_sources))

    def trained_per_source(self, num_sources: int) -> tuple[int, ...]:
        """The delivered tokens the loss is taken on, one entry per source."""
        trained = dict(self.trained)
        return tuple(trained.get(s, 0) for s in range(num_sources))

    def as_json(self) -> dict[str, Any]:
        doc = {
            "split": self.split,
            "truncated": self.truncated,
            "dropped": self.dropped,
            "truncated_tokens": [list(t) for t in self.truncated_tokens],
        }
        if self.empty:  # absent from files written before it: they read as 0
            doc["empty"] = self.empty
        if self.images:  # the same
            doc["images"] = self.images
        if self.skipped_images:
            doc["skipped_images"] = [list(t) for t in self.skipped_images]
        if self.trained:
            doc["trained"] = [list(t) for t in self.trained]
        return doc

    @staticmethod
    def from_json(doc: Any) -> Counters:
        """From ``as_json``'s object; absent (a checkpoint from before counters): zeros."""
        if doc is None:
            return Counters()
        lost = tuple(sorted((int(s), int(n)) for s, n in doc.get("truncated_tokens", ())))
        empty = int(doc.get("empty", 0))
        skipped = tuple(sorted((int(s), int(n)) for s, n in doc.get("skipped_images", ())))
        trained = tuple(sorted((int(s), int(n)) for s, n in doc.get("trained", ())))
        return Counters(
            int(doc["split"]),
            int(doc["truncated"]),
            int(doc["dropped"]),
            lost,
            empty,
            int(doc.get("images", 0)),
            skipped,
            trained,
        )


def _add_per_source(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    total = dict(a)
    for source, n in b:
        total[source] = total.get(source, 0) + n
    return tuple(sorted((s, n) for s, n in total.items() if n))


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
    counters: Counters = field(default_factory=Counters)

    @property
    def step(self) -> int:
        return self.state.step


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
