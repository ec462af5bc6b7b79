"""What long_samples keeps of a long sample, as the planner plans it, and the warnings naming a
source whose samples lose tokens."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from msd.launch.long_sample_warnings import long_sample_warnings
from msd.plan.long_samples import kept_tokens, loss, warning
from msd.plan.step import pieces
from msd.recipe.load import load_recipe
from tests.unit.test_step import spec


@pytest.mark.parametrize("policy", ["split", "truncate", "drop"])
def test_kept_tokens_is_what_the_planner_places(policy: str) -> None:
    sp = spec(long_samples=policy)  # 4 rows of 64 tokens a step
    for length in (1, 63, 64, 65, 200, 256, 257, 10_000):
        placed, _ = pieces(sp, 0, 0, length)
        assert kept_tokens(length, 64, policy, sp.global_rows) == sum(s.length for s in placed)


def test_loss_counts_the_samples_cut_and_their_lost_tokens() -> None:
    found = loss("web", [10, 300, 200_000, 64], 64, "split", 4)
    assert found is not None
    assert (found.samples, found.cut, found.longest) == (4, 2, 200_000)
    assert (found.tokens, found.lost_tokens) == (200_300, (300 - 256) + (200_000 - 256))
    assert loss("web", [10, 200], 64, "split", 4) is None  # split whole: nothing lost
    assert loss("web", [200_000], 64, "drop", 4) is None  # asked for: not reported as lost
    text = warning(found, 64, "split", 4)
    assert "source web" in text and f"{44 + 199_744:,}" in text and "4 × 64 = 256 tokens" in text


def test_a_source_with_a_document_longer_than_a_step_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    texts = ["short text"] * 30 + ["x" * 200_000]
    pq.write_table(pa.table({"text": texts}), folder / "part-0.parquet", row_group_size=8)
    doc = {
        "name": "t",
        "steps": 10,
        "seq_len": 512,
        "global_batch_tokens": 4096,
        "distribute": {"dp": 2},
        "sources": [
            {"name": "docs", "path": str(folder / "*.parquet"), "text_column": "text", "weight": 1},
        ],
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    (found,) = long_sample_warnings(load_recipe(tmp_path / "r.yaml"))
    assert found.startswith("source docs: 1 of the 31 samples profiled")
    assert f"{200_000 - 4096:,}" in found  # a step's 8 rows of 512 tokens are kept
    doc["balance"] = {"long_samples": "drop"}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc))
    assert long_sample_warnings(load_recipe(tmp_path / "r.yaml")) == []
