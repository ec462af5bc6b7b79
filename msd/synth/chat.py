"""Deterministic conversation demo data: chats in every shape msd reads, and the tokenizer and chat
template to render them.

- ``chat-messages/part-NNNNN.parquet``: a ``messages`` column of OpenAI-style turns
  (``list<struct<role, content>>``), one to four exchanges, a system prompt in some;
- ``chat-sharegpt/part-NNNNN.jsonl``: ShareGPT ``conversations`` (``from``/``value``);
- ``chat-llava/shard-NNNNN.tar``: LLaVA-style samples, ``KEY.jpg`` and ``KEY.json`` holding
  ``{"conversations": [...]}`` with an ``<image>`` marker in the first question;
- ``chat-tokenizer/tokenizer.json`` (a BPE trained on the demo's text and the chats, with the
  template's special tokens) and ``chat-tokenizer/tokenizer_config.json`` (a ChatML template
  whose assistant replies and their ``<|im_end|>`` are ``{% generation %}`` blocks, so
  ``loss: assistant`` trains exactly them; ``eos_token`` ``<|endoftext|>``).

About one conversation in 25 is malformed on purpose (an unknown role, or no assistant turn),
so a job shows what it leaves out. The same arguments give byte-identical files.
"""

from __future__ import annotations

import io
import itertools
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from msd.synth.text import END_OF_TEXT, write_parquet

MESSAGES_SOURCE = "chat-messages"
SHAREGPT_SOURCE = "chat-sharegpt"
LLAVA_SOURCE = "chat-llava"
TOKENIZER_DIR = "chat-tokenizer"
DEFAULT_CONVERSATIONS = 400
MALFORMED_EVERY = 25  # about one conversation in this many is malformed
TAR_MTIME = 1_700_000_000

SPECIAL_TOKENS = (END_OF_TEXT, "<|im_start|>", "<|im_end|>", "<image>", "<video>")
# ChatML, as Qwen's templates write it, with each reply and its end-of-turn token a generation
# block; an image part is an <image> marker.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{%- set text = message.content -%}"
    "{%- else -%}{%- set ns = namespace(text='') -%}{%- for part in message.content -%}"
    "{%- if part.type == 'image' -%}{%- set ns.text = ns.text + '<image>' -%}"
    "{%- else -%}{%- set ns.text = ns.text + part.text -%}{%- endif -%}"
    "{%- endfor -%}{%- set text = ns.text -%}{%- endif -%}"
    "{%- if message.role == 'assistant' -%}"
    "{%- generation -%}{{- text + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}{{- text + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
)

_WORDS = (
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "or",
    "but",
    "what",
    "why",
    "how",
    "when",
    "where",
    "which",
    "is",
    "are",
    "was",
    "be",
    "do",
    "does",
    "can",
    "will",
    "would",
    "should",
    "could",
    "cat",
    "dog",
    "bird",
    "river",
    "mountain",
    "city",
    "model",
    "data",
    "train",
    "token",
    "batch",
    "image",
    "video",
    "color",
    "red",
    "green",
    "blue",
    "large",
    "small",
    "fast",
    "slow",
    "first",
    "second",
    "answer",
    "question",
    "think",
    "explain",
    "describe",
    "example",
    "list",
    "reason",
    "because",
    "therefore",
    "however",
    "often",
    "never",
    "always",
    "number",
    "one",
    "two",
    "three",
    "four",
    "five",
    "hello",
    "thanks",
    "please",
    "sure",
    "yes",
    "no",
    "maybe",
)
_SYSTEM_PROMPTS = ("You are a helpful assistant.", "Answer briefly.", "Think step by step.")


@dataclass(frozen=True)
class ChatSourceSummary:
    """What was written for one source: its files, conversations, and bytes on disk."""

    name: str
    files: tuple[Path, ...]
    conversations: int
    bytes: int


def write_chat_sources(
    root: Path, seed: int = 0, conversations: int = DEFAULT_CONVERSATIONS, files: int = 2
) -> list[ChatSourceSummary]:
    """Write the three conversation sources and the chat tokenizer under ``root`` (existing
    files are overwritten); ``conversations`` per source."""
    if conversations < 1 or files < 1:
        raise ValueError("conversations and files must be at least 1")
    root = Path(root)
    chats = {
        name: [
            _conversation(_rng(seed, k, i), i, image=name == LLAVA_SOURCE)
            for i in range(conversations)
        ]
        for k, name in enumerate((MESSAGES_SOURCE, SHAREGPT_SOURCE, LLAVA_SOURCE))
    }
    summaries = [
        _write_messages(root / MESSAGES_SOURCE, chats[MESSAGES_SOURCE], files),
        _write_sharegpt(root / SHAREGPT_SOURCE, chats[SHAREGPT_SOURCE], files),
        _write_llava(root / LLAVA_SOURCE, chats[LLAVA_SOURCE], files, seed),
    ]
    texts = [m["content"] for chat in chats.values() for c in chat for m in c]
    write_chat_tokenizer(root / TOKENIZER_DIR, texts)
    return summaries


def write_chat_tokenizer(directory: Path, texts: list[str], vocab_size: int = 2048) -> Path:
    """A BPE ``tokenizer.json`` trained on ``texts`` with the template's special tokens, and a
    ``tokenizer_config.json`` holding the chat template; the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["[UNK]", *SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.decoder = decoders.ByteLevel()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "chat_template": CHAT_TEMPLATE,
        "eos_token": END_OF_TEXT,
        "pad_token": END_OF_TEXT,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def _rng(seed: int, source: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, source, index])


def _sentence(rng: np.random.Generator, low: int, high: int) -> str:
    words = rng.choice(_WORDS, int(rng.integers(low, high)))
    return " ".join(words).capitalize() + "."


def _conversation(rng: np.random.Generator, index: int, image: bool) -> list[dict[str, str]]:
    """One conversation as OpenAI messages; about one in `MALFORMED_EVERY` is malformed."""
    turns: list[dict[str, str]] = []
    if rng.random() < 0.3:
        turns.append({"role": "system", "content": str(rng.choice(_SYSTEM_PROMPTS))})
    for exchange in range(int(rng.integers(1, 5))):
        question = _sentence(rng, 4, 20)
        if image and exchange == 0:
            question = "<image>\n" + question
        answer = " ".join(_sentence(rng, 5, 25) for _ in range(int(rng.integers(1, 5))))
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if index % MALFORMED_EVERY == MALFORMED_EVERY - 1:
        if rng.random() < 0.5:
            turns[-1] = {"role": "narrator", "content": turns[-1]["content"]}
        else:
            turns = [t for t in turns if t["role"] != "assistant"]
    return turns


def _parts(n: int, files: int) -> Iterator[tuple[int, int, int]]:
    bounds = np.linspace(0, n, min(files, n) + 1).astype(np.int64).tolist()
    for part, (start, stop) in enumerate(itertools.pairwise(bounds)):
        yield part, start, stop


def _write_messages(
    directory: Path, chats: list[list[dict[str, str]]], files: int
) -> ChatSourceSummary:
    directory.mkdir(parents=True, exist_ok=True)
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    paths = []
    for part, start, stop in _parts(len(chats), files):
        table = pa.table(
            {
                "id": pa.array(range(start, stop), pa.int64()),
                "messages": pa.array(chats[start:stop], pa.list_(message)),
            }
        )
        path = directory / f"part-{part:05d}.parquet"
        write_parquet(table, path, rows_per_group=32)
        paths.append(path)
    return _summary(MESSAGES_SOURCE, paths, len(chats))


_FROM = {"user": "human", "assistant": "gpt", "system": "system"}


def _sharegpt(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"from": _FROM.get(m["role"], m["role"]), "value": m["content"]} for m in chat]


def _write_sharegpt(
    directory: Path, chats: list[list[dict[str, str]]], files: int
) -> ChatSourceSummary:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, start, stop in _parts(len(chats), files):
        path = directory / f"part-{part:05d}.jsonl"
        lines = (
            json.dumps({"id": i, "conversations": _sharegpt(chats[i])}) for i in range(start, stop)
        )
        path.write_text("".join(line + "\n" for line in lines))
        paths.append(path)
    return _summary(SHAREGPT_SOURCE, paths, len(chats))


def _write_llava(
    directory: Path, chats: list[list[dict[str, str]]], files: int, seed: int
) -> ChatSourceSummary:
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, start, stop in _parts(len(chats), files):
        path = directory / f"shard-{part:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(start, stop):
                rng = _rng(seed, 9, i)
                side = int(rng.integers(48, 160))
                pixels = rng.integers(0, 256, (side, side + 16, 3), dtype=np.uint8)
                jpeg = io.BytesIO()
                Image.fromarray(pixels).save(jpeg, format="JPEG", quality=85)
                meta = {"id": i, "conversations": _sharegpt(chats[i])}
                _add(tar, f"{i:06d}.jpg", jpeg.getvalue())
                _add(tar, f"{i:06d}.json", json.dumps(meta).encode())
        paths.append(path)
    return _summary(LLAVA_SOURCE, paths, len(chats))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), TAR_MTIME, 0o644
    tar.addfile(info, io.BytesIO(data))


def _summary(name: str, files: list[Path], conversations: int) -> ChatSourceSummary:
    return ChatSourceSummary(
        name, tuple(files), conversations, sum(p.stat().st_size for p in files)
    )
