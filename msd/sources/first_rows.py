"""The first conversations of each file of a conversation source, rendered as a loader would
render them: what `msd validate` looks at before any job starts.

Each file's first `ROWS` rows are read (from its first row group, or its shard's first samples)
and rendered with the source's chat template and tokenizer. A conversation left out is data (a
job leaves it out and counts it), so a file whose first rows hold one is a warning naming the
row and the reason; a source none of whose first rows renders is a wrong column or a template
that does not fit the data, so it is an error.
"""

from __future__ import annotations

import itertools

import numpy as np

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.chat_rows import cells_of, conversations_of
from msd.sources.image_rows import ImageRowReader
from msd.sources.index import RowGroup, SourceIndex
from msd.sources.read import RowGroupReader

ROWS = 8  # rows of each file rendered


def first_rows_problems(
    source: Source, index: SourceIndex, key: str, markers: tuple[str, str] = ("", "")
) -> tuple[str, ...]:
    """One sentence for each file of ``source`` whose first rows hold a conversation that is left
    out (the first such row); raises `SourceError` when no first row of any file renders."""
    conversations = conversations_of(source, markers)
    reader = RowGroupReader()
    rows_of = ImageRowReader(source, index, reader) if index.has_images else None
    problems: list[str] = []
    rendered = 0
    first_reason = ""
    try:
        for file, groups in itertools.groupby(index.row_groups, key=lambda rg: rg.file):
            cells = _first_cells(next(groups), index, reader, rows_of)
            results = conversations.render_batch(cells)
            bad = [(r, why) for r, why in enumerate(results) if isinstance(why, str)]
            rendered += len(results) - len(bad)
            if bad:
                row, why = bad[0]
                first_reason = first_reason or str(why)
                problems.append(
                    f"source '{source.name}' ({key}): '{file}' row {row}: its conversation is "
                    f"left out ({why}); a job leaves such rows out and counts them by reason"
                )
    finally:
        reader.close()
        if rows_of is not None:
            rows_of.close()
    if not rendered:
        raise SourceError(
            f"source '{source.name}' ({key}.text_column): none of the first {ROWS} rows of its "
            f"{len(index.files)} file(s) is a conversation its chat template renders (first: "
            f"{first_reason}); name the column that holds each conversation, or fix the template"
        )
    return tuple(problems)


def _first_cells(
    rg: RowGroup, index: SourceIndex, reader: RowGroupReader, rows_of: ImageRowReader | None
) -> list[object]:
    """The first `ROWS` conversation cells of row group ``rg``."""
    n = min(ROWS, rg.num_rows)
    if rows_of is not None:
        texts = rows_of.read(rg, np.arange(n)).field("text")
        return cells_of(texts)
    return cells_of(reader.read(rg, index.column).slice(0, n))
