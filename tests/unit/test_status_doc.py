"""docs/status.md names every key `msd status --json` prints, every metric the Planner serves and
every key of a `metrics.jsonl` line, and documents no key the code does not have: a field
added to a view without its line on the page fails here."""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from msd.control.job_status import status_json
from msd.control.metrics import HistogramSnapshot, families
from msd.control.view import JobObserver, metrics_line
from msd.jobdir import JobDir
from msd.wire.views import StatusView

DOC = Path(__file__).resolve().parents[2] / "docs" / "status.md"


def section(title: str) -> str:
    """The page's text from the heading ``title`` to the next heading of its level or above."""
    text = DOC.read_text()
    level = re.search(rf"^(#+) {re.escape(title)}$", text, re.MULTILINE)
    assert level is not None, f"docs/status.md has no heading {title!r}"
    rest = text[level.end() :]
    end = re.search(rf"^#{{1,{len(level[1])}}} ", rest, re.MULTILINE)
    return rest[: end.start() if end else len(rest)]


def table_keys(text: str) -> set[str]:
    """The first column of a table's rows: ``| `key` | ...``."""
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE))


def struct_keys(struct: type[msgspec.Struct], prefix: str = "") -> Iterator[str]:
    """Every key of ``struct`` as the page writes it: ``job.step``, ``sources[]``,
    ``sources[].weight``."""
    for field in msgspec.structs.fields(struct):
        path = prefix + field.name
        inner: Any = field.type
        listed = typing.get_origin(inner) is tuple
        if listed:
            inner = typing.get_args(inner)[0]
        if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
            if listed:
                yield path + "[]"
            yield from struct_keys(inner, path + ("[]." if listed else "."))
        else:
            yield path


def a_view() -> StatusView:
    observer = JobObserver(source_names=("web",))
    return observer.view(
        state="running",
        planned=3,
        steps=None,
        uptime_s=1.0,
        failure="",
        weights=(1.0,),
        lifecycle={},
        counts={},
        planner_pid=1,
    )


def test_every_status_json_key_is_on_the_page_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a SLURM job's folder, so that the document holds `slurm[]` entries; without squeue on
    # the PATH their state is UNKNOWN (a SLURM client with no controller to ask waits 18 s)
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "job.json").write_text(
        json.dumps({"name": "t", "cluster": "slurm", "slurm_jobs": {"planner planner": "7"}})
    )
    document = status_json(JobDir(tmp_path), a_view())
    # what the job folder adds to the view: folder, name, cluster, slurm[]
    view_fields = {f.name for f in msgspec.structs.fields(StatusView)}
    added = {f"{k}[]" if isinstance(document[k], list) else k for k in document} - view_fields
    added |= {f"slurm[].{k}" for entry in document["slurm"] for k in entry}
    expected = set(struct_keys(StatusView)) | added
    assert {"job.step", "sources[].weight", "slurm[].state", "folder"} <= expected
    assert table_keys(section("Keys")) == expected


def test_every_metric_is_on_the_page_and_no_other() -> None:
    empty = HistogramSnapshot.empty()
    served = {
        m.name + ("_total" if m.type == "counter" else "") for m in families(a_view(), empty, empty)
    }
    assert "msd_steps_total" in served and "msd_data_wait_seconds" in served
    assert table_keys(section("Prometheus")) == served


def test_every_metrics_jsonl_key_is_on_the_page() -> None:
    line = metrics_line(a_view(), 0.0)
    keys = set(line) | set(line["cache"]) | {k for s in line["sources"].values() for k in s}
    text = section("`JOB/metrics.jsonl`")
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert missing == []
