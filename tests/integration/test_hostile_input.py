"""Input that passes the first checks and would hurt later: a text column with nulls, a source
with no text at all, a checkpoint edited by hand, a job folder that fills up. Each ends in one
sentence (or, for nulls, a counted and finished run), never a hang or a traceback."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from msd.checkpoint.signing import signature, signing_key
from msd.wire.keys import load_keys
from tests.conftest import run_msd, start_launch, wait_for_file

ROWS = 240


def write_sparse(folder: Path, null_every: int, empty_every: int = 0) -> int:
    """A Parquet source of ``ROWS`` rows, every ``null_every``-th text null and every
    ``empty_every``-th empty; how many rows hold no text."""
    folder.mkdir(parents=True, exist_ok=True)
    texts: list[str | None] = []
    for i in range(ROWS):
        if null_every and i % null_every == 0:
            texts.append(None)
        elif empty_every and i % empty_every == 0:
            texts.append("")
        else:
            texts.append(f"word{i} " * (1 + i % 40))
    table = pa.table({"text": pa.array(texts, pa.string())})
    pq.write_table(table, folder / "part-0.parquet", row_group_size=32)
    return sum(1 for t in texts if not t)


def sparse_recipe(path: Path, **overrides: Any) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "name": "sparse",
        "seq_len": 256,
        "global_batch_tokens": 1024,
        "distribute": {"dp": 2},
        "sources": [
            {
                "name": "sparse",
                "path": str(path),
                "text_column": "text",
                "weight": 1.0,
                "repeat": False,
            }
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }
    recipe.update(overrides)
    return recipe


def write(tmp_path: Path, recipe: dict[str, Any], name: str = "recipe.yaml") -> str:
    (tmp_path / name).write_text(yaml.safe_dump(recipe, sort_keys=False))
    return name


@pytest.mark.parametrize("command", ["validate", "launch"])
def test_a_source_whose_text_is_all_null_fails_before_anything_starts(
    command: str, tmp_path: Path
) -> None:
    write_sparse(tmp_path / "nulls", null_every=1)
    name = write(tmp_path, sparse_recipe(tmp_path / "nulls" / "*.parquet"))
    result = run_msd(command, name, cwd=tmp_path, timeout=60)
    err = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in err
    assert "source 'sparse'" in err and "null or empty in all 240 rows" in err, err
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def sparse_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], int]:
    """A finished run over a source with null and empty rows: (job folder, summary, empties)."""
    tmp_path = tmp_path_factory.mktemp("sparse")
    empties = write_sparse(tmp_path / "data", null_every=5, empty_every=7)
    name = write(tmp_path, sparse_recipe(tmp_path / "data" / "*.parquet"))
    result = run_msd("launch", name, "--json", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    return Path(summary["job"]), summary, empties


def test_rows_without_text_are_delivered_empty_and_counted(
    sparse_job: tuple[Path, dict[str, Any], int],
) -> None:
    job, summary, empties = sparse_job
    assert summary["empty_samples"] == empties  # the whole finite source went through once
    assert json.loads((job / "job.json").read_text())["state"] == "done"
    seen = set()
    for log in (job / "trainer").glob("rank-*.jsonl"):
        for line in log.read_text().splitlines():
            seen.update(json.loads(line)["sample_ids"])
    assert len(seen) == ROWS  # every row delivered once, the empty ones too


def test_a_job_folder_is_owner_only_and_its_key_0600(
    sparse_job: tuple[Path, dict[str, Any], int],
) -> None:
    job = sparse_job[0]
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    assert stat.S_IMODE((job / "job.key").stat().st_mode) == 0o600


def resign(path: Path, edit: Any, key_file: Path | None) -> None:
    """Apply ``edit`` to the snapshot's body; recompute its sha256 (and, given the job's key,
    its signature: what a faulty process holding the key would write)."""
    doc = json.loads(path.read_bytes())
    edit(doc["body"])
    canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":")).encode()
    doc["sha256"] = hashlib.sha256(canonical).hexdigest()
    if key_file is not None:
        doc["hmac"] = signature(signing_key(load_keys(key_file)), canonical)
    path.write_bytes(json.dumps(doc).encode())


def _command(body: dict[str, Any]) -> None:
    body["recipe"]["trainer"]["command"] = "touch PWNED"


def test_a_snapshot_whose_trainer_command_was_edited_is_refused(
    sparse_job: tuple[Path, dict[str, Any], int], tmp_path: Path
) -> None:
    job = sparse_job[0]
    snapshot = job / "checkpoints" / "step-00000000.json"
    original = snapshot.read_bytes()
    try:
        resign(snapshot, _command, key_file=None)
        result = run_msd("restore", str(snapshot), cwd=tmp_path, timeout=60)
    finally:
        snapshot.write_bytes(original)
    assert result.returncode != 0, result.stdout
    assert "was changed after it was written" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "runs").exists()


def test_a_snapshot_without_its_job_key_restores_only_under_a_given_recipe(
    sparse_job: tuple[Path, dict[str, Any], int], tmp_path: Path
) -> None:
    job = sparse_job[0]
    away = tmp_path / "step-00000000.json"
    away.write_bytes((job / "checkpoints" / "step-00000000.json").read_bytes())
    resign(away, _command, key_file=None)  # nobody can tell: the key is not beside it
    result = run_msd("restore", str(away), cwd=tmp_path, timeout=60)
    assert result.returncode != 0 and "cannot be verified" in result.stderr, result.stderr
    assert "--recipe" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "runs").exists()
    result = run_msd(
        "restore", str(away), "--recipe", str(job / "recipe.yaml"), "--json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["empty_samples"] == sparse_job[2]  # its command ran
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda b: b["cursors"].__setitem__(0, -5), "cursors[0] is -5, out of range"),
        (lambda b: b.__setitem__("step", -1), "step is -1, out of range"),
        (lambda b: b.__setitem__("cursors", [0, 0]), "num_rows has 1 entries for 2 cursors"),
        (lambda b: b.__setitem__("carry", [[3, 1]]), "carry[0] source is 3"),
        (lambda b: b["recipe"].__setitem__("seq_len", 0), "recipe.seq_len: must be >= 2"),
        (lambda b: b["recipe"].__setitem__("seq_len", "x"), "recipe.seq_len: expected int"),
    ],
)
def test_a_signed_snapshot_with_a_field_out_of_range_is_refused_naming_it(
    sparse_job: tuple[Path, dict[str, Any], int], tmp_path: Path, edit: Any, needle: str
) -> None:
    job = sparse_job[0]
    copy = tmp_path / "job"
    (copy / "checkpoints").mkdir(parents=True)
    (copy / "job.key").write_bytes((job / "job.key").read_bytes())
    snapshot = copy / "checkpoints" / "step-00000000.json"
    snapshot.write_bytes((job / "checkpoints" / "step-00000000.json").read_bytes())
    resign(snapshot, edit, key_file=copy / "job.key")
    result = run_msd("restore", str(snapshot), cwd=tmp_path, timeout=60)
    assert result.returncode != 0
    assert needle in result.stderr and str(snapshot) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 4 MiB filesystem of its own (tmpfs), where this user may mount one."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4M", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        why = done.stderr.decode().strip()
        if os.geteuid() == 0:  # root (as in CI) can: a failure here is a real one
            pytest.fail(f"root could not mount a tmpfs: {why}")
        pytest.skip(f"mounting a tmpfs needs root: {why}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> None:
    """Write into ``folder`` until its filesystem is full (the job may have filled it first)."""
    try:
        with open(folder / "filler", "wb") as f:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise


def test_a_job_folder_that_fills_up_fails_the_job_saying_so(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    write_sparse(tmp_path / "data", null_every=0)
    recipe = sparse_recipe(tmp_path / "data" / "*.parquet", steps=100_000)
    recipe["sources"][0]["repeat"] = True
    recipe["trainer"]["demo"] = {"step_ms": 5}
    recipe["recovery"] = {"restarts": 0}
    name = write(tmp_path, recipe)
    launcher = start_launch(tmp_path, name, "--run-dir", str(small_tmpfs))
    wait_for_file(small_tmpfs, "*/checkpoints/log-*.jsonl", launcher, lines=5, timeout_s=90)
    fill(small_tmpfs)
    out, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 1, out + err
    assert "Traceback" not in err and "is full" in err, err
    (job,) = [p for p in small_tmpfs.iterdir() if p.is_dir()]
    (small_tmpfs / "filler").unlink(missing_ok=True)
    assert json.loads((job / "job.json").read_text())["state"] == "failed"
    assert not list(job.glob(".*.tmp")), "a failed write leaves no temporary file"


def test_a_transform_that_yields_no_tokens_stops_the_job_naming_the_source(
    tmp_path: Path,
) -> None:
    write_sparse(tmp_path / "data", null_every=0)
    (tmp_path / "notokens.py").write_text("def encode(cell):\n    return []\n")
    recipe = sparse_recipe(tmp_path / "data" / "*.parquet", steps=50)
    recipe["sources"][0]["repeat"] = True
    recipe["sources"][0]["transform"] = {"kind": "function", "function": "notokens:encode"}
    name = write(tmp_path, recipe)
    result = run_msd("launch", name, cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "step 0 holds no tokens" in result.stderr and "from sparse are empty" in result.stderr
    job = next((tmp_path / "runs").iterdir())
    assert json.loads((job / "job.json").read_text())["state"] == "failed"
