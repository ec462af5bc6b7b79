"""A local cache of sources on an object store (the recipe's ``cache``), against a real
S3-compatible server (moto, auth on): a job over several epochs fetches each file's bytes
once (the server's log counts the GETs) and streams what local files stream; a later job on
the same cache fetches nothing; a cache smaller than the data evicts and reads right; an
object rewritten after it was cached is read anew by a new job, and refused by name within the
job that listed it."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msd.errors import SourceError
from msd.recipe.schema import Cache, Source
from msd.sources import cache, storage
from msd.sources.cache import CacheConfig
from msd.sources.formats.parquet import ParquetReader
from msd.sources.index import open_source
from msd.sources.storage import Store, StoreError
from tests.conftest import SMALL_SOURCES, read_rank_logs
from tests.integration.test_s3 import digests, launch, local_paths, repeating, s3_paths
from tests.s3.server import S3Bucket

MAX_BYTES = 64 << 20
STEPS = 90  # over two epochs of each source


def gets(s3: S3Bucket) -> Counter[str]:
    """The objects of this test's bucket the server answered a GET for, and how often (the
    requests that bring bytes; listings and HEADs do not)."""
    assert s3.server.log and Path(s3.server.log).is_file(), f"no server log {s3.server.log!r}"
    text = Path(s3.server.log).read_text(errors="replace")
    found = re.findall(rf"GET /{re.escape(s3.bucket)}/(\S+) HTTP", text)
    return Counter(key for key in found if not key.startswith("?"))


def sizes(root: Path, prefix: str) -> dict[str, int]:
    """Each file under ``root`` by its key under ``prefix``, with its size."""
    return {
        f"{prefix}/{p.relative_to(root).as_posix()}": p.stat().st_size
        for p in root.rglob("*")
        if p.is_file()
    }


def last_metrics(job: Path) -> dict[str, int]:
    lines = (job / "metrics.jsonl").read_text().splitlines()
    cache_figures: dict[str, int] = json.loads(lines[-1])["cache"]
    return cache_figures


def epochs_read(job: Path) -> list[float]:
    """Per source: the samples the ranks received (each once, not each piece of a split one)
    over the source's samples."""
    seen: Counter[int] = Counter()
    for records in read_rank_logs(job).values():
        for r in records:
            pieces = zip(r["source_ids"], r["sample_offsets"], strict=True)
            seen.update(src for src, offset in pieces if offset == 0)
    return [seen[i] / s.num_samples for i, s in enumerate(SMALL_SOURCES)]


def repeated(paths: dict[str, str]) -> dict[str, Any]:
    """Over two epochs of every source, as fast as the data plane goes."""
    doc = repeating(paths)
    doc["steps"], doc["trainer"]["demo"]["step_ms"] = STEPS, 0
    return doc


def test_epochs_from_a_cached_store_fetch_each_byte_once_and_stream_like_local_files(
    s3: S3Bucket, small_data: Path, tmp_path: Path
) -> None:
    s3.upload(small_data, "data")
    files = sizes(small_data, "data")
    local, _, err, code = launch(tmp_path / "local", repeated(local_paths(small_data)))
    assert code == 0, err[-2000:]

    doc = repeated(s3_paths(s3))
    doc["cache"] = {"dir": str(tmp_path / "cache"), "max_bytes": MAX_BYTES}
    before = gets(s3)
    job, _, err, code = launch(tmp_path / "cached", doc)
    assert code == 0, err[-2000:]
    assert digests(job) == digests(local)
    fetched = gets(s3) - before
    # Every file fetched once in all (each is one block): the Planner's and the loaders'
    # reads of the same bytes, over every epoch, came from the cache after the first.
    assert set(fetched) == set(files) and max(fetched.values()) == 1, fetched
    assert sum(files[key] * n for key, n in fetched.items()) <= 1.05 * sum(files.values())
    figures = last_metrics(job)
    assert figures["hits"] > 0 and figures["fetched_bytes"] <= sum(files.values())
    assert min(epochs_read(job)) > 2

    # A later job on the same cache: new processes, not one byte fetched.
    before = gets(s3)
    again, _, err, code = launch(tmp_path / "again", doc)
    assert code == 0, err[-2000:]
    assert digests(again) == digests(local)
    assert gets(s3) - before == Counter()
    figures = last_metrics(again)
    assert figures["hits"] > 0 and figures["misses"] == 0 and figures["fetched_bytes"] == 0


def _groups(path: str, store: Store) -> list[pa.Array]:
    reader = ParquetReader(path, store)
    try:
        return [reader.read(i, "text") for i in range(reader.file.num_row_groups)]
    finally:
        reader.close()


def test_a_cache_smaller_than_the_data_evicts_and_reads_right(
    s3: S3Bucket, small_data: Path, tmp_path: Path
) -> None:
    s3.upload(small_data / "web", "web")
    files = sorted(sizes(small_data / "web", "web"))
    # Blocks of 2 KiB, room for 8 of them: a fraction of one file.
    store = Store(cache=CacheConfig(str(tmp_path / "c"), 8 * 2048, block_bytes=2048))
    before, fetched = gets(s3), cache.counts().fetched_bytes
    for _ in range(2):
        for key in files:
            local = _groups(str(small_data / key), Store())
            assert _groups(s3.url(key), store) == local
    total = sum(sizes(small_data / "web", "web").values())
    assert cache.counts().fetched_bytes - fetched > total  # evicted blocks were fetched again
    blocks = sum(-(-size // 2048) for size in sizes(small_data / "web", "web").values())
    assert sum((gets(s3) - before).values()) > blocks  # by the server's count too
    held = [p for p in (tmp_path / "c" / cache.LAYOUT).glob("??/*")]
    assert held and sum(p.stat().st_size for p in held) <= 8 * 2048


def test_an_object_rewritten_after_it_was_cached_is_read_anew(s3: S3Bucket, tmp_path: Path) -> None:
    store = Store(cache=CacheConfig(str(tmp_path / "c"), MAX_BYTES))
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    pq.write_table(pa.table({"text": ["the first version"] * 50}), old / "a.parquet")
    pq.write_table(pa.table({"text": ["the second, longer version"] * 50}), new / "a.parquet")
    s3.upload(old, "x")
    assert _groups(s3.url("x/a.parquet"), store) == _groups(str(old / "a.parquet"), Store())
    assert _groups(s3.url("x/a.parquet"), store) == _groups(str(old / "a.parquet"), Store())
    before = gets(s3)
    s3.upload(new, "x")  # rewritten: another size, a newer modification time
    assert _groups(s3.url("x/a.parquet"), store) == _groups(str(new / "a.parquet"), Store())
    assert (gets(s3) - before)["x/a.parquet"] == 1


def test_an_object_changed_after_the_job_listed_it_is_refused_by_name(
    s3: S3Bucket, tmp_path: Path
) -> None:
    """Within a job (its files listed, with sizes and times, when it started), a rewritten
    object is refused, as ``msd restore`` refuses it, not read anew: its stream would change."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    pq.write_table(pa.table({"text": ["the first version"] * 50}), old / "a.parquet")
    pq.write_table(pa.table({"text": ["the second, longer version"] * 50}), new / "a.parquet")
    s3.upload(old, "y")
    url = s3.url("y/a.parquet")
    listed = storage.stat(url, Store())
    store = Store(
        cache=CacheConfig(str(tmp_path / "c"), MAX_BYTES),
        listed={url: (listed.size, listed.mtime_ns)},
    )
    assert _groups(url, store) == _groups(str(old / "a.parquet"), Store())
    s3.upload(new, "y")
    with pytest.raises(StoreError) as refused:
        _groups(url, store)
    message = str(refused.value)
    assert url in message and "changed after the job listed it" in message
    assert f"{listed.size:,} bytes then" in message


def test_a_cache_dir_that_cannot_be_used_stops_the_source_in_one_sentence(
    s3: S3Bucket, small_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3.upload(small_data / "web", "web")
    monkeypatch.delenv("MSD_TEST_NO_SUCH_DIR", raising=False)
    unset = Cache(dir="$MSD_TEST_NO_SUCH_DIR/msd", max_bytes=MAX_BYTES)
    source = Source(
        name="web", path=s3.url("web/*.parquet"), weight=1, text_column="text", cache=unset
    )
    with pytest.raises(SourceError) as info:
        open_source(source, "sources[0]")
    message = str(info.value)
    assert message.startswith("source 'web' (sources[0]): cache.dir '$MSD_TEST_NO_SUCH_DIR/msd'")
    assert "not set on this machine" in message and "\n" not in message
    (tmp_path / "file").write_text("not a folder")
    blocked = Cache(dir=str(tmp_path / "file" / "c"), max_bytes=MAX_BYTES)
    with pytest.raises(SourceError, match=r"cache.dir '.*': cannot use"):
        open_source(msgspec.structs.replace(source, cache=blocked), "x")
    local = msgspec.structs.replace(source, path=str(small_data / "web" / "*.parquet"))
    assert open_source(local, "sources[0]").num_rows == 500  # a local source ignores it
