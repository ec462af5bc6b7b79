"""benchmarks.chat_tokenize on a tiny data set: its rows, its in-process measurement (which holds
msd's ids and trained tokens to transformers' before timing), and one real loader read through
``msd status``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks import loader_rate
from benchmarks.chat_tokenize import (
    PARALLELISM,
    check_same,
    chunk_rows,
    hf_render,
    hf_tokenizer,
    in_process,
    joined,
    make_data,
    recipe,
    serial_tokenizers,
    source,
    tables,
    well_formed,
)
from msd.recipe.checks import check_recipe
from msd.recipe.load import recipe_from_data
from msd.roles.loader.shard import CHUNK_BYTES, CHUNK_SECONDS
from msd.sources.chat_rows import ChatRows

Sets = tuple[Path, dict[str, list[list[dict[str, str]]]]]


def chat(*roles: str) -> list[dict[str, str]]:
    return [{"role": r, "content": f"{r} {i}"} for i, r in enumerate(roles)]


def test_only_conversations_both_render_are_kept() -> None:
    good = chat("system", "user", "assistant")
    chats = [good, chat("user", "narrator"), chat("user"), chat("user", "assistant")]
    assert well_formed(chats) == [good, chats[3]]


def test_long_rows_join_conversations_keeping_the_first_system_prompt() -> None:
    a, b, c = chat("system", "user", "assistant"), chat("system", "user", "assistant"), chat("user")
    (row,) = joined([a, b, c], 2)  # the third is left over
    assert row == a + b[1:]


def test_a_chunk_is_a_loaders_slice_of_work_or_of_bytes() -> None:
    assert chunk_rows(CHUNK_SECONDS / 10, 1.0) == 10
    assert chunk_rows(1e-9, CHUNK_BYTES / 4) == 4
    assert chunk_rows(1.0, 1.0) == 1


def test_the_windows_run_back_to_back_from_report_to_report() -> None:
    readings = [
        (0.0, (1.0, 1.5, 100)),
        (1.0, (1.5, 2.0, 600)),
        (2.5, (3.0, 3.5, 2100)),
        (3.5, (3.5, 4.0, 2600)),
    ]
    assert loader_rate.windows(readings[:2], window_s=2.0) == []
    first, second = loader_rate.windows([*readings, (5.0, (5.0, 5.5, 4600))], window_s=2.0)
    assert first == {
        "tokens": 2000,
        "cpu_s": 2.0,
        "busy_s": 2.0,
        "cpu_s_per_1m_tokens": 1000.0,
        "busy_s_per_1m_tokens": 1000.0,
    }
    assert second["tokens"] == 2500 and second["cpu_s"] == 2.0  # from the 2.5 s report on


def test_the_thread_pool_is_off_only_inside_the_serial_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARALLELISM, raising=False)
    with serial_tokenizers():
        assert os.environ[PARALLELISM] == "false"
    assert PARALLELISM not in os.environ
    monkeypatch.setenv(PARALLELISM, "true")
    with serial_tokenizers():
        assert os.environ[PARALLELISM] == "false"
    assert os.environ[PARALLELISM] == "true"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Sets:
    root = tmp_path_factory.mktemp("chat-tokenize")
    return root, make_data(root, rows=30, join=3)


def test_the_sets_are_written_as_conversations_and_documents(tiny: Sets) -> None:
    root, sets = tiny
    assert len(sets["long"]) == len(sets["demo"]) // 3 > 0
    for name, chats in sets.items():
        assert pq.read_table(root / name / "chat.parquet").column(0).to_pylist() == chats
        docs = pq.read_table(root / name / "docs.parquet").column(0).to_pylist()
        assert docs[0] == "\n".join(m["content"] for m in chats[0])
    for kind in ("chat", "docs"):
        assert check_recipe(recipe_from_data(recipe(root, "long", kind, True), "test")) == []


def test_a_difference_from_transformers_is_refused(tiny: Sets) -> None:
    root, sets = tiny
    rows = ChatRows(source(root, "demo", "chat"))
    column = pq.read_table(root / "demo" / "chat.parquet").column(0).combine_chunks()
    reference = hf_render(hf_tokenizer(root), sets["demo"])
    check_same(rows, column, reference)
    reference["assistant_masks"][1] = list(np.logical_not(reference["assistant_masks"][1]))
    with pytest.raises(RuntimeError, match="row 1"):
        check_same(rows, column, reference)


def test_every_way_is_timed_on_the_same_conversations(tiny: Sets) -> None:
    root, sets = tiny
    result = in_process(root, "long", sets["long"], repeats=1)
    tokens = result["tokens"]
    # transformers' tokens are msd's less the eos msd adds to each conversation
    assert tokens["transformers_batch"] == tokens["msd_chat"] - len(sets["long"])
    assert tokens["transformers_one_by_one"] == tokens["transformers_batch"]
    assert all(v > 0 and math.isfinite(v) for v in result["cpu_s_per_1m_tokens"].values())
    assert result["chunk_rows"]["msd_chat"] >= 1
    assert tables({"in_process": {"long": result}}).count("\n") == 2
    assert result["tokens"]["msd_chat_serial"] == result["tokens"]["msd_chat"]


def cost(window: dict[str, float]) -> float:
    return window["cpu_s_per_1m_tokens"]


def test_a_real_loader_is_read_from_msd_status(tiny: Sets, tmp_path: Path) -> None:
    root, _ = tiny
    doc = recipe(root, "demo", "chat", repeat=True)
    got = loader_rate.measure(tmp_path, doc, window_s=1.0, count=2, timeout_s=120)
    assert len(got["windows"]) == 2 and got == {**min(got["windows"], key=cost), **got}
    assert all(w["tokens"] > 0 and w["cpu_s"] > 0 and w["busy_s"] > 0 for w in got["windows"])
    (job,) = tmp_path.glob("runs/*/job.json")
    assert json.loads(job.read_text())["state"] == "stopped"  # as `msd stop` leaves it
