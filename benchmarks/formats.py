"""Source formats benchmark: indexing time, CPU per token and memory per open source, for the
same rows in every format msd reads.

    python -m benchmarks.formats [--rows 4000] [--sizes 1 4] [--median-tokens 200]
                                 [--group-rows 1024] [--passes 10] [--index-repeats 5]
                                 [--ks 1 8 32] [--out benchmarks/results]

The rows are one `msd.synth.text.synth_table` source (random lowercase words, log-normal lengths
around ``--median-tokens``, σ = 1: by default the demo's ``web`` source, whose short rows show
per-row costs; with the ``bytes`` transform a row's tokens are its UTF-8 bytes),
``--rows`` rows at size 1× and ``--rows × s`` at each size ``s`` of ``--sizes``, written as:

  * Parquet (``msd.synth.text.write_parquet``: zstd, ``--group-rows`` rows per row group);
  * JSONL, JSONL.gz (level 6), JSONL.zst (level 3): ``{"id": …, "text": …}`` per line;
  * Arrow IPC stream (what ``datasets`` writes), a record batch per ``--group-rows`` rows;
  * Megatron ``.bin``/``.idx``: the text's UTF-8 bytes as uint16 token ids, by megatron-core's
    own ``IndexedDatasetBuilder`` (one sequence per document).

Every format has the same row groups (JSONL and Megatron cut their own: ``group_rows`` is set
to ``--group-rows`` on those sources). Each measurement runs in a fresh Python subprocess per
format and size, so their memory figures start from the same point and are comparable; it is
set up as a loader process is (``msd.roles.footprint``: glibc's mmap threshold fixed, pandas
kept out of pyarrow, which would otherwise import it on its first conversion: 0.3 CPU-s and
tens of MiB charged to whichever format converts first):

  * read — ``open_source`` with an empty ``MSD_CACHE_DIR`` (first: JSONL scans the file and
    writes its index) and again (cached), each the median of ``--index-repeats`` calls (a fresh
    cache folder for every "first" call; the files are in the page cache, so this is the scan,
    not the disk); then ``--passes`` passes over every row group through
    ``msd.sources.read.RowGroupReader``, tokenized by the source's transform (``bytes``): CPU
    seconds (``time.process_time``, all threads) per 1M tokens, median of the passes (the first
    pass alone too: it pays page faults and lazy set-up); RSS and PSS after opening, and after
    reading with the reader still open (PSS split into anonymous and file-backed pages, from
    ``/proc/self/smaps_rollup``: a memory-mapped format's file pages are clean page cache, shared
    and reclaimable, not heap);
  * memory per open source — ``K`` = ``--ks`` sources of that format (copies of the same file
    under different names, so no two share page cache), each opened (index cached beforehand)
    with a reader of its own and one row group read and tokenized from each, everything kept
    open: the PSS growth per source, ``(PSS(K_max) − PSS(K_min)) / (K_max − K_min)`` (the first
    source pays the one-time costs: imports, decoders, allocator pools).

Both at every size of ``--sizes``, to show whether memory per open source is constant or grows
with the file. Writes ``formats.json`` and ``formats.md`` to ``--out``; the data goes to a
temporary folder (``--work`` to keep it), removed at the end.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from msd.recipe.schema import Format, Source
from msd.roles.footprint import fix_mmap_threshold, keep_pandas_out
from msd.sources.index import SourceIndex, open_source
from msd.sources.read import RowGroupReader
from msd.sources.transforms import make_transform
from msd.synth.text import SynthSource, synth_table, write_parquet

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20

# name: (msd format, file name; for Megatron the prefix of .bin/.idx)
LAYOUTS: dict[str, tuple[Format, str]] = {
    "parquet": ("parquet", "part-00000.parquet"),
    "jsonl": ("jsonl", "part-00000.jsonl"),
    "jsonl.gz": ("jsonl", "part-00000.jsonl.gz"),
    "jsonl.zst": ("jsonl", "part-00000.jsonl.zst"),
    "arrow": ("arrow", "data-00000-of-00001.arrow"),
    "megatron": ("megatron", "corpus_text_document"),
}


def log(message: str) -> None:
    print(f"[formats] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- writing the files


def write_all(table: pa.Table, folder: Path, group_rows: int) -> None:
    """``table`` in every layout, ``folder/<layout>/base/<file>``."""
    texts = [str(t) for t in table.column("text").to_pylist()]
    ids = table.column("id").to_pylist()
    lines = "".join(
        json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, texts, strict=True)
    ).encode()
    for layout, (_, name) in LAYOUTS.items():
        base = folder / layout / "base"
        base.mkdir(parents=True, exist_ok=True)
        path = base / name
        if layout == "parquet":
            write_parquet(table, path, group_rows)
        elif layout == "jsonl":
            path.write_bytes(lines)
        elif layout == "jsonl.gz":
            path.write_bytes(gzip.compress(lines, compresslevel=6, mtime=0))
        elif layout == "jsonl.zst":
            import zstandard

            path.write_bytes(zstandard.ZstdCompressor(level=3).compress(lines))
        elif layout == "arrow":
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                for batch in table.to_batches(max_chunksize=group_rows):
                    w.write_batch(batch)
        elif layout == "megatron":
            write_megatron(texts, str(path))


def write_megatron(texts: list[str], prefix: str) -> None:
    """The documents' UTF-8 bytes as uint16 token ids, by megatron-core's own builder."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for text in texts:
        ids = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)
        builder.add_document(torch.from_numpy(ids), [len(ids)])
    builder.finalize(prefix + ".idx")


def copies(folder: Path, layout: str, count: int) -> list[Path]:
    """``count`` copies of ``folder/<layout>/base`` (real copies: no shared page cache), as
    ``copy-NN`` beside it; returns the folders."""
    base = folder / layout / "base"
    made = []
    for k in range(count):
        dest = folder / layout / f"copy-{k:02d}"
        if not dest.exists():
            shutil.copytree(base, dest)
        made.append(dest)
    return made


def source_of(layout: str, folder: Path, name: str, group_rows: int) -> Source:
    fmt, file = LAYOUTS[layout]
    own_groups = fmt in ("jsonl", "megatron")  # formats that cut their own row groups
    return Source(
        name=name,
        path=str(folder / file),
        weight=1.0,
        format=fmt,
        text_column=None if fmt == "megatron" else "text",
        group_rows=group_rows if own_groups else None,
    )


# ---------------------------------------------------------------- measuring (in a subprocess)


def memory() -> dict[str, float]:
    """This process's RSS and PSS (and PSS of anonymous / file-backed pages), and the bytes
    Arrow's memory pool has handed out and not taken back, in MiB."""
    fields: dict[str, float] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Pss_Anon", "Pss_File"):
                fields[key.lower()] = int(rest.split()[0]) / 1024
    fields["arrow_allocated"] = pa.total_allocated_bytes() / MIB
    return fields


def peak_rss_mib() -> float:
    """The peak RSS of this process since its exec (``VmHWM``; ``ru_maxrss`` would carry the
    launching process's over the exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def timed_open(source: Source) -> tuple[SourceIndex, float, float]:
    """``open_source(source)``, its wall and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    index = open_source(source, "sources[0]")
    return index, time.perf_counter() - wall, time.process_time() - cpu


def read_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Index (first, each time with an empty cache; then cached), then read and tokenize every
    row group ``passes`` times."""
    source = source_of(spec["layout"], Path(spec["folder"]), "bench", spec["group_rows"])
    cache_root = Path(os.environ["MSD_CACHE_DIR"])
    gc.collect()
    before = memory()
    first, cached = [], []
    for r in range(spec["index_repeats"]):  # the cache folder is read at every call
        os.environ["MSD_CACHE_DIR"] = str(cache_root / f"first-{r}")
        index, wall, cpu = timed_open(source)
        first.append((wall, cpu))
    for _ in range(spec["index_repeats"]):
        index, wall, cpu = timed_open(source)
        cached.append((wall, cpu))
    tokenize = make_transform(source.transform, index.column_kind)
    reader = RowGroupReader()
    gc.collect()
    opened = memory()
    passes = []
    tokens = 0
    for _ in range(spec["passes"]):
        tokens = 0
        read_cpu = tokenize_cpu = 0.0
        wall = time.perf_counter()
        for rg in index.row_groups:
            t0 = time.process_time()
            array = reader.read(rg, index.column)
            t1 = time.process_time()
            tokens += sum(len(ids) for ids in tokenize(array))
            t2 = time.process_time()
            read_cpu += t1 - t0
            tokenize_cpu += t2 - t1
            del array
        passes.append(
            {
                "cpu_s": read_cpu + tokenize_cpu,
                "read_cpu_s": read_cpu,
                "tokenize_cpu_s": tokenize_cpu,
                "wall_s": time.perf_counter() - wall,
            }
        )
    gc.collect()
    after = memory()
    per_m = 1e6 / tokens

    def median(values: list[float]) -> float:
        return float(statistics.median(values))

    return {
        "rows": index.num_rows,
        "row_groups": len(index.row_groups),
        "tokens": tokens,
        # medians of index_repeats calls; the very first call also pays one-time set-up
        "index_first_s": median([w for w, _ in first]),
        "index_first_cpu_s": median([c for _, c in first]),
        "index_cached_s": median([w for w, _ in cached]),
        "index_cached_cpu_s": median([c for _, c in cached]),
        "index_very_first_s": first[0][0],
        "cpu_s_per_m_tokens": median([p["cpu_s"] for p in passes]) * per_m,
        "read_cpu_s_per_m_tokens": median([p["read_cpu_s"] for p in passes]) * per_m,
        "tokenize_cpu_s_per_m_tokens": median([p["tokenize_cpu_s"] for p in passes]) * per_m,
        "first_pass_cpu_s_per_m_tokens": passes[0]["cpu_s"] * per_m,
        "wall_s_per_m_tokens": median([p["wall_s"] for p in passes]) * per_m,
        "memory_mib": {"start": before, "opened": opened, "read": after},
        "peak_rss_mib": peak_rss_mib(),
    }


def many_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Open ``ks[-1]`` sources one after another, each with its reader and one row group read
    and tokenized, all kept open; memory at each ``K`` of ``ks``."""
    ks: list[int] = spec["ks"]
    held: list[tuple[SourceIndex, RowGroupReader]] = []
    gc.collect()
    at: dict[str, dict[str, float]] = {"0": memory()}
    for k, folder in enumerate(spec["copies"][: ks[-1]], start=1):
        source = source_of(spec["layout"], Path(folder), f"copy{k}", spec["group_rows"])
        index = open_source(source, f"sources[{k}]")
        tokenize = make_transform(source.transform, index.column_kind)
        reader = RowGroupReader()
        ids = tokenize(reader.read(index.row_groups[0], index.column))
        assert sum(len(i) for i in ids) > 0
        del ids
        held.append((index, reader))
        if k in ks:
            gc.collect()
            at[str(k)] = memory()
    lo, hi = str(ks[0]), str(ks[-1])
    span = ks[-1] - ks[0]
    per = {
        key: (at[hi][key] - at[lo][key]) / span
        for key in ("pss", "rss", "pss_anon", "pss_file", "arrow_allocated")
    }
    return {"memory_mib_at_k": at, "per_source_mib": per}


def run_worker(kind: str, spec: dict[str, Any], cache: Path) -> dict[str, Any]:
    """``kind`` (read / many) of ``spec`` in a fresh interpreter; its JSON answer."""
    env = {**os.environ, "MSD_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.formats", "--worker", kind, json.dumps(spec)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {kind} worker of {spec['layout']} failed:\n{done.stderr[-3000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def prebuild(layout: str, folders: list[Path], group_rows: int, cache: Path) -> None:
    """Index every copy once (JSONL writes its cached index), so that the memory-per-source
    worker only loads indexes."""
    previous = os.environ.get("MSD_CACHE_DIR")
    os.environ["MSD_CACHE_DIR"] = str(cache)
    try:
        for k, folder in enumerate(folders, start=1):
            open_source(source_of(layout, folder, f"copy{k}", group_rows), f"sources[{k}]")
    finally:
        if previous is None:
            os.environ.pop("MSD_CACHE_DIR", None)
        else:
            os.environ["MSD_CACHE_DIR"] = previous


# ---------------------------------------------------------------- the report


def file_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / MIB


def write_md(results: dict[str, Any], path: Path) -> None:
    sizes = results["sizes"]
    big = str(max(sizes))
    small = str(min(sizes))
    pss_cols = " | ".join(f"PSS/source MiB ({s}×)" for s in sizes)
    lines = [
        "# Source formats: index time, CPU per token, memory per open source",
        "",
        f"`python -m benchmarks.formats` — {results['machine']['cpus']} CPUs, "
        f"{results['rows']:,} rows at 1× ({results['tokens_at'][small]:,} tokens; "
        f"{max(sizes)}×: {results['tokens_at'][big]:,}), {results['group_rows']} rows per "
        f"row group, `bytes` transform, one fresh process per format and size. Index s and "
        f"CPU at {max(sizes)}×; memory per open source: PSS growth per source from K = "
        f"{results['ks'][0]} to {results['ks'][-1]} open sources.",
        "",
        f"| format | file MiB ({big}×) | index s, first / cached ({big}×) | CPU s per 1M "
        f"tokens ({big}×: read + tokenize) | {pss_cols} | PSS after open → after read MiB "
        f"({big}×) |",
        "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in sizes) + " | ---: |",
    ]
    for layout, by_size in results["formats"].items():
        r = by_size[big]["read"]
        per = " | ".join(f"{by_size[str(s)]['many']['per_source_mib']['pss']:.2f}" for s in sizes)
        mem = r["memory_mib"]
        lines.append(
            f"| {layout} | {by_size[big]['file_mib']:.1f} | {r['index_first_s']:.4f} / "
            f"{r['index_cached_s']:.4f} | {r['cpu_s_per_m_tokens']:.4f} "
            f"({r['read_cpu_s_per_m_tokens']:.4f} + {r['tokenize_cpu_s_per_m_tokens']:.4f}) | "
            f"{per} | {mem['opened']['pss']:.0f} → {mem['read']['pss']:.0f} |"
        )
    lines += [
        "",
        "PSS per open source, split: anonymous + file-backed MiB (RSS; Arrow pool's live bytes):",
        "",
        "| format | "
        + " | ".join(f"{s}×" for s in sizes)
        + f" | reading every row group, PSS growth anon + file MiB ({big}×) |",
        "| --- | " + " | ".join("---:" for _ in sizes) + " | ---: |",
    ]
    for layout, by_size in results["formats"].items():
        mem = by_size[big]["read"]["memory_mib"]
        growth = {k: mem["read"][k] - mem["opened"][k] for k in ("pss_anon", "pss_file")}
        cells = []
        for s in sizes:
            per = by_size[str(s)]["many"]["per_source_mib"]
            cells.append(
                f"{per['pss_anon']:.2f} + {per['pss_file']:.2f} ({per['rss']:.2f}; "
                f"{per['arrow_allocated']:.2f})"
            )
        cells.append(f"{growth['pss_anon']:.1f} + {growth['pss_file']:.1f}")
        lines.append(f"| {layout} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CPU per 1M tokens is the median of the passes over every row group (read + `bytes` "
        "tokenize; the JSON has the split and the first pass). File-backed PSS is the pages of "
        "memory-mapped files (Arrow, Megatron) a reader touched: clean page cache, reclaimable, "
        "not heap. Anonymous growth while Arrow's pool holds (next to) nothing live is most "
        "likely memory the allocators (mimalloc, glibc's per-thread arenas, Python's) kept after "
        "freeing it, not data held. File-backed PSS also moves (± a few MiB between two "
        "samples) as other processes on the machine map or unmap the same shared libraries: "
        "a growth of a format that maps no data file is that. Timings on 2 shared cores are "
        "noisy: compare formats within this run "
        f"(load average at start / end: {results['load_average']['start']:.1f} / "
        f"{results['load_average']['end']:.1f}).",
        "",
    ]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--median-tokens", type=int, default=200)
    parser.add_argument("--group-rows", type=int, default=1024)
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--index-repeats", type=int, default=5)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--formats", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--work", type=Path, default=None, help="keep the data here")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, spec = args.worker
        # As a loader process starts (msd.roles.__main__): glibc's mmap threshold fixed, and
        # pyarrow told once that pandas is not here (else its first conversion imports it).
        fix_mmap_threshold()
        keep_pandas_out()
        worker = read_worker if kind == "read" else many_worker
        print(json.dumps(worker(json.loads(spec))))
        return
    ks = sorted(set(args.ks))
    if len(ks) < 2:
        parser.error("--ks needs at least two values")
    sizes = sorted(set(args.sizes))
    work = args.work or Path(tempfile.mkdtemp(prefix="msd-bench-formats-"))
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "pyarrow": pa.__version__,
        },
        "load_average": {"start": os.getloadavg()[0]},
        "rows": args.rows,
        "sizes": sizes,
        "median_tokens": args.median_tokens,
        "group_rows": args.group_rows,
        "passes": args.passes,
        "ks": ks,
        "tokens_at": {},
        "formats": {layout: {} for layout in args.formats},
    }
    try:
        for size in sizes:
            rows = args.rows * size
            synth = SynthSource("formats", args.median_tokens, 1.0, 32768, rows)
            table = synth_table(synth, seed=0)
            folder = work / f"size-{size}"
            log(f"{size}×: writing {rows:,} rows in {len(LAYOUTS)} formats to {folder}")
            write_all(table, folder, args.group_rows)
            for layout in args.formats:
                spec = {
                    "layout": layout,
                    "folder": str(folder / layout / "base"),
                    "group_rows": args.group_rows,
                    "passes": args.passes,
                    "index_repeats": args.index_repeats,
                }
                read = run_worker("read", spec, folder / layout / "cache-read")
                results["tokens_at"][str(size)] = read["tokens"]
                folders = copies(folder, layout, ks[-1])
                cache = folder / layout / "cache-many"
                prebuild(layout, folders, args.group_rows, cache)
                many_spec = {**spec, "copies": [str(f) for f in folders], "ks": ks}
                many = run_worker("many", many_spec, cache)
                results["formats"][layout][str(size)] = {
                    "file_mib": file_mib(folder / layout / "base"),
                    "read": read,
                    "many": many,
                }
                log(
                    f"{size}× {layout}: index {read['index_first_s']:.3f}/"
                    f"{read['index_cached_s']:.3f} s, {read['cpu_s_per_m_tokens']:.4f} CPU s "
                    f"per 1M tokens, PSS per open source {many['per_source_mib']['pss']:.2f} MiB"
                )
                for f in folders:  # the copies are only for the memory-per-source worker
                    shutil.rmtree(f)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    results["load_average"]["end"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "formats.json").write_text(json.dumps(results, indent=2) + "\n")
    write_md(results, args.out / "formats.md")
    print((args.out / "formats.md").read_text())


if __name__ == "__main__":
    main()
