"""Source formats: each indexes its files and reads a row group's column as Arrow
(``base.Format``); the rest of msd sees row groups and arrays, never a format.

WebDataset shards are indexed in ``msd.sources.webdataset`` and read by
``msd.sources.image_rows`` (their rows are text + images, not one column).
"""

from __future__ import annotations

from msd.sources.formats import arrow, jsonl, megatron, parquet
from msd.sources.formats.base import Format

FORMATS: dict[str, Format] = {
    f.name: f for f in (parquet.FORMAT, jsonl.FORMAT, arrow.FORMAT, megatron.FORMAT)
}
