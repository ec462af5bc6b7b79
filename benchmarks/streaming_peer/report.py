"""Writing ``streaming_peer.json`` and ``streaming_peer.md``: the table, who wins what, caveats.

The "who wins" lines are computed from the numbers (a ratio per metric and point), so a rerun
rewrites them; the paragraphs on why are about mechanisms, which a rerun does not change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEM = "streaming_peer"
SYSTEMS = ("streaming", "msd", "msd-local")
NAMES = {"streaming": "Streaming", "msd": "msd", "msd-local": "msd, local disk (reference)"}
_MIB = 2**20
TIE = 1.10  # ratios within 10% are called even: one run each, on a shared 2-core machine
Entry = dict[str, Any]


def write(results: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{STEM}.json", out / f"{STEM}.md"
    json_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    md_path.write_text(markdown(results))
    return [json_path, md_path]


def rewrite(out: Path) -> str:
    results = json.loads((out / f"{STEM}.json").read_text())
    write(results, out)
    return (out / f"{STEM}.md").read_text()


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _mib(value: Any) -> str:
    return "–" if value is None else _num(value / _MIB, 1)


def rank_fetch_cpu_s_per_mtok(result: Entry, ranks: int) -> float:
    """The ranks' own CPU getting their batches (the DataLoader's receiving end, or msd's
    client), per 1M tokens."""
    tokens_per_rank_step = result["tokens_per_step"] / ranks
    return float(result["fetch_cpu_mean_ms"] / 1000 / tokens_per_rank_step * 1e6)


def _requests(result: Entry) -> str:
    counts = result.get("store_requests") or {}
    return f"{counts.get('get_whole', 0):,} / {counts.get('get_range', 0):,}"


Column = tuple[str, Callable[[Entry, Entry], str]]
COLUMNS: tuple[Column, ...] = (
    ("steps/s", lambda r, e: _num(r["steps_per_s"])),
    ("M tok/s", lambda r, e: _num(r["tokens_per_s"] / 1e6)),
    (
        "wait p50 / p99 / max ms",
        lambda r, e: " / ".join(_num(r[k]) for k in ("wait_p50_ms", "wait_p99_ms", "wait_max_ms")),
    ),
    ("data-plane peak MiB", lambda r, e: _num(r["data_plane_peak_mib"])),
    ("CPU s / 1M tok (warm)", lambda r, e: _num(r["cpu_s_per_mtok"])),
    ("CPU s / 1M tok (whole run)", lambda r, e: _num(r.get("run_cpu_s_per_mtok"))),
    (
        "rank fetch CPU s / 1M tok",
        lambda r, e: _num(rank_fetch_cpu_s_per_mtok(r, e["point"]["R"])),
    ),
    ("S3 server CPU s / 1M tok (warm)", lambda r, e: _num(r.get("store_cpu_s_per_mtok"))),
    ("GETs whole / range", lambda r, e: _requests(r)),
    ("S3 sent MiB", lambda r, e: _mib(r.get("store_sent_bytes"))),
    ("local disk MiB", lambda r, e: _mib(r.get("local_disk_bytes"))),
    ("start-up s", lambda r, e: _num(r["startup_s"], 1)),
    ("cost max/mean", lambda r, e: _num(r["cost_max_over_mean"])),
    ("load 1m before → after", lambda r, e: _load(r)),
)


def _load(result: Entry) -> str:
    load = result.get("load_average_1m")
    return "–" if not load else f"{load[0]:.1f} → {load[1]:.1f}"


def table(entries: list[Entry]) -> list[str]:
    head = ["S", "R", "system", *(name for name, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for entry in entries:
        for system in SYSTEMS:
            result: Entry = entry.get(system) or {}
            cells = [str(entry["point"]["S"]), str(entry["point"]["R"]), NAMES[system]]
            if "steps_per_s" in result:
                cells += [cell(result, entry) for _, cell in COLUMNS]
            elif system in entry:
                why = str(result.get("error", "not run"))[:120].replace("|", "/")
                cells += [f"failed: {why}"] + [""] * (len(COLUMNS) - 1)
            else:
                continue
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def data_lines(results: dict[str, Any]) -> list[str]:
    lines = [
        "| S | tokens in the data | Parquet MiB (row groups) | MDS MiB stored / on disk "
        "(shards) | tokens delivered per run / data |",
        "|---|---|---|---|---|",
    ]
    for entry in results["points"]:
        data = entry["data"]
        runs = [entry[s]["run_tokens"] for s in SYSTEMS if "run_tokens" in (entry.get(s) or {})]
        passes = _num(max(runs) / data["tokens"]) if runs else "–"
        lines.append(
            f"| {entry['point']['S']} | {data['tokens'] / 1e6:.1f} M "
            f"| {_mib(data['parquet_bytes'])} ({data['parquet_row_groups']}) "
            f"| {_mib(data['mds_stored_bytes'])} / {_mib(data['mds_raw_bytes'])} "
            f"({data['mds_shards']}) | {passes} |"
        )
    return lines


# (label, value, True if higher is better, below this both are called even: noise)
Metric = tuple[str, Callable[[Entry, Entry], float | None], bool, float]
METRICS: tuple[Metric, ...] = (
    ("steps/s", lambda r, e: r["steps_per_s"], True, 0.0),
    ("data-wait p50", lambda r, e: r["wait_p50_ms"], False, 1.0),
    ("data-wait p99", lambda r, e: r["wait_p99_ms"], False, 1.0),
    ("data-plane memory", lambda r, e: r["data_plane_peak_mib"], False, 0.0),
    ("data-plane CPU per token (warm)", lambda r, e: r["cpu_s_per_mtok"], False, 0.01),
    (
        "data-plane CPU per token (whole run)",
        lambda r, e: r.get("run_cpu_s_per_mtok"),
        False,
        0.01,
    ),
    ("S3 server CPU per token (warm)", lambda r, e: r.get("store_cpu_s_per_mtok"), False, 0.01),
    ("bytes from the S3 server", lambda r, e: r.get("store_sent_bytes"), False, 0.0),
    ("start-up", lambda r, e: r["startup_s"], False, 0.0),
)


def store_line(entry: Entry) -> str | None:
    """What each system took from the store at this point, against the data's size."""
    data = entry["data"]
    said = []
    theirs, ours = entry.get("streaming") or {}, entry.get("msd") or {}
    if "downloaded_bytes" in theirs:
        said.append(
            f"Streaming downloaded {theirs['shards_downloaded']} of {data['mds_shards']} shards "
            f"({_mib(theirs['downloaded_bytes'])} MiB, "
            f"{theirs['downloaded_bytes'] / data['mds_stored_bytes']:.2f}× the stored MDS) and "
            f"kept {_mib(theirs['local_disk_bytes'])} MiB on local disk"
        )
    if "store_sent_bytes" in ours:
        counts = ours.get("store_requests") or {}
        repeats = ""
        if "get_repeats" in counts or "get_bytes" in counts:
            repeats = (
                f", {counts.get('get_repeats', 0)} of them for a range fetched before in the run "
                f"({_mib(counts.get('get_repeat_bytes', 0))} MiB)"
            )
        said.append(
            f"msd fetched {_mib(ours['store_sent_bytes'])} MiB "
            f"({ours['store_sent_bytes'] / data['parquet_bytes']:.2f}× the Parquet) in "
            f"{counts.get('get_range', 0)} ranged GETs{repeats}"
        )
    if not said:
        return None
    runs = [r["run_tokens"] for r in (theirs, ours) if "run_tokens" in r]
    passes = f", for {max(runs) / data['tokens']:.2f}× the data's tokens delivered" if runs else ""
    return f"- S={entry['point']['S']}: " + "; ".join(said) + passes + "."


def verdicts(entry: Entry) -> list[str]:
    """Per metric: who is better at this point, and by what factor."""
    ours, theirs = entry.get("msd") or {}, entry.get("streaming") or {}
    if "steps_per_s" not in ours or "steps_per_s" not in theirs:
        return []
    said = []
    for label, get, higher, floor in METRICS:
        a, b = get(ours, entry), get(theirs, entry)
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            continue
        if max(a, b) < floor or max(a, b) <= 0:
            said.append(f"{label}: even (both below {floor:g})")
            continue
        ratio = math.inf if min(a, b) <= 0 else max(a, b) / min(a, b)
        msd_better = (a > b) == higher
        if ratio < TIE:
            said.append(f"{label}: even (×{ratio:.2f})")
        else:
            factor = "≫" if math.isinf(ratio) else f"×{ratio:.1f}"
            said.append(f"{label}: **{'msd' if msd_better else 'Streaming'}** ({factor})")
    return said


WHY = """\
**Why.** Streaming downloads a whole shard to local disk before it reads a sample of it and,
with no `cache_limit`, keeps every shard it downloaded: a sample read again afterwards (a source
mixed in more often than it has samples, a second pass) costs no request and no byte from the
store, and once the shards are in, its workers read local files only. But its shuffle (`py1e`)
spreads every worker's first samples over the whole dataset, so it downloads nearly every shard
during start-up, whatever share of the data the run will use, and it needs that much local disk
(decompressed). msd keeps nothing: when a source visits a row group it reads that row group's
whole column chunk (ranged GETs of up to 1 MiB), however few of its rows the run then takes, and
a later visit reads it again; the store serves it all through the run, a second pass again, and
the GETs of a range fetched before are counted below. On a dataset larger than the local disk
Streaming needs a `cache_limit`, and then it too evicts and downloads again.

The steps: msd balances each step's cost across ranks (`cost max/mean`), while each Streaming
rank packs its own rows and every step waits at the barrier for the slowest rank; and a rank
takes its batch from msd's client instead of a DataLoader worker's tensor hand-off, which shows
in the ranks' data-wait p50 and fetch CPU (as it does for `benchmarks.dataloader`'s baseline).
The CPU: per sample, Streaming's reader opens the shard file, seeks and reads twice and closes
it, and the MDS `str` comes back decoded, to be encoded again; packing is the dataloader
baseline's (the same code for both peers of msd). Memory: each Streaming rank has W worker
processes, each with its own reader state, packer and batches in flight, so that data plane
grows with R·W; msd's grows with the sources and the batch, not with the ranks. Streaming's
grew with S too here; the table does not say by what.
"""

CAVEATS = """\
**Caveats.** The S3 server is moto on the same 2 cores as everything else (its CPU is in its
own column, not in either data plane's), serving from memory over loopback: no network latency
or bandwidth limit and no per-request price, which favours msd's ranged GETs over what a real
store would show; but moto is slow per request (Python), which does not. The data is small (S
sources of ~4 MB; the whole dataset fits in the local cache and the page cache), so Streaming's
cache is never under pressure; its shard files in the page cache are not in any process's PSS.
One run per system and point: start-up times and wait tails move by several times between runs
on this machine (in the three full runs made while this benchmark was written, msd's p99 wait
at S=8 was 3.5, 154 and 277 ms, start-ups ranged from 9 to 53 s); the means, memory, CPU and
bytes moved little. Streaming 0.13.0 declares numpy<2.2 and xxhash<4: it ran with
numpy 2.4 and xxhash 4 (nothing failed), imported without `streaming.vision` and
`StreamingDataLoader` (they need torchvision and transformers; `lib.py`), with a plain
`DataLoader` as the dataloader baseline has. Both systems tokenize the same way (the UTF-8
bytes as ids; Streaming's workers re-encode the `str` MDS decodes) and pack the same rows
(`benchmarks/dataloader/packing.py`); Streaming's epoch is sized to outlast the run
(`config.py`), its partition and shuffle are its defaults (`relaxed`, `py1e`), and its
`batch_size` is an average micro-batch's samples.
"""


def _imported(peer: dict[str, str]) -> str:
    if str(peer.get("imported_as", "")).startswith("submodules"):
        return "`StreamingDataset`, `Stream`, `MDSWriter` imported without `streaming.vision`"
    return "the whole package imported"


def extra_systems(entry: Entry) -> list[str]:
    return [NAMES[s] for s in SYSTEMS if s in entry]


def markdown(results: dict[str, Any]) -> str:
    settings = results.get("settings", {})
    machine = results.get("machine", {})
    peer = machine.get("streaming_peer", {})
    first = results["points"][0] if results["points"] else None
    lines = [
        "# MosaicML Streaming beside msd, from the same S3 server",
        "",
        "`python -m benchmarks.streaming_peer` (`benchmarks/streaming_peer/`): the simulated",
        "data-parallel trainer of `benchmarks.dataloader` fed by MosaicML Streaming (MDS shards,",
        "one `Stream` per source, a `DataLoader` per rank) and by msd (the Parquet files), both",
        "reading from one S3 server.",
        "",
    ]
    if first is not None:
        p = first["point"]
        lines += [
            f"Machine: {machine.get('cores')} cores, {machine.get('memory_gib')} GiB; Python "
            f"{machine.get('python')}, torch {machine.get('torch')}, numpy "
            f"{machine.get('numpy')}, pyarrow {machine.get('pyarrow')}, mosaicml-streaming "
            f"{peer.get('mosaicml-streaming')} ({_imported(peer)}). "
            f"{settings.get('store', '')}.",
            "",
            f"Each run: R={p['R']} ranks, {p['rows']} rows × {p['seq_len']} tokens per rank "
            f"per step, {first['steps']} steps measured after {first['warmup']} of warm-up, "
            f"an average rank computing {settings.get('target_step_s', 0) * 1000:.0f} ms a "
            f"step; equal weights, the `bytes` transform; Parquet row groups of "
            f"{p['rg_bytes'] / _MIB:.0f} MiB, MDS shards of at most "
            f"{first['shard_bytes'] / _MIB:.0f} MiB (zstd:3, as the Parquet); Streaming with "
            f"W={p['W']} workers per rank, msd with `loader.sources_per_process: "
            f"{first['sources_per_process']}`.",
            "",
        ]
    lines += [*table(results["points"]), ""]
    lines += [
        "Memory: peak of the data processes' summed PSS (Streaming's DataLoader workers; msd's",
        "Planner, loaders, Constructor) plus the ranks' growth over their idle PSS. CPU (warm):",
        "those processes' CPU seconds in the measured window per 1M tokens; (whole run): all",
        "they used from start to end over every token delivered, start-up included. S3 server:",
        "moto's CPU in the window; the GETs it answered over the whole run (a whole object, or",
        "a byte range) and their bytes (object or range sizes, from moto's request recorder).",
        "Local disk: Streaming's cache at the end. Start-up: from starting the ranks (or",
        "`msd launch`) to the end of the first step.",
        "",
    ]
    lines += [*data_lines(results), ""]
    lines += ["**Who is better** (×: the ratio; within 10% is called even):", ""]
    for entry in results["points"]:
        said = verdicts(entry)
        if said:
            lines.append(f"- S={entry['point']['S']}: " + "; ".join(said) + ".")
    extra = results.get("extra_runs") or []
    if extra:
        lines += ["", "**Other runs** (`--append`: repeats and references, same code):", ""]
        lines += [*table(extra), ""]
        lines += [f"- {e['date']}: {e['key']}, {', '.join(extra_systems(e))}" for e in extra]
    lines += ["", "**From the store** (whole runs):", ""]
    lines += [line for line in map(store_line, results["points"]) if line is not None]
    lines += ["", WHY, CAVEATS]
    loads = [
        x
        for e in results["points"] + (results.get("extra_runs") or [])
        for system in SYSTEMS
        for x in (e.get(system) or {}).get("load_average_1m", [])
    ]
    if loads:
        lines += [
            f"The 1-minute load average was {min(loads):.1f}–{max(loads):.1f} at the starts and "
            f"ends of the runs, on {machine.get('cores')} cores: above the core count, other "
            "work (other sessions' tests) shared the machine, and every number here is under "
            "that contention, which was not the same for every run.",
            "",
        ]
    return "\n".join(lines)
