"""The S3 test server (tests/s3/server.py) behaves like S3 where the tests lean on it: objects
round-trip byte for byte, wrong and missing credentials are refused, and a paused server stops
answering, then answers again with its objects kept."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from tests.s3.server import S3Bucket, S3Server, bucket_name, s3_path

# Fail fast: one attempt, a short timeout (the defaults retry for many seconds).
_FAST = {"request_timeout": 1, "connect_timeout": 1}


def _one_try() -> pafs.AwsStandardS3RetryStrategy:
    return pafs.AwsStandardS3RetryStrategy(max_attempts=1)


def _tree(root: Path) -> dict[str, bytes]:
    """A few files, nested, of sizes around pyarrow's buffer sizes; path -> contents."""
    files = {
        "a.bin": os.urandom(1),
        "empty.txt": b"",
        "sub/b.bin": os.urandom(70_000),
        "sub/deeper/c.bin": os.urandom(6 * 1024 * 1024 + 3),  # past one multipart part (5 MiB)
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _read_all(fs: pafs.FileSystem, base: str) -> dict[str, bytes]:
    """Every object under ``base`` (``bucket/prefix``): relative key -> contents."""
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    found = {}
    for info in infos:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                found[info.path[len(base) + 1 :]] = f.read()
    return found


def test_objects_round_trip_byte_for_byte(s3: S3Bucket, tmp_path: Path) -> None:
    files = _tree(tmp_path)
    url = s3.upload(tmp_path, "data/set")
    assert url == f"s3://{s3.bucket}/data/set"
    assert _read_all(s3.server.filesystem(), s3_path(url)) == files
    # What a subprocess of the test sees: only the environment the fixture set.
    fs, path = pafs.FileSystem.from_uri(s3.url("data/set/sub/b.bin"))
    with fs.open_input_stream(path) as f:
        assert f.read() == files["sub/b.bin"]


@pytest.mark.parametrize("wrong", ["secret_key", "access_key"])
def test_wrong_key_is_refused(s3: S3Bucket, tmp_path: Path, wrong: str) -> None:
    (tmp_path / "x").write_bytes(b"x")
    s3.upload(tmp_path, "p")
    fs = s3.server.filesystem(**{wrong: "AKIANOTTHERIGHTONE1"}, retry_strategy=_one_try())
    with pytest.raises(OSError, match=r"ACCESS_DENIED|InvalidAccessKeyId|SignatureDoesNotMatch"):
        fs.open_input_stream(f"{s3.bucket}/p/x").read()
    with pytest.raises(OSError), fs.open_output_stream(f"{s3.bucket}/p/y") as out:
        out.write(b"y")
    assert sorted(_read_all(s3.server.filesystem(), f"{s3.bucket}/p")) == ["x"]


def test_unsigned_request_is_refused(s3: S3Bucket, tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"x")
    s3.upload(tmp_path, "p")
    anonymous = pafs.S3FileSystem(
        anonymous=True,
        endpoint_override=s3.server.endpoint,
        region=s3.server.region,
        retry_strategy=_one_try(),
    )
    with pytest.raises(OSError):
        anonymous.open_input_stream(f"{s3.bucket}/p/x").read()
    with pytest.raises(OSError):
        anonymous.get_file_info(pafs.FileSelector(s3.bucket, recursive=True))


def test_paused_server_times_out_then_resumes_with_its_objects(
    s3: S3Bucket, s3_server: S3Server, tmp_path: Path
) -> None:
    (tmp_path / "kept.bin").write_bytes(payload := os.urandom(1000))
    s3.upload(tmp_path, "p")
    fs = s3_server.filesystem(**_FAST, retry_strategy=_one_try())
    key = f"{s3.bucket}/p/kept.bin"
    s3_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(OSError, match=r"(?i)timeout|NETWORK_CONNECTION"):
            fs.open_input_stream(key).read()
        assert time.monotonic() - started < 5
        assert not s3_server.answers(timeout_s=0.5)
    finally:
        s3_server.resume()
    with fs.open_input_stream(key) as f:
        assert f.read() == payload


def test_bucket_names_are_valid_and_fresh() -> None:
    long = "test_" + "X" * 200 + "[param-1]"
    names = {bucket_name(hint) for hint in (long, long, "xn--a", "__", "test_a[b.c]")}
    assert len(names) == 5
    assert all(3 <= len(name) <= 63 for name in names)
    assert not any(name.startswith("xn--") for name in names)
