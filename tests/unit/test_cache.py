"""msd.sources.cache on real files: blocks read through a cache folder are the origin's bytes,
whichever way each came; the folder stays within max_bytes, least recently used first; a
changed file (size or modification time) is never served old blocks; a truncated block is
fetched again; and processes sharing a folder read right while they evict under each other."""

from __future__ import annotations

import multiprocessing
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from msd.recipe.schema import Cache, Source
from msd.sources import cache
from msd.sources.cache import CacheConfig, CacheError
from msd.sources.formats.base import as_launched, store_of
from msd.sources.storage import Listed, StoreError

BLOCK = 4096


class Origin:
    """A local file standing in for an object: counts the ranged reads the cache asks of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reads: list[tuple[int, int]] = []

    def open(self) -> Any:
        return self

    def read_at(self, size: int, offset: int) -> bytes:
        self.reads.append((offset, size))
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def close(self) -> None:
        pass


def write_object(path: Path, size: int, seed: int = 0) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


def found(path: Path, mtime_ns: int = 1) -> Listed:
    return Listed(f"s3://bucket/{path.name}", path.stat().st_size, mtime_ns)


def failure(exc: BaseException) -> BaseException:
    return StoreError(f"the store failed ({exc})", transient=False)


def opened(config: CacheConfig, origin: Origin, mtime_ns: int = 1) -> pa.NativeFile:
    return cache.open_cached(config, found(origin.path, mtime_ns), "test", origin.open, failure)


def blocks(root: Path) -> list[Path]:
    return sorted(p for p in (root / cache.LAYOUT).glob("??/*") if not p.name.startswith("."))


def config(root: Path, max_bytes: int = 1 << 30) -> CacheConfig:
    return CacheConfig(str(root), max_bytes, block_bytes=BLOCK)


def test_reads_through_the_cache_are_the_origins_bytes_and_a_second_pass_fetches_nothing(
    tmp_path: Path,
) -> None:
    data = write_object(tmp_path / "obj", 10 * BLOCK + 123)  # the last block short
    origin = Origin(tmp_path / "obj")
    rng = random.Random(1)
    ranges = [(rng.randrange(len(data)), rng.randrange(3 * BLOCK)) for _ in range(200)]
    ranges += [(0, len(data)), (len(data) - 5, 100), (len(data), 10)]
    before = cache.counts()
    for _ in range(2):
        with opened(config(tmp_path / "c"), origin) as f:
            assert f.size() == len(data)
            for offset, size in ranges:
                assert f.read_at(size, offset) == data[offset : offset + size]
    # Each block fetched once, whole (one ranged read), and none on the second pass.
    assert sorted(origin.reads) == [
        (i * BLOCK, min(BLOCK, len(data) - i * BLOCK)) for i in range(11)
    ]
    now = cache.counts()
    assert now.misses - before.misses == 11
    assert now.fetched_bytes - before.fetched_bytes == len(data)
    assert now.hits > before.hits
    assert sum(p.stat().st_size for p in blocks(tmp_path / "c")) == len(data)


def test_a_stream_reads_front_to_back_and_seeks_like_a_file(tmp_path: Path) -> None:
    data = write_object(tmp_path / "obj", 3 * BLOCK + 7)
    with opened(config(tmp_path / "c"), Origin(tmp_path / "obj")) as f:
        assert f.read(10) == data[:10] and f.tell() == 10
        assert f.read() == data[10:]
        f.seek(-7, 2)
        assert f.read() == data[-7:]
        f.seek(BLOCK - 1)
        assert f.read(2) == data[BLOCK - 1 : BLOCK + 1]


def test_a_changed_object_is_never_served_from_the_old_ones_blocks(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    old = write_object(path, 2 * BLOCK)
    root = tmp_path / "c"
    with opened(config(root), Origin(path)) as f:
        assert f.read() == old
    new = write_object(path, 2 * BLOCK, seed=1)  # rewritten: same size, a newer mtime
    origin = Origin(path)
    with opened(config(root), origin, mtime_ns=2) as f:
        assert f.read() == new
    assert len(origin.reads) == 2  # fetched anew
    grown = write_object(path, 2 * BLOCK + 1, seed=2)  # another size, same mtime
    with opened(config(root), Origin(path), mtime_ns=2) as f:
        assert f.read() == grown


def test_a_truncated_block_is_fetched_again_never_served(tmp_path: Path) -> None:
    data = write_object(tmp_path / "obj", 3 * BLOCK)
    root = tmp_path / "c"
    with opened(config(root), Origin(tmp_path / "obj")) as f:
        f.read()
    middle = next(p for p in blocks(root) if p.name.endswith("-1"))
    os.truncate(middle, 100)
    origin = Origin(tmp_path / "obj")
    with opened(config(root), origin) as f:
        assert f.read() == data
    assert origin.reads == [(BLOCK, BLOCK)]
    assert middle.stat().st_size == BLOCK  # replaced whole
    middle.write_bytes(os.urandom(BLOCK + 1))  # not the block: of another length
    with opened(config(root), Origin(tmp_path / "obj")) as f:
        assert f.read() == data

    # Truncated while a reader holds it open: the reader fetches it again too.
    origin = Origin(tmp_path / "obj")
    with opened(config(root), origin) as f:
        assert f.read_at(10, BLOCK) == data[BLOCK : BLOCK + 10]
        os.truncate(middle, 20)
        assert f.read_at(100, BLOCK + 50) == data[BLOCK + 50 : BLOCK + 150]
    assert origin.reads == [(BLOCK, BLOCK)]


def test_the_folder_keeps_within_max_bytes_evicting_the_least_recently_used(
    tmp_path: Path,
) -> None:
    data = write_object(tmp_path / "obj", 20 * BLOCK)
    root = tmp_path / "c"
    small = config(root, max_bytes=8 * BLOCK)
    with opened(small, Origin(tmp_path / "obj")) as f:
        assert f.read_at(8 * BLOCK, 0) == data[: 8 * BLOCK]  # blocks 0-7: full
    held = blocks(root)
    assert len(held) == 8
    for i, path in enumerate(sorted(held, key=lambda p: int(p.name.rpartition("-")[2]))):
        os.utime(path, ns=(10**9 * (1 + i), 10**9 * (1 + i)))  # used in order, long ago
    with opened(small, Origin(tmp_path / "obj")) as f:
        assert f.read_at(10, 0) == data[:10]  # block 0: used now
        assert f.read_at(BLOCK, 8 * BLOCK) == data[8 * BLOCK : 9 * BLOCK]  # block 8: a miss
    names = {int(p.name.rpartition("-")[2]) for p in blocks(root)}
    # Evicted down to 90% of 8 blocks before block 8 was kept: the oldest, 1 and 2, went.
    assert names == {0, 3, 4, 5, 6, 7, 8}
    with opened(small, Origin(tmp_path / "obj")) as f:  # a pass over everything
        assert f.read() == data
    assert sum(p.stat().st_size for p in blocks(root)) <= 8 * BLOCK
    # The count the processes keep agrees with what the folder holds.
    lock = (root / cache.LAYOUT / "lock").read_bytes()
    assert int(lock.decode()) == sum(p.stat().st_size for p in blocks(root))


def test_a_block_larger_than_the_whole_cache_is_served_not_kept(tmp_path: Path) -> None:
    data = write_object(tmp_path / "obj", 3 * BLOCK)
    tiny = CacheConfig(str(tmp_path / "c"), BLOCK - 1, block_bytes=BLOCK)
    with opened(tiny, Origin(tmp_path / "obj")) as f:
        assert f.read() == data
    assert blocks(tmp_path / "c") == []


def test_an_object_shorter_than_its_listing_is_a_store_failure(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    write_object(path, 2 * BLOCK)
    listed = Listed("s3://bucket/obj", 3 * BLOCK, 1)  # it lost a block since it was listed
    f = cache.open_cached(config(tmp_path / "c"), listed, "test", Origin(path).open, failure)
    with pytest.raises(StoreError, match="changed while it was read"):
        f.read()


def test_a_cache_dir_naming_an_unset_variable_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MSD_TEST_UNSET", raising=False)
    with pytest.raises(CacheError, match=r"cache.dir '\$MSD_TEST_UNSET/c' names \$MSD_TEST_UNSET"):
        cache.resolve("$MSD_TEST_UNSET/c")
    monkeypatch.setenv("MSD_TEST_UNSET", "/scratch")
    assert cache.resolve("$MSD_TEST_UNSET/c") == Path("/scratch/c")
    assert cache.resolve("~/c") == Path.home() / "c"


def _reader(root: str, path: str, max_bytes: int, seed: int, start: Any) -> tuple[int, int]:
    """One process: reads of random ranges of ``path`` through the cache at ``root``, each
    checked against the file; its (blocks fetched, bytes fetched)."""
    data = Path(path).read_bytes()
    origin = Origin(Path(path))
    rng = random.Random(seed)
    start.wait()
    for _ in range(4):
        with opened(CacheConfig(root, max_bytes, block_bytes=BLOCK), origin) as f:
            for _ in range(150):
                offset, size = rng.randrange(len(data)), rng.randrange(1, 3 * BLOCK)
                if f.read_at(size, offset) != data[offset : offset + size]:
                    raise AssertionError(f"wrong bytes at {offset}+{size}")
    counts = cache.counts()
    return counts.misses, counts.fetched_bytes


@pytest.mark.parametrize("evicting", [False, True])
def test_processes_sharing_a_folder_read_right_and_fetch_a_block_once(
    tmp_path: Path, evicting: bool
) -> None:
    """Two processes read the same blocks at once (spawned: nothing shared but the folder).
    With room for everything, each block is fetched once in all; with room for a few,
    they evict under each other's readers, and every byte still matches."""
    size = 24 * BLOCK + 99
    write_object(tmp_path / "obj", size)
    max_bytes = 4 * BLOCK if evicting else 1 << 30
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Manager().Barrier(2)
    args = [(str(tmp_path / "c"), str(tmp_path / "obj"), max_bytes, s, start) for s in (1, 2)]
    with ctx.Pool(2) as pool:
        fetched = pool.starmap(_reader, args)
    if not evicting:
        assert sum(m for m, _ in fetched) == 25 and sum(b for _, b in fetched) == size
    else:
        assert sum(b for _, b in fetched) > size  # evicted blocks were fetched again
    held = blocks(tmp_path / "c")
    assert sum(p.stat().st_size for p in held) <= max_bytes
    assert not list((tmp_path / "c" / cache.LAYOUT).glob("??/.tmp-*"))


def test_msd_launch_reads_through_the_cache_only_where_the_loaders_run() -> None:
    held = Cache(dir="$TMPDIR/msd", max_bytes=1 << 30)
    source = Source(name="web", path="s3://b/web/*.parquet", weight=1.0, cache=held)
    assert as_launched(source, "local") is source  # what it reads, the loaders find
    assert as_launched(source, "slurm").cache is None  # a login node keeps nothing
    assert store_of(source).cache == CacheConfig("$TMPDIR/msd", 1 << 30)
