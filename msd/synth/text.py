"""Deterministic demo data: Parquet sources with long-tailed (log-normal) sample lengths.

Real mixtures differ mostly in their length distributions (short web pages, mid-sized code
files, long books), which is what makes packing and balancing hard, so that is all the demo
data models. Each row's ``text`` is random lowercase words whose UTF-8 length is exactly the
sampled length, so with the ``bytes`` transform a row has exactly that many tokens.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from msd.sources.index import source_key

MIN_TOKENS = 16
END_OF_TEXT = "<|endoftext|>"  # the demo tokenizer's end-of-document token

# 26 letters and 5 spaces: words average ~6 letters.
_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
_LETTERS = 26


@dataclass(frozen=True)
class SynthSource:
    """A demo source: ``num_samples`` rows, lengths log-normal around ``median_tokens``."""

    name: str
    median_tokens: int
    sigma: float
    max_tokens: int
    num_samples: int


# About 52 MB of text, 30 MB of zstd Parquet; about a second to write.
DEFAULT_SOURCES: tuple[SynthSource, ...] = (
    SynthSource("web", median_tokens=200, sigma=1.0, max_tokens=32768, num_samples=40_000),
    SynthSource("code", median_tokens=1000, sigma=1.0, max_tokens=32768, num_samples=10_000),
    SynthSource("books", median_tokens=4000, sigma=0.8, max_tokens=32768, num_samples=4_000),
)


# Told of each file once it is written: its path, how many are written so far, how many in all.
OnFile = Callable[[Path, int, int], None]
Wrote = Callable[[Path], None]


def counting(on_file: OnFile | None, total: int) -> Wrote:
    """A `Wrote` that tells ``on_file`` of each file with its count out of ``total``."""
    done = itertools.count(1)

    def wrote(path: Path) -> None:
        if on_file is not None:
            on_file(path, next(done), total)

    return wrote


def sample_lengths(source: SynthSource, seed: int = 0) -> npt.NDArray[np.int64]:
    """The byte length of every row of ``source``, clipped to [16, max_tokens]."""
    rng = _rng(source, seed, stream=0)
    raw = rng.lognormal(np.log(source.median_tokens), source.sigma, source.num_samples)
    return np.clip(np.rint(raw), MIN_TOKENS, max(source.max_tokens, MIN_TOKENS)).astype(np.int64)


def synth(
    out_dir: Path,
    sources: Sequence[SynthSource] = DEFAULT_SOURCES,
    seed: int = 0,
    files_per_source: int = 2,
    rows_per_row_group: int = 256,
) -> list[Path]:
    """Write ``out_dir/<name>/part-NNNNN.parquet`` for every source; returns the paths.

    Same arguments give byte-identical files; existing files are overwritten.
    """
    if files_per_source < 1 or rows_per_row_group < 1:
        raise ValueError("files_per_source and rows_per_row_group must be at least 1")
    paths: list[Path] = []
    for source in sources:
        table = synth_table(source, seed)
        paths.extend(
            _write_parts(table, Path(out_dir) / source.name, files_per_source, rows_per_row_group)
        )
    return paths


def synth_table(source: SynthSource, seed: int = 0) -> pa.Table:
    """All rows of ``source``: ``id`` (row number) and ``text`` (exactly the sampled bytes)."""
    if source.num_samples < 1:
        raise ValueError(f"source '{source.name}' needs at least one sample")
    lengths = sample_lengths(source, seed)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    data = _text_bytes(_rng(source, seed, stream=1), offsets)
    # 32-bit offsets (plain `string`) unless a source is too big for them.
    small = offsets[-1] < 2**31
    kind, offset_type = (pa.string(), np.int32) if small else (pa.large_string(), np.int64)
    buffers = [None, pa.py_buffer(offsets.astype(offset_type)), pa.py_buffer(data)]
    text = pa.Array.from_buffers(kind, len(lengths), buffers)
    ids = pa.array(np.arange(len(lengths), dtype=np.int64))
    return pa.table({"id": ids, "text": text})


def _rng(source: SynthSource, seed: int, stream: int) -> np.random.Generator:
    # Lengths and text draw from separate streams so lengths can be recomputed alone.
    return np.random.default_rng([seed, source_key(source.name), stream])


def _text_bytes(rng: np.random.Generator, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    data = _ALPHABET[rng.integers(0, len(_ALPHABET), int(offsets[-1]), dtype=np.uint8)]
    # Rows start and end with a letter, so no text has leading or trailing spaces.
    for edge in (offsets[:-1], offsets[1:] - 1):
        data[edge] = _ALPHABET[rng.integers(0, _LETTERS, len(edge), dtype=np.uint8)]
    return data


def _write_parts(table: pa.Table, directory: Path, files: int, rows_per_group: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, min(files, table.num_rows) + 1).astype(np.int64)
    paths = []
    for part, (start, stop) in enumerate(itertools.pairwise(bounds)):
        path = directory / f"part-{part:05d}.parquet"
        write_parquet(table.slice(int(start), int(stop - start)), path, rows_per_group)
        paths.append(path)
    return paths


def write_parquet(table: pa.Table, path: Path, rows_per_group: int) -> None:
    """A demo Parquet file: every option pinned, so the bytes depend only on the data (and the
    pyarrow version)."""
    pq.write_table(
        table,
        path,
        row_group_size=rows_per_group,
        compression="zstd",
        compression_level=3,
        use_dictionary=["id"],
        write_statistics=["id"],
        version="2.6",
        data_page_version="1.0",
        write_page_index=False,
        store_schema=True,
    )


def train_tokenizer(
    out_dir: Path,
    sources: Sequence[SynthSource] = DEFAULT_SOURCES,
    seed: int = 0,
    vocab_size: int = 4096,
    rows: int = 200,
) -> Path:
    """Train a small BPE ``tokenizer.json`` on the first ``rows`` rows of each demo source.

    It gives the demo a tokenizer with a realistic cost per token (the ``bytes`` transform is
    nearly free), for ``transform: {kind: tokenizer, path: .../tokenizer.json}``; its last id is
    `END_OF_TEXT`, for ``eos``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = [t for s in sources for t in synth_table(s, seed).column("text").to_pylist()[:rows]]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]"], show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    # After training, so every learned token keeps its id: the end-of-document token (eos).
    tokenizer.add_special_tokens([END_OF_TEXT])
    path = Path(out_dir) / "tokenizer.json"
    tokenizer.save(str(path))
    return path
