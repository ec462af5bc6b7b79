"""Arrow IPC sources: real files written by ``datasets.save_to_disk`` and pyarrow, in tmp_path."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats.arrow import FORMAT, _null_or_empty
from msd.sources.formats.base import ColumnKind, FileIndex
from msd.sources.transforms import text_bytes, token_lists

KEY = "sources[2]"


@pytest.fixture(scope="module")
def datasets() -> Any:
    module = pytest.importorskip("datasets")
    module.disable_progress_bars()
    return module


def _source(path: Path | str, text: str | None = "text", tokens: str | None = None) -> Source:
    return Source(name="web", path=str(path), weight=1.0, text_column=text, token_column=tokens)


def _read_back(
    source: Source, column: str, kind: ColumnKind = "text"
) -> tuple[tuple[str, ...], list[FileIndex], list[Any]]:
    """Every file, its index, and every row of ``column`` read through FORMAT, in order."""
    files = FORMAT.files(source, KEY)
    indexes, rows = [], []
    for path in files:
        index = FORMAT.index(source, KEY, path, column, kind)
        indexes.append(index)
        reader = FORMAT.open(path)
        try:
            for group, n in enumerate(index.group_rows):
                array = reader.read(group, column)
                assert isinstance(array, pa.Array) and len(array) == n
                rows.extend(array.to_pylist())
        finally:
            reader.close()
    return files, indexes, rows


def _stream_batches(path: str) -> list[int]:
    """The record batches' row counts, as pyarrow reads the stream on its own."""
    with pa.memory_map(path) as mapped:
        return [b.num_rows for b in pa.ipc.open_stream(mapped)]


def _one_sentence(exc: pytest.ExceptionInfo[SourceError], *names: str) -> str:
    message = str(exc.value)
    assert "\n" not in message and ". " not in message, message
    assert "source 'web'" in message and KEY in message, message
    for name in names:
        assert name in message, message
    return message


def _write_ipc(path: Path, batches: list[pa.RecordBatch], file_format: bool) -> Path:
    schema = batches[0].schema
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_file if file_format else pa.ipc.new_stream
        with writer(sink, schema) as w:
            for batch in batches:
                w.write_batch(batch)
    return path


def _ids(rows: list[list[int]]) -> pa.Array:
    return pa.array(rows, pa.list_(pa.int64()))


def _batch(texts: list[str | None], **more: list[Any]) -> pa.RecordBatch:
    return pa.record_batch({"text": pa.array(texts, pa.string()), **more})


# --- save_to_disk folders ------------------------------------------------------------------


def test_a_sharded_save_to_disk_folder_reads_back_every_row_in_order(tmp_path, datasets):
    texts = [f"document {i} " + "é" * (i % 7) for i in range(6600)]
    ids = [[i, i + 1, i * 3] for i in range(6600)]
    ds = datasets.Dataset.from_dict({"text": texts, "ids": ids})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=3)

    files, indexes, rows = _read_back(_source(tmp_path / "ds"), "text")
    state = json.loads((tmp_path / "ds" / "state.json").read_text())
    assert files == tuple(str(tmp_path / "ds" / e["filename"]) for e in state["_data_files"])
    assert len(files) == 3
    assert rows == texts
    for path, index in zip(files, indexes, strict=True):
        assert index.group_rows == tuple(_stream_batches(path))
        assert len(index.group_rows) == 3  # 2,200 rows a shard, written 1,000 a batch
        assert index.holds_text and index.problems == ()

    _, _, token_rows = _read_back(_source(tmp_path / "ds", None, "ids"), "ids", "tokens")
    assert token_rows == ids


def test_files_follow_the_order_state_json_gives_not_sorted_order(tmp_path, datasets):
    ds = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(90)]})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=3)
    state_path = tmp_path / "ds" / "state.json"
    state = json.loads(state_path.read_text())
    state["_data_files"].reverse()
    state_path.write_text(json.dumps(state))

    files, _, rows = _read_back(_source(tmp_path / "ds"), "text")
    assert [os.path.basename(f) for f in files] == [
        "data-00002-of-00003.arrow",
        "data-00001-of-00003.arrow",
        "data-00000-of-00003.arrow",
    ]
    assert rows == [f"row {i}" for i in range(60, 90)] + [f"row {i}" for i in range(30, 60)] + [
        f"row {i}" for i in range(30)
    ]


def test_a_generated_dataset_with_small_batches_gives_one_group_per_batch(tmp_path, datasets):
    def rows() -> Any:
        for i in range(1234):
            yield {"text": "x" * (i % 50), "tokens": list(range(i % 9))}

    features = datasets.Features(
        {"text": datasets.Value("string"), "tokens": datasets.List(datasets.Value("int32"))}
    )
    ds = datasets.Dataset.from_generator(
        rows, features=features, cache_dir=str(tmp_path / "cache"), writer_batch_size=100
    )
    # A shuffled dataset is saved in its shuffled order (save_to_disk flattens the indices).
    ds = ds.shuffle(seed=3)
    ds.save_to_disk(str(tmp_path / "gen"), num_shards=2, max_shard_size=None)

    files, indexes, text_rows = _read_back(_source(tmp_path / "gen"), "text")
    assert text_rows == ds["text"]
    assert sum(sum(i.group_rows) for i in indexes) == 1234
    assert [i.group_rows for i in indexes] == [tuple(_stream_batches(f)) for f in files]

    source = _source(tmp_path / "gen", None, "tokens")
    _, _, token_rows = _read_back(source, "tokens", "tokens")
    assert token_rows == ds["tokens"]

    # What a loader does next: the arrays feed the transforms as a Parquet column would.
    reader = FORMAT.open(files[0])
    try:
        n = FORMAT.index(source, KEY, files[0], "tokens", "tokens").group_rows[0]
        ids = token_lists(reader.read(0, "tokens"))
        assert [list(a) for a in ids] == ds["tokens"][:n]
        utf8 = text_bytes(reader.read(0, "text"))
        assert [bytes(a.astype("uint8")) for a in utf8] == [t.encode() for t in ds["text"][:n]]
    finally:
        reader.close()


def test_a_dataset_dict_folder_asks_for_one_split(tmp_path, datasets):
    ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SourceError) as exc:
        FORMAT.files(_source(tmp_path / "dd"), KEY)
    message = _one_sentence(exc, str(tmp_path / "dd"), "DatasetDict", "train, test")
    assert str(tmp_path / "dd" / "train") in message

    # One split's folder is a dataset like any other.
    _, _, rows = _read_back(_source(tmp_path / "dd" / "test"), "text")
    assert rows == ["a", "b"]


def test_state_json_listing_a_missing_file_is_refused(tmp_path, datasets):
    ds = datasets.Dataset.from_dict({"text": [str(i) for i in range(20)]})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)
    (tmp_path / "ds" / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(SourceError) as exc:
        FORMAT.files(_source(tmp_path / "ds"), KEY)
    _one_sentence(exc, "state.json", "data-00001-of-00002.arrow", "does not exist")


@pytest.mark.parametrize(
    "state",
    ["{not json", "[]", '{"_data_files": []}', '{"_data_files": [{"name": "x.arrow"}]}'],
)
def test_a_garbled_state_json_is_refused(tmp_path, state):
    folder = tmp_path / "ds"
    folder.mkdir()
    _write_ipc(folder / "data-00000-of-00001.arrow", [_batch(["a"])], file_format=False)
    (folder / "state.json").write_text(state)
    with pytest.raises(SourceError) as exc:
        FORMAT.files(_source(folder), KEY)
    _one_sentence(exc, str(folder / "state.json"), "save_to_disk")


def test_a_folder_without_state_json_points_at_a_glob(tmp_path):
    (tmp_path / "plain").mkdir()
    _write_ipc(tmp_path / "plain" / "a.arrow", [_batch(["a"])], file_format=False)
    with pytest.raises(SourceError) as exc:
        FORMAT.files(_source(tmp_path / "plain"), KEY)
    _one_sentence(exc, str(tmp_path / "plain"), "state.json", "*.arrow")


# --- plain IPC files written with pyarrow --------------------------------------------------


@pytest.mark.parametrize("file_format", [True, False], ids=["ipc-file", "ipc-stream"])
def test_plain_ipc_files_read_back_batch_by_batch(tmp_path, file_format):
    texts = [f"t{i}" for i in range(25)]
    batches = [
        _batch(texts[:10], ids=_ids([[i] for i in range(10)])),
        _batch([], ids=_ids([])),  # an empty batch is a group too
        _batch(texts[10:13], ids=_ids([[1, 2]] * 3)),
        _batch(texts[13:], ids=_ids([[]] * 12)),
    ]
    _write_ipc(tmp_path / "b.arrow", batches, file_format)
    _write_ipc(tmp_path / "a.arrow", [_batch(["first"], ids=_ids([[7]]))], file_format)
    if file_format:
        assert (tmp_path / "b.arrow").read_bytes()[:6] == b"ARROW1"

    files, indexes, rows = _read_back(_source(tmp_path / "*.arrow"), "text")
    assert files == (str(tmp_path / "a.arrow"), str(tmp_path / "b.arrow"))
    assert [i.group_rows for i in indexes] == [(1,), (10, 0, 3, 12)]
    assert rows == ["first", *texts]
    _, _, ids = _read_back(_source(tmp_path / "*.arrow", None, "ids"), "ids", "tokens")
    assert ids == [[7]] + [[i] for i in range(10)] + [[1, 2]] * 3 + [[]] * 12


def test_large_string_and_binary_columns_are_text(tmp_path):
    batch = pa.record_batch(
        {
            "text": pa.array(["α", "β"], pa.large_string()),
            "raw": pa.array([b"\x00a", b"b"], pa.binary()),
            "ids": pa.array([[1], [2, 3]], pa.large_list(pa.int16())),
        }
    )
    path = str(_write_ipc(tmp_path / "x.arrow", [batch, batch], file_format=True))
    source = _source(path)
    for column, kind, want in [
        ("text", "text", ["α", "β"]),
        ("raw", "text", [b"\x00a", b"b"]),
        ("ids", "tokens", [[1], [2, 3]]),
    ]:
        assert FORMAT.index(source, KEY, path, column, kind).group_rows == (2, 2)
        reader = FORMAT.open(path)
        assert reader.read(1, column).to_pylist() == want
        reader.close()


def test_reads_are_zero_copy_views_of_the_memory_map(tmp_path):
    big = "y" * 1_000_000
    batches = [_batch([big] * 8) for _ in range(4)]  # 32 MB of text
    for file_format, name in [(True, "f.arrow"), (False, "s.arrow")]:
        path = str(_write_ipc(tmp_path / name, batches, file_format))
        before = pa.total_allocated_bytes()
        reader = FORMAT.open(path)
        arrays = [reader.read(g, "text") for g in range(4)]
        assert pa.total_allocated_bytes() - before < 1_000_000
        assert sum(a.nbytes for a in arrays) > 32_000_000
        reader.close()
        # Arrays handed out stay valid after close: they hold the mapping.
        assert arrays[3][7].as_py() == big
        with pytest.raises(ValueError, match="closed"):
            reader.read(0, "text")


@pytest.mark.parametrize("file_format", [True, False], ids=["ipc-file", "ipc-stream"])
def test_holds_text_is_false_only_when_every_batch_is_null_or_empty(tmp_path, file_format):
    nulls = _write_ipc(tmp_path / "n.arrow", [_batch([None, None]), _batch([])], file_format)
    empty = _write_ipc(tmp_path / "e.arrow", [_batch(["", None]), _batch([""])], file_format)
    sliced = _batch(["abc", "", ""]).slice(1)
    empty2 = _write_ipc(tmp_path / "e2.arrow", [sliced], file_format)
    late = _write_ipc(tmp_path / "l.arrow", [_batch([None]), _batch(["", "z"])], file_format)
    source = _source(tmp_path / "*.arrow")
    holds = {
        p.name: FORMAT.index(source, KEY, str(p), "text", "text").holds_text
        for p in (nulls, empty, empty2, late)
    }
    assert holds == {"n.arrow": False, "e.arrow": False, "e2.arrow": False, "l.arrow": True}

    lists = pa.array([[], None], pa.list_(pa.int32()))
    no_ids = _write_ipc(tmp_path / "t.arrow", [_batch(["a", "b"], ids=lists)], file_format)
    tokens = _source(no_ids, None, "ids")
    assert not FORMAT.index(tokens, KEY, str(no_ids), "ids", "tokens").holds_text
    some = pa.array([[], [5]], pa.list_(pa.int32()))
    ids = _write_ipc(tmp_path / "u.arrow", [_batch(["a", "b"], ids=some)], file_format)
    assert FORMAT.index(tokens, KEY, str(ids), "ids", "tokens").holds_text


def test_emptiness_reads_the_offsets_of_a_sliced_array():
    strings = pa.array(["abc", "", "", "de"])
    assert _null_or_empty(strings.slice(1, 2))
    assert not _null_or_empty(strings.slice(2, 2))
    assert not _null_or_empty(strings.slice(0, 1))
    big = pa.array(["", "", "x"], pa.large_binary())
    assert _null_or_empty(big.slice(0, 2)) and not _null_or_empty(big.slice(1))
    lists = pa.array([[1], [], None, [2]], pa.list_(pa.int32()))
    assert _null_or_empty(lists.slice(1, 2)) and not _null_or_empty(lists.slice(2))


# --- errors -------------------------------------------------------------------------------


def test_a_missing_column_names_the_file_and_the_columns_it_has(tmp_path):
    path = str(_write_ipc(tmp_path / "a.arrow", [_batch(["a"], ids=[[1]])], False))
    with pytest.raises(SourceError) as exc:
        FORMAT.index(_source(path, "content"), KEY, path, "content", "text")
    _one_sentence(exc, path, "'content'", "text, ids", f"{KEY}.text_column")


def test_a_column_of_the_wrong_type_is_refused(tmp_path, datasets):
    ds = datasets.Dataset.from_dict({"text": ["a", "b"], "n": [1, 2], "ids": [[1], [2]]})
    ds.save_to_disk(str(tmp_path / "ds"))
    (path,) = FORMAT.files(_source(tmp_path / "ds"), KEY)
    with pytest.raises(SourceError) as exc:
        FORMAT.index(_source(tmp_path / "ds", "n"), KEY, path, "n", "text")
    _one_sentence(exc, path, "'n'", "int64", "not string or binary")
    with pytest.raises(SourceError) as exc:
        FORMAT.index(_source(tmp_path / "ds", None, "text"), KEY, path, "text", "tokens")
    _one_sentence(exc, path, "not a list of integers", f"{KEY}.token_column")
    with pytest.raises(SourceError) as exc:
        FORMAT.index(_source(tmp_path / "ds", "ids"), KEY, path, "ids", "text")
    _one_sentence(exc, path, "list<item: int64>")


def _not_arrow(tmp_path: Path) -> list[Path]:
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"hello, this is not Arrow at all " * 20)
    empty = tmp_path / "empty.arrow"
    empty.write_bytes(b"")
    parquet = tmp_path / "table.arrow"
    pq.write_table(pa.table({"text": ["a"]}), parquet)
    stream = _write_ipc(tmp_path / "s.arrow", [_batch(["a" * 100])] * 3, file_format=False)
    cut_stream = tmp_path / "cut-stream.arrow"
    cut_stream.write_bytes(stream.read_bytes()[: stream.stat().st_size // 2])
    file = _write_ipc(tmp_path / "f.arrow", [_batch(["a" * 100])] * 3, file_format=True)
    cut_file = tmp_path / "cut-file.arrow"
    cut_file.write_bytes(file.read_bytes()[:-30])
    folder = tmp_path / "folder.arrow"
    folder.mkdir()
    return [junk, empty, parquet, cut_stream, cut_file, folder]


def test_a_file_that_is_not_arrow_is_one_sentence_naming_it(tmp_path):
    for path in _not_arrow(tmp_path):
        with pytest.raises(SourceError) as exc:
            FORMAT.index(_source(path), KEY, str(path), "text", "text")
        _one_sentence(exc, str(path), "not a readable Arrow IPC file", f"{KEY}.path")
        with pytest.raises(SourceError) as exc:
            FORMAT.open(str(path))
        assert str(path) in str(exc.value) and ". " not in str(exc.value)


def test_a_glob_matching_nothing_is_refused(tmp_path):
    with pytest.raises(SourceError) as exc:
        FORMAT.files(_source(tmp_path / "*.arrow"), KEY)
    _one_sentence(exc, "no file matches", str(tmp_path / "*.arrow"))


@pytest.mark.parametrize("file_format", [True, False], ids=["ipc-file", "ipc-stream"])
def test_a_file_changed_since_indexing_is_reported_by_name(tmp_path, file_format):
    path = tmp_path / "a.arrow"
    _write_ipc(path, [_batch(["a"]), _batch(["b"]), _batch(["c"])], file_format)
    index = FORMAT.index(_source(path), KEY, str(path), "text", "text")
    assert index.group_rows == (1, 1, 1)
    _write_ipc(path, [pa.record_batch({"other": pa.array(["x"])})], file_format)
    reader = FORMAT.open(str(path))
    try:
        with pytest.raises(SourceError) as exc:
            reader.read(2, "text")
        assert str(path) in str(exc.value) and "changed" in str(exc.value)
        with pytest.raises(SourceError) as exc:
            reader.read(0, "text")
        assert str(path) in str(exc.value) and "'text'" in str(exc.value)
    finally:
        reader.close()
    shutil.copy(path, tmp_path / "b.arrow")
    os.remove(path)
    with pytest.raises(SourceError) as exc:
        FORMAT.open(str(path))
    assert str(path) in str(exc.value)


def test_the_format_is_named_arrow():
    assert FORMAT.name == "arrow"
