"""The same conversations read from every format msd reads give the same samples: Parquet
(``list<struct>`` and JSON text), JSONL (ShareGPT and OpenAI), Arrow IPC and WebDataset ``.json``
members, each turned into ids and trained spans as a loader turns them."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msd.recipe.schema import Chat, Source, Transform
from msd.sources.chat_rows import ChatRows
from msd.sources.fuse import Fuser, FuseSpec
from msd.sources.image_rows import ImageRowReader
from msd.sources.index import open_source
from msd.sources.read import RowGroupReader
from msd.sources.vision import ImageGeometry
from msd.synth.chat import TOKENIZER_DIR, write_chat_tokenizer

CHATS = [
    [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "hi, how are you"},
    ],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four five"},
    ],
    [{"role": "user", "content": "no answer"}],  # left out: no assistant turn
]
_FROM = {"user": "human", "assistant": "gpt", "system": "system"}


def _sharegpt(chat: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"from": _FROM[m["role"]], "value": m["content"]} for m in chat]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tok") / TOKENIZER_DIR
    texts = [m["content"] for chat in CHATS for m in chat] * 3
    return write_chat_tokenizer(folder, texts, vocab_size=300)


def _source(path: Path, column: str, tokenizer_dir: Path, fmt: str | None = None) -> Source:
    return Source(
        name="c",
        path=str(path),
        weight=1.0,
        format=fmt,  # type: ignore[arg-type]
        text_column=column,
        transform=Transform(kind="tokenizer", path=str(tokenizer_dir / "tokenizer.json"), eos=0),
        chat=Chat(template=str(tokenizer_dir / "tokenizer_config.json")),
    )


def _samples(source: Source) -> list[tuple[list[int], list[list[int]]]]:
    """Each row as a loader reads it: its ids and trained spans."""
    index = open_source(source, "sources[0]")
    reader = RowGroupReader()
    out = []
    if index.has_images:  # WebDataset: through the Fuser, as an image source's rows go
        spec = FuseSpec(ImageGeometry(), 151655, "<image>", 1 << 20)
        fuser = Fuser.of_source(source, index.column_kind, spec, True)
        rows = ImageRowReader(source, index, reader).read(index.row_groups[0])
        ids, _ = fuser(rows)
        spans = [np.zeros((0, 2)) if t is None else t for t in fuser.trained]
        return [(i.tolist(), s.tolist()) for i, s in zip(ids, spans, strict=True)]
    chat = ChatRows(source)
    for rg in index.row_groups:
        ids = chat(reader.read(rg, index.column))
        out += [(i.tolist(), s.tolist()) for i, s in zip(ids, chat.trained, strict=True)]
    return out


def test_every_format_gives_the_same_conversations(tmp_path: Path, tokenizer_dir: Path) -> None:
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    pq.write_table(pa.table({"m": pa.array(CHATS, pa.list_(message))}), tmp_path / "a.parquet")
    reference = _samples(_source(tmp_path / "a.parquet", "m", tokenizer_dir))
    assert [len(ids) > 0 for ids, _ in reference] == [True, True, False]
    assert all(spans for _, spans in reference[:2])

    (tmp_path / "json").mkdir()
    texts = pa.array([json.dumps(c) for c in CHATS])
    pq.write_table(pa.table({"m": texts}), tmp_path / "json" / "a.parquet")
    with open(tmp_path / "a.jsonl", "w") as f:
        for chat in CHATS:
            f.write(json.dumps({"meta": {"conversations": _sharegpt(chat)}}) + "\n")
    with pa.OSFile(str(tmp_path / "a.arrow"), "wb") as sink:
        table = pa.table({"m": pa.array(CHATS, pa.list_(message))})
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for i, chat in enumerate(CHATS):
            data = json.dumps({"messages": chat}).encode()
            info = tarfile.TarInfo(f"{i:03d}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for path, column, fmt in (
        (tmp_path / "json" / "a.parquet", "m", None),
        (tmp_path / "a.jsonl", "meta.conversations", None),
        (tmp_path / "a.arrow", "m", None),
        (tmp_path / "a.tar", "json", "webdataset"),
    ):
        assert _samples(_source(path, column, tokenizer_dir, fmt)) == reference, path.name
