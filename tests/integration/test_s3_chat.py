"""Conversation sources in an S3-compatible store (the moto server of ``tests/s3``): OpenAI
messages in Parquet, ShareGPT in JSONL and LLaVA-style image conversations in WebDataset, read
from ``s3://``, give the stream the same files give from local disk, byte for byte (labels and
loss_mask included), and count the malformed conversations the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from msd.synth.chat import (
    LLAVA_SOURCE,
    MESSAGES_SOURCE,
    SHAREGPT_SOURCE,
    TOKENIZER_DIR,
    write_chat_sources,
)
from tests.integration.test_multimodal import digests, launch
from tests.s3.server import S3Bucket

SEQ_LEN = 256


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3-chat")
    write_chat_sources(root / "data", seed=6, conversations=30, files=2)
    (root / "data" / TOKENIZER_DIR).rename(root / TOKENIZER_DIR)  # local: only data goes up
    return root


def recipe(data: str, tokenizer: Path) -> dict[str, Any]:
    transform = {"kind": "tokenizer", "path": str(tokenizer / "tokenizer.json"), "eos": 0}
    chat = {"template": str(tokenizer / "tokenizer_config.json")}
    sources = [
        {"name": "m", "path": f"{data}/{MESSAGES_SOURCE}/*.parquet", "text_column": "messages"},
        {"name": "s", "path": f"{data}/{SHAREGPT_SOURCE}/*.jsonl", "text_column": "conversations"},
        {
            "name": "l",
            "path": f"{data}/{LLAVA_SOURCE}/*.tar",
            "format": "webdataset",
            "text_column": "json",
        },
    ]
    return {
        "name": "s3-chat",
        "seed": 6,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 2 * SEQ_LEN,
        "distribute": {"dp": 2},
        "vision": {"max_pixels": 14 * 14 * 4 * 16},
        "sources": [
            {**s, "transform": transform, "chat": chat, "weight": 1.0, "repeat": False}
            for s in sources
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }


def test_conversation_sources_from_s3_give_the_local_stream(
    s3: S3Bucket, chat_data: Path, tmp_path: Path
) -> None:
    tokenizer = chat_data / TOKENIZER_DIR
    local, here = launch(tmp_path / "local", recipe(str(chat_data / "data"), tokenizer))
    remote, there = launch(
        tmp_path / "s3", recipe(s3.upload(chat_data / "data", "chat"), tokenizer)
    )
    assert len(digests(local)) == 2 * here["steps"] > 0
    assert digests(remote) == digests(local)
    assert there["left_out_by_source"] == here["left_out_by_source"] != {}
    assert there["trained_tokens_by_source"] == here["trained_tokens_by_source"]
