"""Many tiny sources: too many loader processes draw a warning, and a launch summarises its
loader processes in one line (every process is listed in JOB/loaders.txt)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from msd.synth.text import SynthSource, synth
from tests.conftest import run_msd, start_launch

SOURCES = 80


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many")
    tiny = [
        SynthSource(f"src{i:03d}", median_tokens=30, sigma=0.5, max_tokens=200, num_samples=40)
        for i in range(SOURCES)
    ]
    synth(root / "data", tiny, seed=2, files_per_source=1, rows_per_row_group=20)
    return root


def recipe(root: Path, name: str, loaders: int | str | None = 1, **extra: Any) -> str:
    r: dict[str, Any] = {
        "name": name,
        "steps": 3,
        "seq_len": 256,
        "global_batch_tokens": 1024,
        "distribute": {"dp": 2},
        "sources": [
            {
                "name": f"src{i:03d}",
                "path": f"data/src{i:03d}/*.parquet",
                "text_column": "text",
                "weight": 1 + i % 5,
                **({} if loaders is None else {"loaders": loaders}),
            }
            for i in range(SOURCES)
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
        **extra,
    }
    (root / f"{name}.yaml").write_text(yaml.safe_dump(r, sort_keys=False))
    return f"{name}.yaml"


def flat(text: str) -> str:
    return " ".join(text.split())  # the console wraps long lines at spaces


def test_validate_and_dry_run_warn_about_a_process_per_source(many: Path) -> None:
    # on SLURM the limit is 64 whatever this machine's CPUs: 80 sources, 80 loader jobs
    one_each = recipe(many, "one-each", cluster="slurm")
    for args in (("validate", one_each), ("launch", one_each, "--dry-run")):
        result = run_msd(*args, cwd=many)
        assert result.returncode == 0, result.stderr
        warning = flat(result.stderr)
        assert warning.startswith("warning: this recipe starts 80 loader processes"), warning
        assert "sources_per_process" in warning and "loaders: auto" in warning
        assert "Traceback" not in result.stderr
    shared = recipe(many, "shared", cluster="slurm", loader={"sources_per_process": 8})
    result = run_msd("validate", shared, cwd=many)
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


def test_launch_summarises_loaders_instead_of_naming_every_source(many: Path) -> None:
    auto = recipe(many, "auto", loaders="auto", loader={"cpus": 2})
    result = run_msd("launch", auto, cwd=many)
    assert result.returncode == 0, result.stderr
    before_progress = flat(result.stdout.split("step ")[0])
    assert f"loaders (auto, 2 CPUs): {SOURCES} sources on" in before_progress
    named = [i for i in range(SOURCES) if f"src{i:03d}" in before_progress]
    assert len(named) <= 3, before_progress
    assert "more sources (--json has them all)" in result.stdout
    (job,) = (many / "runs").glob("auto-*")
    lines = (job / "loaders.txt").read_text().splitlines()
    served = sorted(s for line in lines for s in line.split("\t")[1].split(", "))
    assert served == [f"src{i:03d}" for i in range(SOURCES)]


def test_by_default_many_sources_share_a_handful_of_processes_as_msd_plan_says(
    many: Path,
) -> None:
    """No ``loaders`` and no ``loader:`` section: 80 sources on 2 loader CPUs are not 80
    processes, and `msd plan` says what `msd launch` starts (both measure what the sources
    cost, each time: a light source's grouping may differ by a process)."""
    plain = recipe(many, "plain", loaders=None)
    doc = yaml.safe_load((many / plain).read_text())
    doc["loader"] = {"cpus": 2}  # as on a 2-CPU machine, whatever this one has
    (many / plain).write_text(yaml.safe_dump(doc, sort_keys=False))
    planned = run_msd("plan", plain, "--json", cwd=many)
    assert planned.returncode == 0, planned.stderr
    processes = json.loads(planned.stdout)["processes"]
    assert processes <= 4
    result = run_msd("launch", plain, cwd=many)
    assert result.returncode == 0, result.stderr
    (job,) = (many / "runs").glob("plain-*")
    lines = (job / "loaders.txt").read_text().splitlines()
    assert len(lines) <= 4 and abs(len(lines) - processes) <= 1, (lines, processes)
    served = sorted(s for line in lines for s in line.split("\t")[1].split(", "))
    assert served == [f"src{i:03d}" for i in range(SOURCES)]


def test_status_of_many_sources_shows_a_screen_and_all_of_them_on_request(many: Path) -> None:
    slow = recipe(many, "slow", loader={"sources_per_process": 20}, steps=10**6)
    doc = yaml.safe_load((many / slow).read_text())
    for s in doc["sources"]:
        s["repeat"] = True
    (many / slow).write_text(yaml.safe_dump(doc, sort_keys=False))
    launcher = start_launch(many, slow)
    try:
        deadline = time.monotonic() + 90
        screen = run_msd("status", cwd=many)
        while screen.returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            screen = run_msd("status", cwd=many)
        every = run_msd("status", "--all", cwd=many)
    finally:
        for job in (many / "runs").glob("slow-*"):
            run_msd("stop", str(job), cwd=many)
        launcher.communicate(timeout=60)
    assert screen.returncode == 0 and every.returncode == 0, screen.stderr + every.stderr
    # 12 sources, those that most need a look, and one line for the other 68
    rows = re.compile(r"^src\d{3} ", re.MULTILINE)  # a source's row (not a loader's: src000+19)
    assert len(rows.findall(screen.stdout)) == 12
    assert f"and {SOURCES - 12} more sources: weight" in flat(screen.stdout)
    assert len(set(rows.findall(every.stdout))) == SOURCES
    assert "more sources" not in every.stdout
