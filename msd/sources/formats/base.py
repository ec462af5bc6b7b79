"""What every source format implements: index a file once, then read one row group's column.

A *row group* is the unit a loader reads and the shuffle moves whole (a Parquet row group, a
run of JSONL lines, a run of Megatron documents, an Arrow record batch): rows in a fixed order,
numbered from 0 within the file. Nothing above this layer knows formats: the Planner sees row
counts, a loader gets an Arrow array per row group — ``string``/``binary`` cells for text, a
list of integers per row for token ids — exactly as a Parquet column would give it.

Every problem a user can fix is a `msd.errors.SourceError` of one sentence naming the source,
its recipe key and the file; rows a file holds but that cannot become samples (a malformed
JSON line) are left out of the index, the same on every run, and listed in ``problems``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import msgspec
import pyarrow as pa

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources import storage
from msd.sources.cache import CacheConfig, CacheError, folder
from msd.sources.storage import Store

# What a source's column holds: text, token id lists, or conversations (a list of messages in
# the file's own types, or its JSON: msd.sources.chat reads either).
ColumnKind = Literal["text", "tokens", "chat"]


@dataclass(frozen=True)
class FileIndex:
    """One file of a source: the rows of each of its row groups, in reading order.

    ``holds_text``: False only when the file proves the column null or empty in every row (the
    source is refused if every file says so). ``problems``: rows left out, one sentence each.
    """

    group_rows: tuple[int, ...]
    holds_text: bool = True
    problems: tuple[str, ...] = ()


class FileReader(Protocol):
    """An open file: reads the ``column`` (of the kind it was opened for) of row group
    ``group`` as one Arrow array."""

    def read(self, group: int, column: str) -> pa.Array: ...

    def close(self) -> None: ...


class Format(Protocol):
    """A source format: which files a source's ``path`` names, their indexes, their readers."""

    name: str

    def files(self, source: Source, key: str) -> tuple[str, ...]:
        """The files ``source.path`` names, in the source's fixed order (raise if none)."""
        ...

    def index(
        self, source: Source, key: str, path: str, column: str, kind: ColumnKind
    ) -> FileIndex:
        """Index ``path`` (reading metadata, or once the whole file, then from a cache)."""
        ...

    def open(self, path: str, kind: ColumnKind, store: Store, group_rows: int | None) -> FileReader:
        """A reader of ``path`` (on ``store`` where it is a URL) for columns of ``kind``
        (JSONL parses by it); ``group_rows``: the source's, for formats that cut their own
        row groups (``Source.group_rows``)."""
        ...


def store_of(source: Source) -> Store:
    """How ``source``'s files are reached (its ``endpoint_url`` and ``cache``; local paths
    ignore both); read through a cache, each file the job listed must still be as listed."""
    cache = source.cache
    if cache is None:
        return Store(endpoint_url=source.endpoint_url, anonymous=source.anonymous)
    listed = {f.path: (f.size, f.mtime_ns) for f in source.files} or None
    return Store(
        endpoint_url=source.endpoint_url,
        anonymous=source.anonymous,
        cache=CacheConfig(cache.dir, cache.max_bytes),
        listed=listed,
    )


def as_launched(source: Source, cluster: str) -> Source:
    """``source`` as ``msd launch`` reads it (footers, a profile): through its local cache
    where the loaders run on the same machine (``cluster: local``: what it reads, they find),
    else without (a SLURM node's ``$TMPDIR`` is its own, and the login node keeps nothing)."""
    if cluster == "local" or source.cache is None:
        return source
    return msgspec.structs.replace(source, cache=None)


def check_cache(source: Source, key: str) -> None:
    """``source``'s local cache can be used on this machine (its folder made if missing); a
    `SourceError` naming the source if not. A local source has none to check."""
    if source.cache is None or not storage.is_remote(source.path):
        return
    try:
        folder(source.cache.dir)
    except CacheError as exc:
        raise SourceError(f"source '{source.name}' ({key}): {exc}") from None


def glob_files(source: Source, key: str) -> tuple[str, ...]:
    """The regular files ``source.path`` (a glob; ``~`` expanded, ``**`` recursive; or an
    object store's URL) matches, as sorted absolute paths or URLs — or, in a job, the files it
    matched when the job started (``Source.files``)."""
    if source.files:
        return tuple(f.path for f in source.files)
    files = tuple(f.path for f in listing(source, key, source.path))
    if not files:
        hint = (
            f"check the {storage.bucket_word(source.path)} and prefix"
            if storage.is_remote(source.path)
            else "check the path, relative paths are taken from the current directory"
        )
        raise SourceError(
            f"source '{source.name}' ({key}.path): no file matches '{source.path}'; {hint}"
        )
    return files


def listing(source: Source, key: str, pattern: str) -> tuple[storage.Listed, ...]:
    """``storage.glob`` of ``pattern``, an object store's refusal as a `SourceError`."""
    try:
        return storage.glob(pattern, store_of(source))
    except storage.StoreError as exc:
        raise SourceError(f"source '{source.name}' ({key}.path): {exc}") from exc


def cache_dir(kind: str) -> Path:
    """Where indexes of ``kind`` (``webdataset``, ``jsonl``) are cached: ``$MSD_CACHE_DIR/kind``,
    else ``~/.cache/msd/kind``."""
    root = os.environ.get("MSD_CACHE_DIR")
    return Path(root) / kind if root else Path.home() / ".cache" / "msd" / kind


def file_key(path: str, store: Store = storage.LOCAL) -> str:
    """A name for a cached index of ``path`` that changes when the file does (`listed_key` of
    it as it is now)."""
    return listed_key(storage.stat(path, store), store)


def listed_key(found: storage.Listed, store: Store = storage.LOCAL) -> str:
    """A name for something cached of a file as ``found`` (its absolute path, or its URL and
    store's endpoint: one key on two stores is two files; its size and modification time)."""
    if storage.is_remote(found.path):
        where = f"{found.path}\0{storage.endpoint_of(store, found.path)}"
    else:
        where = os.path.abspath(found.path)
    text = f"{where}\0{found.size}\0{found.mtime_ns}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def check_column(
    source: Source, key: str, path: str, schema: pa.Schema, column: str, kind: ColumnKind
) -> None:
    """``column`` is in ``schema`` and holds text (``kind`` text), integer lists (tokens), or
    conversations (chat: lists, or their JSON as text)."""
    field_key = f"{key}.{'token_column' if kind == 'tokens' else 'text_column'}"
    where = f"source '{source.name}' ({field_key}): '{path}'"
    if schema.get_field_index(column) < 0:
        names = ", ".join(schema.names) or "none"
        raise SourceError(
            f"{where} has no column '{column}' (it has: {names}); set {field_key} to one of them"
        )
    typ = schema.field(column).type
    if kind == "text" and not is_text(typ):
        raise SourceError(
            f"{where} column '{column}' is {typ}, not string or binary; "
            "use token_column for pre-tokenized lists"
        )
    if kind == "tokens" and not is_tokens(typ):
        raise SourceError(
            f"{where} column '{column}' is {typ}, not a list of integers; use text_column for text"
        )
    listed = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    if kind == "chat" and not (is_text(typ) or listed):
        raise SourceError(
            f"{where} column '{column}' is {typ}, not a list of messages or their JSON; name "
            "the column that holds each row's conversation"
        )


def is_text(typ: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )


def is_tokens(typ: pa.DataType) -> bool:
    is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    return bool(is_list and pa.types.is_integer(typ.value_type))


def reason(exc: BaseException) -> str:
    """The first sentence of an exception's message (Arrow's errors run to several)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return first.split(". ")[0].rstrip(".")


def check_image_column(
    source: Source, key: str, path: str, schema: pa.Schema, field: str = "image_column"
) -> None:
    """An image (``field="video_column"``: video) column holds binary, ``{bytes, ...}`` structs,
    or lists of either."""
    column = getattr(source, field)
    assert column is not None
    what = "video" if field == "video_column" else "image"
    if schema.get_field_index(column) < 0:
        names = ", ".join(schema.names) or "none"
        raise SourceError(
            f"source '{source.name}' ({key}.{field}): '{path}' has no column '{column}' "
            f"(it has: {names}); set {field} to one of them"
        )
    typ = schema.field(column).type
    inner = typ.value_type if pa.types.is_list(typ) or pa.types.is_large_list(typ) else typ
    if is_binary(inner) or (pa.types.is_struct(inner) and bytes_field(inner) is not None):
        return
    raise SourceError(
        f"source '{source.name}' ({key}.{field}): '{path}' column "
        f"'{column}' is {typ}, not binary, a{'n' if what == 'image' else ''} {what} struct with "
        "a binary 'bytes' field, or a list of those"
    )


def bytes_field(typ: pa.StructType) -> str | None:
    """The name of a struct's binary ``bytes`` field (the Hugging Face Image struct's)."""
    for i in range(typ.num_fields):
        field = typ.field(i)
        if field.name == "bytes" and is_binary(field.type):
            return str(field.name)
    return None


def is_binary(typ: pa.DataType) -> bool:
    return bool(pa.types.is_binary(typ) or pa.types.is_large_binary(typ))
