"""One source's conversations to token ids and the tokens its loss trains (pure, no sockets)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from msd.errors import SourceError
from msd.sources.chat.cells import REASONS as CELL_REASONS
from msd.sources.chat.cells import Message, parse, with_system
from msd.sources.chat.template import ChatTemplate, CompiledTemplate, Span
from msd.sources.chat.tokens import Ids, Markers, Mask, TextSegment, trained_mask

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

log = logging.getLogger(__name__)

Loss = Literal["assistant", "all", "last"]
LOSSES: tuple[str, ...] = get_args(Loss)

# The reasons a conversation is left out, beside those of `msd.sources.chat.cells`.
NO_ASSISTANT = "no assistant turn"
TEMPLATE_FAILED = "template failed"
MEDIA_MISMATCH = "markers do not match the media"
NO_TRAINED = "no trained tokens"
# Every reason `Conversations.render` may give.
REASONS = (*CELL_REASONS, NO_ASSISTANT, TEMPLATE_FAILED, MEDIA_MISMATCH, NO_TRAINED)


@dataclass(frozen=True)
class Segment:
    """The tokens of the text between two media markers, and which of them are trained."""

    ids: Ids
    trained: Mask


@dataclass(frozen=True)
class RenderedText:
    """A conversation rendered: the text, the generation spans the loss keeps, the text cut at
    its media markers (one more segment than ``media``), and the media kinds in order."""

    text: str
    spans: tuple[Span, ...]
    segments: tuple[TextSegment, ...]
    media: tuple[str, ...]


@dataclass(frozen=True)
class Rendered:
    """A conversation tokenized: ``segments[i]``, then the placeholders of ``media[i]``
    (``"image"`` or ``"video"``), then ``segments[i + 1]``. Without media, one segment: the
    whole text tokenized at once, ``ids`` and ``trained`` as transformers gives them."""

    segments: tuple[Segment, ...]
    media: tuple[str, ...]

    @property
    def ids(self) -> Ids:
        """The segments' ids back to back (the media's placeholders left out)."""
        if len(self.segments) == 1:
            return self.segments[0].ids
        return np.concatenate([s.ids for s in self.segments])

    @property
    def trained(self) -> Mask:
        """Which of `ids` are trained."""
        if len(self.segments) == 1:
            return self.segments[0].trained
        return np.concatenate([s.trained for s in self.segments])


class Conversations:
    """The conversations of one source: its chat template compiled once, its tokenizer, its
    loss (``assistant``, ``all`` or ``last``), system prompt and media markers (image, video;
    ``""``: none). Raises `SourceError` for a template that cannot serve the loss."""

    def __init__(
        self,
        template: ChatTemplate,
        tokenizer: Tokenizer,
        loss: Loss = "assistant",
        system: str | None = None,
        markers: tuple[str, str] = ("<image>", "<video>"),
    ) -> None:
        if loss not in LOSSES:
            raise SourceError(f"loss is {loss!r}; use one of {', '.join(LOSSES)}")
        self._template = CompiledTemplate(template)
        if loss != "all" and not self._template.has_generation:
            raise SourceError(
                f"loss {loss!r} trains the tokens inside the chat template's "
                "{% generation %} blocks, and this template has none; wrap each assistant "
                "reply and its end-of-turn token in {% generation %}...{% endgeneration %}, "
                "or set loss: all"
            )
        self.loss, self.system = loss, system
        self._markers = Markers(*markers)
        self._tokenizer = _untruncated(tokenizer)

    def text(self, cell: object) -> RenderedText | str:
        """``cell`` rendered with the template (not tokenized), or why it is left out."""
        messages = parse(cell)
        if isinstance(messages, str):
            return messages
        messages = with_system(messages, self.system)
        if self.loss != "all" and not any(m["role"] == "assistant" for m in messages):
            return NO_ASSISTANT
        media = self._markers.declared(messages)
        rendered = self._render(messages)
        if isinstance(rendered, str):
            return rendered
        text, spans = rendered
        if self.loss == "last":
            spans = spans[-1:]
        segments, found = self._markers.split(text, spans)
        if found != media:
            return MEDIA_MISMATCH
        return RenderedText(text, tuple(spans), tuple(segments), tuple(media))

    def render(self, cell: object) -> Rendered | str:
        """``cell`` rendered and tokenized, or why it is left out."""
        return self.render_batch([cell])[0]

    def render_batch(self, cells: Sequence[object]) -> list[Rendered | str]:
        """`render` of each cell, the texts of all of them tokenized in one batch."""
        texts = [self.text(cell) for cell in cells]
        pieces = [s.text for t in texts if not isinstance(t, str) for s in t.segments]
        encodings = iter(self._tokenizer.encode_batch(pieces, add_special_tokens=False))
        return [t if isinstance(t, str) else self._tokenized(t, encodings) for t in texts]

    def _render(self, messages: list[Message]) -> tuple[str, list[Span]] | str:
        try:
            return self._template.render(messages)
        except Exception as exc:  # the template is code: whatever it raises, the row is out
            log.debug("chat template failed on a conversation: %s: %s", type(exc).__name__, exc)
            return TEMPLATE_FAILED

    def _tokenized(self, text: RenderedText, encodings: Iterator[Encoding]) -> Rendered | str:
        segments = tuple(self._segment(piece, next(encodings)) for piece in text.segments)
        if not any(s.trained.any() for s in segments):
            return NO_TRAINED
        return Rendered(segments, text.media)

    def _segment(self, piece: TextSegment, encoding: Encoding) -> Segment:
        ids = np.asarray(encoding.ids, dtype=np.int32)
        if self.loss == "all":
            return Segment(ids, np.ones(len(ids), dtype=np.bool_))
        return Segment(ids, trained_mask(encoding.offsets, piece.spans))


def _untruncated(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer``, or a copy of it that neither truncates nor pads (as transformers encodes
    a chat), the caller's left as it is."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    own = type(tokenizer).from_str(tokenizer.to_str())
    own.no_truncation()
    own.no_padding()
    return own
