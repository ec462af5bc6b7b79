"""A conversation source's rows as samples: token ids, and the spans of them its loss is taken
on (``msd.sources.chat`` renders and tokenizes each conversation; this reads them from a column
and frames them as documents).

A row whose conversation is left out (malformed, a template that raises, nothing to train) is
an empty sample, counted by reason in ``skips`` ("conversations left out (<reason>)"); a null
cell is an empty sample, as a null text is. ``bos``/``eos`` of the source's transform go around
each conversation and are not trained: the template's own end-of-turn tokens are.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from msd.recipe.schema import Source
from msd.sources.chat import ChatTemplate, Conversations, Rendered
from msd.sources.formats.base import ColumnKind
from msd.sources.transforms import Ids, Tokenize, boundaries, load_tokenizer, make_transform

LEFT_OUT = "conversations left out"  # followed by the reason, e.g. "(unknown role)"
_EMPTY: Ids = np.zeros(0, dtype=np.int32)
_NO_SPANS = np.zeros((0, 2), dtype=np.int64)


def conversations_of(source: Source, markers: tuple[str, str] = ("", "")) -> Conversations:
    """The renderer of ``source``'s conversations (its ``chat`` section and tokenizer); a
    template that cannot be loaded or cannot serve the loss is a `SourceError`."""
    chat = source.chat
    assert chat is not None
    template = ChatTemplate.load(chat.template)
    tokenizer = load_tokenizer(source.transform.path)
    return Conversations(template, tokenizer, chat.loss, chat.system, markers)


def spans_of(trained: np.ndarray) -> np.ndarray:
    """The ``[start, end)`` runs of True in ``trained``, as an int64 [k, 2] array."""
    padded = np.zeros(len(trained) + 2, dtype=np.bool_)
    padded[1:-1] = trained
    # Where the value changes: a run's start, then its end, alternately (it starts False).
    changes = np.flatnonzero(padded[1:] != padded[:-1])
    return changes.astype(np.int64, copy=False).reshape(-1, 2)


def cells_of(column: pa.Array) -> list[object]:
    """A column's conversations as Python values: lists of messages as they are, JSON text as
    ``str`` or ``bytes`` (parsed by ``msd.sources.chat``), nulls as None."""
    return list(column.to_pylist())


class ChatRows:
    """Turns a column of conversations into samples (a `Tokenize`: ids per row) and keeps, for
    the rows of the last call, the spans of each sample trained (``trained``)."""

    def __init__(self, source: Source) -> None:
        self.conversations = conversations_of(source)
        self.bos, self.eos = boundaries(source.transform)
        self.skips: Counter[str] = Counter()
        self.trained: list[np.ndarray] = []

    def __call__(self, column: pa.Array) -> list[Ids]:
        cells = cells_of(column)
        rendered = self.conversations.render_batch(cells)
        ids: list[Ids] = []
        self.trained = []
        for cell, r in zip(cells, rendered, strict=True):
            if cell is None or isinstance(r, str):
                if cell is not None:
                    self.skips[f"{LEFT_OUT} ({r})"] += 1
                ids.append(_EMPTY)
                self.trained.append(_NO_SPANS)
            else:
                tokens, spans = self.framed(r)
                ids.append(tokens)
                self.trained.append(spans)
        return ids

    def framed(self, rendered: Rendered) -> tuple[Ids, np.ndarray]:
        """A conversation's ids with the transform's bos and eos around, and the spans of them
        trained (`spans_of`)."""
        head = 0 if self.bos is None else 1
        body = rendered.ids
        tokens = np.empty(head + len(body) + (self.eos is not None), dtype=np.int32)
        if self.bos is not None:
            tokens[0] = self.bos
        tokens[head : head + len(body)] = body
        if self.eos is not None:
            tokens[-1] = self.eos
        spans = spans_of(rendered.trained)
        return tokens, spans + head if head else spans


def tokenize_of(source: Source, column_kind: ColumnKind) -> Tokenize:
    """How a loader turns ``source``'s column into samples: its conversations (a `ChatRows`),
    or its transform."""
    if source.chat is not None:
        return ChatRows(source)
    return make_transform(source.transform, column_kind)
