"""eos end to end: a finite epoch of text sources with ``transform.eos`` delivers every document
once with exactly one eos, at its end (the last token of its last piece, whether or not it was
split), and the Planner counted it: the epoch holds one token more per document than the same
epoch without eos."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import base_recipe, read_rank_logs
from tests.integration.test_multimodal import launch

EOS = 256  # outside the byte range: no text byte is it


def _recipe(data: Path, eos: int | None) -> dict[str, Any]:
    doc = base_recipe(data, seq_len=256, global_batch_tokens=2048, distribute={"dp": 2})
    doc["trainer"]["demo"]["save_batches"] = True
    for source in doc["sources"]:
        source["loaders"] = 1
        if eos is not None:
            source["transform"] = {"kind": "bytes", "eos": eos}
    return doc


def _documents(job: Path) -> tuple[Counter[tuple[int, int]], list[np.ndarray]]:
    """Pieces delivered per (source, sample), and each rank-step's tokens."""
    pieces: Counter[tuple[int, int]] = Counter()
    batches = []
    for rank, records in read_rank_logs(job).items():
        for r in records:
            pieces.update(zip(r["source_ids"], r["sample_ids"], strict=True))
            batches.append(np.load(job / "trainer" / f"rank-{rank}" / f"step-{r['step']}.npz"))
    return pieces, batches


def test_every_document_ends_with_one_eos_counted_by_the_planner(
    small_data: Path, tmp_path: Path
) -> None:
    job, summary = launch(tmp_path / "eos", _recipe(small_data, EOS))
    _, plain_summary = launch(tmp_path / "plain", _recipe(small_data, None))
    pieces, batches = _documents(job)
    documents = len(pieces)
    assert summary["split_samples"] > 0  # some documents were split: their eos is in the last
    eos_seen = 0
    for batch in batches:
        ids, positions = batch["input_ids"], batch["position_ids"]
        at = np.argwhere(ids == EOS)
        eos_seen += len(at)
        for r, t in at.tolist():
            # the last token of its piece: the row ends, or the next token starts a piece
            assert t + 1 == ids.shape[1] or positions[r, t + 1] == 0, (r, t)
    assert eos_seen == documents
    assert summary["tokens"] == plain_summary["tokens"] + documents
    assert summary["truncated_samples"] == plain_summary["truncated_samples"] == 0
