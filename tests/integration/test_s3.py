"""Sources in an object store: a real S3-compatible server (moto, authentication on) and real
role processes. The stream from S3 is the stream from the same files on local disk, byte for
byte; it survives kill -9 of a loader, a store that stops answering for a while (the loaders
retry, counted) and one that stops for longer than the retry budget (the job stops naming the
source, and `msd restore` continues it); a restore reads exactly the files the job listed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import (
    SMALL_SOURCES,
    assert_launch_ok,
    base_recipe,
    processes_of_launcher,
    read_rank_logs,
    run_msd,
    start_launch,
)
from tests.integration.test_checkpoint import global_batches
from tests.integration.test_recovery import role_pids, wait_for_step
from tests.s3.server import S3Bucket

STEPS = 60
JOB_S = 240  # how long a test's job may run on a busy machine


def recipe(paths: dict[str, str], **overrides: Any) -> dict[str, Any]:
    """The shared small sources (three Parquet sources, 32-row row groups), by ``paths``."""
    doc = base_recipe(Path("unused"), **overrides)
    for source in doc["sources"]:
        source["path"] = paths[source["name"]]
    return doc


def local_paths(data: Path) -> dict[str, str]:
    return {s.name: str(data / s.name / "*.parquet") for s in SMALL_SOURCES}


def s3_paths(s3: S3Bucket) -> dict[str, str]:
    return {s.name: s3.url(f"data/{s.name}/*.parquet") for s in SMALL_SOURCES}


def repeating(paths: dict[str, str], **overrides: Any) -> dict[str, Any]:
    """A run of ``STEPS`` steps over repeating sources, checkpointed every 20, paced so that a
    test can act mid-run."""
    doc = recipe(paths, steps=STEPS, checkpoint={"every_steps": 20}, **overrides)
    doc["trainer"]["demo"]["step_ms"] = 20
    for s in doc["sources"]:
        s["repeat"] = True
    return doc


def launch(root: Path, doc: dict[str, Any], *options: str) -> tuple[Path, str, str, int]:
    """`msd launch` of ``doc`` in ``root`` to its end: (the job folder, stdout, stderr, code)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(root, "r.yaml", "--json", *options)
    out, err = proc.communicate(timeout=240)
    (job,) = (root / "runs").iterdir()
    return job, out, err, proc.returncode


def digests(job: Path) -> dict[tuple[int, int], str]:
    return {(rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(job).items() for r in rs}


def max_read_retries(job: Path) -> int:
    lines = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    return max(
        (s.get("read_retries", 0) for line in lines for s in line["sources"].values()), default=0
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> dict[Any, str]:
    """Every rank's digests of the repeating run from local files, without failure."""
    job, _, err, code = launch(
        tmp_path_factory.mktemp("reference"), repeating(local_paths(small_data))
    )
    assert code == 0, err[-2000:]
    found = digests(job)
    assert len(found) == 4 * STEPS
    return found


def as_jsonl(data: Path, root: Path) -> dict[str, str]:
    """The rows of each Parquet file of ``data`` as a JSON Lines file of the same name."""
    paths = {}
    for s in SMALL_SOURCES:
        (root / s.name).mkdir(parents=True)
        for parquet in sorted((data / s.name).glob("*.parquet")):
            rows = pq.read_table(parquet, columns=["text"]).column("text").to_pylist()
            lines = "".join(json.dumps({"text": t}) + "\n" for t in rows)
            (root / s.name / f"{parquet.stem}.jsonl").write_text(lines)
        paths[s.name] = str(root / s.name / "*.jsonl")
    return paths


def test_a_finite_epoch_from_s3_or_jsonl_is_the_epoch_from_local_parquet(
    s3: S3Bucket, small_data: Path, tmp_path: Path
) -> None:
    """The same rows from local Parquet, from S3 Parquet and from local JSONL cut into row
    groups of the Parquet files' size (``group_rows``): byte-identical per-rank streams."""
    s3.upload(small_data, "data")
    local, _, err, code = launch(tmp_path / "local", recipe(local_paths(small_data)))
    assert code == 0, err[-2000:]
    remote, _, err, code = launch(tmp_path / "s3", recipe(s3_paths(s3)))
    assert code == 0, err[-2000:]
    assert digests(remote) == digests(local)
    doc = recipe(as_jsonl(small_data, tmp_path / "jsonl"))
    for source in doc["sources"]:
        source["group_rows"] = 32  # the Parquet files' row groups (conftest's small_data)
    lines, _, err, code = launch(tmp_path / "from-jsonl", doc)
    assert code == 0, err[-2000:]
    assert digests(lines) == digests(local)
    pieces = Counter(
        (src, sid)
        for records in read_rank_logs(remote).values()
        for r in records
        for src, sid in zip(r["source_ids"], r["sample_ids"], strict=True)
    )
    ids = {(i, j) for i, s in enumerate(SMALL_SOURCES) for j in range(s.num_samples)}
    assert set(pieces) == ids  # every sample (each of its pieces once: split samples repeat)
    # The job recorded what it read: the URLs, with sizes, in its recipe.
    saved = json.loads((remote / "recipe.json").read_text())
    files = [f[0] for s in saved["sources"] for f in s["files"]]
    assert len(files) == 2 * len(SMALL_SOURCES) and all(f.startswith("s3://") for f in files)
    assert processes_of_launcher(os.getpid()) == []


def test_kill_of_a_loader_reading_s3_and_a_restore_keep_the_stream(
    s3: S3Bucket, small_data: Path, tmp_path: Path, reference: dict[Any, str]
) -> None:
    """kill -9 of a loader mid-run: the stream of local files. Then the bucket gains a file the
    glob matches and `msd restore` from step 20 reads the files the job listed (the same
    batches); a file changed since is refused, by name."""
    s3.upload(small_data, "data")
    root = tmp_path / "run"
    root.mkdir()
    (root / "r.yaml").write_text(yaml.safe_dump(repeating(s3_paths(s3)), sort_keys=False))
    proc = start_launch(root, "r.yaml", "--json")
    try:
        wait_for_step(root, 15, proc)
        os.kill(role_pids(proc.pid, "loader")[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    (job,) = (root / "runs").iterdir()
    assert digests(job) == reference

    extra = tmp_path / "extra" / "web"
    extra.mkdir(parents=True)
    pq.write_table(
        pa.table({"text": ["a new shard that lands mid-run"] * 40}), extra / "zz.parquet"
    )
    s3.upload(tmp_path / "extra", "data")
    again = run_msd("restore", str(job), "--step", "20", "--json", cwd=root, timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    (restored,) = [p for p in (root / "runs").iterdir() if p != job]
    later = {k: v for k, v in reference.items() if k[1] >= 20}
    assert digests(restored) == later

    s3.server.upload(small_data / "code", s3.url("data/code"))  # rewritten: a newer mtime
    refused = run_msd("restore", str(job), "--step", "20", cwd=root)
    assert refused.returncode != 0
    assert "source 'code'" in refused.stderr and "changed after" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_rescale_and_an_elastic_restore_from_s3_keep_the_stream(
    s3: S3Bucket, small_data: Path, tmp_path: Path, reference: dict[Any, str]
) -> None:
    """`msd rescale` of a source read from S3 mid-run: the reference stream; then the job
    restored at step 40 as DP 2: the same global batches."""
    s3.upload(small_data, "data")
    root = tmp_path / "run"
    root.mkdir()
    doc = repeating(s3_paths(s3))
    doc["trainer"]["demo"]["step_ms"] = 100  # time for the rescale to land mid-run
    (root / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(root, "r.yaml", "--json")
    try:
        job = wait_for_step(root, 5, proc)
        # The new generation reads while the job runs or never: rescale waits as long as the
        # job may run (it stops waiting when the job ends), and its own error, not the
        # subprocess's timeout, says what went wrong.
        up = run_msd(
            "rescale",
            str(job),
            "--source",
            "web",
            "--loaders",
            "3",
            "--timeout-s",
            str(JOB_S),
            cwd=root,
            timeout=JOB_S + 60,
        )
        out, err = proc.communicate(timeout=JOB_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    assert up.returncode == 0, up.stderr
    generations = json.loads((job / "loaders.json").read_text())["generations"]
    assert [(g["source"], g["loaders"]) for g in generations] == [("web", 3)]
    assert generations[0]["start"] is not None  # it took effect before the run ended
    assert digests(job) == reference

    doc["distribute"] = {"dp": 2}
    (root / "dp2.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    restored = run_msd(
        "restore", str(job), "--step", "40", "--recipe", "dp2.yaml", "--json", cwd=root, timeout=240
    )
    assert restored.returncode == 0, restored.stderr[-2000:]
    (elastic,) = [p for p in (root / "runs").iterdir() if p != job]
    assert sorted(read_rank_logs(elastic)) == [0, 1]
    before, after = global_batches(job), global_batches(elastic)
    assert sorted(after) == list(range(40, STEPS))
    assert all(after[step] == before[step] for step in range(40, STEPS))


def test_a_store_that_stops_answering_for_5_s_costs_wait_not_data(
    s3: S3Bucket, small_data: Path, tmp_path: Path, reference: dict[Any, str]
) -> None:
    """The server stopped (SIGSTOP) for 5 s mid-run: loaders retry, the trainers stall, and the
    stream is the reference's; the retries are counted."""
    s3.upload(small_data, "data")
    root = tmp_path / "run"
    root.mkdir()
    (root / "r.yaml").write_text(yaml.safe_dump(repeating(s3_paths(s3)), sort_keys=False))
    proc = start_launch(root, "r.yaml", "--json")
    try:
        wait_for_step(root, 10, proc)
        s3.server.pause()
        time.sleep(5)
        s3.server.resume()
        out, err = proc.communicate(timeout=240)
    finally:
        s3.server.resume()
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    (job,) = (root / "runs").iterdir()
    assert digests(job) == reference
    assert max_read_retries(job) > 0
    # The trainers waited out the outage (about 4.9 s of the 5 s: the rest was read ahead),
    # and only that: the same stream.
    stalls = [sum(r["wait_ms"] for r in records) for records in read_rank_logs(job).values()]
    assert min(stalls) > 3000, stalls


def test_a_store_down_past_the_retry_budget_stops_the_job_and_restore_continues_it(
    s3: S3Bucket, small_data: Path, tmp_path: Path, reference: dict[Any, str]
) -> None:
    s3.upload(small_data, "data")
    root = tmp_path / "run"
    root.mkdir()
    doc = repeating(s3_paths(s3), loader={"read_retry_s": 2})
    (root / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(root, "r.yaml")
    try:
        wait_for_step(root, 25, proc)  # past the checkpoint of step 20
        s3.server.pause()
        _, err = proc.communicate(timeout=120)
    finally:
        s3.server.resume()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "source '" in err and "object store" in err and "msd restore" in err, err[-2000:]
    assert "Traceback" not in err
    assert processes_of_launcher(proc.pid) == []
    (job,) = (root / "runs").iterdir()
    again = run_msd("restore", str(job), "--json", cwd=root, timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    (restored,) = [p for p in (root / "runs").iterdir() if p != job]
    continued = digests(restored)
    assert continued and continued == {k: v for k, v in reference.items() if k in continued}
    assert max(step for _, step in continued) == STEPS - 1


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("bucket", "does not exist"),
        ("secret", "refused access"),
        ("no credentials", "no AWS credentials were found"),
        ("prefix", "no file matches"),
    ],
)
def test_a_wrong_bucket_key_or_credentials_fail_validate_with_one_sentence(
    s3: S3Bucket,
    small_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
    expected: str,
) -> None:
    s3.upload(small_data / "web", "data/web")
    paths = s3_paths(s3)
    if change == "bucket":
        paths["web"] = paths["web"].replace(s3.bucket, s3.bucket + "-gone")
    if change == "prefix":
        paths["web"] = paths["web"].replace("data/", "dta/")
    if change == "secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    if change == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws either
    doc = recipe(paths)
    doc["sources"] = doc["sources"][:1]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_msd("validate", "r.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert "source 'web'" in message and expected in message, message
    assert len(message.splitlines()) == 1, message
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
