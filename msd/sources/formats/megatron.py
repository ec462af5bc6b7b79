"""Megatron-LM / NeMo indexed datasets: a ``.bin`` of raw token ids and its ``.idx``.

A sample is one *document* (its sequences' tokens, concatenated); a row group is a run of
consecutive documents holding at most `GROUP_TOKENS` tokens (one longer document is a group of
its own), or of ``group_rows`` documents where the source sets it. Reads are zero-copy views
of a memory map of the ``.bin`` whenever a group's sequences lie back to back, as Megatron's
builder writes them; other layouts are gathered.

A dataset in an object store (`msd.sources.storage`) is read the same way without a
map: its ``.idx`` is read whole (the header first, to check the sizes it claims) and held in
memory while the file is open, and a row group's tokens are one ranged read of the ``.bin``.

The ``.idx`` layout followed is version 1, as ``megatron/core/datasets/indexed_dataset.py``
(megatron-core 0.16, ``_IndexWriter``/``_IndexReader``) writes it, all little-endian:

- 9 bytes magic ``MMIDIDX\\x00\\x00``, uint64 version (1), uint8 dtype code (1 uint8, 2 int8,
  3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16; floats are refused);
- uint64 sequence count *S*, uint64 document count *D* (the length of ``document_indices``,
  which starts with 0, so a file holds *D* - 1 documents);
- int32 ``sizes[S]`` (tokens per sequence), int64 ``pointers[S]`` (byte offsets into the
  ``.bin``), int64 ``document_indices[D]`` (0, then the sequence index ending each document,
  the last being *S*);
- for a multimodal dataset only, int8 ``modes[S]``; accepted only when every mode is 0 (text).

Every byte is untrusted: counts are checked against the file size, sizes and pointers against
the ``.bin`` and the dtype, document indices for being monotonic from 0 to *S*, each as one
`SourceError` sentence naming the file. The checks scan the index in chunks of `CHUNK`
entries through a memory map, so memory stays bounded however large the dataset. The token
column is always the file itself: ``token_column`` is ignored and ``text_column`` refused.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from msd.errors import SourceError
from msd.jobdir import atomic_write
from msd.recipe.schema import Source
from msd.sources import storage
from msd.sources.formats.base import (
    ColumnKind,
    FileIndex,
    cache_dir,
    listed_key,
    listing,
    reason,
    store_of,
)
from msd.sources.storage import LOCAL, Store

log = logging.getLogger(__name__)

GROUP_TOKENS = 1 << 20  # a row group's token budget (a longer document is a group alone)
CHUNK = 1 << 20  # index entries checked or summed at a time (bounds memory)

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, doc count
DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    8: np.dtype("<u2"),
}
FLOAT_CODES = {6: "float64", 7: "float32"}

Int64s = npt.NDArray[np.int64]


@dataclass(frozen=True)
class MegatronIndex:
    """A parsed and checked ``.idx``: views of its memory map, and the row groups.

    ``group_starts``: the first document of each group, then the number of documents.
    """

    path: str
    bin_path: str
    bin_size: int
    dtype: np.dtype[Any]
    sizes: npt.NDArray[np.int32]
    pointers: Int64s
    document_indices: Int64s
    group_starts: Int64s
    tokens: int

    @property
    def documents(self) -> int:
        return len(self.document_indices) - 1

    @property
    def group_rows(self) -> tuple[int, ...]:
        return tuple(np.diff(self.group_starts).tolist())


class MegatronFormat:
    name = "megatron"

    def files(self, source: Source, key: str) -> tuple[str, ...]:
        """The ``.idx`` files ``source.path`` names (a ``.idx`` glob, a ``.bin`` glob, or a
        data prefix as Megatron's ``data_path`` takes it; local or a URL), sorted — or, in a
        job, those it named when the job started (``Source.files``); each needs its ``.bin``."""
        if source.files:
            return tuple(f.path for f in source.files)
        where = f"source '{source.name}' ({key}.path)"
        remote = storage.is_remote(source.path)
        pattern = source.path if remote else os.path.expanduser(source.path)
        stem = pattern[:-4] if pattern.endswith((".idx", ".bin")) else pattern
        bins: list[str] = []
        if pattern.endswith(".bin"):
            bins = _glob(source, key, pattern)
            idx_files = [storage.sibling(b, ".idx") for b in bins]
            present = _present(source, key, stem + ".idx", idx_files)
            for b, idx in zip(bins, idx_files, strict=True):
                if idx not in present:
                    raise SourceError(
                        f"{where}: '{b}' has no index '{idx}' beside it; copy the .idx next "
                        "to the .bin, or narrow the glob to complete datasets"
                    )
        else:
            idx_files = _glob(source, key, stem + ".idx")
        if not idx_files:
            hint = (
                f"and check the {storage.bucket_word(source.path)} and prefix"
                if remote
                else "relative paths being taken from the current directory"
            )
            raise SourceError(
                f"{where}: no Megatron index matches '{source.path}'; give a .idx glob, a .bin "
                "glob or a data prefix without extension (prefix.idx and prefix.bin), "
                f"{hint}"
            )
        paths = tuple(sorted(set(idx_files)))
        if bins:
            return paths  # every .bin was found by the glob
        wanted = [storage.sibling(idx, ".bin") for idx in paths]
        present = _present(source, key, stem + ".bin", wanted)
        for idx in paths:
            bin_path = storage.sibling(idx, ".bin")
            if bin_path not in present:
                raise SourceError(
                    f"{where}: '{idx}' has no data file '{bin_path}' beside it; copy the .bin "
                    "next to the .idx, or remove the .idx from the glob"
                )
        return paths

    def index(
        self, source: Source, key: str, path: str, column: str, kind: ColumnKind
    ) -> FileIndex:
        """Check ``path`` and its ``.bin``; one row per document, groups of `GROUP_TOKENS`."""
        if kind == "text":
            raise SourceError(
                f"source '{source.name}' ({key}.text_column): Megatron data '{path}' is already "
                "tokenized; set token_column (any name, it is ignored) instead of text_column"
            )
        what = f"source '{source.name}' ({key}.path): Megatron index"
        parsed = parse(path, what, store_of(source), group_rows=source.group_rows)
        log.debug(
            "indexed %s: %d documents, %d tokens, %d row groups",
            path,
            parsed.documents,
            parsed.tokens,
            len(parsed.group_starts) - 1,
        )
        return FileIndex(parsed.group_rows, holds_text=parsed.tokens > 0)

    def open(
        self,
        path: str,
        kind: ColumnKind = "tokens",
        store: Store = LOCAL,
        group_rows: int | None = None,
    ) -> MegatronReader:
        """A reader of ``path`` (on ``store`` where it is a URL); ``group_rows``: the source's
        documents per row group (None: `GROUP_TOKENS` tokens of documents)."""
        return MegatronReader(path, store, group_rows)


class MegatronReader:
    """An open dataset: the checked ``.idx`` and a read-only memory map of the ``.bin`` — or,
    for a ``.bin`` in an object store, the open object, read by range.

    The index is parsed and checked again against the ``.bin`` as it is now; every read then
    checks that the ``.bin`` kept that size (a truncated map would crash the process). For an
    object the size is the one it had when opened, and a read that comes back short is refused
    the same way. An object store's failures (``OSError``) are left to the caller, which tells
    a transient one from the rest (``msd.sources.read``).
    """

    def __init__(self, path: str, store: Store = LOCAL, group_rows: int | None = None) -> None:
        self.index = parse(path, "Megatron index", store, True, group_rows)
        self._closed = False
        self._file: BinaryIO | None = None
        self._input: pa.NativeFile | None = None
        self._tokens: npt.NDArray[Any] = np.empty(0, dtype=self.index.dtype)
        if storage.is_remote(self.index.bin_path):
            self._input = storage.open_input(self.index.bin_path, store)
            try:
                self._check_size()
            except BaseException:
                self._input.close()
                raise
            return
        self._file = open(self.index.bin_path, "rb")  # noqa: SIM115 (closed by close())
        try:
            self._check_size()
            count = self.index.bin_size // self.index.dtype.itemsize
            if count:
                self._tokens = np.memmap(
                    self._file, dtype=self.index.dtype, mode="r", shape=(count,)
                )
        except BaseException:
            self._file.close()
            raise

    def read(self, group: int, column: str) -> pa.Array:
        """Row group ``group`` as a ``large_list`` of the file's integer type, one row per
        document in order (``column`` is ignored: the file has one)."""
        index = self.index
        if self._closed:
            raise SourceError(f"Megatron data '{index.bin_path}' was read after it was closed")
        if not 0 <= group < len(index.group_starts) - 1:
            raise SourceError(
                f"Megatron index '{index.path}' has {len(index.group_starts) - 1} row groups, "
                f"not a group {group}; it was changed after the source was indexed, index again"
            )
        self._check_size()
        d0, d1 = (int(d) for d in index.group_starts[group : group + 2])
        bounds = index.document_indices[d0 : d1 + 1]
        s0, s1 = int(bounds[0]), int(bounds[-1])
        sizes = index.sizes[s0:s1].astype(np.int64)
        seq_offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=seq_offsets[1:])
        offsets = seq_offsets[bounds - s0]
        values = self._values(index.pointers[s0:s1], sizes)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))

    def close(self) -> None:
        self._closed = True
        self._tokens = np.empty(0, dtype=self.index.dtype)  # arrays read still hold the map
        if self._file is not None:
            self._file.close()
        if self._input is not None:
            self._input.close()

    def _values(self, pointers: Int64s, sizes: Int64s) -> npt.NDArray[Any]:
        """The tokens of these sequences, concatenated: one view when they are contiguous."""
        item = self.index.dtype.itemsize
        keep = sizes > 0
        pointers, sizes = pointers[keep] // item, sizes[keep]
        if not len(sizes):
            return np.empty(0, dtype=self.index.dtype)
        breaks = np.flatnonzero(pointers[1:] != pointers[:-1] + sizes[:-1]) + 1
        runs = np.split(np.arange(len(sizes)), breaks)
        spans = [(int(pointers[r[0]]), int(pointers[r[-1]] + sizes[r[-1]])) for r in runs]
        if self._input is not None:
            views = self._fetch(spans)
        else:
            views = [self._tokens[a:b].view(np.ndarray) for a, b in spans]
        return views[0] if len(views) == 1 else np.concatenate(views)

    def _fetch(self, spans: list[tuple[int, int]]) -> list[npt.NDArray[Any]]:
        """The tokens of each span (token positions ``[start, stop)``) of the remote ``.bin``:
        one ranged read of them all (a group as Megatron's builder writes it is one span), or
        one read a span where they lie far apart (reading the gaps would cost more)."""
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        if hi - lo <= 2 * sum(b - a for a, b in spans):
            tokens = self._read_tokens(lo, hi)
            return [tokens[a - lo : b - lo] for a, b in spans]
        return [self._read_tokens(a, b) for a, b in spans]

    def _read_tokens(self, start: int, stop: int) -> npt.NDArray[Any]:
        assert self._input is not None
        item = self.index.dtype.itemsize
        data = self._input.read_at((stop - start) * item, start * item)
        if len(data) != (stop - start) * item:
            raise SourceError(
                f"Megatron data '{self.index.bin_path}' ended at byte {start * item + len(data):,}"
                f", inside the {self.index.bin_size:,} bytes it had when opened and checked "
                "against its index; it was changed after the source was indexed, restore it or "
                "index the source again"
            )
        return np.frombuffer(data, dtype=self.index.dtype)

    def _check_size(self) -> None:
        if self._input is not None:
            size = int(self._input.size())
        else:
            assert self._file is not None
            size = os.fstat(self._file.fileno()).st_size
        if size != self.index.bin_size:
            raise SourceError(
                f"Megatron data '{self.index.bin_path}' is {size:,} bytes, not the "
                f"{self.index.bin_size:,} it had when opened and checked against its index; it was "
                "changed after the source was indexed, restore it or index the source again"
            )


def parse(
    path: str,
    what: str,
    store: Store = LOCAL,
    raw_store_errors: bool = False,
    group_rows: int | None = None,
) -> MegatronIndex:
    """Parse and check the ``.idx`` at ``path`` against its ``.bin`` (``what`` starts every
    error, e.g. ``source 'web' (sources[0].path): Megatron index``); row groups of
    ``group_rows`` documents each (the last holds the rest), or, for None, of `GROUP_TOKENS`
    tokens.

    A local ``.idx`` is memory-mapped; one in an object store (``store``) is read whole once
    its header's sizes are checked, and held in memory. Where the ``.idx`` or ``.bin`` cannot
    be read that is a `SourceError` — or, for a URL with ``raw_store_errors``, the store's
    ``OSError`` itself (a loader tells a transient failure from the rest).
    """
    where = f"{what} '{path}'"
    bin_path = storage.sibling(path, ".bin")
    remote = storage.is_remote(path)
    try:
        if remote:
            idx_found = storage.stat(path, store)
            idx_size = idx_found.size
            bin_size = storage.stat(bin_path, store).size
            head = storage.read_range(path, 0, HEADER.size, store)
        else:
            idx_size = os.path.getsize(path)
            bin_size = os.path.getsize(bin_path)
            with open(path, "rb") as f:
                head = f.read(HEADER.size)
    except OSError as exc:
        if remote and raw_store_errors:
            raise
        raise _unreadable(where, bin_path, exc) from exc
    if len(head) < HEADER.size:
        raise SourceError(
            f"{where} is {idx_size} bytes, shorter than the {HEADER.size}-byte header; "
            "it is truncated or not a Megatron index"
        )
    magic, version, code, seqs, docs = HEADER.unpack(head)
    if magic != MAGIC:
        raise SourceError(
            f"{where} starts with {magic!r}, not the magic {MAGIC!r}; it is not a Megatron "
            "indexed dataset (.idx) file"
        )
    if version != VERSION:
        raise SourceError(
            f"{where} has layout version {version}, not {VERSION}; only version {VERSION} "
            "(megatron-core's) can be read"
        )
    if code in FLOAT_CODES:
        raise SourceError(
            f"{where} holds {FLOAT_CODES[code]} values, not integer token ids; "
            "re-tokenize the data with an integer dtype"
        )
    if code not in DTYPES:
        raise SourceError(
            f"{where} has an unknown dtype code {code} (known: 1-8); "
            "it is damaged or not a Megatron index"
        )
    dtype = DTYPES[code]
    body = HEADER.size + 12 * seqs + 8 * docs
    if idx_size not in (body, body + seqs):
        raise SourceError(
            f"{where} is {idx_size:,} bytes, but its header's {seqs:,} sequences and {docs:,} "
            f"document indices need {body:,}; it is truncated or damaged, rebuild it"
        )
    if docs == 0:
        raise SourceError(
            f"{where} has no document indices (there must be at least the leading 0); "
            "it is damaged, rebuild it"
        )
    if bin_size % dtype.itemsize:
        raise SourceError(
            f"{where} says {dtype.name} tokens, but its data '{bin_path}' is {bin_size:,} "
            f"bytes, not a multiple of {dtype.itemsize}; the .bin is truncated or belongs to "
            "another index"
        )
    raw: npt.NDArray[np.uint8]
    if remote:
        raw = _cached_remote(idx_found, where, bin_path, head, store, raw_store_errors)
    else:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    off = HEADER.size
    sizes = np.frombuffer(raw, dtype="<i4", count=seqs, offset=off)
    pointers = np.frombuffer(raw, dtype="<i8", count=seqs, offset=off + 4 * seqs)
    doc_idx = np.frombuffer(raw, dtype="<i8", count=docs, offset=off + 12 * seqs)
    tokens = _check_sequences(where, bin_path, bin_size, dtype, sizes, pointers)
    _check_documents(where, seqs, doc_idx)
    if idx_size == body + seqs and seqs:
        modes = np.frombuffer(raw, dtype=np.int8, count=seqs, offset=body)
        if any(chunk.any() for chunk in _chunks(modes)):
            raise SourceError(
                f"{where} is multimodal (it marks sequences that are not text); "
                "only token-only Megatron datasets can be read"
            )
    starts = (
        _group_starts(sizes, doc_idx) if group_rows is None else _fixed_starts(docs - 1, group_rows)
    )
    return MegatronIndex(path, bin_path, bin_size, dtype, sizes, pointers, doc_idx, starts, tokens)


def _cached_remote(
    found: storage.Listed,
    where: str,
    bin_path: str,
    head: bytes,
    store: Store,
    raw_store_errors: bool,
) -> npt.NDArray[np.uint8]:
    """A remote ``.idx``, memory-mapped from a copy in ``cache_dir("megatron")`` made on its
    first read (keyed by its URL, endpoint, size and modification time): a loader reopening
    the dataset reads no index bytes from the store again."""
    digest = listed_key(found, store)
    cache = cache_dir("megatron") / f"{storage.cache_name(found.path)}.{digest}"
    try:
        if cache.stat().st_size == found.size:
            raw: npt.NDArray[np.uint8] = np.memmap(cache, dtype=np.uint8, mode="r")
            if raw[: len(head)].tobytes() == head:
                return raw
    except (OSError, ValueError):
        pass  # not cached yet, or damaged: read it again
    data = _read_remote(found.path, where, bin_path, found.size, head, store, raw_store_errors)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, data.tobytes())
    except OSError as exc:
        log.warning("cannot cache the index '%s' in %s (%s)", found.path, cache.parent, exc)
    return data


def _read_remote(
    path: str,
    where: str,
    bin_path: str,
    idx_size: int,
    head: bytes,
    store: Store,
    raw_store_errors: bool,
) -> npt.NDArray[np.uint8]:
    """The whole remote ``.idx`` (``idx_size`` bytes, checked against its header) in memory."""
    try:
        data = storage.read_range(path, 0, idx_size, store)
    except OSError as exc:
        if raw_store_errors:
            raise
        raise _unreadable(where, bin_path, exc) from exc
    if len(data) != idx_size or data[: len(head)] != head:
        raise SourceError(
            f"{where} changed while it was read ({len(data):,} bytes, not {idx_size:,}); "
            "index the source again once it is no longer being written"
        )
    return np.frombuffer(data, dtype=np.uint8)


def _unreadable(where: str, bin_path: str, exc: OSError) -> SourceError:
    """An ``.idx`` or ``.bin`` that cannot be read (an object store's refusal included: its
    message is one sentence)."""
    remote_missing = isinstance(exc, FileNotFoundError) and storage.is_remote(bin_path)
    detail = reason(exc) if remote_missing else (exc.strerror or exc)
    return SourceError(
        f"{where} or its data '{bin_path}' cannot be read ({detail}); "
        "check that both exist and are readable"
    )


def _check_sequences(
    where: str,
    bin_path: str,
    bin_size: int,
    dtype: np.dtype[Any],
    sizes: npt.NDArray[np.int32],
    pointers: Int64s,
) -> int:
    """Every size non-negative, every sequence aligned and inside the ``.bin``: the tokens."""
    item = dtype.itemsize
    tokens = 0
    for start in range(0, len(sizes), CHUNK):
        size = sizes[start : start + CHUNK].astype(np.int64)
        ptr = pointers[start : start + CHUNK]
        if (size < 0).any():
            i = start + int(np.argmax(size < 0))
            raise SourceError(
                f"{where} gives sequence {i} a negative size {int(size[i - start])}; "
                "it is damaged, rebuild it"
            )
        bad = (ptr < 0) | (ptr > bin_size) | (ptr % item != 0)
        if not bad.any():
            bad = ptr + size * item > bin_size
        if bad.any():
            i = start + int(np.argmax(bad))
            p, n = int(ptr[i - start]), int(size[i - start])
            raise SourceError(
                f"{where} puts sequence {i} ({n:,} {dtype.name} tokens) at byte {p:,}, which "
                f"is not {item}-byte aligned inside its {bin_size:,}-byte data '{bin_path}'; "
                "the .bin is truncated or belongs to another index"
            )
        tokens += int(size.sum())
    return tokens


def _check_documents(where: str, seqs: int, doc_idx: Int64s) -> None:
    """The document indices run from 0 to the sequence count, never decreasing."""
    first, last = int(doc_idx[0]), int(doc_idx[-1])
    if first != 0 or last != seqs:
        raise SourceError(
            f"{where} has document indices from {first:,} to {last:,}, not from 0 to its "
            f"{seqs:,} sequences; it is damaged, rebuild it"
        )
    for start in range(0, len(doc_idx) - 1, CHUNK):
        step = np.diff(doc_idx[start : start + CHUNK + 1])
        if (step < 0).any():
            i = start + int(np.argmax(step < 0)) + 1
            raise SourceError(
                f"{where} has document index {i} ({int(doc_idx[i]):,}) below the one before "
                f"it ({int(doc_idx[i - 1]):,}); the indices must not decrease, rebuild it"
            )


def _group_starts(sizes: npt.NDArray[np.int32], doc_idx: Int64s) -> Int64s:
    """The first document of each row group, then the document count: greedy runs of at most
    `GROUP_TOKENS` tokens, at least one document each."""
    starts = [0]
    group_begin = 0  # token position where the open group starts
    base = 0  # first document of the current array of ends
    before = 0  # where the document before ``base`` ends
    for ends in _document_ends(sizes, doc_idx):
        pos = 0
        while pos < len(ends):
            j = pos + int(np.searchsorted(ends[pos:], group_begin + GROUP_TOKENS, "right"))
            if j == len(ends):
                break  # the open group takes every document left here; it may go on
            end = max(base + j, starts[-1] + 1)  # exclusive; one document at least
            starts.append(end)
            group_begin = int(ends[end - 1 - base]) if end > base else before
            pos = end - base
        base += len(ends)
        before = int(ends[-1])
    documents = len(doc_idx) - 1
    if documents > starts[-1]:
        starts.append(documents)
    return np.asarray(starts, dtype=np.int64)


def _fixed_starts(documents: int, group_rows: int) -> Int64s:
    """The first document of each run of ``group_rows`` documents, then the document count."""
    if not documents:
        return np.zeros(1, dtype=np.int64)
    return np.append(np.arange(0, documents, group_rows, dtype=np.int64), np.int64(documents))


def _document_ends(sizes: npt.NDArray[np.int32], doc_idx: Int64s) -> Iterator[Int64s]:
    """The token position at which each document ends, in order, a bounded array at a time."""
    ends = doc_idx[1:]
    covered = int(np.searchsorted(ends, 0, "right"))  # empty documents before any sequence
    yield from _chunks(np.zeros(covered, dtype=np.int64))
    carry = 0
    for start in range(0, len(sizes), CHUNK):
        stop = min(start + CHUNK, len(sizes))
        prefix = np.empty(stop - start + 1, dtype=np.int64)
        prefix[0] = carry
        np.cumsum(sizes[start:stop], dtype=np.int64, out=prefix[1:])
        prefix[1:] += carry
        upto = int(np.searchsorted(ends, stop, "right"))
        for chunk in _chunks(ends[covered:upto]):
            yield prefix[chunk - start]
        covered, carry = upto, int(prefix[-1])


def _chunks(array: npt.NDArray[Any]) -> Iterator[npt.NDArray[Any]]:
    for start in range(0, len(array), CHUNK):
        yield array[start : start + CHUNK]


def _glob(source: Source, key: str, pattern: str) -> list[str]:
    """The files ``pattern`` matches (local ones as absolute paths), sorted."""
    return [found.path for found in listing(source, key, pattern)]


def _present(source: Source, key: str, pattern: str, wanted: list[str]) -> set[str]:
    """Which of ``wanted`` (files ``pattern`` matches, if they exist) exist: checked one by one
    where local, found with one listing of ``pattern`` in an object store."""
    if not storage.is_remote(pattern):
        return {path for path in wanted if os.path.isfile(path)}
    return {found.path for found in listing(source, key, pattern)} & set(wanted)


FORMAT = MegatronFormat()
