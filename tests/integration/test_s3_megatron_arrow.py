"""Megatron and Arrow sources in an S3-compatible store (the moto server of ``tests/s3``) read
back exactly as the same files do from local disk: the same row groups, the same arrays, and
the same one-sentence errors for damaged files."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats import arrow, megatron
from msd.sources.formats.base import store_of
from msd.sources.index import SourceIndex, open_source
from msd.sources.read import RowGroupReader
from tests.s3.server import S3Bucket

KEY = "sources[0]"


def _source(path: str, **fields: Any) -> Source:
    if "text_column" not in fields:
        fields.setdefault("token_column", "tokens")
    return Source(name="web", path=path, weight=1.0, **fields)


def _groups(index: SourceIndex, root: str) -> list[tuple[str, int, int, str, str]]:
    """Each row group, its file named relative to ``root`` (a folder or a URL)."""
    return [
        (g.file[len(root) :].lstrip("/"), g.index, g.num_rows, g.format, g.kind)
        for g in index.row_groups
    ]


def _arrays(index: SourceIndex, column: str | None = None) -> list[pa.Array]:
    with RowGroupReader() as reader:
        return [reader.read(g, column or index.column) for g in index.row_groups]


def _same_as_local(
    local: Source, remote: Source, root: Path, url: str, column: str | None = None
) -> SourceIndex:
    """Index and read ``local`` and ``remote`` (the same files, under ``root`` and ``url``):
    every row group and every array equal."""
    here, there = open_source(local, KEY), open_source(remote, KEY)
    assert all(f.startswith(url + "/") for f in there.files)
    assert [f[len(url) :] for f in there.files] == [f[len(str(root)) :] for f in here.files]
    assert _groups(there, url) == _groups(here, str(root))
    assert {g.store for g in there.row_groups} == {store_of(remote)}
    assert there.num_rows == here.num_rows
    remote_arrays, local_arrays = _arrays(there, column), _arrays(here, column)
    assert len(remote_arrays) == len(local_arrays) > 0
    for a, b in zip(remote_arrays, local_arrays, strict=True):
        assert a.type == b.type and a.equals(b)
    return there


def _one_sentence(message: str, *names: str) -> None:
    assert "\n" not in message, message
    assert message.startswith(f"source 'web' ({KEY}."), message
    for name in names:
        assert name in message, message
    # the file names hold dots; the sentence must not stop anywhere else
    stripped = message
    for name in names:
        stripped = stripped.replace(name, "NAME")
    assert ". " not in stripped, message


# --- Megatron ---------------------------------------------------------------------------------


def _idx(path: Path, code: int, sizes: list[int], pointers: list[int], docs: list[int]) -> None:
    header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, code, len(sizes), len(docs))
    path.write_bytes(
        header
        + np.asarray(sizes, "<i4").tobytes()
        + np.asarray(pointers, "<i8").tobytes()
        + np.asarray(docs, "<i8").tobytes()
    )


def _megatron_data(root: Path) -> Path:
    """Datasets as megatron-core's builder writes them (many row groups), and two written
    byte by byte whose sequences are scattered in the .bin (near each other, and far apart)."""
    mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    torch = pytest.importorskip("torch")
    root.mkdir()
    rng = np.random.default_rng(11)
    for name, dtype in (("a", np.uint16), ("b", np.int32)):
        builder = mcore.IndexedDatasetBuilder(str(root / f"{name}.bin"), dtype=dtype)
        for d in range(150):
            lengths = rng.integers(0, 120, int(rng.integers(1, 4)))
            if d == 7:
                lengths = np.asarray([0])  # an empty document
            for n in lengths:
                builder.add_item(torch.tensor(rng.integers(0, 60_000, int(n)), dtype=torch.int64))
            builder.end_document()
        builder.finalize(str(root / f"{name}.idx"))
    (root / "c.bin").write_bytes(np.arange(100, 120, dtype="<i4").tobytes())
    _idx(root / "c.idx", 4, [3, 2, 4], [40, 0, 20], [0, 2, 3])
    (root / "d.bin").write_bytes(np.arange(1000, dtype="<i4").tobytes())
    _idx(root / "d.idx", 4, [3, 2, 1], [0, 4 * 900, 4 * 500], [0, 2, 3])
    return root


@pytest.fixture
def megatron_on_s3(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str]:
    monkeypatch.setattr(megatron, "GROUP_TOKENS", 1000)  # several row groups a file
    root = _megatron_data(tmp_path / "m")
    return root, s3.upload(root, "corpus/m")


def test_megatron_datasets_on_s3_read_as_they_do_locally(megatron_on_s3) -> None:
    root, url = megatron_on_s3
    there = _same_as_local(_source(f"{root}/*.idx"), _source(f"{url}/*.idx"), root, url)
    assert len(there.files) == 4 and len(there.row_groups) > 8
    rows = [row for a in _arrays(there) for row in a.to_pylist()]
    scattered = [[110, 111, 112, 100, 101], [105, 106, 107, 108], [0, 1, 2, 900, 901], [500]]
    assert rows[-4:] == scattered  # c.idx and d.idx, gathered from their .bin

    # a .bin glob and a data prefix name the same datasets
    by_bin = open_source(_source(f"{url}/*.bin"), KEY)
    assert by_bin.files == there.files
    prefix = open_source(_source(f"{url}/b", format="megatron"), KEY)
    assert prefix.files == (f"{url}/b.idx",)
    assert _groups(prefix, url) == [g for g in _groups(there, url) if g[0] == "b.idx"]

    # group_rows: runs of that many documents instead (the last holds the rest)
    fixed = _same_as_local(
        _source(f"{root}/a.idx", group_rows=7), _source(f"{url}/a.idx", group_rows=7), root, url
    )
    assert [g.num_rows for g in fixed.row_groups] == [7] * 21 + [3]


def test_a_megatron_read_from_s3_is_one_ranged_read_of_the_bin(megatron_on_s3) -> None:
    _, url = megatron_on_s3
    reader = megatron.FORMAT.open(f"{url}/a.idx", "tokens", store_of(_source(url)))
    try:
        assert reader._input is not None and len(reader._tokens) == 0  # no map, no download
        calls: list[tuple[int, int]] = []
        real = reader._input

        class Counting:
            def read_at(self, nbytes: int, offset: int) -> bytes:
                calls.append((nbytes, offset))
                return bytes(real.read_at(nbytes, offset))

            def size(self) -> int:
                return int(real.size())

            def close(self) -> None:
                real.close()

        reader._input = Counting()
        groups = len(reader.index.group_starts) - 1
        arrays = [reader.read(g, "tokens") for g in range(groups)]
        assert len(calls) == groups  # one ranged GET a row group
        assert sum(n for n, _ in calls) == reader.index.bin_size  # the .bin read once, no more
        assert sum(len(a.values) for a in arrays) == reader.index.tokens
    finally:
        reader.close()


def test_a_remote_index_is_read_from_the_store_once_a_machine(
    megatron_on_s3: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The .idx is copied to the cache on its first read; a reopened dataset reads only its
    header from the store, and a changed .idx is read again."""
    root, url = megatron_on_s3
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))
    ranges: list[tuple[str, int, int]] = []
    real = megatron.storage.read_range

    def counting(path: str, offset: int, size: int, store: Any = None) -> bytes:
        ranges.append((path, offset, size))
        return real(path, offset, size, store)

    monkeypatch.setattr(megatron.storage, "read_range", counting)
    store = store_of(_source(url))
    first = megatron.parse(f"{url}/a.idx", "index", store)
    assert [size for *_, size in ranges] == [megatron.HEADER.size, (root / "a.idx").stat().st_size]
    assert len(list((tmp_path / "cache" / "megatron").iterdir())) == 1
    ranges.clear()
    again = megatron.parse(f"{url}/a.idx", "index", store)
    assert [size for *_, size in ranges] == [megatron.HEADER.size]  # the header only
    assert np.array_equal(again.document_indices, first.document_indices)
    assert np.array_equal(again.sizes, first.sizes)


def _wrong_version(idx: Path) -> None:
    raw = bytearray(idx.read_bytes())
    raw[9:17] = struct.pack("<Q", 2)
    idx.write_bytes(bytes(raw))


def _truncated_bin(idx: Path) -> None:
    bin_path = idx.with_suffix(".bin")
    bin_path.write_bytes(bin_path.read_bytes()[:-8])


@pytest.mark.parametrize(
    ("damage", "says"), [(_wrong_version, "version 2"), (_truncated_bin, "aligned")]
)
def test_a_damaged_megatron_dataset_on_s3_is_the_same_error_as_locally(
    s3: S3Bucket, tmp_path: Path, damage, says: str
) -> None:
    root = _megatron_data(tmp_path / "m")
    for name in ("a", "c", "d"):
        for ext in (".idx", ".bin"):
            (root / f"{name}{ext}").unlink()
    damage(root / "b.idx")
    url = s3.upload(root, "m")
    with pytest.raises(SourceError) as local:
        open_source(_source(f"{root}/*.idx"), KEY)
    with pytest.raises(SourceError) as remote:
        open_source(_source(f"{url}/*.idx"), KEY)
    assert says in str(remote.value)
    assert str(remote.value) == str(local.value).replace(str(root), url)
    _one_sentence(str(remote.value), f"{url}/b.idx")


def test_a_bin_truncated_on_s3_after_indexing_is_caught(megatron_on_s3, s3: S3Bucket) -> None:
    root, url = megatron_on_s3
    index = open_source(_source(f"{url}/a.idx"), KEY)
    with s3.server.filesystem().open_output_stream(f"{s3.bucket}/corpus/m/a.bin") as out:
        out.write((root / "a.bin").read_bytes()[:-8])
    # A loader opening it checks the index against the .bin as it is now. (One that had it
    # open already cannot tell: pyarrow reports a ranged read the shorter object cut short as
    # complete.)
    with RowGroupReader() as reader, pytest.raises(SourceError) as info:
        reader.read(index.row_groups[0], "tokens")
    assert "aligned" in str(info.value) and f"{url}/a.bin" in str(info.value)


def test_megatron_files_missing_on_s3_are_one_sentence(megatron_on_s3, s3: S3Bucket) -> None:
    _, url = megatron_on_s3
    s3.server.filesystem().delete_file(f"{s3.bucket}/corpus/m/b.bin")
    with pytest.raises(SourceError) as info:
        open_source(_source(f"{url}/*.idx"), KEY)
    _one_sentence(str(info.value), f"{url}/b.idx", f"{url}/b.bin")
    assert "has no data file" in str(info.value)
    with pytest.raises(SourceError) as info:
        megatron.FORMAT.index(_source(url), KEY, f"{url}/b.idx", "tokens", "tokens")
    _one_sentence(str(info.value), f"{url}/b.idx", f"{url}/b.bin")
    assert "cannot be read" in str(info.value)
    with pytest.raises(SourceError) as info:
        open_source(_source(f"{url}/nothing", format="megatron"), KEY)
    _one_sentence(str(info.value), f"{url}/nothing")


# --- Arrow ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def datasets() -> Any:
    module = pytest.importorskip("datasets")
    module.disable_progress_bars()
    return module


def _write_ipc(path: Path, batches: list[pa.RecordBatch], file_format: bool) -> None:
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_file if file_format else pa.ipc.new_stream
        with writer(sink, batches[0].schema) as w:
            for batch in batches:
                w.write_batch(batch)


def _batch(texts: list[str | None], ids: list[list[int]], **more: pa.Array) -> pa.RecordBatch:
    return pa.record_batch(
        {"text": pa.array(texts, pa.string()), "ids": pa.array(ids, pa.list_(pa.int32())), **more}
    )


def test_a_save_to_disk_folder_url_reads_as_it_does_locally(
    s3: S3Bucket, tmp_path: Path, datasets: Any
) -> None:
    texts = [f"row {i} " + "é" * (i % 5) for i in range(2500)]
    ids = [list(range(i % 7)) for i in range(2500)]
    ds = datasets.Dataset.from_dict({"text": texts, "ids": ids})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=3)
    url = s3.upload(tmp_path / "ds", "hf/ds")

    remote = _source(url, text_column="text", token_column=None)
    assert remote.data_format == "arrow"  # state.json found in the store
    local = _source(str(tmp_path / "ds"), text_column="text", token_column=None)
    there = _same_as_local(local, remote, tmp_path / "ds", url)
    state = json.loads((tmp_path / "ds" / "state.json").read_text())
    assert there.files == tuple(f"{url}/{e['filename']}" for e in state["_data_files"])
    assert [t for a in _arrays(there) for t in a.to_pylist()] == texts
    tokens = _source(url + "/", token_column="ids", format="arrow")
    assert [r for a in _arrays(open_source(tokens, KEY)) for r in a.to_pylist()] == ids


def test_a_reopened_remote_stream_reads_only_the_batches_it_wants(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a remote stream's batches lie is found once a machine (then cached): the second
    reader of the file does not read the stream to find them, and reads the same batches."""
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))
    texts = [f"row {i}" for i in range(30)]
    (tmp_path / "d").mkdir()
    batches = [_batch(texts[i : i + 10], [[i]] * 10) for i in (0, 10, 20)]
    _write_ipc(tmp_path / "d" / "s.arrow", batches, file_format=False)
    url = s3.upload(tmp_path / "d", "cached")
    scans: list[int] = []
    real = arrow._stream_places

    def counting(source: pa.NativeFile) -> Any:
        scans.append(1)
        return real(source)

    monkeypatch.setattr(arrow, "_stream_places", counting)
    store = store_of(_source(url))
    read = []
    for _ in range(2):
        reader = arrow.FORMAT.open(f"{url}/s.arrow", "text", store)
        read.append([reader.read(g, "text").to_pylist() for g in (2, 0, 1)])
        reader.close()
    assert scans == [1]  # the first reader only
    assert read[0] == read[1] == [texts[20:], texts[:10], texts[10:20]]


@pytest.mark.parametrize("file_format", [True, False], ids=["ipc-file", "ipc-stream"])
def test_arrow_globs_on_s3_read_as_they_do_locally(
    s3: S3Bucket, tmp_path: Path, file_format: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrow, "SCAN_BUFFER_BYTES", 64)  # streams: messages across reads
    texts = [f"t{i}" * (i % 4) for i in range(40)]
    _write_ipc(
        tmp_path / "b.arrow",
        [
            _batch(texts[:10], [[i] for i in range(10)]),
            _batch([], []),  # an empty batch is a group too
            _batch(texts[10:13], [[1, 2]] * 3),
            _batch(texts[13:], [[]] * 27),
        ],
        file_format,
    )
    _write_ipc(tmp_path / "a.arrow", [_batch(["first", None], [[7], [8, 9]])], file_format)
    url = s3.upload(tmp_path, "plain")
    local, remote = (
        _source(f"{tmp_path}/*.arrow", text_column="text"),
        _source(f"{url}/*.arrow", text_column="text"),
    )
    there = _same_as_local(local, remote, tmp_path, url)
    assert [g[2] for g in _groups(there, url)] == [2, 10, 0, 3, 27]
    _same_as_local(
        _source(f"{tmp_path}/*.arrow", token_column="ids"),
        _source(f"{url}/*.arrow", token_column="ids"),
        tmp_path,
        url,
    )

    # A remote stream keeps only where each batch lies; a batch is one ranged read.
    reader = arrow.FORMAT.open(f"{url}/b.arrow", "text", store_of(remote))
    try:
        batches = reader._batches
        assert batches.count == 4 and batches._kept == []
        assert (batches._file is not None) == file_format
        assert len(batches._places) == (0 if file_format else 4)
        assert reader.read(3, "text").to_pylist() == texts[13:]
    finally:
        reader.close()


def test_a_remote_stream_with_dictionaries_is_read_whole(s3: S3Bucket, tmp_path: Path) -> None:
    kinds = pa.array(["x", "y", "x"]).dictionary_encode()
    batches = [_batch(["a", "b", "c"], [[1], [2], [3]], kind=kinds)] * 3
    _write_ipc(tmp_path / "d.arrow", batches, file_format=False)
    url = s3.upload(tmp_path, "dict")
    there = _same_as_local(
        _source(f"{tmp_path}/*.arrow", text_column="text"),
        _source(f"{url}/*.arrow", text_column="text"),
        tmp_path,
        url,
    )
    assert _arrays(there, "kind")[2].equals(kinds)


def _not_arrow(root: Path) -> list[str]:
    root.mkdir()
    (root / "junk.arrow").write_bytes(b"hello, this is not Arrow at all " * 20)
    (root / "empty.arrow").write_bytes(b"")
    _write_ipc(root / "s.arrow", [_batch(["a" * 100], [[1]])] * 3, file_format=False)
    whole = (root / "s.arrow").read_bytes()
    (root / "cut-stream.arrow").write_bytes(whole[: len(whole) // 2])
    _write_ipc(root / "f.arrow", [_batch(["a" * 100], [[1]])] * 3, file_format=True)
    (root / "cut-file.arrow").write_bytes((root / "f.arrow").read_bytes()[:-30])
    return ["junk.arrow", "empty.arrow", "cut-stream.arrow", "cut-file.arrow"]


def test_remote_arrow_errors_are_one_sentence_naming_the_file(
    s3: S3Bucket, tmp_path: Path, datasets: Any
) -> None:
    names = _not_arrow(tmp_path / "bad")
    ds = datasets.Dataset.from_dict({"text": [str(i) for i in range(20)]})
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    ds.save_to_disk(str(tmp_path / "gone"), num_shards=2)
    (tmp_path / "gone" / "data-00001-of-00002.arrow").unlink()
    (tmp_path / "garbled").mkdir()
    shutil.copy(tmp_path / "bad" / "s.arrow", tmp_path / "garbled" / "data.arrow")
    (tmp_path / "garbled" / "state.json").write_text("{not json")
    url = s3.upload(tmp_path, "")

    def both(path: str, **fields: Any) -> tuple[str, str]:
        """The errors indexing ``path`` gives, under tmp_path and at the URL (same text)."""
        messages = []
        for root in (str(tmp_path), url):
            with pytest.raises(SourceError) as info:
                open_source(_source(f"{root}/{path}", text_column="text", **fields), KEY)
            messages.append(str(info.value))
        assert messages[1] == messages[0].replace(str(tmp_path), url)
        return messages[0], messages[1]

    for name in names:
        _, remote = both(f"bad/{name}")
        _one_sentence(remote, f"{url}/bad/{name}", "not a readable Arrow IPC file")
    _, remote = both("dd", format="arrow")
    _one_sentence(remote, f"{url}/dd", f"{url}/dd/train", "DatasetDict")
    _, remote = both("gone", format="arrow")
    _one_sentence(remote, f"{url}/gone/state.json", "data-00001-of-00002.arrow", "does not exist")
    _, remote = both("garbled", format="arrow")
    _one_sentence(remote, f"{url}/garbled/state.json", "not readable JSON")

    # An object gone between listing and indexing, and a bucket that is not there.
    gone = f"{url}/bad/missing.arrow"
    with pytest.raises(SourceError) as info:
        arrow.FORMAT.index(_source(gone, text_column="text"), KEY, gone, "text", "text")
    _one_sentence(str(info.value), gone, "does not exist")
    nowhere = f"s3://{s3.bucket}-missing/ds"
    with pytest.raises(SourceError) as info:
        open_source(_source(nowhere, text_column="text", format="arrow"), KEY)
    _one_sentence(str(info.value), f"'{s3.bucket}-missing'", "does not exist")
