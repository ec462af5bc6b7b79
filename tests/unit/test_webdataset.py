"""WebDataset shards: real tar files written with tarfile in tmp_path."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from msd.errors import SourceError
from msd.sources.webdataset import (
    TarIndex,
    index_tar,
    load_or_build_index,
    read_member,
    split_name,
)

MEMBERS = [
    ("shard/000000.jpg", b"jpeg-0" * 100),
    ("shard/000000.TXT", b"a cat"),
    ("shard/000001.png", b"png-1" * 300),
    ("shard/000001.txt", b"a dog"),
    ("shard/000002.webp", b"webp-2" * 50),
    ("shard/000002.json", b'{"caption": "a bird"}'),
    ("shard/000003.seg.png", b"mask"),
    ("shard/000003.txt", b""),
]


def _write_tar(path: Path, members: list[tuple[str, bytes]], folder: str | None = None) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        if folder is not None:
            info = tarfile.TarInfo(folder)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _offset_of(path: Path, name: str) -> tuple[int, int]:
    with tarfile.open(path) as tar:
        info = tar.getmember(name)
        return info.offset, info.offset_data


def _by_key(index: TarIndex) -> dict[str, dict[str, tuple[int, int]]]:
    return {sample.key: sample.members for sample in index.samples}


def test_members_are_grouped_by_key_in_the_tars_order(tmp_path: Path) -> None:
    index = index_tar(_write_tar(tmp_path / "a.tar", MEMBERS, folder="shard"))
    assert [s.key for s in index.samples] == [f"shard/00000{i}" for i in range(4)]
    assert [sorted(s.members) for s in index.samples] == [
        ["jpg", "txt"],
        ["png", "txt"],
        ["json", "webp"],
        ["seg.png", "txt"],
    ]
    assert index.problems == () and all(s.problems == () for s in index.samples)


def test_offsets_read_back_byte_identical(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    members = _by_key(index_tar(path))
    for name, data in MEMBERS:
        key, ext = split_name(name) or ("", "")
        assert read_member(path, *members[key][ext]) == data


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("a/b/000.JPG", ("a/b/000", "jpg")),
        ("000.seg.png", ("000", "seg.png")),
        ("./x.y/000.txt", ("./x.y/000", "txt")),
        ("README", None),
        (".hidden", None),
        ("trailing.", None),
    ],
)
def test_split_name(name: str, parts: tuple[str, str] | None) -> None:
    assert split_name(name) == parts


def test_a_tar_cut_inside_a_member_keeps_the_samples_before_it(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    _, data_start = _offset_of(path, "shard/000001.png")
    os.truncate(path, data_start + 10)
    index = index_tar(path)
    assert list(_by_key(index)) == ["shard/000000"]
    assert len(index.problems) == 1
    assert "'shard/000001.png' is cut short" in index.problems[0]


def test_a_tar_cut_inside_a_header_keeps_the_members_before_it(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    header, _ = _offset_of(path, "shard/000002.webp")
    os.truncate(path, header + 100)
    index = index_tar(path)
    # The last sample before the cut may have lost members after it: it goes too.
    assert list(_by_key(index)) == ["shard/000000"]
    assert index.problems == (
        f"the file is cut inside the member header at byte {header}",
        "sample 'shard/000001' may be cut short with the shard; dropped",
    )


def test_a_tar_cut_between_members_is_reported(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    header, _ = _offset_of(path, "shard/000002.webp")
    os.truncate(path, header)
    index = index_tar(path)
    assert list(_by_key(index)) == ["shard/000000"]
    assert len(index.problems) == 2 and "no end-of-archive block" in index.problems[0]
    assert index.problems[1] == "sample 'shard/000001' may be cut short with the shard; dropped"


def test_garbage_after_some_members_is_reported(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    header, _ = _offset_of(path, "shard/000002.webp")
    with open(path, "r+b") as file:
        file.seek(header)
        file.write(b"\xff" * 512)
    index = index_tar(path)
    assert list(_by_key(index)) == ["shard/000000"]
    assert index.problems == (
        f"unreadable member header at byte {header}; the rest is dropped",
        "sample 'shard/000001' may be cut short with the shard; dropped",
    )


def test_a_sample_without_text_is_kept_and_flagged(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", [("k/1.jpg", b"x"), ("k/1.cls", b"3"), ("k/2.txt", b"t")])
    samples = index_tar(path).samples
    assert [s.key for s in samples] == ["k/1", "k/2"]
    assert samples[0].problems == ("no text member (caption, json, text, txt)",)
    assert samples[1].problems == ()
    assert index_tar(path, text_exts=("cls",)).samples[0].problems == ()


def test_odd_members_are_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [
            ("1.jpg", b"first"),
            ("1.jpg", b"second"),
            ("1.txt", b"t"),
            ("NOTES", b""),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("2.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "1.jpg"
        tar.addfile(link)
        folder = tarfile.TarInfo("3.d")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
    index = index_tar(path)
    assert [s.key for s in index.samples] == ["1"]
    assert read_member(path, *index.samples[0].members["jpg"]) == b"first"
    assert index.samples[0].problems == ("duplicate member '1.jpg'; the first is kept",)
    assert index.problems == (
        "member 'NOTES' has no key.extension name; skipped",
        "member '2.jpg' is a link, not a regular file; skipped",
    )


def test_an_empty_file_is_a_problem_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    path.write_bytes(b"")
    index = index_tar(path)
    assert index.samples == () and index.problems == ("empty file",)


def test_an_empty_tar_has_no_samples_and_no_problems(tmp_path: Path) -> None:
    index = index_tar(_write_tar(tmp_path / "a.tar", []))
    assert index.samples == () and index.problems == ()


def test_a_file_that_cannot_be_opened_or_is_no_tar_raises(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot read"):
        index_tar(tmp_path / "missing.tar")
    (tmp_path / "text.tar").write_bytes(b"hello, not a tar" * 100)
    with pytest.raises(SourceError, match="not a tar file"):
        index_tar(tmp_path / "text.tar")
    plain = _write_tar(tmp_path / "a.tar", MEMBERS).read_bytes()
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress(plain))
    with pytest.raises(SourceError, match="gzip-compressed"):
        index_tar(tmp_path / "a.tar.gz")


def test_read_member_refuses_a_short_read(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    size = path.stat().st_size
    with pytest.raises(SourceError, match="changed after it was indexed"):
        read_member(path, size - 4, 8)
    with pytest.raises(SourceError, match="cannot read"):
        read_member(tmp_path / "missing.tar", 0, 1)
    with pytest.raises(ValueError, match="non-negative"):
        read_member(path, -1, 1)


# The cache ---------------------------------------------------------------------------------------


def _cache_file(cache_dir: Path) -> Path:
    (cache,) = cache_dir.iterdir()
    return cache


def test_the_cache_is_used_while_the_tar_is_unchanged(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    cache_dir = tmp_path / "cache"
    first = load_or_build_index(path, cache_dir)
    assert first == index_tar(path)
    written = _cache_file(cache_dir).stat().st_mtime_ns
    # Same size and mtime, other bytes: only a cache hit still sees the original samples.
    stat = path.stat()
    path.write_bytes(b"\0" * stat.st_size)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_or_build_index(path, cache_dir) == first
    assert _cache_file(cache_dir).stat().st_mtime_ns == written


def test_a_changed_tar_is_scanned_again(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    cache_dir = tmp_path / "cache"
    load_or_build_index(path, cache_dir)
    _write_tar(path, [*MEMBERS, ("shard/000004.jpg", b"new" * 400), ("shard/000004.txt", b"t")])
    index = load_or_build_index(path, cache_dir)
    assert index == index_tar(path) and len(index.samples) == 5
    cached = json.loads(_cache_file(cache_dir).read_text())
    assert len(cached["index"]["samples"]) == 5


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # cut short
        lambda text: "not json",
        lambda text: text.replace('"version":1', '"version":99'),
        lambda text: text.replace('"key":"shard/000000"', '"key":7'),
        lambda text: text.replace('"jpg":[', '"jpg":[999999999,1],"x":['),  # outside the tar
    ],
    ids=["cut", "garbage", "version", "type", "bounds"],
)
def test_a_damaged_cache_is_rebuilt(tmp_path: Path, damage: object) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    cache_dir = tmp_path / "cache"
    expected = load_or_build_index(path, cache_dir)
    cache = _cache_file(cache_dir)
    original = cache.read_text()
    assert callable(damage)
    damaged = damage(original)
    assert damaged != original
    cache.write_text(damaged)
    assert load_or_build_index(path, cache_dir) == expected
    assert cache.read_text() == original
    assert [p.name for p in cache_dir.iterdir()] == [cache.name]  # no temporary file left


def test_text_flags_follow_the_caller_not_the_cache(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", [("1.jpg", b"x"), ("1.cls", b"3")])
    cache_dir = tmp_path / "cache"
    assert load_or_build_index(path, cache_dir).samples[0].problems != ()
    assert load_or_build_index(path, cache_dir, text_exts=("cls",)).samples[0].problems == ()


def test_an_unwritable_cache_only_costs_a_scan(tmp_path: Path) -> None:
    path = _write_tar(tmp_path / "a.tar", MEMBERS)
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder should be")
    assert load_or_build_index(path, blocker) == index_tar(path)
    assert load_or_build_index(path, None) == index_tar(path)
