"""The child side of ``benchmarks.loader_memory``: one loader process's shards, driven by a
simulated Planner, and what the process and the shards hold afterwards (imported only after
the process is set up as a loader role is)."""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psutil
import pyarrow as pa

from benchmarks.dataloader.data import DataSpec, ensure_data
from msd.plan.partition import generations, loader_processes, span
from msd.recipe.schema import Recipe
from msd.roles.loader import shard as shard_module
from msd.roles.loader.shard import MAX_OPEN_FILES, SourceShard
from msd.sources.read import RowGroupReader


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            [
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            ]
        )
    ]


def heap() -> dict[str, int]:
    """glibc's heap: bytes in use, and bytes free but kept by the process (fragmentation)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"heap_used": info.uordblks + info.hblkhd, "heap_free_kept": info.fordblks}


def process_memory() -> dict[str, int]:
    """This process's PSS, RSS and USS (``/proc/self/smaps_rollup``), in bytes."""
    info = psutil.Process().memory_full_info()
    return {"pss": int(info.pss), "rss": int(info.rss), "uss": int(info.uss)}


def recipe_for(paths: list[str], seq_len: int, ranks: int, rows: int) -> Recipe:
    """``benchmarks.dataloader``'s msd recipe, every source in one loader process."""
    doc = {
        "name": "loader-memory",
        "seed": 0,
        "steps": 1_000_000,
        "seq_len": seq_len,
        "global_batch_tokens": seq_len * rows * ranks,
        "micro_batch_size": rows,
        "distribute": {"dp": ranks},
        "sources": [
            {
                "name": f"s{i:04d}",
                "path": path,
                "text_column": "text",
                "transform": {"kind": "bytes"},
                "weight": 1.0,
                "repeat": True,
            }
            for i, path in enumerate(paths)
        ],
        "loader": {"sources_per_process": len(paths)},
        "trainer": {"command": "demo"},
    }
    return msgspec.convert(doc, Recipe)


def make_shards(recipe: Recipe) -> tuple[RowGroupReader, list[SourceShard]]:
    """The shards of the recipe's one loader process, as ``Loader.__init__`` makes them."""
    (process,) = loader_processes(recipe)
    reader = RowGroupReader(max_open_files=min(MAX_OPEN_FILES, 4 * len(process.shards)))
    table = generations(recipe)
    return reader, [SourceShard(recipe, s, reader, span(table, s)) for s in process.shards]


def read_ahead(shards: list[SourceShard]) -> int:
    """Read as the loader's loop does while idle: the emptiest hungry shard, until none is."""
    chunks = 0
    while True:
        hungry = [s for s in shards if s.hungry]
        if not hungry:
            return chunks
        min(hungry, key=lambda s: s.fill).read_next()
        chunks += 1


def consume(shards: list[SourceShard], tokens: int, rng: np.random.Generator) -> None:
    """One step of a Planner: samples of sources drawn by (equal) weight, oldest first."""
    taken = 0
    while taken < tokens:
        shard = shards[int(rng.integers(len(shards)))]
        while not shard.held:
            if shard.read_next() is None and shard.visit is None and not shard.held:
                break
        if shard.held:
            gpos = min(shard.held)
            taken += max(1, len(shard.held[gpos]))
            shard.forget(gpos)


def _unique_bases(arrays: list[np.ndarray]) -> int:
    bases: dict[int, int] = {}
    for a in arrays:
        base = a.base if isinstance(a.base, np.ndarray) else a
        bases[id(base)] = base.nbytes
    return sum(bases.values())


def parts(shards: list[SourceShard], reader: RowGroupReader) -> dict[str, int]:
    """The loader's own structures, in bytes (what Python objects around them cost aside)."""
    held = [t for s in shards for t in s.held.values()]
    visits = [s.visit for s in shards if s.visit is not None]
    orders = [s.cursor.order for s in shards if s.cursor.order is not None]
    return {
        "held_tokens": sum(t.nbytes for t in held),
        "held_buffers": _unique_bases(held),
        "held_objects": sum(sys.getsizeof(t) + 100 for t in held),  # view + dict entry
        "window": sum(v.held_bytes() for v in visits),
        "visit_arrays": sum(v.rows.nbytes + v.sizes.nbytes + 8 * len(v.bounds) for v in visits),
        "orders": sum(o.block_perm.nbytes + o.block_starts.nbytes for o in orders),
        "open_files": len(reader.open_files()),
    }


def trace_top(limit: int) -> list[dict[str, Any]]:
    stats = tracemalloc.take_snapshot().statistics("lineno")[:limit]
    return [{"where": str(s.traceback), "bytes": s.size, "blocks": s.count} for s in stats]


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One loader process's memory serving ``n`` sources (run in a fresh process)."""
    pa.set_memory_pool(pa.system_memory_pool())  # as msd.roles.loader.loop.main does
    if args.window_kib:
        fixed = int(args.window_kib) * 1024

        def window_bytes(budget_tokens: int) -> int:
            return fixed

        shard_module.window_bytes = window_bytes
    cpu = psutil.Process().cpu_times()
    dataset = ensure_data(DataSpec(max(n, args.data_sources)), Path(args.data_root))
    paths = [s.path for s in dataset.sources[:n]]
    recipe = recipe_for(paths, args.seq_len, args.ranks, args.rows)
    if args.trace:
        tracemalloc.start()
    gc.collect()
    base = process_memory() | heap()
    started = time.perf_counter()
    reader, shards = make_shards(recipe)
    opened = process_memory() | heap()
    rng = np.random.default_rng(0)
    peak = 0
    for _ in range(args.steps):
        consume(shards, recipe.global_batch_tokens, rng)
        read_ahead(shards)
        peak = max(peak, process_memory()["pss"])
    gc.collect()
    pa.default_memory_pool().release_unused()
    after = process_memory() | heap()
    result: dict[str, Any] = {
        "sources": n,
        "steps": args.steps,
        "seconds": round(time.perf_counter() - started, 1),
        "base": base,
        "opened": opened,
        "after": after,
        "peak_pss": peak,
        "arrow_allocated": pa.total_allocated_bytes(),
        # Arrow's C++ default pool, which the Parquet reader decodes into (mimalloc unless
        # ARROW_DEFAULT_MEMORY_POOL names another): 0 when nothing went through mimalloc.
        "mimalloc_peak": pa.mimalloc_memory_pool().max_memory(),
        "cpu_s": round(sum(psutil.Process().cpu_times()[:2]) - sum(cpu[:2]), 2),
        "parts": parts(shards, reader),
        "budget_tokens": shards[0].budget,
        "window_bytes": shards[0].opener.window_bytes,
    }
    if args.trace:
        result["top"] = trace_top(15)
    return result
