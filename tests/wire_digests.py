"""Per-rank batch digests of a few jobs that cover every kind of batch msd builds, to compare
the streams of two msd versions (a wire or packing change must not alter one batch byte).

    python -m tests.wire_digests OUT.json     # records with the msd this interpreter imports

tests/integration/test_wire_digests.py runs the same jobs and compares with
tests/integration/wire_digests.json, recorded by the release before the compact wire. The
cases: text from three Parquet sources plus a token-id source with a vocabulary above 65,536
(samples split across rows, balancing on); a dp 2 × cp 2 × pp 2 job (context-parallel slices,
pipeline stages' tensor subsets); images from WebDataset and Parquet captions and interleaved
documents, decoded at full size (``vlm``, recorded again when that became the default) and with
``vision.decode: fast`` (``vlm-fast``: the bytes ``vlm`` had before). ``relayed`` runs some of
them again on simulated nodes with payloads relayed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from msd.synth.text import SynthSource, synth
from msd.synth.vlm import write_vlm_sources

SOURCES = (
    SynthSource("web", median_tokens=40, sigma=0.8, max_tokens=700, num_samples=120),
    SynthSource("code", median_tokens=120, sigma=0.8, max_tokens=700, num_samples=60),
    SynthSource("books", median_tokens=300, sigma=0.6, max_tokens=700, num_samples=40),
)
IMAGE_TOKEN = 151_655
SEQ_LEN = 256

Digests = dict[str, list[str]]  # rank → digest of each step, in step order


def make_data(root: Path) -> None:
    """The files every case reads (the same bytes on every run)."""
    synth(root / "text", SOURCES, seed=7, files_per_source=2, rows_per_row_group=16)
    rng = np.random.default_rng(3)
    ids = [rng.integers(0, 150_000, int(n)).tolist() for n in rng.integers(1, 600, 80)]
    (root / "ids").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"ids": ids}), root / "ids" / "part-0.parquet", row_group_size=16)
    write_vlm_sources(root / "vlm", seed=3, samples=12, files_per_source=2, rows_per_row_group=4)


def recipes(root: Path) -> dict[str, dict[str, Any]]:
    text = [
        {
            "name": s.name,
            "path": str(root / "text" / s.name / "*.parquet"),
            "text_column": "text",
            "weight": w,
        }
        for s, w in zip(SOURCES, (0.5, 0.3, 0.2), strict=True)
    ]
    ids = {
        "name": "ids",
        "path": str(root / "ids" / "*.parquet"),
        "token_column": "ids",
        "weight": 0.3,
    }
    images = root / "vlm"
    trainer = {"command": "demo", "demo": {"step_ms": 0}}
    common = {"seed": 11, "seq_len": SEQ_LEN, "trainer": trainer}
    cases: dict[str, dict[str, Any]] = {
        "text": {
            **common,
            "name": "text",
            "steps": 10,
            "global_batch_tokens": 2 * 2 * SEQ_LEN,
            "distribute": {"dp": 2},
            "sources": [*text, ids],
        },
        "hybrid": {
            **common,
            "name": "hybrid",
            "steps": 6,
            "global_batch_tokens": 2 * 2 * SEQ_LEN,
            "micro_batch_size": 1,
            "distribute": {"dp": 2, "cp": 2, "pp": 2},
            "sources": text,
        },
        "vlm": {
            **common,
            "name": "vlm",
            "steps": 6,
            "seq_len": 1024,
            "global_batch_tokens": 2 * 1024,
            "distribute": {"dp": 2},
            "vision": {"max_pixels": 64 * 64, "image_token_id": IMAGE_TOKEN},
            "sources": [
                {
                    "name": "captions-wds",
                    "path": str(images / "captions-wds" / "*.tar"),
                    "format": "webdataset",
                    "text_column": "txt",
                    "weight": 0.4,
                },
                {
                    "name": "captions-parquet",
                    "path": str(images / "captions-parquet" / "*.parquet"),
                    "text_column": "text",
                    "image_column": "image",
                    "weight": 0.3,
                },
                {
                    "name": "interleaved",
                    "path": str(images / "interleaved-parquet" / "*.parquet"),
                    "text_column": "text",
                    "image_column": "images",
                    "weight": 0.3,
                },
            ],
        },
    }
    vlm = cases["vlm"]
    cases["vlm-fast"] = {**vlm, "name": "vlm-fast", "vision": {**vlm["vision"], "decode": "fast"}}
    return cases


# Cases run again on simulated nodes, payloads relayed along a chain of Constructors (fan-out 1,
# ``msd.plan.fanout``): case → nodes. The batches must be those of the one-node run.
RELAYED = {"text": 2, "hybrid": 4, "vlm": 2}


def relayed(cases: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ``RELAYED`` cases, each on its nodes with fan-out 1."""
    return {
        name: {
            **cases[name],
            "name": f"{name}-relayed",
            "trainer": {**cases[name]["trainer"], "nodes": nodes},
            "constructor": {"fanout": 1},
        }
        for name, nodes in RELAYED.items()
    }


def run_case(recipe: dict[str, Any], folder: Path) -> Digests:
    """Launch ``recipe`` in ``folder`` with this interpreter's msd; each rank's digests."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "msd.cli", "launch", "recipe.yaml"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{recipe['name']}: msd launch failed:\n{done.stderr[-3000:]}")
    found: Digests = {}
    for log in sorted(folder.glob("runs/*/trainer/rank-*.jsonl")):
        rank = log.stem.removeprefix("rank-")
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        found[rank] = [e["digest"] for e in sorted(lines, key=lambda e: e["step"])]
    return found


def record(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_data(root / "data")
        cases = {
            name: run_case(recipe, root / name) for name, recipe in recipes(root / "data").items()
        }
    out.write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
