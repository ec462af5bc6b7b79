"""What conversations cost a loader: CPU per 1M tokens to render each with its chat template,
tokenize it and mark the trained tokens, beside plain documents of the same words and beside
transformers' ``apply_chat_template``, in one process and in a real loader process.

    python -m benchmarks.chat_tokenize [--rows 3000] [--join 8] [--repeats 5] [--window-s 3]

Data (the same bytes every run): ``demo``, the well-formed conversations of ``msd.synth.chat``
(OpenAI messages in Parquet, one to four exchanges; its malformed rows left out, as
transformers cannot be compared on them), with its tokenizer (a BPE trained on them, 2,048
tokens) and ChatML template; ``long``, each row ``--join`` demo conversations back to back (8 to
32 exchanges). Each set is also written as documents: a conversation's message contents joined
by newlines. Tokens are what a loader delivers: each conversation's (or document's) and an eos.

In one process, per set, each way timed ``--repeats`` times in turn, the least CPU time kept
(``time.process_time()``: every thread of the process):

- ``msd chat``: `ChatRows`, the code a loader runs, on the Parquet column as read, a loader's
  chunk at a time (the rows of about ``CHUNK_SECONDS`` of tokenizing, as its loop takes them);
- ``msd docs``: the ``tokenizer`` transform (`make_transform`) on the documents, chunked alike;
- ``transformers``: ``PreTrainedTokenizerFast`` of the same ``tokenizer.json``,
  ``apply_chat_template(rows, tokenize=True, return_dict=True,
  return_assistant_tokens_mask=True)`` on all rows in one call, and one row a call; its ids and
  mask are checked equal to msd's, row by row, before anything is timed.

In a real loader (``benchmarks.loader_rate``): a job (``trainer: {command: demo}``) whose only
source is the set, repeating, one loader; the tokens it read and the CPU and busy seconds it
spent, read from ``msd status``, over ``--repeats`` back-to-back windows of ``--window-s``, the
least CPU per token kept. The conversations, then the documents; each with the tokenizers'
thread pool as the environment sets it, and off (``TOKENIZERS_PARALLELISM=false``), as in one
process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import loader_rate
from benchmarks.loader_rate import per_million
from msd.recipe.load import recipe_from_data
from msd.recipe.schema import Source
from msd.roles.loader.shard import CHUNK_BYTES, CHUNK_SECONDS
from msd.sources.chat_rows import ChatRows
from msd.sources.transforms import make_transform
from msd.synth.chat import MESSAGES_SOURCE, TOKENIZER_DIR, write_chat_sources
from msd.synth.text import END_OF_TEXT, write_parquet

KINDS = ("chat", "docs")
PARALLELISM = "TOKENIZERS_PARALLELISM"
ROLES = frozenset({"system", "user", "assistant"})
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
ROWS_PER_GROUP = 64
SEQ_LEN = 8192

Chat = list[dict[str, str]]


# Data ----------------------------------------------------------------------------------------


def well_formed(chats: Sequence[Chat]) -> list[Chat]:
    """The conversations msd and transformers both render: known roles, an assistant turn."""
    return [
        c
        for c in chats
        if {m["role"] for m in c} <= ROLES and any(m["role"] == "assistant" for m in c)
    ]


def joined(chats: Sequence[Chat], join: int) -> list[Chat]:
    """Row ``i``: ``chats[join*i .. join*i + join - 1]`` back to back, the first system prompt
    kept (a system turn mid-conversation is not what templates expect)."""
    rows = []
    for i in range(len(chats) // join):
        parts = chats[join * i : join * (i + 1)]
        rows.append(
            [m for k, c in enumerate(parts) for m in c if not (k and m["role"] == "system")]
        )
    return rows


def document(chat: Chat) -> str:
    return "\n".join(m["content"] for m in chat)


def make_data(root: Path, rows: int, join: int, seed: int = 0) -> dict[str, list[Chat]]:
    """The demo conversations and tokenizer under ``root``; each set as ``SET/chat.parquet``
    and ``SET/docs.parquet``; the sets' conversations."""
    write_chat_sources(root / "synth", seed=seed, conversations=rows, files=1)
    demo = well_formed(
        pq.read_table(root / "synth" / MESSAGES_SOURCE).column("messages").to_pylist()
    )
    sets = {"demo": demo, "long": joined(demo, join)}
    for name, chats in sets.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        chat = pa.table({"messages": pa.array(chats, pa.list_(MESSAGE))})
        docs = pa.table({"text": pa.array([document(c) for c in chats], pa.string())})
        write_parquet(chat, root / name / "chat.parquet", ROWS_PER_GROUP)
        write_parquet(docs, root / name / "docs.parquet", ROWS_PER_GROUP)
    return sets


def recipe(root: Path, name: str, kind: str, repeat: bool) -> dict[str, Any]:
    """A job reading set ``name`` as ``kind`` (``chat`` or ``docs``), one loader; repeating
    (until stopped) or one epoch."""
    tokenizer = root / "synth" / TOKENIZER_DIR
    transform = {"kind": "tokenizer", "path": str(tokenizer / "tokenizer.json"), "eos": END_OF_TEXT}
    src: dict[str, Any] = {
        "name": f"{name}-{kind}",
        "path": str(root / name / f"{kind}.parquet"),
        "text_column": "messages" if kind == "chat" else "text",
        "transform": transform,
        "weight": 1.0,
        "loaders": 1,
        "repeat": repeat,
    }
    if kind == "chat":
        src["chat"] = {"template": str(tokenizer / "tokenizer_config.json")}
    doc: dict[str, Any] = {
        "name": f"chat-tokenize-{name}-{kind}",
        "seed": 1,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 2 * SEQ_LEN,
        "sources": [src],
        "trainer": {"command": "demo", "demo": {"step_ms": 1}},
    }
    if repeat:
        doc["steps"] = 10**7  # stopped once measured
    return doc


def source(root: Path, name: str, kind: str) -> Source:
    return recipe_from_data(recipe(root, name, kind, repeat=False), "chat_tokenize").sources[0]


# 1./2. One process ---------------------------------------------------------------------------

Tokenize = Callable[[pa.Array], list[Any]]


def timed(work: Callable[[], int]) -> tuple[float, int]:
    """The CPU time ``work`` took, and what it returned."""
    start = time.process_time()
    out = work()
    return time.process_time() - start, out


def chunk_rows(cpu_per_row_s: float, bytes_per_row: float) -> int:
    """The rows a loader tokenizes at a time: about ``CHUNK_SECONDS`` of work, ``CHUNK_BYTES``
    of text at most."""
    by_time = CHUNK_SECONDS / max(cpu_per_row_s, 1e-12)
    return max(1, int(min(by_time, CHUNK_BYTES / max(bytes_per_row, 1.0))))


def chunked(tokenize: Tokenize, column: pa.Array, rows: int) -> int:
    """``tokenize`` on ``column``, ``rows`` at a time; the tokens it gave."""
    return sum(
        len(ids) for at in range(0, len(column), rows) for ids in tokenize(column.slice(at, rows))
    )


def loader_chunk(tokenize: Tokenize, column: pa.Array, bytes_per_row: float) -> int:
    """`chunk_rows` for ``tokenize``, its cost read from one pass over ``column``."""
    cpu, _ = timed(lambda: chunked(tokenize, column, len(column)))
    return chunk_rows(cpu / len(column), bytes_per_row)


def hf_tokenizer(root: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    folder = root / "synth" / TOKENIZER_DIR
    config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_file=str(folder / "tokenizer.json"), eos_token=config["eos_token"]
    )
    tokenizer.chat_template = config["chat_template"]
    return tokenizer


def hf_render(tokenizer: Any, chats: Sequence[Chat]) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = tokenizer.apply_chat_template(
        list(chats), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return out


def hf_batch(tokenizer: Any, chats: Sequence[Chat]) -> int:
    """transformers on all of ``chats`` in one call; the tokens it gave."""
    return sum(len(ids) for ids in hf_render(tokenizer, chats)["input_ids"])


def hf_one_by_one(tokenizer: Any, chats: Sequence[Chat]) -> int:
    """transformers on ``chats``, one a call; the tokens it gave."""
    return sum(
        len(
            tokenizer.apply_chat_template(
                c, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )["input_ids"]
        )
        for c in chats
    )


def check_same(rows: ChatRows, column: pa.Array, reference: dict[str, list[list[int]]]) -> None:
    """msd's ids and trained tokens are transformers' (and an untrained eos), row by row."""
    ids = rows(column)
    for i, (got, spans) in enumerate(zip(ids, rows.trained, strict=True)):
        trained = np.zeros(len(got), bool)
        for start, end in spans:
            trained[start:end] = True
        want, mask = reference["input_ids"][i], reference["assistant_masks"][i]
        if got[:-1].tolist() != want or trained.tolist() != [bool(m) for m in mask] + [False]:
            raise RuntimeError(f"row {i}: msd's ids or trained tokens differ from transformers'")


@contextlib.contextmanager
def serial_tokenizers() -> Iterator[None]:
    """The tokenizers library's thread pool off, as ``TOKENIZERS_PARALLELISM=false`` sets it for
    a process (the library reads it at each call)."""
    before = os.environ.get(PARALLELISM)
    os.environ[PARALLELISM] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ[PARALLELISM]
        else:
            os.environ[PARALLELISM] = before


def serially(work: Callable[[], int]) -> Callable[[], int]:
    def serial() -> int:
        with serial_tokenizers():
            return work()

    return serial


def in_process(root: Path, name: str, chats: Sequence[Chat], repeats: int) -> dict[str, Any]:
    """Set ``name``'s conversations and documents in this process (see the module's doc)."""
    chat_column, docs_column = (
        pq.read_table(root / name / f"{kind}.parquet").column(0).combine_chunks() for kind in KINDS
    )
    chat = ChatRows(source(root, name, "chat"))
    docs = make_transform(source(root, name, "docs").transform, "text")
    tokenizer = hf_tokenizer(root)
    check_same(chat, chat_column, hf_render(tokenizer, chats))
    text_bytes = sum(len(document(c).encode()) for c in chats) / len(chats)
    chunks = {
        "msd_chat": loader_chunk(chat, chat_column, text_bytes),
        "msd_docs": loader_chunk(docs, docs_column, text_bytes),
    }
    ways: dict[str, Callable[[], int]] = {
        "msd_chat": lambda: chunked(chat, chat_column, chunks["msd_chat"]),
        "msd_docs": lambda: chunked(docs, docs_column, chunks["msd_docs"]),
        "transformers_batch": lambda: hf_batch(tokenizer, chats),
        "transformers_one_by_one": lambda: hf_one_by_one(tokenizer, chats),
    }
    ways["msd_chat_serial"] = serially(ways["msd_chat"])
    ways["msd_docs_serial"] = serially(ways["msd_docs"])
    best = dict.fromkeys(ways, float("inf"))
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for way, work in ways.items():
            cpu, tokens[way] = timed(work)
            best[way] = min(best[way], cpu)
    return summarize_in_process(len(chats), chunks, tokens, best)


def summarize_in_process(
    rows: int, chunks: dict[str, int], tokens: dict[str, int], best: dict[str, float]
) -> dict[str, Any]:
    """CPU seconds per 1M tokens of each way (transformers' over msd's tokens of the same
    conversations, so the two compare as CPU times), and the ratios."""
    per_1m = {
        way: per_million(cpu, tokens["msd_docs" if "docs" in way else "msd_chat"])
        for way, cpu in best.items()
    }
    return {
        "rows": rows,
        "tokens": tokens,
        "chunk_rows": chunks,
        "cpu_s": {k: round(v, 4) for k, v in best.items()},
        "cpu_s_per_1m_tokens": {k: round(v, 3) for k, v in per_1m.items()},
        "chat_over_docs": round(per_1m["msd_chat"] / per_1m["msd_docs"], 3),
        # msd's tokens per CPU-second over transformers' (1: as fast; the target is 0.8 or more)
        "msd_rate_over_transformers_batch": round(best["transformers_batch"] / best["msd_chat"], 3),
        "msd_rate_over_transformers_one_by_one": round(
            best["transformers_one_by_one"] / best["msd_chat"], 3
        ),
    }


# The run ---------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import jinja2
    import tokenizers
    import transformers

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        PARALLELISM: os.environ.get(PARALLELISM),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def run(root: Path, rows: int, join: int, repeats: int, window_s: float | None) -> dict[str, Any]:
    """Both sets in this process, then (unless ``window_s`` is None) in a real loader."""
    sets = make_data(root, rows, join)
    result: dict[str, Any] = {
        "machine": machine(),
        "settings": {"rows": rows, "join": join, "repeats": repeats, "window_s": window_s},
        "in_process": {
            name: in_process(root, name, chats, repeats) for name, chats in sets.items()
        },
    }
    if window_s is not None:
        result["in_loader"] = {name: in_loader(root, name, window_s, repeats) for name in sets}
        for name, loader in result["in_loader"].items():
            loader.update(loader_ratios(result["in_process"][name], loader))
    result["machine"]["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    return result


def in_loader(root: Path, name: str, window_s: float, windows: int) -> dict[str, Any]:
    """Set ``name`` in a real loader: its conversations and its documents, each with the
    tokenizers' thread pool as the environment sets it and off (``_serial``)."""
    found = {}
    for kind in KINDS:
        doc = recipe(root, name, kind, repeat=True)
        for way, env in ((kind, {}), (f"{kind}_serial", {PARALLELISM: "false"})):
            workdir = root / "jobs" / f"{name}-{way}"
            found[way] = loader_rate.measure(workdir, doc, window_s, windows, env=env)
    return found


def loader_ratios(one: dict[str, Any], loader: dict[str, Any]) -> dict[str, float]:
    """The loader's rate on the conversations over transformers' in one process (all rows in a
    call), with the thread pool and without; its conversations' cost over its documents'."""
    chat, serial = (loader[k]["cpu_s_per_1m_tokens"] for k in ("chat", "chat_serial"))
    transformers = one["cpu_s_per_1m_tokens"]["transformers_batch"]
    return {
        "rate_over_transformers_batch": round(transformers / chat, 3),
        "serial_rate_over_transformers_batch": round(transformers / serial, 3),
        "chat_over_docs": round(chat / loader["docs"]["cpu_s_per_1m_tokens"], 3),
    }


def tables(result: dict[str, Any]) -> str:
    """The figures as Markdown tables: CPU seconds per 1M tokens, and ratios of rates."""
    lines = [
        "| set | rows | tokens/row | msd chat | msd chat, serial | msd docs | chat / docs "
        "| transformers, all rows | transformers, a row a call | msd rate / transformers' |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, p in result["in_process"].items():
        per = p["cpu_s_per_1m_tokens"]
        lines.append(
            f"| {name} | {p['rows']} | {p['tokens']['msd_chat'] / p['rows']:.0f} | "
            f"{per['msd_chat']:.2f} | {per['msd_chat_serial']:.2f} | {per['msd_docs']:.2f} | "
            f"{p['chat_over_docs']:.2f} | {per['transformers_batch']:.2f} | "
            f"{per['transformers_one_by_one']:.2f} | {p['msd_rate_over_transformers_batch']:.2f} |"
        )
    if "in_loader" not in result:
        return "\n".join(lines)
    lines += [
        "",
        "| set | loader: chat | chat, serial | docs | docs, serial | chat / docs "
        "| loader rate / transformers' | serial |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, lo in result["in_loader"].items():
        cpu = {
            k: lo[k]["cpu_s_per_1m_tokens"] for k in ("chat", "chat_serial", "docs", "docs_serial")
        }
        lines.append(
            f"| {name} | {cpu['chat']:.2f} | {cpu['chat_serial']:.2f} | {cpu['docs']:.2f} | "
            f"{cpu['docs_serial']:.2f} | {lo['chat_over_docs']:.2f} | "
            f"{lo['rate_over_transformers_batch']:.2f} | "
            f"{lo['serial_rate_over_transformers_batch']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=3000, help="demo conversations written")
    parser.add_argument("--join", type=int, default=8, help="demo conversations per long row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=3.0, help="0: no real loader")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    with TemporaryDirectory(prefix="msd-chat-tokenize-") as tmp:
        result = run(Path(tmp), args.rows, args.join, args.repeats, args.window_s or None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chat_tokenize.json").write_text(json.dumps(result, indent=2) + "\n")
    print(tables(result))


if __name__ == "__main__":
    main()
