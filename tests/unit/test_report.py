import json
import math

import pytest
import typer
from typer.testing import CliRunner

from cli.report import report
from msd.control.report import load_series, plot
from msd.errors import LaunchError


def line(t, step, weights=None, **over):
    record = {
        "time": 1_700_000_000.0 + t,
        "uptime_s": t,
        "state": "running",
        "step": step,
        "planned": step + 4,
        "steps_per_s": 2.0,
        "tokens_per_s": 8192.0 + t,
        "tokens": 4096 * step,
        "wait_p50_ms": 0.1,
        "wait_p99_ms": 0.5 + t,
        "balance_max_over_mean": 1.02,
        "plan_ms_p99": 3.0,
        "loaders": 2,
        "sources": {
            name: {"weight": w, "tokens_per_s": 100.0, "queue_samples": 5}
            for name, w in (weights or {}).items()
        },
    }
    record.update(over)
    return json.dumps(record)


def write(path, lines, tail=""):
    path.write_text("".join(x + "\n" for x in lines) + tail)
    return path


def test_load_series_reads_every_line_and_skips_a_truncated_last_one(tmp_path):
    lines = [line(0, 0, {"web": 0.7}), line(30, 60, {"web": 0.5, "code": 0.5})]
    path = write(tmp_path / "metrics.jsonl", lines, tail=line(60, 120)[:40])
    s = load_series(path)
    assert s.minutes == (0.0, 0.5)
    assert s.tokens_per_s == (8192.0, 8222.0)
    assert s.wait_p99_ms == (0.5, 30.5)
    assert s.steps_per_s == (2.0, 2.0)
    assert s.balance == (1.02, 1.02)
    assert list(s.source_weights) == ["code", "web"]
    assert s.source_weights["web"] == (0.7, 0.5)
    assert math.isnan(s.source_weights["code"][0]) and s.source_weights["code"][1] == 0.5


def test_a_malformed_middle_line_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "metrics.jsonl", [line(0, 0), "{not json", line(2, 4)])
    with pytest.raises(LaunchError, match=r"metrics\.jsonl line 2 is malformed"):
        load_series(path)


def test_a_line_missing_a_figure_is_malformed(tmp_path):
    path = write(tmp_path / "metrics.jsonl", [line(0, 0, tokens_per_s=None), line(1, 2)])
    with pytest.raises(LaunchError, match=r"line 1 is malformed \('tokens_per_s' is None"):
        load_series(path)


def test_a_missing_or_empty_file_is_an_error(tmp_path):
    with pytest.raises(LaunchError, match="does not exist"):
        load_series(tmp_path / "metrics.jsonl")
    with pytest.raises(LaunchError, match="no complete line"):
        load_series(write(tmp_path / "metrics.jsonl", [], tail='{"time": 1'))


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = write(
        tmp_path / "metrics.jsonl", [line(t, t, {"web": 0.6, "code": 0.4}) for t in range(5)]
    )
    out = plot(load_series(path), tmp_path / "r.png", title="job")
    assert out == tmp_path / "r.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_cli_writes_job_report_png_by_default(tmp_path):
    pytest.importorskip("matplotlib")
    write(tmp_path / "metrics.jsonl", [line(t, t) for t in range(3)])
    app = typer.Typer()
    app.command()(report)
    result = CliRunner().invoke(app, [str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.png").stat().st_size > 0
    assert str(tmp_path / "report.png") in result.output.replace("\n", "")


def test_cli_reports_a_missing_metrics_file_as_one_line(tmp_path):
    app = typer.Typer()
    app.command()(report)
    result = CliRunner().invoke(app, [str(tmp_path)])
    assert result.exit_code == 1
    assert "error:" in result.output and "does not exist" in result.output
    assert "Traceback" not in result.output
