"""Source indexing, row-group reading and transforms, on real Parquet files in tmp_path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msd.errors import SourceError
from msd.recipe.schema import Source, Transform
from msd.sources.index import RowGroup, open_source, source_key
from msd.sources.read import RowGroupReader
from msd.sources.transforms import make_transform

TEXTS = ["héllo wörld", "", None, "日本語", "a😀b", "plain"]


def _write(path: Path, columns: dict[str, Any], rows_per_group: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=rows_per_group)
    return path


def _text(n: int, start: int = 0) -> dict[str, Any]:
    rows = range(start, start + n)
    return {"id": list(rows), "text": [f"row {i}" for i in rows]}


def _src(path: Path | str, **kw: Any) -> Source:
    kw.setdefault("text_column", "text")
    return Source(name="web", path=str(path), weight=1.0, **kw)


def _error(source: Source, key: str = "sources[0]") -> str:
    with pytest.raises(SourceError) as info:
        open_source(source, key)
    return str(info.value)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    # Written in reverse name order: the index must sort, not trust the file system.
    _write(tmp_path / "data" / "b.parquet", _text(10, 3), rows_per_group=4)
    _write(tmp_path / "data" / "a.parquet", _text(3), rows_per_group=5)
    (tmp_path / "data" / "sub.parquet").mkdir()  # a directory matching the glob is skipped
    return tmp_path / "data"


def test_open_source_indexes_sorted_files_and_row_groups(data: Path) -> None:
    index = open_source(_src(data / "*.parquet"), "sources[0]")
    a, b = str(data / "a.parquet"), str(data / "b.parquet")
    assert index.files == (a, b)
    groups = (RowGroup(a, 0, 3), RowGroup(b, 0, 4), RowGroup(b, 1, 4), RowGroup(b, 2, 2))
    assert index.row_groups == groups
    assert index.row_starts == (0, 3, 7, 11)
    assert index.num_rows == 13
    assert (index.name, index.column, index.column_kind) == ("web", "text", "text")


def test_open_source_relative_and_home_paths_become_absolute(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(data.parent)
    assert open_source(_src("data/a.*"), "s").files == (str(data / "a.parquet"),)
    monkeypatch.setenv("HOME", str(data.parent))
    assert open_source(_src("~/data/b.parquet"), "s").files == (str(data / "b.parquet"),)


def test_token_column_kind(tmp_path: Path) -> None:
    _write(tmp_path / "t.parquet", {"ids": pa.array([[1, 2], [3]], pa.list_(pa.int32()))})
    index = open_source(_src(tmp_path / "t.parquet", text_column=None, token_column="ids"), "s")
    assert (index.column, index.column_kind, index.num_rows) == ("ids", "tokens", 2)


def test_no_match_names_source_key_and_pattern(tmp_path: Path) -> None:
    msg = _error(_src(tmp_path / "nothing" / "*.parquet"), "sources[2]")
    assert "'web'" in msg and "sources[2].path" in msg and "nothing/*.parquet" in msg
    assert "current directory" in msg


def test_not_parquet_names_the_file(data: Path) -> None:
    bad = data / "c.parquet"
    bad.write_text("not parquet at all")
    msg = _error(_src(data / "*.parquet"))
    assert "'web'" in msg and "sources[0].path" in msg and str(bad) in msg
    assert "\n" not in msg


@pytest.mark.parametrize("columns", [{}, {"text_column": "text", "token_column": "ids"}])
def test_exactly_one_column_is_required(data: Path, columns: dict[str, str]) -> None:
    source = Source(name="web", path=str(data / "*.parquet"), weight=1.0, **columns)
    msg = _error(source, "sources[4]")
    assert "'web'" in msg and "sources[4]" in msg and "exactly one" in msg


def test_missing_column_lists_the_columns_present(data: Path) -> None:
    msg = _error(_src(data / "*.parquet", text_column="body"))
    assert "sources[0].text_column" in msg and str(data / "a.parquet") in msg
    assert "'body'" in msg and "id, text" in msg


@pytest.mark.parametrize(
    ("column", "kind", "typ"),
    [
        (pa.array([1, 2]), "text_column", "int64"),
        (pa.array(["a", "b"]), "token_column", "string"),
        (pa.array([[1.0], [2.0]]), "token_column", "double"),
    ],
)
def test_wrong_column_type(tmp_path: Path, column: Any, kind: str, typ: str) -> None:
    path = _write(tmp_path / "x.parquet", {"c": column})
    other = "token_column" if kind == "text_column" else "text_column"
    msg = _error(_src(path, **{kind: "c", other: None}))
    assert f"sources[0].{kind}" in msg and str(path) in msg and typ in msg


def test_zero_rows(tmp_path: Path) -> None:
    _write(tmp_path / "e.parquet", {"text": pa.array([], pa.string())})
    msg = _error(_src(tmp_path / "*.parquet"))
    assert "'web'" in msg and "no rows" in msg and "*.parquet" in msg


def test_source_key_is_stable_64_bit() -> None:
    # Seeds derive from this: a change here reshuffles every existing job.
    assert source_key("web") == 5800646647749121652
    assert source_key("code") != source_key("web")
    assert all(0 <= source_key(n) < 2**64 for n in ["", "books", "日本"])


def test_reader_reads_one_row_group_of_one_column(data: Path) -> None:
    b = str(data / "b.parquet")
    with RowGroupReader() as reader:
        text = reader.read(RowGroup(b, 1, 4), "text")
        ids = reader.read(RowGroup(b, 2, 2), "id")
    assert isinstance(text, pa.Array)
    assert text.to_pylist() == ["row 7", "row 8", "row 9", "row 10"]
    assert ids.to_pylist() == [11, 12]
    assert reader.open_files() == ()


def test_reader_keeps_at_most_max_open_files(tmp_path: Path) -> None:
    paths = [str(_write(tmp_path / f"{i}.parquet", _text(2))) for i in range(3)]
    reader = RowGroupReader(max_open_files=2)
    for path in [paths[0], paths[1], paths[0], paths[2]]:
        reader.read(RowGroup(path, 0, 2), "text")
    assert reader.open_files() == (paths[0], paths[2])  # paths[1] was least recently used
    reader.close()
    assert reader.open_files() == ()
    with pytest.raises(ValueError):
        RowGroupReader(max_open_files=0)


def test_reader_errors_name_the_file(data: Path) -> None:
    reader = RowGroupReader()
    gone, good = RowGroup(str(data / "gone.parquet"), 0, 1), RowGroup(str(data / "a.parquet"), 0, 3)
    for rg, column in [(gone, "text"), (good, "nope")]:
        with pytest.raises(SourceError, match=rg.file):
            reader.read(rg, column)


def _as_lists(arrays: list[Any]) -> list[list[int]]:
    assert all(a.dtype == np.int32 and a.ndim == 1 for a in arrays)
    return [a.tolist() for a in arrays]


def _expected_bytes(texts: list[str | None]) -> list[list[int]]:
    return [list((t or "").encode()) for t in texts]


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_bytes_fast_path_equals_utf8_encode(typ: Any) -> None:
    tokenize = make_transform(Transform(), "text")
    values = [t.encode() if t is not None and "binary" in str(typ) else t for t in TEXTS]
    array = pa.array(values, typ)
    assert _as_lists(tokenize(array)) == _expected_bytes(TEXTS)
    assert _as_lists(tokenize(array.slice(2, 3))) == _expected_bytes(TEXTS[2:5])
    assert _as_lists(tokenize(array.slice(3, 3))) == _expected_bytes(TEXTS[3:6])  # no nulls
    assert tokenize(array.slice(6)) == []


def test_bytes_null_slot_backed_by_data_is_empty() -> None:
    offsets = pa.py_buffer(np.array([0, 2, 5, 7], np.int32).tobytes())
    validity = pa.py_buffer(bytes([0b101]))
    array = pa.StringArray.from_buffers(3, offsets, pa.py_buffer(b"abcdefg"), validity, 1)
    assert _as_lists(make_transform(Transform(), "text")(array)) == [[97, 98], [], [102, 103]]


@given(st.lists(st.one_of(st.none(), st.text()), max_size=20), st.integers(0, 5))
def test_bytes_fast_path_property(texts: list[str | None], start: int) -> None:
    array = pa.array(texts, pa.string()).slice(min(start, len(texts)))
    expected = _expected_bytes(texts[min(start, len(texts)) :])
    assert _as_lists(make_transform(Transform(), "text")(array)) == expected


@pytest.mark.parametrize("typ", [pa.list_(pa.int64()), pa.large_list(pa.int16())])
def test_token_column_passes_through(typ: Any) -> None:
    array = pa.array([[1, 2, 3], None, [], [4], [5, 6]], typ)
    tokenize = make_transform(Transform(), "tokens")
    assert _as_lists(tokenize(array)) == [[1, 2, 3], [], [], [4], [5, 6]]
    assert _as_lists(tokenize(array.slice(1, 3))) == [[], [], [4]]


@pytest.mark.parametrize(
    "array",
    [
        pa.array([[1], [2**31]], pa.list_(pa.int64())),
        pa.array([[2**63]], pa.list_(pa.uint64())),
        pa.array([[1, None]], pa.list_(pa.int64())),
    ],
)
def test_token_column_refuses_bad_ids(array: Any) -> None:
    with pytest.raises(SourceError):
        make_transform(Transform(), "tokens")(array)


def test_tokenizer_kind(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "[CLS]": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # A post-processor that would add [CLS]: the transform must not apply it.
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", special_tokens=[("[CLS]", 1)]
    )
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    tokenize = make_transform(Transform(kind="tokenizer", path=path), "text")
    array = pa.array(["hello world", None, "world foo hello"])
    assert _as_lists(tokenize(array)) == [[2, 3], [], [3, 0, 2]]


@pytest.mark.parametrize("content", [None, "{not json"])
def test_tokenizer_bad_file_names_the_path(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SourceError, match=r"tokenizer\.json"):
        make_transform(Transform(kind="tokenizer", path=str(path)), "text")
    with pytest.raises(SourceError, match="text_column"):
        make_transform(Transform(kind="tokenizer", path="x.json"), "tokens")


HELPER = """
def word_lengths(text):
    return [len(w) for w in text.split()]
def reverse(ids):
    return ids[::-1]
def square(text):
    return [[1, 2], [3, 4]]
def fail(text):
    raise RuntimeError("boom")
NOT_CALLABLE = 3
"""


@pytest.fixture
def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = "msd_test_transform_helper"
    (tmp_path / f"{name}.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_function_kind_on_text_and_tokens(helper: str) -> None:
    lengths = make_transform(Transform(kind="function", function=f"{helper}:word_lengths"), "text")
    assert _as_lists(lengths(pa.array(["ab cde", None, ""]))) == [[2, 3], [], []]
    reverse = make_transform(Transform(kind="function", function=f"{helper}:reverse"), "tokens")
    assert _as_lists(reverse(pa.array([[1, 2, 3], [], None]))) == [[3, 2, 1], [], []]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_colon", "package.module:function"),
        ("msd_no_such_module_xyz:f", "msd_no_such_module_xyz"),
        ("{helper}:missing", "missing"),
        ("{helper}:NOT_CALLABLE", "not callable"),
    ],
)
def test_function_kind_load_errors(helper: str, spec: str, match: str) -> None:
    with pytest.raises(SourceError, match=match):
        make_transform(Transform(kind="function", function=spec.format(helper=helper)), "text")


@pytest.mark.parametrize(("fn", "match"), [("fail", "boom"), ("square", "flat")])
def test_function_kind_call_errors(helper: str, fn: str, match: str) -> None:
    tokenize = make_transform(Transform(kind="function", function=f"{helper}:{fn}"), "text")
    with pytest.raises(SourceError, match=match):
        tokenize(pa.array(["x"]))
