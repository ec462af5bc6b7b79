"""WebDataset shards in an object store (the moto S3 test server): indexed by reading each once,
read with one ranged GET per run of wanted samples, every byte equal to the local shards', damage
reported as it is locally, and the store's failures as the loader takes them."""

from __future__ import annotations

import dataclasses
import gzip
import re
import socket
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources import storage
from msd.sources.image_rows import ImageRowReader, read_block
from msd.sources.index import SourceIndex, cache_dir, open_source
from msd.sources.read import RowGroupReader, Unavailable
from msd.sources.storage import Store
from msd.sources.webdataset import _spans, load_or_build_index, read_member, read_members
from msd.synth.vlm import WDS_SOURCE, write_captions_wds
from tests.s3.server import S3Bucket

SAMPLES = 24
SHARDS = 2


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of WebDataset shards (an image, a caption and a JSON member per sample)."""
    root = tmp_path_factory.mktemp("wds") / WDS_SOURCE
    write_captions_wds(root, seed=0, samples=SAMPLES, shards=SHARDS)
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class Counted:
    """Counts the streams opened (`storage.open_stream`) and ranged reads (``read_at`` of
    `storage.open_input`'s files) of remote files."""

    def __init__(self) -> None:
        self.streams = 0
        self.read_ats = 0
        self.opens = 0


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    counts = Counted()
    open_input, open_stream = storage.open_input, storage.open_stream

    class Counting:
        def __init__(self, file: Any, remote: bool) -> None:
            self.file, self.remote = file, remote

        def read_at(self, nbytes: int, offset: int) -> bytes:
            counts.read_ats += self.remote
            data: bytes = self.file.read_at(nbytes, offset)
            return data

        def __getattr__(self, name: str) -> Any:
            return getattr(self.file, name)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

    def counting_input(path: str, store: Store = storage.LOCAL) -> Counting:
        counts.opens += storage.is_remote(path)
        return Counting(open_input(path, store), storage.is_remote(path))

    def counting_stream(path: str, store: Store = storage.LOCAL) -> Any:
        counts.streams += storage.is_remote(path)
        return open_stream(path, store)

    monkeypatch.setattr(storage, "open_input", counting_input)
    monkeypatch.setattr(storage, "open_stream", counting_stream)
    return counts


class Requests:
    """The requests the S3 test server logged for one bucket (None: it keeps no log here)."""

    def __init__(self, s3: S3Bucket) -> None:
        self.log = Path(s3.server.log) if s3.server.log else None
        self.line = re.compile(rf"(GET|HEAD|PUT|POST|DELETE) /{re.escape(s3.bucket)}\b")
        self.seen = 0

    def new(self) -> list[str] | None:
        """The methods of the bucket's requests since the last call ("GET", "HEAD", ...)."""
        if self.log is None or not self.log.is_file():
            return None
        text = self.log.read_text(errors="replace")
        found = [m.group(1) for m in self.line.finditer(text)]
        fresh, self.seen = found[self.seen :], len(found)
        return fresh


def _source(path: str, name: str = "wds") -> Source:
    return Source(name=name, path=path, weight=1, format="webdataset")


def _opened(source: Source) -> tuple[SourceIndex, ImageRowReader]:
    src = open_source(source, "sources[0]")
    return src, ImageRowReader(source, src, RowGroupReader())


def _rows(reader: ImageRowReader, src: SourceIndex) -> list[list[tuple[Any, Any]]]:
    """Every shard's (text, images) of every sample."""
    out = []
    for rg in src.row_groups:
        rows = reader.read(rg)
        texts, images = rows.field("text").to_pylist(), rows.field("images").to_pylist()
        out.append(list(zip(texts, images, strict=True)))
    return out


def _without_paths(src: SourceIndex) -> list[str]:
    return [p.split(": ", 1)[1] for p in src.problems]


def test_every_sample_from_s3_equals_the_local_one(
    s3: S3Bucket, shards: Path, counted: Counted, cache: Path
) -> None:
    local, local_reader = _opened(_source(str(shards / "*.tar")))
    s3.upload(shards, "shards")
    requests = Requests(s3)
    requests.new()
    remote, reader = _opened(_source(s3.url("shards/*.tar")))
    scan = requests.new()
    if scan is not None:  # a listing; a stat, one GET of the tar and of its end, a stat again
        assert scan.count("GET") == 1 + 2 * SHARDS, scan
    assert remote.files == tuple(s3.url(f"shards/{p.name}") for p in sorted(shards.glob("*.tar")))
    assert [rg.num_rows for rg in remote.row_groups] == [rg.num_rows for rg in local.row_groups]
    assert remote.num_rows == SAMPLES and remote.problems == ()
    assert counted.streams == SHARDS  # one streaming GET scanned each shard
    # The scans are cached under valid local names, and used: no shard is streamed again.
    names = sorted(p.name for p in cache.rglob("*.index.json"))
    assert len(names) == 2 * SHARDS  # the local shards' and the remote ones'
    assert all(n.startswith("shard-0000") for n in names)
    open_source(_source(s3.url("shards/*.tar")), "sources[0]")
    assert counted.streams == SHARDS
    cached = requests.new()
    if cached is not None:  # a listing, and a stat of each shard
        assert cached.count("GET") == 1 and len(cached) == 1 + SHARDS, cached

    counted.read_ats = counted.opens = 0
    assert _rows(reader, remote) == _rows(local_reader, local)
    members = 3 * SAMPLES  # image, caption, JSON: the reads ask for two of them
    assert counted.read_ats == SHARDS  # one ranged GET a shard, not one a member
    assert counted.read_ats < members // 10
    assert counted.opens == SHARDS  # each opened once (a HEAD request), then kept open
    reads = requests.new()
    if reads is not None:  # besides the reads, a stat that the index is fresh, and the open
        assert reads.count("GET") == SHARDS and len(reads) <= 3 * SHARDS, reads

    counted.read_ats = counted.opens = 0
    rg, local_rg = remote.row_groups[0], local.row_groups[0]
    rows = np.array([rg.num_rows - 1, 0, 3, 3, 1])
    picked, truth = reader.read(rg, rows), local_reader.read(local_rg, rows)
    assert picked.equals(truth)
    assert counted.read_ats <= 2 and counted.opens == 0

    counted.read_ats = 0
    block = np.array([SAMPLES - 1, 0, SAMPLES // 2, 5, 2])
    assert read_block(reader, remote.row_groups, block).equals(
        read_block(local_reader, local.row_groups, block)
    )
    assert counted.read_ats <= 2 * SHARDS


def test_a_truncated_shard_gives_the_same_problems_as_locally(
    s3: S3Bucket, shards: Path, tmp_path: Path
) -> None:
    data = sorted(shards.glob("*.tar"))[0].read_bytes()
    cuts = {
        "inside-member": len(data) // 2,
        "between": _end_of_members(data),  # no end-of-archive block
        "inside-header": _end_of_members(data) + 100,
    }
    for name, cut in cuts.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "shard.tar").write_bytes(data[:cut])
        s3.upload(folder, name)
        local, local_reader = _opened(_source(str(folder / "shard.tar"), name))
        remote, reader = _opened(_source(s3.url(f"{name}/shard.tar"), name))
        assert local.problems, name
        assert _without_paths(remote) == _without_paths(local)
        assert all(p.startswith(s3.url(f"{name}/shard.tar") + ": ") for p in remote.problems)
        assert remote.num_rows == local.num_rows
        assert _rows(reader, remote) == _rows(local_reader, local)


def _end_of_members(data: bytes) -> int:
    """Where a tar's end-of-archive zero blocks start."""
    end = len(data.rstrip(b"\0"))
    return -(-end // 512) * 512


def test_a_shard_cut_after_it_was_indexed_is_a_source_error(
    s3: S3Bucket, shards: Path, tmp_path: Path
) -> None:
    s3.upload(shards, "shards")
    src, reader = _opened(_source(s3.url("shards/*.tar")))
    reader.sizes(src.row_groups[0])  # the reader holds the shard's index
    data = sorted(shards.glob("*.tar"))[0].read_bytes()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "shard-00000.tar").write_bytes(data[: len(data) // 2])
    s3.upload(tmp_path / "cut", "shards")
    with pytest.raises(SourceError, match="changed after it was indexed") as caught:
        reader.read(src.row_groups[0])
    assert s3.url("shards/shard-00000.tar") in str(caught.value)
    # A reader that indexes the shard anew sees fewer samples than the source's row group.
    _, fresh = _opened(_source(s3.url("shards/shard-00001.tar")))
    with pytest.raises(SourceError, match="changed after") as caught:
        fresh.read(src.row_groups[0])


def test_index_time_failures_are_one_sentence_naming_the_shard(
    s3: S3Bucket, shards: Path, tmp_path: Path, cache: Path
) -> None:
    missing = s3.url("shards/missing.tar")
    with pytest.raises(SourceError) as caught:
        load_or_build_index(missing, cache)
    assert f"'{missing}'" in str(caught.value) and "\n" not in str(caught.value)

    plain = sorted(shards.glob("*.tar"))[0].read_bytes()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.tar").write_bytes(gzip.compress(plain))
    (tmp_path / "bad" / "b.tar").write_bytes(b"hello, not a tar" * 100)
    s3.upload(tmp_path / "bad", "bad")
    with pytest.raises(SourceError, match="gzip-compressed"):
        load_or_build_index(s3.url("bad/a.tar"), cache)
    with pytest.raises(SourceError, match="not a tar file"):
        load_or_build_index(s3.url("bad/b.tar"), cache)

    s3.upload(shards, "shards")
    url = s3.url("shards/shard-00000.tar")
    with pytest.raises(SourceError) as caught:
        load_or_build_index(url, cache, store=Store(endpoint_url=_dead_endpoint()))
    message = str(caught.value)
    assert message.startswith(f"cannot open the WebDataset shard '{url}' (")
    assert "did not serve" in message and "\n" not in message


def test_store_failures_while_reading_are_unavailable_or_a_source_error(
    s3: S3Bucket, shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3.upload(shards, "shards")
    src, reader = _opened(_source(s3.url("shards/*.tar")))
    rg = src.row_groups[0]
    assert len(reader.read(rg)) == rg.num_rows  # its index is now held by the reader
    # A store that does not answer: a retry may succeed.
    unreachable = dataclasses.replace(rg, store=Store(endpoint_url=_dead_endpoint()))
    with pytest.raises(Unavailable) as gone:
        reader.read(unreachable)
    assert gone.value.file == rg.file and rg.file in gone.value.reason
    # ... as when its index must be checked against the store (a reader that holds none).
    dead = msgspec.structs.replace(_source(s3.url("shards/*.tar")), endpoint_url=_dead_endpoint())
    with pytest.raises(Unavailable) as gone:
        ImageRowReader(dead, src, RowGroupReader()).read(rg)
    assert gone.value.file == rg.file and rg.file in gone.value.reason
    assert len(reader.read(rg)) == rg.num_rows  # the failed reads left the reader usable
    # A store that refuses the credentials: no retry helps.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    refused = dataclasses.replace(rg, store=Store(endpoint_url=s3.server.endpoint))
    with pytest.raises(SourceError, match="refused access") as caught:
        reader.read(refused)
    assert f"'{rg.file}'" in str(caught.value) and "\n" not in str(caught.value)


def test_a_shard_that_is_gone_after_indexing_is_a_source_error(s3: S3Bucket, shards: Path) -> None:
    s3.upload(shards, "shards")
    src, reader = _opened(_source(s3.url("shards/*.tar")))
    rg = src.row_groups[0]
    reader.sizes(rg)  # the reader holds its index
    s3.server.filesystem().delete_file(rg.file[len("s3://") :])
    with pytest.raises(SourceError, match="gone") as caught:
        reader.read(rg)
    assert f"'{rg.file}'" in str(caught.value)


def test_an_empty_remote_shard_is_reported_not_streamed(
    s3: S3Bucket, tmp_path: Path, counted: Counted
) -> None:
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "empty.tar").write_bytes(b"")
    s3.upload(tmp_path / "e", "e")
    index = load_or_build_index(s3.url("e/empty.tar"), cache_dir())
    assert index.samples == () and index.problems == ("empty file",)
    assert counted.streams == 0


def test_members_read_together_come_back_in_the_asked_order(shards: Path) -> None:
    path = sorted(shards.glob("*.tar"))[0]
    index = load_or_build_index(path, None)
    where = [m for s in index.samples for m in s.members.values()]
    alone = [read_member(path, *m) for m in where]
    picked = [5, 0, 5, len(where) - 1, 1, 2]
    assert read_members(path, [where[i] for i in picked]) == [alone[i] for i in picked]
    assert read_members(path, []) == []
    assert _spans([(0, 10), (600, 5), (10, 0), (2000, 1)], gap=600) == [
        (0, 605, [0, 2, 1]),
        (2000, 2001, [3]),
    ]
    assert len(_spans([(i * 10, 10) for i in range(10)], gap=0, limit=50)) == 2


def _dead_endpoint() -> str:
    """An endpoint on loopback that nothing listens on (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
