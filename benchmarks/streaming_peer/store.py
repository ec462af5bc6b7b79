"""The S3 server both systems read from: the tests' moto server (``tests/s3/server.py``).

One server per invocation, auth on, one bucket; the Parquet sources go under
``parquet/<data folder>/`` and their MDS shards under ``mds/<tag>/<source>/``. Both systems get
its endpoint and key from the environment: the AWS variables (``AWS_ENDPOINT_URL`` for msd and
boto3) and ``S3_ENDPOINT_URL``, the variable Streaming's S3 client reads.

What each run asked of the store comes from moto's request recorder (``/moto-api/recorder``),
on only while a run is: every request's method, path and headers. A GET without a ``Range``
header is a whole object (Streaming's shard downloads), one with it a byte range (msd's column
chunk and footer reads); the bytes served are the object's size or the range's, clamped to
the object (moto logs no response sizes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import psutil
import pyarrow.fs as pafs

from tests.s3 import server as s3server

BUCKET = "msd-streaming-peer"
RECORDING = "recording.jsonl"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@contextlib.contextmanager
def running(log_dir: Path) -> Iterator[s3server.S3Server]:
    """A moto server with the bucket made and this process's environment pointed at it
    (restored after)."""
    missing = s3server.missing_modules()
    if missing:
        raise RuntimeError(f"the S3 server needs {', '.join(missing)} (the project's dev extras)")
    saved = dict(os.environ)
    os.environ["MOTO_RECORDER_FILEPATH"] = str(log_dir / RECORDING)  # read by the server
    os.environ.pop("MOTO_ENABLE_RECORDING", None)  # off until a run starts
    try:
        server = s3server.start(log_dir=log_dir)
    except BaseException:
        os.environ.clear()
        os.environ.update(saved)
        raise
    try:
        for name in s3server.CONFLICTING_ENV:
            os.environ.pop(name, None)
        os.environ.update(server.env())
        os.environ["S3_ENDPOINT_URL"] = server.endpoint
        server.make_bucket(BUCKET)
        yield server
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def url(*parts: str) -> str:
    return "s3://" + "/".join([BUCKET, *parts])


def object_sizes(server: s3server.S3Server) -> dict[str, int]:
    """``bucket/key`` -> size of every object in the bucket."""
    infos = server.filesystem().get_file_info(pafs.FileSelector(BUCKET, recursive=True))
    return {info.path: int(info.size) for info in infos if info.type == pafs.FileType.File}


def _recorder(server: s3server.S3Server, action: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"{server.endpoint}/moto-api/recorder/{action}", data=b"", method="POST"
    )
    with opener.open(request, timeout=10) as response:
        response.read()


def recording_path(server: s3server.S3Server) -> Path:
    return Path(server.log).parent / RECORDING


@contextlib.contextmanager
def recording(server: s3server.S3Server) -> Iterator[list[dict[str, Any]]]:
    """Record the requests made inside the block; the list holds them once it ends."""
    _recorder(server, "reset-recording")
    _recorder(server, "start-recording")
    requests: list[dict[str, Any]] = []
    try:
        yield requests
    finally:
        _recorder(server, "stop-recording")
        path = recording_path(server)
        if path.exists():
            for line in path.read_text().splitlines():
                if line:
                    requests.append(json.loads(line))


def summarize(requests: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, int]:
    """Counts of whole-object GETs, ranged GETs, HEADs, listings and others; the bytes the
    GETs were answered with; and the GETs (and their bytes) of an object or range the run had
    fetched already."""
    counts: Counter[str] = Counter()
    seen: set[tuple[str, str | None]] = set()
    for request in requests:
        method = str(request["method"]).upper()
        parsed = urlparse(str(request["url"]))
        path = unquote(parsed.path).lstrip("/")
        headers = {str(k).lower(): str(v) for k, v in request.get("headers", {}).items()}
        if method == "GET" and ("list-type" in parsed.query or "/" not in path.rstrip("/")):
            counts["list"] += 1
        elif method == "GET":
            size = sizes.get(path, 0)
            match = _RANGE.fullmatch(headers.get("range", "").strip())
            if match is None:
                counts["get_whole"] += 1
                served = size
            else:
                counts["get_range"] += 1
                served = _range_bytes(match, size)
            counts["get_bytes"] += served
            what = (path, None if match is None else match.group(0))
            if what in seen:  # the same object, or the same range of it, fetched before
                counts["get_repeats"] += 1
                counts["get_repeat_bytes"] += served
            seen.add(what)
        else:
            counts[method.lower()] += 1
    return dict(counts)


def _range_bytes(match: re.Match[str], size: int) -> int:
    first, last = match.groups()
    if not first:  # bytes=-N: the last N
        return min(int(last or 0), size)
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    return max(0, end - start + 1)


def process(server: s3server.S3Server) -> psutil.Process:
    return psutil.Process(server.pid)
