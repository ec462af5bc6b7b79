"""A document longer than a step with long_samples: split: `msd validate` and `msd launch` name
the source and the tokens it will lose, the Planner's log says so when it happens, and the run
summary counts the tokens lost, per source."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tests.conftest import run_msd

LONG = 200_000  # bytes, and tokens (the default transform): one 200 KB document
KEPT = 2 * 4 * 512  # one step's rows: dp 2 × 4 rows × seq_len 512


def test_a_document_longer_than_a_step_is_warned_about_and_counted(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    texts = [f"short text {i}" for i in range(40)] + ["x" * LONG]
    pq.write_table(pa.table({"text": texts}), folder / "part-0.parquet", row_group_size=8)
    recipe = {
        "name": "long",
        "seq_len": 512,
        "global_batch_tokens": 4096,
        "distribute": {"dp": 2},
        "sources": [
            {
                "name": "docs",
                "path": str(folder / "*.parquet"),
                "text_column": "text",
                "weight": 1,
                "repeat": False,
            }
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))

    validated = run_msd("validate", "r.yaml", cwd=tmp_path)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    lost = f"lose {LONG - KEPT:,} of their {LONG:,} tokens"
    warned = " ".join(validated.stderr.split())  # rich may wrap it
    assert "source docs: 1 of the 41 samples profiled" in warned and lost in warned

    launched = run_msd("launch", "r.yaml", "--json", cwd=tmp_path)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert lost in " ".join(launched.stderr.split())
    summary = json.loads(launched.stdout[launched.stdout.index("{") :])
    assert summary["truncated_samples"] == 1 and summary["split_samples"] == 1
    assert summary["truncated_tokens"] == LONG - KEPT
    assert summary["truncated_tokens_by_source"] == {"docs": LONG - KEPT}
    (log,) = tmp_path.glob("runs/long-*/logs/planner-planner.log")
    assert f"source docs: a sample lost {LONG - KEPT} tokens to long_samples: split" in (
        log.read_text()
    )
