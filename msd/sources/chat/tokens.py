"""Rendered text to tokens: cut at the media markers, and which tokens a loss trains (pure).

A token is trained when its character offsets overlap a generation span, by transformers'
rule (``apply_chat_template(..., return_assistant_tokens_mask=True)``): the spans are walked
in the order the template recorded them, each token compared with the first span that does
not end at or before the token's start.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from msd.errors import SourceError
from msd.sources.chat.cells import Message
from msd.sources.chat.template import Span

Ids = npt.NDArray[np.int32]
Mask = npt.NDArray[np.bool_]
_NEVER = np.array([np.iinfo(np.int64).max])  # a span start past every token


@dataclass(frozen=True)
class TextSegment:
    """Rendered text between two media markers, and the generation spans within it (in its
    own characters)."""

    text: str
    spans: tuple[Span, ...]


class Markers:
    """Where an image (``image``) or a video (``video``) is in text; an empty marker is none."""

    def __init__(self, image: str, video: str) -> None:
        if image and image == video:
            raise SourceError(f"the image and video markers are both {image!r}; give each its own")
        self._kinds = {m: kind for m, kind in ((image, "image"), (video, "video")) if m}
        longest_first = sorted(self._kinds, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, longest_first))) if self._kinds else None

    def find(self, text: str) -> list[str]:
        """The kinds of the markers in ``text``, in order."""
        if self._pattern is None:
            return []
        return [self._kinds[m] for m in self._pattern.findall(text)]

    def declared(self, messages: list[Message]) -> list[str]:
        """The media of a conversation in order: its image and video parts, and the markers in
        its text (a ShareGPT ``value`` holds them; so may a text part)."""
        media: list[str] = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str):
                media += self.find(content)
                continue
            for part in content or ():
                kind = part["type"]
                media += self.find(part["text"]) if kind == "text" else [kind]
        return media

    def split(self, text: str, spans: Sequence[Span]) -> tuple[list[TextSegment], list[str]]:
        """``text`` cut at its markers (the markers left out), each piece with the spans that
        overlap it, and the kinds of the markers in order."""
        if self._pattern is None:
            return [TextSegment(text, tuple(spans))], []
        cuts = list(self._pattern.finditer(text))
        if not cuts:
            return [TextSegment(text, tuple(spans))], []
        starts = [0] + [m.end() for m in cuts]
        ends = [m.start() for m in cuts] + [len(text)]
        pieces = [_piece(text, a, b, spans) for a, b in zip(starts, ends, strict=True)]
        return pieces, [self._kinds[m.group()] for m in cuts]


def _piece(text: str, start: int, end: int, spans: Sequence[Span]) -> TextSegment:
    inside = tuple(
        (max(s, start) - start, min(e, end) - start) for s, e in spans if s < end and e > start
    )
    return TextSegment(text[start:end], inside)


def trained_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> Mask:
    """Which of the tokens at ``offsets`` overlap a span (transformers' rule, see above)."""
    if not spans or not offsets:
        return np.zeros(len(offsets), dtype=np.bool_)
    if any(a[1] > b[1] for a, b in itertools.pairwise(spans)):
        return _walked(offsets, spans)
    # Flattened first: numpy reads a list of tuples twice as slowly (a row's cost, every row).
    flat = itertools.chain.from_iterable(offsets)
    at = np.fromiter(flat, dtype=np.int64, count=2 * len(offsets)).reshape(-1, 2)
    token_starts = at[:, 0]
    if not (token_starts[1:] >= token_starts[:-1]).all():
        return _walked(offsets, spans)
    bounds = np.array(spans, dtype=np.int64)
    # Spans ending in order, tokens starting in order: the span a token is compared with is
    # the first one ending after the token starts; past the last span, one no token ends after.
    first = np.searchsorted(bounds[:, 1], token_starts, side="right")
    starts = np.concatenate((bounds[:, 0], _NEVER))
    mask: Mask = at[:, 1] > starts[first]
    return mask


def _walked(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> Mask:
    """`trained_mask` one token at a time, for spans or tokens out of order."""
    mask = np.zeros(len(offsets), dtype=np.bool_)
    at = 0
    for i, (start, end) in enumerate(offsets):
        while at < len(spans) and start >= spans[at][1]:
            at += 1
        if at == len(spans):
            break
        mask[i] = end > spans[at][0]
    return mask
