"""The payloads a Data Constructor holds until their step is built (no sockets).

A step's plan (from the Planner) says which samples ``(source, gpos)`` it needs; loaders send
their tokens, usually after the plan, sometimes just before it. The intake keeps, per step:

* for a planned step, the tokens of the samples its plan needs. A payload for a sample the plan
  does not list was routed by nobody: dropped (``unplanned``). The first copy of a sample wins
  (a shadow may send again what a lost loader sent: the same tokens), so a later payload can
  never replace tokens already held;
* for a step whose plan has not come yet, what arrived, within ``early_cap_bytes`` in all.
  When its plan comes, what it does not need is dropped (``unplanned``). Over the cap the
  furthest step's payloads go first (``over-capacity``): a legitimate early payload is for a
  step right after the planned ones, a flood spreads over the whole window.

Which steps are accepted at all (the window) is the Constructor's call; the intake only counts.
``payload_samples`` reads a payload's samples off its frames; ``early_cap_bytes`` sizes the cap.
"""

from __future__ import annotations

import numpy as np

from msd.batch.sample import SampleImages
from msd.recipe.schema import Recipe
from msd.wire.protocol import Payload, PayloadLayout, trained_spans
from msd.wire.rejects import Rejects

Key = tuple[int, int]  # (source, gpos)
# its tokens, its images if it has any, and the [start, end) spans of its tokens a loss is
# taken on (None: every token)
Sample = tuple[np.ndarray, SampleImages | None, np.ndarray | None]

EARLY_CAP_MIN_BYTES = 64 << 20


class Intake:
    def __init__(self, rejects: Rejects, early_cap_bytes: int) -> None:
        self.rejects = rejects
        self.early_cap_bytes = early_cap_bytes
        self.missing: dict[int, set[Key]] = {}  # planned step → samples not received yet
        self.held: dict[int, dict[Key, Sample]] = {}  # step → samples received for it
        # step → bytes of the payload frames it keeps samples of (a sample is a view on one)
        self.frame_bytes: dict[int, int] = {}

    @property
    def held_bytes(self) -> int:
        """Bytes of the payloads held for steps not built yet."""
        return sum(self.frame_bytes.values())

    @property
    def early_bytes(self) -> int:
        """Bytes of the payloads held for steps not planned yet."""
        return sum(b for s, b in self.frame_bytes.items() if s not in self.missing)

    def planned(self, step: int) -> bool:
        return step in self.missing

    def add(self, step: int, keys: list[Key], samples: list[Sample], frame_bytes: int) -> None:
        """The samples of one payload for ``step`` (``samples`` are views on its frame)."""
        held = self.held.setdefault(step, {})
        missing = self.missing.get(step)
        kept = 0
        for key, sample in zip(keys, samples, strict=True):
            if key in held:
                continue  # a second copy: the first stays
            if missing is not None and key not in missing:
                self.rejects.count("unplanned", f"step {step} does not need sample {key}")
                continue
            held[key] = sample
            kept += 1
            if missing is not None:
                missing.discard(key)
        if kept:
            self.frame_bytes[step] = self.frame_bytes.get(step, 0) + frame_bytes
        if missing is None and kept:
            self._bound_early()
        if not held:
            del self.held[step]

    def plan(self, step: int, needed: set[Key]) -> None:
        """The plan of ``step`` came: keep what it needs of what arrived, wait for the rest."""
        held = self.held.get(step, {})
        for key in [k for k in held if k not in needed]:
            del held[key]
            self.rejects.count("unplanned", f"step {step} does not need sample {key}")
        if not held:  # nothing kept: its frames are gone
            self.held.pop(step, None)
            self.frame_bytes.pop(step, None)
        self.missing[step] = needed - held.keys()

    def complete(self, step: int) -> bool:
        return not self.missing.get(step, True)

    def take(self, step: int) -> dict[Key, Sample]:
        """The samples of a complete step; the intake forgets the step."""
        del self.missing[step]
        self.frame_bytes.pop(step, None)
        return self.held.pop(step, {})

    def forget_below(self, step: int) -> None:
        """Drop whatever is held for steps before ``step`` (built already, or never will be)."""
        for old in [s for s in self.held if s < step]:
            del self.held[old]
            self.frame_bytes.pop(old, None)
        for old in [s for s in self.missing if s < step]:
            del self.missing[old]

    def _bound_early(self) -> None:
        while self.early_bytes > self.early_cap_bytes:
            furthest = max(s for s in self.frame_bytes if s not in self.missing)
            n = len(self.held.pop(furthest, {}))
            del self.frame_bytes[furthest]
            self.rejects.count("over-capacity", f"{n} samples of step {furthest} dropped")


def payload_samples(msg: Payload, buffers: list[memoryview]) -> list[Sample]:
    """Each sample of a payload: views on its frames (no copy), its images if it has any."""
    tokens = np.frombuffer(buffers[0], dtype=msg.token_dtype)  # checked on decode
    layout = PayloadLayout.of(msg)
    bounds, first, rows, grids = layout.bounds, layout.first, layout.rows, layout.grids
    images: list[SampleImages | None] = [None] * len(msg.gpos)
    if msg.images:
        patches = np.frombuffer(buffers[1], dtype=np.uint8).reshape(-1, msg.patch_values)
        for i, n in enumerate(msg.images):
            if n:
                own = grids[first[i] : first[i] + n]
                span = patches[rows[first[i]] : rows[first[i] + n]]
                videos = tuple(map(bool, msg.videos[first[i] : first[i] + n]))
                images[i] = SampleImages(
                    span,
                    tuple((t, h, w) for t, h, w in own.tolist()),
                    videos if any(videos) else (),
                    msg.video_rows,
                )
    spans = trained_spans(msg)
    return [
        (tokens[bounds[i] : bounds[i + 1]], images[i], None if spans is None else spans[i])
        for i in range(len(msg.gpos))
    ]


def early_cap_bytes(recipe: Recipe, groups: int) -> int:
    """How many bytes of payloads a Constructor keeps for steps not planned yet: the tokens (and
    at most the patches they stand for) of its rows over the whole planning window, eight times
    over, and at least 64 MiB."""
    window = 2 * recipe.constructor.prefetch_steps + 8
    per_token = 4
    if recipe.has_images:  # a placeholder token brings merge_size² patches with it
        per_token += recipe.bytes_per_visual_token
    step_bytes = groups * recipe.rows_per_rank * recipe.seq_len * per_token
    return max(EARLY_CAP_MIN_BYTES, 8 * window * step_bytes)
