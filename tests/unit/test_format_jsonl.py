"""The JSON Lines source format, on real files in tmp_path holding the stdlib's docstrings."""

from __future__ import annotations

import gzip
import importlib
import inspect
import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats.base import ColumnKind, FileIndex, cache_dir
from msd.sources.formats.jsonl import FORMAT, GROUP_BYTES, MAX_PROBLEMS, cached_index, load_index
from msd.sources.transforms import text_bytes, token_lists

try:
    import zstandard
except ImportError:  # an optional dependency: the .zst cases are skipped without it
    zstandard = None  # type: ignore[assignment]

KEY = "sources[0]"
needs_zstd = pytest.mark.skipif(zstandard is None, reason="needs the zstandard package")
MODULES = (
    "argparse", "asyncio", "calendar", "codecs", "collections", "configparser", "contextlib",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "doctest", "email", "enum",
    "functools", "gzip", "heapq", "http.client", "inspect", "itertools", "json", "logging",
    "os", "pathlib", "pickle", "pydoc", "random", "re", "shutil", "socket", "statistics",
    "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "unittest", "urllib.parse", "zipfile",
)  # fmt: skip
ODD = ["héllo wörld", "日本語のテキスト", "a😀b", 'quotes " and \\ backslash', "tab\tand\u2028sep"]


@cache
def _paragraphs() -> tuple[str, ...]:
    """Paragraphs of the docstrings of some stdlib modules and their classes and functions."""
    found: list[str] = []
    for name in MODULES:
        module = importlib.import_module(name)
        docs = [module.__doc__ or ""]
        for attr, obj in sorted(vars(module).items()):
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                docs.append(inspect.getdoc(obj) or "")
        found += [p.strip() for doc in docs for p in doc.split("\n\n") if len(p.strip()) > 40]
    paragraphs = tuple(dict.fromkeys(found))
    assert len(paragraphs) > 500, "the stdlib docstrings are needed (not run with -OO)"
    return paragraphs


def _texts(total_bytes: int) -> list[str]:
    """Texts of one to five paragraphs each (and some odd characters), ``total_bytes`` in all."""
    paras, texts, size, i = _paragraphs(), [], 0, 0
    while size < total_bytes:
        start = (i * 7) % len(paras)
        text = "\n\n".join(paras[start : start + i % 5 + 1])
        if i % 50 == 0:
            text = f"{ODD[(i // 50) % len(ODD)]} {text}"
        texts.append(text)
        size += len(text.encode())
        i += 1
    return texts


def _write(path: Path, lines: list[str] | list[bytes], codec: str | None = None) -> Path:
    raw = [line.encode() if isinstance(line, str) else line for line in lines]
    data = b"".join(line + b"\n" for line in raw)
    if codec == "gzip":
        data = gzip.compress(data)
    elif codec == "zstd":
        assert zstandard is not None
        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _rows(path: Path, rows: list[dict[str, Any]], codec: str | None = None) -> Path:
    return _write(path, [json.dumps(r, ensure_ascii=False) for r in rows], codec)


def _src(path: Path | str, **kw: Any) -> Source:
    if "token_column" not in kw:
        kw.setdefault("text_column", "text")
    return Source(name="web", path=str(path), weight=1.0, **kw)


def _index(path: Path, column: str = "text", kind: ColumnKind = "text") -> FileIndex:
    return FORMAT.index(_src(path), KEY, str(path), column, kind)


def _read_all(path: Path, column: str = "text", kind: ColumnKind = "text") -> list[Any]:
    index = _index(path, column, kind)
    reader = FORMAT.open(str(path), kind)
    try:
        arrays = [reader.read(g, column) for g in range(len(index.group_rows))]
    finally:
        reader.close()
    assert [len(a) for a in arrays] == list(index.group_rows)
    return [cell for a in arrays for cell in a.to_pylist()]


def _error(fn: Any, *args: Any) -> str:
    with pytest.raises(SourceError) as info:
        fn(*args)
    return str(info.value)


def _cache_files() -> list[Path]:
    return sorted(cache_dir("jsonl").glob("*.npz"))


@pytest.fixture(autouse=True)
def _cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))


# Round trips -------------------------------------------------------------------------------------

NAMES = {None: "docs.jsonl", "gzip": "docs.jsonl.gz", "zstd": "docs.ndjson.zst"}


@pytest.mark.parametrize("codec", [None, "gzip", pytest.param("zstd", marks=needs_zstd)])
def test_every_row_comes_back_in_order_across_several_groups(
    tmp_path: Path, codec: str | None
) -> None:
    texts = _texts(3 * GROUP_BYTES + GROUP_BYTES // 2)
    rows = [{"id": i, "text": t, "meta": {"n": i}} for i, t in enumerate(texts)]
    path = _rows(tmp_path / NAMES[codec], rows, codec)
    index = _index(path)
    assert len(index.group_rows) >= 4 and sum(index.group_rows) == len(texts)
    assert index.holds_text and index.problems == ()
    assert _read_all(path) == texts
    # The groups are runs of lines of about GROUP_BYTES each (the last may be short).
    line_index = load_index(str(path), "text", "text")
    spans = [line_index.span(g) for g in range(line_index.num_groups)]
    assert all(stop - start <= GROUP_BYTES for start, stop in spans)
    assert all(stop - start > GROUP_BYTES * 0.9 for start, stop in spans[:-1])


def test_a_text_group_is_a_string_array_whose_bytes_are_the_utf8_of_each_text(
    tmp_path: Path,
) -> None:
    texts = [*ODD, "", "plain"]
    path = _rows(tmp_path / "odd.json", [{"text": t} for t in texts])
    _index(path)
    array = FORMAT.open(str(path), "text").read(0, "text")
    assert array.type == pa.string()
    assert array.to_pylist() == texts
    assert [bytes(ids.astype(np.uint8)) for ids in text_bytes(array)] == [t.encode() for t in texts]


def test_a_line_longer_than_a_group_is_a_group_of_its_own(tmp_path: Path) -> None:
    paras = _paragraphs()
    big = "\n".join(paras) * (GROUP_BYTES // len("\n".join(paras)) + 2)
    texts = ["before", big, "after", "and more"]
    path = _rows(tmp_path / "big.jsonl", [{"text": t} for t in texts])
    assert _index(path).group_rows == (1, 1, 2)
    assert _read_all(path) == texts


def test_nested_key_paths_give_nulls_where_a_level_is_missing_or_null(tmp_path: Path) -> None:
    paras = _paragraphs()
    rows: list[dict[str, Any]] = [
        {"meta": {"content": paras[0], "lang": "en"}, "text": "not this"},
        {"meta": {"lang": "en"}},
        {"meta": None},
        {"other": 1},
        {"meta": {"content": None}},
        {"meta": {"content": paras[1], "deeper": {"content": "no"}}},
    ]
    path = _rows(tmp_path / "nested.jsonl", rows)
    assert _read_all(path, "meta.content") == [paras[0], None, None, None, None, paras[1]]
    deep = _rows(tmp_path / "deep.jsonl", [{"a": {"b": {"c": "x"}}}, {"a": {"b": {}}}])
    assert _read_all(deep, "a.b.c") == ["x", None]


def test_token_lists_come_back_as_int64_lists_with_nulls(tmp_path: Path) -> None:
    ids = [[1, 2, 3], [], None, [2**63 - 1, -(2**63)], [0] * 1000, [7]]
    rows: list[dict[str, Any]] = [{"ids": v} for v in ids]
    rows.insert(2, {"text": "no ids here"})
    path = _rows(tmp_path / "tokens.jsonl.gz", rows, "gzip")
    index = _index(path, "ids", "tokens")
    assert index.problems == () and sum(index.group_rows) == len(rows)
    array = FORMAT.open(str(path), "tokens").read(0, "ids")
    assert array.type == pa.list_(pa.int64())
    assert array.to_pylist() == [*ids[:2], None, *ids[2:]]
    small = _rows(tmp_path / "small.jsonl", [{"ids": [5, 6]}, {"ids": None}, {"ids": [9]}])
    _index(small, "ids", "tokens")
    cells = token_lists(FORMAT.open(str(small), "tokens").read(0, "ids"))
    assert [c.tolist() for c in cells] == [[5, 6], [], [9]]


def test_tokens_that_are_not_int64_integers_are_left_out(tmp_path: Path) -> None:
    lines = [
        '{"ids": [1, 2]}',
        '{"ids": [1, true]}',
        '{"ids": [1.0]}',
        f'{{"ids": [{2**63}]}}',
        '{"ids": [1, null]}',
        '{"ids": "1 2 3"}',
        '{"ids": [3]}',
    ]
    path = _write(tmp_path / "bad-ids.jsonl", lines)
    index = _index(path, "ids", "tokens")
    assert sum(index.group_rows) == 2
    assert [p.split(":")[0] for p in index.problems] == [f"line {n}" for n in (2, 3, 4, 5, 6)]
    assert all("'ids' is not a list of integers" in p for p in index.problems)
    assert _read_all(path, "ids", "tokens") == [[1, 2], [3]]


def test_null_missing_and_empty_text(tmp_path: Path) -> None:
    path = _rows(tmp_path / "some.jsonl", [{"text": None}, {}, {"text": ""}, {"text": "x"}])
    index = _index(path)
    assert index.holds_text and index.group_rows == (4,)
    assert _read_all(path) == [None, None, "", "x"]
    empty = _rows(tmp_path / "none.jsonl", [{"text": None}, {"id": 3}, {"text": ""}])
    index = _index(empty)
    assert not index.holds_text and index.group_rows == (3,)
    blank = _write(tmp_path / "blank.jsonl", ["", "  ", "\r"])
    assert _index(blank) == FileIndex((), holds_text=False)


# Lines left out ----------------------------------------------------------------------------------


def _messy(tmp_path: Path) -> tuple[Path, list[str]]:
    paras = _paragraphs()
    lines: list[str] = []
    kept: list[str] = []
    for i in range(40):
        lines.append(json.dumps({"text": paras[i]}))
        kept.append(paras[i])
    lines[3] = '{"text": "cut sho'
    lines[7] = '["an", "array"]'
    lines[11] = '"a string"'
    lines[15] = '{"text": 17}'
    lines[19] = ""
    lines[23] = json.dumps({"text": paras[23]}) + "\r"  # CRLF: kept
    lines[27] = '{"text": "ok"} trailing'
    for n in (3, 7, 11, 15, 19, 27):
        kept[n] = ""
    return _write(tmp_path / "messy.jsonl", lines), [k for k in kept if k]


def test_malformed_lines_are_left_out_and_listed(tmp_path: Path) -> None:
    path, kept = _messy(tmp_path)
    index = _index(path)
    assert sum(index.group_rows) == len(kept) == 34
    assert index.problems[0].startswith("line 4: not valid JSON (")
    assert index.problems[1].startswith("line 8: not a JSON object (")
    assert index.problems[2].startswith("line 12: not a JSON object (")
    assert index.problems[3].startswith("line 16: 'text' is not a string (")
    assert index.problems[4].startswith("line 28: not valid JSON (")
    assert len(index.problems) == 5  # the blank line 20 is skipped silently
    assert _read_all(path) == kept


def test_lines_left_out_are_the_same_on_every_build(tmp_path: Path) -> None:
    path, _ = _messy(tmp_path)
    first = _index(path)
    assert _index(path) == first
    for path_of_cache in _cache_files():
        path_of_cache.unlink()
    assert _index(path) == first
    assert len(_cache_files()) == 1


def test_problems_stop_at_the_first_few_then_one_count(tmp_path: Path) -> None:
    lines = ["{not json"] * 30 + ['{"text": "fine"}']
    index = _index(_write(tmp_path / "bad.jsonl", lines))
    assert len(index.problems) == MAX_PROBLEMS + 1
    assert index.problems[MAX_PROBLEMS - 1].startswith(f"line {MAX_PROBLEMS}: not valid JSON")
    assert index.problems[-1] == "30 lines left out in all; the first 20 are listed"
    assert index.group_rows == (1,)


def test_a_byte_order_mark_before_the_first_line_is_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path / "bom.jsonl", [b'\xef\xbb\xbf{"text": "first"}', b'{"text": "2"}'])
    index = _index(path)
    assert index.problems == ()
    assert _read_all(path) == ["first", "2"]


# The cache ---------------------------------------------------------------------------------------


def test_the_index_is_cached_and_the_cache_is_what_is_read(tmp_path: Path) -> None:
    path, _ = _messy(tmp_path)
    first = _index(path)
    (cache,) = _cache_files()
    assert list(cache.parent.iterdir()) == [cache]  # written atomically: no temporary left
    # Plant a problem only the cache holds: a second index reading it proves no rescan.
    with np.load(cache, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    header = json.loads(arrays["header"].tobytes())
    header["problems"] = [*header["problems"], "from the cache"]
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(cache, **arrays)
    second = _index(path)
    assert second.problems == (*first.problems, "from the cache")
    assert second.group_rows == first.group_rows
    assert cached_index(str(path), "text", "text") is not None
    assert cached_index(str(path), "text", "tokens") is None  # one cache per column and kind


@pytest.mark.parametrize("damage", ["garbage", "truncated", "offsets", "pickle", "groups"])
def test_a_damaged_cache_is_rebuilt(tmp_path: Path, damage: str) -> None:
    texts = _texts(64 * 1024)
    path = _rows(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    first = _index(path)
    (cache,) = _cache_files()
    data = cache.read_bytes()
    with np.load(cache, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    if damage == "garbage":
        cache.write_bytes(b"not an npz file at all")
    elif damage == "truncated":
        cache.write_bytes(data[: len(data) // 2])
    elif damage == "offsets":
        arrays["ends"] = arrays["ends"] + 10 * path.stat().st_size
        np.savez(cache, **arrays)
    elif damage == "pickle":
        np.savez(cache, **{**arrays, "starts": np.array([object()] * 3, dtype=object)})
    else:
        arrays["groups"] = np.array([0, 0, len(texts)], dtype=np.int64)
        np.savez(cache, **arrays)
    damaged = cache.read_bytes()
    assert _index(path) == first
    assert cache.read_bytes() != damaged  # written again
    rebuilt = cached_index(str(path), "text", "text")
    assert rebuilt is not None and rebuilt.file_index() == first
    assert _read_all(path) == texts


def test_a_changed_file_is_indexed_again(tmp_path: Path) -> None:
    path = _rows(tmp_path / "docs.jsonl", [{"text": "one"}, {"text": "two"}])
    assert _index(path).group_rows == (2,)
    _rows(path, [{"text": "one"}, {"text": "two"}, {"text": "three"}])
    os.utime(path, ns=(1, 1))
    assert _index(path).group_rows == (3,)
    assert _read_all(path) == ["one", "two", "three"]
    assert len(_cache_files()) == 2  # one per version of the file


def test_an_unwritable_cache_only_costs_a_scan(tmp_path: Path, monkeypatch: Any) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("MSD_CACHE_DIR", str(blocker))
    path = _rows(tmp_path / "docs.jsonl", [{"text": "one"}, {"text": "two"}])
    assert _index(path).group_rows == (2,)
    assert _read_all(path) == ["one", "two"]


# Reading -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", pytest.param("zstd", marks=needs_zstd)])
def test_compressed_reads_forward_backward_and_again(tmp_path: Path, codec: str) -> None:
    texts = _texts(4 * GROUP_BYTES)
    path = _rows(tmp_path / f"docs.jsonl{'.gz' if codec == 'gzip' else '.zst'}", [
        {"text": t} for t in texts
    ], codec)  # fmt: skip
    index = _index(path)
    starts = np.cumsum([0, *index.group_rows]).tolist()
    expected = [texts[starts[g] : starts[g + 1]] for g in range(len(index.group_rows))]
    assert len(expected) >= 4
    reader = FORMAT.open(str(path), "text")
    order = [2, 3, 0, 3, 1, 1, 2]
    arrays = [reader.read(g, "text") for g in order]
    assert [a.to_pylist() for a in arrays] == [expected[g] for g in order]
    assert arrays[5] is arrays[4]  # the same group again: kept, not decompressed again
    reader.close()


@needs_zstd
def test_a_zstd_file_of_several_frames_reads_whole(tmp_path: Path) -> None:
    texts = _texts(300 * 1024)
    lines = [json.dumps({"text": t}).encode() + b"\n" for t in texts]
    half = len(lines) // 2
    c = zstandard.ZstdCompressor()
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(c.compress(b"".join(lines[:half])) + c.compress(b"".join(lines[half:])))
    assert _read_all(path) == texts


def test_a_reader_without_a_kind_uses_the_cached_index(tmp_path: Path) -> None:
    path = _rows(tmp_path / "docs.jsonl", [{"ids": [1, 2]}, {"ids": [3]}])
    reader = FORMAT.open(str(path))
    message = _error(reader.read, 0, "ids")
    assert "no cached index of 'ids'" in message and str(path) in message
    _index(path, "ids", "tokens")
    assert FORMAT.open(str(path)).read(0, "ids").to_pylist() == [[1, 2], [3]]


def test_a_file_changed_after_indexing_is_refused_on_read(tmp_path: Path) -> None:
    texts = _texts(GROUP_BYTES + 100 * 1024)
    path = _rows(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    assert len(_index(path).group_rows) == 2
    reader = FORMAT.open(str(path), "text")
    assert reader.read(1, "text").to_pylist() == texts[-len(reader.read(1, "text")) :]
    with open(path, "r+b") as file:
        file.truncate(100)
    message = _error(reader.read, 0, "text")
    assert str(path) in message and "changed after it was indexed" in message
    assert "no row group 1" in _error(FORMAT.open(str(path), "text").read, 1, "text")


# Errors ------------------------------------------------------------------------------------------


def test_files_are_the_json_lines_files_the_glob_matches(tmp_path: Path) -> None:
    for name in ("b.jsonl", "a.json.gz", "c.ndjson.zst", "_SUCCESS", "d.jsonl.crc", "e.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "dir.jsonl").mkdir()
    files = FORMAT.files(_src(tmp_path / "*"), KEY)
    assert files == tuple(str(tmp_path / n) for n in ("a.json.gz", "b.jsonl", "c.ndjson.zst"))
    message = _error(FORMAT.files, _src(tmp_path / "*.txt"), KEY)
    assert "'web' (sources[0].path)" in message and "*.jsonl" in message
    assert "no file matches" in _error(FORMAT.files, _src(tmp_path / "none*"), KEY)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "gone.jsonl"
    message = _error(_index, path)
    assert message.startswith("source 'web' (sources[0].path): ")
    assert str(path) in message and "check the path" in message
    assert str(path) in _error(FORMAT.open, str(path))


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("plain.jsonl.gz", b'{"text": "not gzip"}\n', "not a readable gzip stream"),
        ("cut.jsonl.gz", gzip.compress(b'{"text": "x"}\n' * 5000)[:-40], "gzip stream"),
        pytest.param(
            "plain.jsonl.zst",
            b'{"text": "not zstd"}\n',
            "not a readable zstd stream",
            marks=needs_zstd,
        ),
        pytest.param("cut.jsonl.zst", b"", "cut short", marks=needs_zstd),
        ("gz.jsonl", gzip.compress(b'{"text": "x"}\n'), "gzip-compressed but not named so"),
    ],
)
def test_a_bad_stream_is_refused(tmp_path: Path, name: str, data: bytes, said: str) -> None:
    if name == "cut.jsonl.zst":  # a compressed stream with its last 100 bytes cut off
        data = zstandard.ZstdCompressor().compress(os.urandom(3000).hex().encode() * 30)[:-100]
    path = tmp_path / name
    path.write_bytes(data)
    message = _error(_index, path)
    assert message.startswith("source 'web' (sources[0].path): ")
    assert str(path) in message and said in message
    assert len(message.split(". ")) == 1  # one sentence


def test_a_column_no_line_holds_is_refused_with_its_key(tmp_path: Path) -> None:
    path = _rows(tmp_path / "ids.jsonl", [{"text": [1, 2, 3]}, {"text": [4]}])
    message = _error(_index, path)
    assert message.startswith("source 'web' (sources[0].text_column): ")
    assert "line 1: 'text' is not a string" in message and "token_column" in message
    message = _error(_index, _rows(tmp_path / "t.jsonl", [{"ids": "text"}]), "ids", "tokens")
    assert message.startswith("source 'web' (sources[0].token_column): ")
    junk = _write(tmp_path / "junk.jsonl", ["<html>", "</html>"])
    assert "line 1: not valid JSON" in _error(_index, junk)


def test_a_bad_key_path_is_refused(tmp_path: Path) -> None:
    path = _rows(tmp_path / "docs.jsonl", [{"text": "x"}])
    message = _error(_index, path, "meta..content")
    assert message.startswith("source 'web' (sources[0].text_column): 'meta..content'")


@needs_zstd
def test_zst_without_zstandard_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _rows(tmp_path / "docs.jsonl.zst", [{"text": "x"}], "zstd")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # what an absent package looks like
    message = _error(_index, path)
    assert message.startswith("source 'web' (sources[0].path): ")
    assert "pip install zstandard" in message and str(path) in message


def test_two_columns_of_one_compressed_group_read_from_one_decompression(tmp_path: Path) -> None:
    texts = _texts(GROUP_BYTES // 2)
    rows = [{"text": t, "meta": {"title": t[:20]}} for t in texts]
    path = _rows(tmp_path / "two.jsonl.gz", rows, "gzip")
    _index(path)
    _index(path, "meta.title")
    reader = FORMAT.open(str(path), "text")
    assert reader.read(0, "text").to_pylist() == texts
    assert reader.read(0, "meta.title").to_pylist() == [t[:20] for t in texts]
    assert reader.read(0, "text").to_pylist() == texts
