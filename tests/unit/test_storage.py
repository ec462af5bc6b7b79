"""msd.sources.storage without a server: globs over object keys, what a store's failure means,
where credentials may come from; and a loader's retry schedule (msd.roles.loader.outage)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from msd.roles.loader.outage import FIRST_DELAY_S, MAX_DELAY_S, Outage
from msd.sources import storage
from msd.sources.storage import Store
from msd.sources.stores import s3


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("data/*.parquet", "data/a.parquet", True),
        ("data/*.parquet", "data/sub/a.parquet", False),
        ("data/**/*.parquet", "data/a.parquet", True),
        ("data/**/*.parquet", "data/x/y/a.parquet", True),
        ("data/**", "data/x/y/a.txt", True),
        ("data/part-?.jsonl.gz", "data/part-1.jsonl.gz", True),
        ("data/part-?.jsonl.gz", "data/part-12.jsonl.gz", False),
        ("data/part-[0-4].tar", "data/part-3.tar", True),
        ("data/part-[!0-4].tar", "data/part-3.tar", False),
        ("data/a+b.parquet", "data/a+b.parquet", True),
        ("data/a+b.parquet", "data/aab.parquet", False),
    ],
)
def test_globs_over_object_keys_match_like_local_globs(
    pattern: str, key: str, matches: bool
) -> None:
    assert bool(storage._glob_regex(pattern).fullmatch(key)) is matches


def test_local_globs_list_sorted_absolute_files_with_sizes(tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt"):
        (tmp_path / name).write_text(name * 3)
    (tmp_path / "dir.txt").mkdir()
    found = storage.glob(str(tmp_path / "*.txt"))
    assert [f.path for f in found] == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert [f.size for f in found] == [15, 15]


def test_siblings_and_names_of_urls_and_paths() -> None:
    assert storage.sibling("s3://b/x/corpus.idx", ".bin") == "s3://b/x/corpus.bin"
    assert storage.sibling("/d/corpus.idx", ".bin") == "/d/corpus.bin"
    assert storage.join("s3://b/ds/", "state.json") == "s3://b/ds/state.json"
    assert storage.name_of("s3://b/x/part-1.tar") == "part-1.tar"
    assert storage.is_remote("s3://b/k") and not storage.is_remote("/s3:/b")


@pytest.mark.parametrize(
    ("message", "says", "transient"),
    [
        ("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: gone", "does not exist", False),
        (
            "AWS Error ACCESS_DENIED during HeadObject operation: No response body.",
            "refused",
            False,
        ),
        ("AWS Error SLOW_DOWN during GetObject operation: Please reduce", "did not serve", True),
        ("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28", "did not", True),
        ("AWS Error UNKNOWN (HTTP status 503) during GetObject operation", "did not serve", True),
    ],
)
def test_a_stores_failures_become_one_sentence_saying_whether_to_retry(
    message: str, says: str, transient: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    error = storage.store_error(OSError(message), "s3://bkt/a/b.parquet", Store("http://h:9"))
    assert says in str(error) and error.transient is transient
    assert "\n" not in str(error)
    assert ("bkt" in str(error)) and ("http://h:9" in str(error))


def test_without_credentials_a_refusal_says_where_credentials_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert not s3.credentials_found()
    error = storage.store_error(
        OSError("AWS Error INTERNAL_FAILURE during ListObjectsV2 operation: "),
        "s3://bkt/a",
        Store(),
    )
    assert "no AWS credentials were found" in str(error) and "anonymous" in str(error)
    assert not error.transient  # said at once, not after the retry budget
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert s3.credentials_found()


def test_retries_back_off_doubling_until_the_budget_is_spent() -> None:
    outage = Outage(since=100.0, budget_s=3.0)
    delays = []
    now = 100.0
    while outage.failed(now):
        delays.append(round(outage.retry_at - now, 6))
        now = outage.retry_at
    assert delays[:3] == [FIRST_DELAY_S, 2 * FIRST_DELAY_S, 4 * FIRST_DELAY_S]
    assert all(d <= MAX_DELAY_S for d in delays)
    assert now == pytest.approx(103.0)  # the last try at the budget's end, none after
    assert outage.retries == len(delays)
