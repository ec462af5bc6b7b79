"""What one Source Loader process holds per source it serves, part by part.

```bash
python -m benchmarks.loader_memory                       # N = 16, 64, 256, 1024 sources
python -m benchmarks.loader_memory --sources 64 --trace  # and the top Python allocations
```

Each N runs in a fresh process: the sources of ``benchmarks.dataloader`` (4 MB of text each in
one Parquet file, 2 MB row groups, lengths log-normal around 200, 1,000 or 4,000 bytes, the
``bytes`` transform, equal weights; the first N of the S = 1,024 set, written once under
``benchmarks/runs/dataloader-data``) served by the loader's socket-free core as one loader
process serves them (``SourceShard``s sharing one ``RowGroupReader``; the process set up as
``python -m msd.roles loader`` sets up its own).
A simulated Planner consumes ``global_batch_tokens`` a step (16,384 × 2 rows × 8 ranks by
default): each sample's source drawn by weight, the oldest sample the source holds taken (read
first if none is held, as when the Planner waits); between steps the loader reads ahead as its
loop does (the emptiest hungry shard first) until no shard is hungry.

Reported, after the steps: the process's PSS, and its growth (PSS, peak PSS, USS: USS is the
steadiest, PSS moves with whatever else shares the libraries' pages) over the process before
any shard existed (imports done), per source; glibc's heap in use and free-but-kept
(``mallinfo2``); Arrow's allocated bytes, and the peak of Arrow's mimalloc pool (what the Parquet
reader decodes into unless the loader names the C allocator); and the loader's own structures
counted byte by byte: held tokens (and the buffers their views keep alive), the open block's
window, the visit's row and size arrays, the epoch orders; "after_open" is the growth once the
shards exist (source indexes, nothing read). ``--trace`` adds tracemalloc's top lines,
``--window-kib`` fixes every window's size (to weigh its memory against its CPU).
Writes ``benchmarks/results/loader_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from msd.roles import footprint

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "loader_memory.json"
DATA_ROOT = ROOT / "benchmarks" / "runs" / "dataloader-data"  # benchmarks.dataloader's
MIB = 2**20


def per_source(r: dict[str, Any]) -> dict[str, float]:
    """KiB per source of each measure."""
    n, base, after = r["sources"], r["base"], r["after"]
    row = {
        "pss": (after["pss"] - base["pss"]) / n,
        "pss_peak": (r["peak_pss"] - base["pss"]) / n,
        "uss": (after["uss"] - base["uss"]) / n,
        "after_open": (r["opened"]["pss"] - base["pss"]) / n,
        "heap_used": (after.get("heap_used", 0) - base.get("heap_used", 0)) / n,
        "heap_free_kept": (after.get("heap_free_kept", 0) - base.get("heap_free_kept", 0)) / n,
        "arrow": r["arrow_allocated"] / n,
        "mimalloc_peak": r.get("mimalloc_peak", 0) / n,
    }
    row |= {k: v / n for k, v in r["parts"].items() if k != "open_files"}
    return {k: v / 1024 for k, v in row.items()}


def table(results: list[dict[str, Any]]) -> str:
    columns = list(per_source(results[0]))
    lines = [
        "| N | base PSS MiB | PSS MiB | CPU s | "
        + " | ".join(f"{c} KiB/src" for c in columns)
        + " |",
        "|" + "---|" * (4 + len(columns)),
    ]
    for r in results:
        row = per_source(r)
        cells = [f"{row[c]:.1f}" for c in columns]
        pss = r["after"]["pss"] / MIB
        head = f"| {r['sources']} | {r['base']['pss'] / MIB:.1f} | {pss:.1f} | {r['cpu_s']:.1f} | "
        lines.append(head + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_one(args: argparse.Namespace, n: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.loader_memory", "--one", str(n)]
    argv += ["--steps", str(args.steps), "--seq-len", str(args.seq_len)]
    argv += ["--ranks", str(args.ranks), "--rows", str(args.rows)]
    argv += ["--data-sources", str(args.data_sources), "--data-root", args.data_root]
    argv += ["--trace"] if args.trace else []
    argv += ["--window-kib", str(args.window_kib)] if args.window_kib else []
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--data-sources", type=int, default=1024, help="sources written")
    parser.add_argument("--data-root", default=str(DATA_ROOT))
    parser.add_argument(
        "--window-kib", type=int, help="every text window this size (CPU against memory)"
    )
    parser.add_argument("--trace", action="store_true", help="tracemalloc's top lines (slower)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        # Set up as ``python -m msd.roles loader`` sets up its process, before pyarrow loads.
        footprint.fix_mmap_threshold()
        footprint.arrow_on_malloc()
        footprint.keep_pandas_out()
        from benchmarks.loader_memory_probe import measure

        result = measure(args.one, args)
        sys.stdout.write(json.dumps(result) + "\n")
        return
    results = []
    for n in args.sources:
        results.append(run_one(args, n))
        sys.stdout.write(table(results[-1:]).splitlines()[-1] + "\n")
        sys.stdout.flush()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    sys.stdout.write(table(results) + "\n")
    for r in results:
        for line in r.get("top", []):
            sys.stdout.write(f"N={r['sources']} {line['bytes'] / MIB:8.2f} MiB {line['where']}\n")


if __name__ == "__main__":
    main()
