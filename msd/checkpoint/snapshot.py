"""What a checkpoint holds, as plain values: the Planner's state at a step and what it needs to
be continued (``Snapshot``), with the job's totals and counters. Its files:
``msd.checkpoint.format``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from msd.plan.step import PlannerState


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
