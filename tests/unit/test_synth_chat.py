"""The conversation demo data: byte-identical for the same arguments, every shape msd reads,
some conversations malformed on purpose, and a template transformers renders with masks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from msd.synth.chat import (
    LLAVA_SOURCE,
    MESSAGES_SOURCE,
    SHAREGPT_SOURCE,
    TOKENIZER_DIR,
    write_chat_sources,
)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_the_same_arguments_write_the_same_bytes_in_every_shape(tmp_path: Path) -> None:
    summaries = write_chat_sources(tmp_path / "a", seed=2, conversations=30, files=2)
    write_chat_sources(tmp_path / "b", seed=2, conversations=30, files=2)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert [s.name for s in summaries] == [MESSAGES_SOURCE, SHAREGPT_SOURCE, LLAVA_SOURCE]
    assert all(s.conversations == 30 and len(s.files) == 2 for s in summaries)
    rows = [r for f in summaries[0].files for r in pq.read_table(f).column("messages").to_pylist()]
    roles = [{m["role"] for m in r} for r in rows]
    assert any("narrator" in r or "assistant" not in r for r in roles)  # malformed on purpose
    assert sum("assistant" in r and r <= {"system", "user", "assistant"} for r in roles) >= 25
    config = json.loads((tmp_path / "a" / TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert "{%- generation -%}" in config["chat_template"]
    assert config["eos_token"] == "<|endoftext|>"


def test_transformers_renders_the_demo_template_with_assistant_masks(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    write_chat_sources(tmp_path, conversations=3, files=1)
    folder = tmp_path / TOKENIZER_DIR
    config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    tokenizer.chat_template = config["chat_template"]
    chat = [{"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi."}]
    out = tokenizer.apply_chat_template(
        chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(trained) == "Hi.<|im_end|>"
