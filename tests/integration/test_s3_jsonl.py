"""JSON Lines sources in an object store (the S3 test server, tests/s3): each file is indexed by
one pass over it and read a row group at a time, and gives the same rows, in the same row
groups, with the same lines left out, as the same files read from local disk."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from msd.errors import SourceError
from msd.recipe.schema import PinnedFile, Source
from msd.sources import storage
from msd.sources.formats import jsonl
from msd.sources.index import SourceIndex, open_source
from msd.sources.read import RowGroupReader, Unavailable
from tests.s3.server import S3Bucket
from tests.unit.test_format_jsonl import _texts

try:
    import zstandard
except ImportError:  # an optional dependency: the .zst cases are skipped without it
    zstandard = None  # type: ignore[assignment]

KEY = "sources[0]"
needs_zstd = pytest.mark.skipif(zstandard is None, reason="needs the zstandard package")
SUFFIX = {None: ".jsonl", "gzip": ".jsonl.gz", "zstd": ".jsonl.zst"}
CODECS = [None, "gzip", pytest.param("zstd", marks=needs_zstd)]
FILE_TEXT_BYTES = 5 * jsonl.GROUP_BYTES // 2  # two full row groups and a short one per file


@pytest.fixture(autouse=True)
def _cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))


def _lines(seed: int) -> list[bytes]:
    """Lines of real text (stdlib docstrings), nested keys, and malformed lines among them."""
    rng = random.Random(seed)
    texts = _texts(FILE_TEXT_BYTES)
    rng.shuffle(texts)
    out: list[bytes] = []
    for i, text in enumerate(texts):
        row: dict[str, Any] = {"id": i, "text": text, "meta": {"n": i, "lang": "en"}}
        out.append(json.dumps(row, ensure_ascii=i % 3 == 0).encode())
        if i % 41 == 7:
            out.append(b'{"text": "cut short')  # not JSON
        if i % 53 == 11:
            out.append(json.dumps({"text": [1, 2, 3]}).encode())  # not a string
        if i % 67 == 5:
            out.append(b"")  # blank: skipped, not a problem
        if i % 71 == 3:
            out.append(b'["an", "array"]')  # not an object
    return out


def _write(path: Path, lines: list[bytes], codec: str | None) -> None:
    data = b"".join(line + b"\n" for line in lines)
    if codec == "gzip":
        data = gzip.compress(data, compresslevel=6)
    elif codec == "zstd":
        assert zstandard is not None
        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _dataset(root: Path, codec: str | None, files: int = 2) -> Path:
    """``files`` JSON Lines files (and a file that is not one) under ``root``/data."""
    folder = root / "data"
    for k in range(files):
        _write(folder / f"part-{k}{SUFFIX[codec]}", _lines(seed=k), codec)
    (folder / "_SUCCESS").write_bytes(b"")
    return folder


def _upload(s3: S3Bucket, folder: Path, prefix: str) -> None:
    """``s3.upload``, byte for byte: pyarrow's output streams compress a file named .gz or .zst
    on the way unless told not to (``compression=None``)."""
    fs = s3.server.filesystem()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"{s3.bucket}/{prefix}/{path.relative_to(folder).as_posix()}"
            with fs.open_output_stream(key, compression=None) as out:
                out.write(path.read_bytes())


def _src(path: str, **kw: Any) -> Source:
    kw.setdefault("text_column", "text")
    return Source(name="web", path=path, weight=1.0, **kw)


def _read_groups(index: SourceIndex, column: str, order: list[int] | None = None) -> list[pa.Array]:
    groups = index.row_groups
    with RowGroupReader(max_open_files=2) as reader:
        return [reader.read(groups[i], column) for i in order or range(len(groups))]


def _requests(s3: S3Bucket, method: str, prefix: str = "x") -> int:
    """How many ``method`` requests for objects under ``prefix`` of this test's bucket the
    server has logged so far (listings are not counted)."""
    # Every server tests/s3/server.py starts writes one: no log is a broken set-up, not a skip.
    assert s3.server.log and Path(s3.server.log).is_file(), f"no server log {s3.server.log!r}"
    needle = f"{method} /{s3.bucket}/{prefix}/"
    text = Path(s3.server.log).read_text(errors="replace")
    return sum(needle in line for line in text.splitlines())


def _one_sentence(message: str) -> None:
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(f"source 'web' ({KEY}")


# Same rows as local ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_s3_rows_equal_local_rows_group_by_group(
    s3: S3Bucket, tmp_path: Path, codec: str | None
) -> None:
    folder = _dataset(tmp_path, codec)
    _upload(s3, folder, "x")
    pattern = f"*{SUFFIX[codec]}"
    local = open_source(_src(str(folder / pattern)), KEY)
    remote = open_source(_src(s3.url(f"x/{pattern}")), KEY)

    def as_url(path: str) -> str:
        return path.replace(str(folder), s3.url("x"), 1)

    assert remote.files == tuple(as_url(f) for f in local.files) and len(remote.files) == 2
    for path in local.files:  # the objects are the files, byte for byte
        data = Path(path).read_bytes()
        assert storage.read_range(as_url(path), 0, len(data) + 1) == data
    assert [(g.file, g.index, g.num_rows) for g in remote.row_groups] == [
        (as_url(g.file), g.index, g.num_rows) for g in local.row_groups
    ]
    assert len(remote.row_groups) >= 6 and remote.num_rows == local.num_rows
    # The same malformed lines are left out, and listed (20 per file, then a count).
    assert remote.problems == tuple(as_url(p) for p in local.problems)
    assert any("not valid JSON" in p for p in remote.problems)
    assert any("not a JSON object" in p for p in remote.problems)
    assert any("'text' is not a string" in p for p in remote.problems)

    local_arrays = _read_groups(local, "text")
    remote_arrays = _read_groups(remote, "text")
    assert len(remote_arrays) == len(local_arrays)
    for got, want in zip(remote_arrays, local_arrays, strict=True):
        assert got.type == want.type == pa.string()
        assert got.equals(want)
    # Out of order, across both files (a compressed file starts its stream again when the
    # next group lies before the last one): still the same rows.
    order = [4, 0, 5, 1, 1, 3, 2, 0]
    for got, g in zip(_read_groups(remote, "text", order), order, strict=True):
        assert got.equals(local_arrays[g])
    # A nested key path reads the same from S3 too.
    nested_local = open_source(_src(str(folder / pattern), text_column="meta.lang"), KEY)
    nested = open_source(_src(s3.url(f"x/{pattern}"), text_column="meta.lang"), KEY)
    assert [a.to_pylist() for a in _read_groups(nested, "meta.lang")] == [
        a.to_pylist() for a in _read_groups(nested_local, "meta.lang")
    ]


# The index cache ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_a_second_open_reads_the_cache_not_the_objects(
    s3: S3Bucket, tmp_path: Path, codec: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _upload(s3, _dataset(tmp_path, codec), "x")
    scans: list[str] = []
    scan = jsonl._scan_file

    def counted(path: str, *args: Any) -> Any:
        scans.append(path)
        return scan(path, *args)

    monkeypatch.setattr(jsonl, "_scan_file", counted)
    source = _src(s3.url(f"x/*{SUFFIX[codec]}"))
    first = open_source(source, KEY)
    assert scans == list(first.files)
    caches = sorted((tmp_path / "cache" / "jsonl").glob("*.npz"))
    assert [c.name.split(".")[0] for c in caches] == ["part-0", "part-1"]  # local file names
    gets = _requests(s3, "GET")
    second = open_source(source, KEY)
    assert scans == list(first.files)  # no second scan
    assert _requests(s3, "GET") == gets  # and not one byte of the objects fetched
    assert second == first
    # Reading uses the cached index too.
    assert len(_read_groups(second, "text")) == len(second.row_groups)
    assert scans == list(first.files)


def test_a_changed_object_is_indexed_again(s3: S3Bucket, tmp_path: Path) -> None:
    folder = _dataset(tmp_path, None, files=1)
    _upload(s3, folder, "x")
    source = _src(s3.url("x/*.jsonl"))
    before = open_source(source, KEY)
    path = folder / "part-0.jsonl"
    path.write_bytes(path.read_bytes() + b'{"text": "one more line"}\n')
    _upload(s3, folder, "x")
    after = open_source(source, KEY)
    assert after.num_rows == before.num_rows + 1
    assert _read_groups(after, "text")[-1].to_pylist()[-1] == "one more line"


# Requests ----------------------------------------------------------------------------------------


def test_a_plain_group_is_one_ranged_get(s3: S3Bucket, tmp_path: Path) -> None:
    _upload(s3, _dataset(tmp_path, None, files=1), "x")
    index = open_source(_src(s3.url("x/*.jsonl")), KEY)
    gets = _requests(s3, "GET")
    arrays = _read_groups(index, "text")
    assert _requests(s3, "GET") - gets == len(index.row_groups) == len(arrays)


@pytest.mark.parametrize("codec", ["gzip", pytest.param("zstd", marks=needs_zstd)])
def test_a_compressed_object_is_fetched_once_going_forward(
    s3: S3Bucket, tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _dataset(tmp_path, codec, files=1)
    _upload(s3, folder, "x")
    size = (folder / f"part-0{SUFFIX[codec]}").stat().st_size
    chunk = size // 8 + 1
    monkeypatch.setattr(jsonl, "REMOTE_CHUNK", chunk)
    monkeypatch.setattr(jsonl, "_ZSTD_CHUNK", 4096)  # zstd is fed in pieces smaller than that
    passes = -(-size // chunk)  # the GETs one pass over the object takes
    assert passes == 8
    gets = _requests(s3, "GET")
    index = open_source(_src(s3.url(f"x/*{SUFFIX[codec]}")), KEY)
    assert _requests(s3, "GET") - gets <= passes + 1  # indexed: one pass
    gets = _requests(s3, "GET")
    forward = _read_groups(index, "text")
    assert len(forward) >= 3
    assert _requests(s3, "GET") - gets <= passes + 1  # every group, going forward: one pass
    gets = _requests(s3, "GET")
    again = _read_groups(index, "text", [1, 2, 0])  # group 0 after 2: the stream starts again
    assert _requests(s3, "GET") - gets <= 2 * passes + 2
    assert [a.to_pylist() for a in again] == [forward[g].to_pylist() for g in (1, 2, 0)]


# Failures ----------------------------------------------------------------------------------------


def test_a_missing_key_or_prefix_names_the_source(s3: S3Bucket, tmp_path: Path) -> None:
    _upload(s3, _dataset(tmp_path, None, files=1), "x")
    for path in (s3.url("x/gone.jsonl"), s3.url("y/*.jsonl"), s3.url("x/*.jsonl.gz")):
        with pytest.raises(SourceError) as info:
            open_source(_src(path), KEY)
        message = str(info.value)
        _one_sentence(message)
        assert f"({KEY}.path)" in message and path in message
        assert "check the bucket and prefix" in message
    # A file the job pinned at launch, since removed from the bucket.
    url = s3.url("x/part-0.jsonl")
    found = storage.stat(url)
    s3.server.filesystem().delete_file(storage.filesystem(url, storage.LOCAL)[1])
    with pytest.raises(SourceError) as info:
        open_source(_src(s3.url("x/*.jsonl"), files=(PinnedFile(url, found.size, 1),)), KEY)
    message = str(info.value)
    _one_sentence(message)
    assert f"({KEY}.path)" in message and url in message


def test_a_store_failure_while_indexing_is_one_sentence(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each failure below is the same on every try: a short retry budget gives the same message.
    monkeypatch.setattr(storage, "OPEN_RETRY_S", 3.0)
    _upload(s3, _dataset(tmp_path, "gzip", files=1), "x")
    url = s3.url("x/part-0.jsonl.gz")
    # An unsigned request: the server refuses it (moto answers 500, which is retried).
    found = storage.stat(url)
    pinned = PinnedFile(url, found.size, found.mtime_ns)
    refused = _src(s3.url("x/*.jsonl.gz"), anonymous=True, files=(pinned,))
    with pytest.raises(SourceError) as info:
        open_source(refused, KEY)
    message = str(info.value)
    _one_sentence(message)
    assert f"({KEY}.path)" in message and url in message
    # The connection drops in the middle of the scan.
    real = storage.open_input

    def dropping(path: str, store: storage.Store = storage.LOCAL) -> Any:
        return _Flaky(real(path, store), fail_at=found.size // 2)

    monkeypatch.setattr(storage, "open_input", dropping)
    monkeypatch.setattr(jsonl, "REMOTE_CHUNK", 64 * 1024)
    with pytest.raises(SourceError) as info:
        open_source(_src(s3.url("x/*.jsonl.gz")), KEY)
    message = str(info.value)
    _one_sentence(message)
    assert f"({KEY}.path)" in message and url in message and "Timeout was reached" in message
    assert not list((tmp_path / "cache" / "jsonl").glob("*.npz"))  # nothing half-built kept


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_a_transient_read_failure_is_retried_by_the_loader(
    s3: S3Bucket, tmp_path: Path, codec: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _upload(s3, _dataset(tmp_path, codec, files=1), "x")
    index = open_source(_src(s3.url(f"x/*{SUFFIX[codec]}")), KEY)
    want = [a.to_pylist() for a in _read_groups(index, "text")]
    assert len(want) == 3
    size = storage.stat(index.files[0]).size
    real = storage.open_input
    opened: list[_Flaky] = []

    def flaky(path: str, store: storage.Store = storage.LOCAL) -> Any:
        # The first open drops its connection past 60% of the object: in row group 1.
        opened.append(_Flaky(real(path, store), fail_at=None if opened else size * 6 // 10))
        return opened[-1]

    monkeypatch.setattr(storage, "open_input", flaky)
    monkeypatch.setattr(jsonl, "REMOTE_CHUNK", 64 * 1024)
    with RowGroupReader() as reader:
        groups = index.row_groups
        assert reader.read(groups[0], "text").to_pylist() == want[0]
        with pytest.raises(Unavailable) as info:
            reader.read(groups[1], "text")
        assert info.value.file == groups[1].file and "Timeout was reached" in info.value.reason
        # Read again later: the file is opened afresh and the rows are the same.
        assert [reader.read(g, "text").to_pylist() for g in groups] == want
    assert len(opened) == 2 and opened[0].closed


class _Flaky:
    """A pyarrow file whose reads fail, as a dropped connection does, once they reach past byte
    ``fail_at`` of the object (None: never)."""

    def __init__(self, file: Any, fail_at: int | None) -> None:
        self._file = file
        self._fail_at = fail_at
        self._pos = 0
        self.closed = False

    def _check(self, offset: int, size: int) -> None:
        if self._fail_at is not None and offset + size > self._fail_at:
            raise OSError(
                "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, "
                "Timeout was reached"
            )

    def read(self, size: int = -1) -> bytes:
        self._check(self._pos, size if size >= 0 else self.size())
        data = bytes(self._file.read(size))
        self._pos += len(data)
        return data

    def read_at(self, nbytes: int, offset: int) -> bytes:
        self._check(offset, nbytes)
        return bytes(self._file.read_at(nbytes, offset))

    def seek(self, offset: int) -> int:
        self._pos = int(self._file.seek(offset))
        return self._pos

    def size(self) -> int:
        return int(self._file.size())

    def close(self) -> None:
        self.closed = True
        self._file.close()

    def __enter__(self) -> _Flaky:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
