"""Conversation sources end to end: OpenAI ``messages`` in Parquet, ShareGPT in JSONL, LLaVA-style
image conversations in WebDataset (``msd synth --kind chat``: about one in 25 malformed) and plain
documents, a tokenizer with ``eos``, the demo's ChatML template, real role processes, DP 4.

Checked: every sample is delivered once (malformed ones as empty samples, counted by reason,
the same on two runs); each text conversation's tokens are transformers'
``apply_chat_template`` ids and an eos, and its labels are the next token exactly where
transformers' assistant mask trains it (so ``loss_mask`` is that mask, shifted); an image
conversation's placeholders are never trained; a document's every token is; the stream (masks
included) is the same after kill -9 of a loader, and the same global batches on a restore
onto DP 2.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from msd.batch.pack import IGNORE_INDEX, PAD_ID
from msd.synth.chat import (
    LLAVA_SOURCE,
    MESSAGES_SOURCE,
    SHAREGPT_SOURCE,
    TOKENIZER_DIR,
    write_chat_sources,
)
from msd.synth.text import SynthSource, synth
from tests.conftest import (
    assert_launch_ok,
    processes_of_launcher,
    read_rank_logs,
    run_msd,
    start_launch,
)
from tests.integration.test_multimodal import digests, global_batches, launch
from tests.integration.test_recovery import role_pids, wait_for_step

CONVERSATIONS = 50
SEQ_LEN = 256  # some conversations are longer: split, each piece with its part of the mask
MESSAGES, SHAREGPT, LLAVA, DOCS = range(4)
IMAGE_TOKEN = 151655
TEXT = SynthSource("docs", median_tokens=120, sigma=0.8, max_tokens=900, num_samples=60)


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat")
    write_chat_sources(root, seed=4, conversations=CONVERSATIONS, files=2)
    synth(root, (TEXT,), seed=4, files_per_source=1, rows_per_row_group=16)
    return root


def recipe(root: Path) -> dict[str, Any]:
    tokenizer = str(root / TOKENIZER_DIR / "tokenizer.json")
    template = str(root / TOKENIZER_DIR / "tokenizer_config.json")
    transform = {"kind": "tokenizer", "path": tokenizer, "eos": "<|endoftext|>"}
    chat = {"template": template}
    sources = [
        {
            "name": "messages",
            "path": str(root / MESSAGES_SOURCE / "*.parquet"),
            "text_column": "messages",
            "chat": chat,
            "weight": 0.3,
        },
        {
            "name": "sharegpt",
            "path": str(root / SHAREGPT_SOURCE / "*.jsonl"),
            "text_column": "conversations",
            "chat": chat,
            "weight": 0.3,
        },
        {
            "name": "llava",
            "path": str(root / LLAVA_SOURCE / "*.tar"),
            "format": "webdataset",
            "text_column": "json",
            "chat": chat,
            "weight": 0.2,
        },
        {
            "name": "docs",
            "path": str(root / "docs" / "*.parquet"),
            "text_column": "text",
            "weight": 0.2,
        },
    ]
    return {
        "name": "chat",
        "seed": 5,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 4 * SEQ_LEN,
        "distribute": {"dp": 4},
        "vision": {"max_pixels": 14 * 14 * 4 * 16, "marker": "<image>"},
        "sources": [{**s, "transform": transform, "repeat": False} for s in sources],
        "checkpoint": {"every_steps": 3, "keep": 20},
        "trainer": {"command": "demo", "demo": {"step_ms": 20, "save_batches": True}},
    }


@pytest.fixture(scope="module")
def epoch(tmp_path_factory: pytest.TempPathFactory, chat_data: Path) -> tuple[Path, dict]:
    where = tmp_path_factory.mktemp("epoch")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MSD_CACHE_DIR", str(where / "cache"))
        return launch(where, recipe(chat_data))


def hf_tokenizer(root: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    config = json.loads((root / TOKENIZER_DIR / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(root / TOKENIZER_DIR / "tokenizer.json"), eos_token=config["eos_token"]
    )
    tokenizer.chat_template = config["chat_template"]
    return tokenizer


_FROM = {"human": "user", "gpt": "assistant", "system": "system"}


def conversations(root: Path) -> dict[tuple[int, int], list[dict[str, str]]]:
    """(source, sample id) → its conversation as OpenAI messages, read straight from the files."""
    found: dict[tuple[int, int], list[dict[str, str]]] = {}
    rows = [
        row
        for path in sorted((root / MESSAGES_SOURCE).glob("*.parquet"))
        for row in pq.read_table(path).column("messages").to_pylist()
    ]
    found.update({(MESSAGES, i): row for i, row in enumerate(rows)})
    lines = [
        json.loads(line)
        for path in sorted((root / SHAREGPT_SOURCE).glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    for i, line in enumerate(lines):
        turns = line["conversations"]
        found[(SHAREGPT, i)] = [
            {"role": _FROM.get(t["from"], t["from"]), "content": t["value"]} for t in turns
        ]
    return found


def reference(root: Path) -> dict[tuple[int, int], tuple[list[int], list[int]] | None]:
    """Each text conversation's ids and assistant mask by transformers (None: it raises or has
    no assistant turn, so msd leaves it out)."""
    tokenizer = hf_tokenizer(root)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    out: dict[tuple[int, int], tuple[list[int], list[int]] | None] = {}
    for key, messages in conversations(root).items():
        roles = {m["role"] for m in messages}
        if "assistant" not in roles or not roles <= {"system", "user", "assistant"}:
            out[key] = None
            continue
        got = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        out[key] = ([*got["input_ids"], eos], [*got["assistant_masks"], 0])
    return out


Piece = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # offset, input ids, labels, loss_mask


def delivered(job: Path, empty: set[tuple[int, int]]) -> dict[tuple[int, int], list[Piece]]:
    """(source, sample) → its pieces as delivered (``empty``: the samples that hold no token,
    listed in the batches but taking no place)."""
    found: dict[tuple[int, int], list[Piece]] = {}
    for rank, records in read_rank_logs(job).items():
        for r in records:
            batch = np.load(job / "trainer" / f"rank-{rank}" / f"step-{r['step']}.npz")
            assert np.array_equal(batch["loss_mask"], batch["labels"] != IGNORE_INDEX)
            ids, labels, mask = (batch[k].reshape(-1) for k in ("input_ids", "labels", "loss_mask"))
            bounds = batch["cu_seqlens"].tolist()
            # Each non-empty piece is a sequence of its own; a row's padding is one too.
            runs = iter((a, b) for a, b in itertools.pairwise(bounds) if np.any(ids[a:b] != PAD_ID))
            owners = zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True)
            for source, sample, offset in owners:
                pieces = found.setdefault((source, sample), [])
                if (source, sample) in empty:
                    continue
                a, b = next(runs)
                end = a + int(np.flatnonzero(ids[a:b] != PAD_ID)[-1]) + 1
                pieces.append((offset, ids[a:end], labels[a:end], mask[a:end]))
            assert next(runs, None) is None
    return found


def test_every_conversation_is_transformers_rendering_trained_where_it_says(
    epoch: tuple[Path, dict], chat_data: Path
) -> None:
    job, summary = epoch
    expected = reference(chat_data)
    llava_left_out = _llava_left_out(chat_data)
    empty = {k for k, v in expected.items() if v is None} | {(LLAVA, i) for i in llava_left_out}
    got = delivered(job, empty)
    rows = {MESSAGES: CONVERSATIONS, SHAREGPT: CONVERSATIONS, LLAVA: CONVERSATIONS, DOCS: 60}
    assert Counter(k for k in got) == Counter(
        {(s, i): 1 for s, n in rows.items() for i in range(n)}
    )
    starts = Counter(
        (s, i)
        for records in read_rank_logs(job).values()
        for r in records
        for s, i, o in zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True)
        if o == 0
    )
    assert set(starts.values()) == {1}
    left_out = sum(1 for v in expected.values() if v is None)
    assert left_out >= 2  # the demo's malformed conversations
    checked = 0
    for key, ref in expected.items():
        if ref is None:
            assert got[key] == [], key
            continue
        ids, mask = ref
        pieces = sorted(got[key], key=lambda p: p[0])
        tokens = np.concatenate([p[1] for p in pieces])
        assert tokens.tolist() == ids, key
        for offset, own, labels, _ in pieces:
            trained = np.array(mask[offset + 1 : offset + len(own)], dtype=bool)
            want = np.where(trained, own[1:], IGNORE_INDEX)
            assert labels[:-1].tolist() == want.tolist(), key
            assert labels[-1] == IGNORE_INDEX
        checked += 1
    assert checked == 2 * CONVERSATIONS - left_out
    split = [k for k, v in expected.items() if v is not None and len(got[k]) > 1]
    assert split, "no conversation was split: the split case is not checked"
    # What the loss sees, per source: a conversation's trained tokens, every token of a document.
    trained = summary["trained_tokens_by_source"]
    for source, name in ((MESSAGES, "messages"), (SHAREGPT, "sharegpt")):
        masks = [ref[1] for (s, _), ref in expected.items() if s == source and ref is not None]
        assert trained[name] == sum(sum(m) for m in masks) > 0, name
    assert trained["docs"] == sum(len(p[1]) for i in range(60) for p in got[(DOCS, i)])
    assert (
        0 < trained["llava"] < sum(len(p[1]) for (s, _), v in got.items() if s == LLAVA for p in v)
    )
    for i in range(60):  # documents: every next token trained but across pieces
        for _, own, labels, _ in got[(DOCS, i)]:
            assert labels[:-1].tolist() == own[1:].tolist()
    for i in set(range(CONVERSATIONS)) - set(llava_left_out):
        own = np.concatenate([p[1] for p in got[(LLAVA, i)]])
        labels = np.concatenate([p[2] for p in got[(LLAVA, i)]])
        assert np.count_nonzero(own == IMAGE_TOKEN) > 0  # its image's placeholders
        assert not np.any(labels == IMAGE_TOKEN)  # never trained
        assert np.any(labels != IGNORE_INDEX)  # its replies are
    reasons = summary["left_out_by_source"]
    text_reasons = [reasons.get(name, {}) for name in ("messages", "sharegpt")]
    assert sum(sum(r.values()) for r in text_reasons) == left_out
    assert all(k.startswith("conversations left out (") for r in reasons.values() for k in r)
    assert summary["skipped_images_by_source"].get("llava", 0) == len(llava_left_out) > 0


def _llava_left_out(root: Path) -> list[int]:
    """The LLaVA samples whose conversation is malformed (their image goes with them)."""
    import tarfile

    bad = []
    for path in sorted((root / LLAVA_SOURCE).glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name.endswith(".json"):
                    handle = tar.extractfile(member)
                    meta = json.loads(handle.read() if handle else b"{}")
                    froms = {t["from"] for t in meta["conversations"]}
                    if "gpt" not in froms or not froms <= {"human", "gpt", "system"}:
                        bad.append(int(meta["id"]))
    return bad


def test_a_second_run_counts_the_same_and_gives_the_same_stream(
    tmp_path: Path, epoch: tuple[Path, dict], chat_data: Path
) -> None:
    doc = recipe(chat_data)
    doc["trainer"]["demo"]["save_batches"] = False
    for source in doc["sources"][:2]:
        source["loaders"] = 2
    job, summary = launch(tmp_path, doc)
    assert digests(job) == digests(epoch[0])
    assert summary["left_out_by_source"] == epoch[1]["left_out_by_source"]
    assert summary["empty_samples"] == epoch[1]["empty_samples"] > 0


def test_a_killed_loader_and_a_restore_onto_dp_2_keep_batches_and_masks(
    tmp_path: Path, epoch: tuple[Path, dict], chat_data: Path
) -> None:
    doc = recipe(chat_data)
    doc["trainer"]["demo"] = {"step_ms": 300}
    doc["loader"] = {"heartbeat_s": 2}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml", "--json")
    try:
        job = wait_for_step(tmp_path, 2, proc)
        victims = [p for p in role_pids(proc.pid, "loader") if "messages" in " ".join(_cmdline(p))]
        assert len(victims) == 1
        os.kill(victims[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    recoveries = json.loads((job / "job.json").read_text())["recoveries"]
    assert [r["how"] for r in recoveries] == ["restarted"], recoveries
    assert digests(job) == digests(epoch[0])  # loss_mask and labels included
    assert processes_of_launcher(proc.pid) == []

    dp2 = recipe(chat_data)
    dp2["distribute"] = {"dp": 2}
    dp2["trainer"]["demo"]["save_batches"] = False
    (tmp_path / "dp2.yaml").write_text(yaml.safe_dump(dp2, sort_keys=False))
    result = run_msd(
        "restore", str(epoch[0]), "--step", "3", "--recipe", "dp2.yaml", "--json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    restored = Path(json.loads(result.stdout)["job"])
    before, after = global_batches(epoch[0]), global_batches(restored)
    assert sorted(after) == [s for s in sorted(before) if s >= 3] and len(after) >= 3
    for step in after:
        assert after[step] == before[step], step


def _cmdline(pid: int) -> list[str]:
    import psutil

    try:
        return psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return []
