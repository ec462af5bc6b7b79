"""The VLM mode: msd against per-rank DataLoaders that decode images in every rank's workers.

    python -m benchmarks.dataloader --vlm [--quick] [--point S,R,W,L[,ROWS]] [--steps N] ...

The text benchmark's method on S image-text Parquet sources (``vlm_data.py``: captions and
interleaved documents, equal weights, images decoded by Pillow to Qwen2-VL uint8 patches with
the same geometry by both systems):

* baseline (``vlm_baseline.py``): ``DataLoader(num_workers=W)`` per rank, every worker opening
  every source, decoding and fusing its own samples, packing its rank's micro-batch; no
  balancing;
* msd: the same sources as a recipe (``image_column``, ``vision:``, ``cost`` with the encoder's
  terms, ``balance.objective: sum``, ``long_samples: truncate``) through ``msd launch``, with
  msd's defaults for the loader processes (no ``loaders`` per source, no ``loader:`` section:
  many sources share the loader CPUs by measured cost) unless ``--sources-per-process``,
  ``--buffer-tokens`` or ``--buffer-bytes`` asks otherwise.

Both feed ``trainer.py``, whose cost for a VLM batch is the backbone's ``attn·Σlen² + lin·Σlen``
plus the encoder's ``enc_attn·Σp² + enc_lin·Σp`` over its images (``vlm_cost.py``); an average
rank computes ``target_step_ms`` per step. Per point: steps/s, data-wait, peak data-plane PSS
(workers or roles, plus the ranks' growth), data-plane CPU seconds per 1,000 images (and, for
msd, each role's: the loaders' beside the DataLoader workers'), images/s, msd's loader processes,
and on the baseline's batches the speed-up perfect balancing allows (``metrics.balance``, the
bound with the costliest sample's encoder + backbone cost). Writes ``dataloader-vlm.json`` /
``.md`` (``--quick``: ``dataloader-vlm-quick.*``) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import psutil
import yaml

from benchmarks.dataloader.config import Settings
from benchmarks.dataloader.cost import CostModel, seconds_per_cost
from benchmarks.dataloader.data import DATA_ROOT, ROOT
from benchmarks.dataloader.metrics import measure, read_rank_logs, steps_by_rank
from benchmarks.dataloader.msd_run import KINDS, start_launcher, wait_launcher
from benchmarks.dataloader.packing import patience_of
from benchmarks.dataloader.procmon import ProcessSampler, children_of, command_kind
from benchmarks.dataloader.report import machine
from benchmarks.dataloader.run_baseline import start_ranks, wait_ranks
from benchmarks.dataloader.sweep import msd_digest
from benchmarks.dataloader.vlm_baseline import MAX_PIXELS, VlmStreamConfig
from benchmarks.dataloader.vlm_cost import mean_rank_cost
from benchmarks.dataloader.vlm_data import VlmDataset, VlmDataSpec, ensure_vlm_data
from msd.recipe.schema import Vision
from msd.sources.fuse import geometry_of

TRAINER_MODULE = "benchmarks.dataloader.trainer"
SYSTEMS = ("baseline", "msd")
STEPS, WARMUP, QUICK_STEPS = 40, 8, 16
TARGET_STEP_S = 1.0
VLM_COST = CostModel(attn=1.0, lin=256.0, enc_attn=1.0, enc_lin=256.0)
MEMORY_TARGET = 13.5  # at S = 64 (the issue's)
BALANCE_TARGET = 0.95  # msd speed-up / perfect-balance speed-up
MSD_OPTIONS: dict[str, Any] = {}  # from the command line: buffer_tokens/bytes, balance_method


@dataclass(frozen=True)
class VlmPoint:
    sources: int
    ranks: int
    workers: int
    seq_len: int = 2048
    rows: int = 2

    @property
    def key(self) -> str:
        return f"vlm-S{self.sources}-R{self.ranks}-W{self.workers}-L{self.seq_len}x{self.rows}"

    @property
    def global_batch_tokens(self) -> int:
        return self.ranks * self.rows * self.seq_len

    def as_dict(self) -> dict[str, int]:
        return {
            "S": self.sources,
            "R": self.ranks,
            "W": self.workers,
            "seq_len": self.seq_len,
            "rows": self.rows,
        }


def vlm_points() -> list[VlmPoint]:
    return [VlmPoint(16, 8, 2), VlmPoint(64, 8, 2)]


def quick_points() -> list[VlmPoint]:
    return [VlmPoint(4, 2, 1, 1024, 2)]


def images_per_s(log_dir: Path, warmup: int, elapsed_s: float) -> dict[str, float]:
    """Images and patches delivered per second in the warm window (all ranks)."""
    warm = steps_by_rank(read_rank_logs(log_dir))[warmup:]
    images = sum(r.get("images", 0) for step in warm for r in step)
    patches = sum(r.get("patches", 0) for step in warm for r in step)
    return {
        "images_per_s": images / elapsed_s,
        "patches_per_s": patches / elapsed_s,
        "images_per_step": images / max(1, len(warm)),
    }


def finish(result: dict[str, Any], log_dir: Path, warmup: int) -> dict[str, Any]:
    """Add images/s and data-plane CPU seconds per 1,000 images (in all, and per kind of data
    process) to ``measure``'s result."""
    result |= images_per_s(log_dir, warmup, result["warm_elapsed_s"])
    per_kimage = 1000 / result["images_per_s"]
    result["cpu_s_per_kimage"] = result["cpu_cores_busy"] * per_kimage
    for kind in result.get("by_kind", {}).values():
        kind["cpu_s_per_kimage"] = kind["cpu_cores_busy"] * per_kimage
    return result


def role_of(proc: psutil.Process) -> str:
    """A role process's role (``planner``, ``loader``, ``constructor``) from its command line."""
    try:
        argv = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return "?"
    at = argv.index("msd.roles") if "msd.roles" in argv else -2
    return argv[at + 1] if 0 <= at + 1 < len(argv) else "?"


def trainer_argv(system: str, log_dir: Path, model: CostModel, spc: float) -> list[str]:
    return [
        "--log-dir",
        str(log_dir),
        "--seconds-per-cost",
        repr(spc),
        "--attn",
        repr(model.attn),
        "--lin",
        repr(model.lin),
        "--enc-attn",
        repr(model.enc_attn),
        "--enc-lin",
        repr(model.enc_lin),
    ]


def stream_config(
    point: VlmPoint, dataset: VlmDataset, settings: Settings, vision: Vision
) -> VlmStreamConfig:
    return VlmStreamConfig(
        paths=tuple(s.path for s in dataset.sources),
        image_columns=tuple(s.image_column for s in dataset.sources),
        weights=dataset.weights,
        seq_len=point.seq_len,
        rows=point.rows,
        patience=patience_of(point.ranks * point.rows),
        vision=vision,
        seed=settings.seed,
        workers=point.workers,
        steps=settings.steps,
        sharing_strategy=settings.sharing_strategy,
    )


def run_baseline(
    point: VlmPoint,
    dataset: VlmDataset,
    settings: Settings,
    vision: Vision,
    run_dir: Path,
    spc: float,
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    stream_config(point, dataset, settings, vision).save(run_dir / "stream.json")
    argv = [sys.executable, "-m", TRAINER_MODULE, "baseline-vlm"]
    argv += trainer_argv("baseline", run_dir / "ranks", settings.cost, spc)
    argv += ["--config", str(run_dir / "stream.json")]
    result = run_ranks(point, run_dir, argv, settings)
    return result if "error" in result else finish(result, run_dir / "ranks", settings.warmup)


def run_ranks(point: Any, run_dir: Path, argv: list[str], settings: Settings) -> dict[str, Any]:
    """The baseline's rank processes (``argv``, ``point.ranks`` of them), their DataLoader
    workers sampled as the data plane: ``measure``'s metrics (``error`` set if the run
    failed)."""
    started = time.time()
    children = start_ranks(point, run_dir, argv)
    pids = [r.popen.pid for r in children]

    def discover() -> tuple[list[psutil.Process], list[psutil.Process]]:
        alive = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
        return children_of(pids), alive

    sampler = ProcessSampler(discover, settings.sample_interval_s, lambda _: "worker")
    sampler.start()
    try:
        error = wait_ranks(children, settings.timeout_s)
    finally:
        sampler.stop()
    if error is not None:
        return {"error": error, "run_dir": str(run_dir)}
    result = measure(run_dir / "ranks", sampler.samples, settings.warmup)
    return result | {
        "run_dir": str(run_dir),
        "wall_s": time.time() - started,
        "startup_s": result["first_step_end"] - started,
    }


def recipe_dict(
    point: VlmPoint,
    dataset: VlmDataset,
    settings: Settings,
    vision: Vision,
    command: str,
    sources_per_process: int | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The recipe; ``options``: ``buffer_tokens``, ``buffer_bytes`` (loader read-ahead),
    ``balance_method``. Without ``sources_per_process`` or a read-ahead option the recipe has
    no ``loader:`` section: msd decides the loader processes."""
    model = settings.cost
    options = options or {}
    loader: dict[str, Any] = {}
    if sources_per_process:
        loader["sources_per_process"] = sources_per_process
    for key in ("buffer_tokens", "buffer_bytes"):
        if options.get(key):
            loader[key] = options[key]
    method = options.get("balance_method") or "greedy"
    recipe: dict[str, Any] = {
        "name": f"dl-{point.key}",
        "seed": settings.seed,
        "steps": settings.steps,
        "seq_len": point.seq_len,
        "global_batch_tokens": point.global_batch_tokens,
        "micro_batch_size": point.rows,
        "distribute": {"dp": point.ranks},
        "vision": msgspec.to_builtins(vision),
        "sources": [
            {
                "name": s.name,
                "path": s.path,
                "text_column": "text",
                "image_column": s.image_column,
                "transform": {"kind": "bytes"},
                "weight": s.weight,
                "repeat": True,
            }
            for s in dataset.sources
        ],
        "cost": {
            "attn": model.attn,
            "lin": model.lin,
            "enc_attn": model.enc_attn,
            "enc_lin": model.enc_lin,
        },
        "balance": {"method": method, "long_samples": "truncate", "objective": "sum"},
        "trainer": {"command": command, "ranks": point.ranks},
    }
    if loader:
        recipe["loader"] = loader
    return recipe


def run_msd(
    point: VlmPoint,
    dataset: VlmDataset,
    settings: Settings,
    vision: Vision,
    run_dir: Path,
    spc: float,
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = run_dir / "ranks"
    command = " ".join(
        ["python", "-m", TRAINER_MODULE, "msd", *trainer_argv("msd", log_dir, settings.cost, spc)]
    )
    per_process = settings.sources_per_process
    recipe = recipe_dict(point, dataset, settings, vision, command, per_process, MSD_OPTIONS)
    result, summary = run_launcher(recipe, run_dir, settings)
    if "error" in result:
        return result
    keys = ("steps", "tokens", "tokens_per_s", "images", "skipped_images", "truncated_samples")
    return finish(result, log_dir, settings.warmup) | {
        "sources_per_process": per_process,
        "recipe_loader": recipe.get("loader", {}),
        "balance_method": recipe["balance"]["method"],
        "msd_summary": {k: summary.get(k) for k in keys},
    }


def run_launcher(
    recipe: dict[str, Any], run_dir: Path, settings: Settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``msd launch`` of ``recipe``, its roles sampled as the data plane: ``measure``'s metrics
    (``error`` set if the run failed) and the run's summary."""
    recipe_path = run_dir / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    started = time.time()
    launcher = start_launcher(recipe_path, run_dir)
    cache: dict[int, str] = {}

    def discover() -> tuple[list[psutil.Process], list[psutil.Process]]:
        found: dict[str, list[psutil.Process]] = {"role": [], "trainer": []}
        for proc in children_of([launcher.pid]):
            kind = command_kind(proc, KINDS, cache)
            if kind is not None:
                found[kind].append(proc)
        return found["role"], found["trainer"]

    sampler = ProcessSampler(discover, settings.sample_interval_s, role_of)
    sampler.start()
    try:
        error = wait_launcher(launcher, settings.timeout_s)
    finally:
        sampler.stop()
    if error is not None:
        tail = (run_dir / "launch.err").read_text(errors="replace")[-1500:]
        return {"error": f"{error}: {tail}", "run_dir": str(run_dir)}, {}
    result = measure(run_dir / "ranks", sampler.samples, settings.warmup)
    summary: dict[str, Any] = json.loads((run_dir / "launch.out").read_text())
    return result | {
        "run_dir": str(run_dir),
        "job": summary.get("job"),
        "wall_s": time.time() - started,
        "startup_s": result["first_step_end"] - started,
    }, summary


def run_point(
    point: VlmPoint,
    settings: Settings,
    spec: VlmDataSpec,
    vision: Vision,
    systems: tuple[str, ...],
    data_root: Path,
) -> dict[str, Any]:
    dataset = ensure_vlm_data(spec, data_root)
    patience = patience_of(point.ranks * point.rows)
    cost = mean_rank_cost(
        dataset.sources,
        geometry_of(vision),
        point.seq_len,
        point.rows,
        patience,
        settings.cost,
        seed=settings.seed,
    )
    entry: dict[str, Any] = {
        "key": point.key,
        "point": point.as_dict(),
        "data": {
            "spec": spec.__dict__,
            "bytes_on_disk": dataset.bytes_on_disk,
            "images": sum(len(x) for s in dataset.sources for x in s.image_sizes),
            "samples": sum(s.samples for s in dataset.sources),
        },
        "vision": msgspec.to_builtins(vision),
        "steps": settings.steps,
        "warmup": settings.warmup,
        "msd_source_digest": msd_digest(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mean_rank_cost": cost,
        "seconds_per_cost": seconds_per_cost(settings.target_step_s, cost),
    }
    run_dir = settings.run_root / time.strftime("%Y%m%d-%H%M%S") / point.key
    for system in systems:
        print(f"[{point.key}] {system}: running", flush=True)
        load_before = os.getloadavg()[0]
        run = run_baseline if system == "baseline" else run_msd
        entry[system] = run(
            point, dataset, settings, vision, run_dir / system, entry["seconds_per_cost"]
        )
        entry[system]["load_average_1m"] = [load_before, os.getloadavg()[0]]
        print(f"[{point.key}] {system}: {brief(entry[system])}", flush=True)
    return entry


def brief(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED: {result['error'][:400]}"
    return (
        f"{result['steps_per_s']:.3f} steps/s, {result['images_per_s']:.0f} images/s, "
        f"wait p50 {result['wait_p50_ms']:.1f} / p99 {result['wait_p99_ms']:.1f} ms, "
        f"data plane {result['data_plane_peak_mib']:.0f} MiB, "
        f"{result['cpu_s_per_kimage']:.2f} CPU s/1k images, "
        f"max/mean cost {result['cost_max_over_mean']:.3f} "
        f"(max/bound {result['cost_max_over_bound']:.3f})"
    )


# ----------------------------------------------------------------------------- the report


def ratios(entry: dict[str, Any]) -> dict[str, float | None]:
    """The issue's three numbers for one point, None where a system did not measure."""
    b, m = entry.get("baseline") or {}, entry.get("msd") or {}
    if "steps_per_s" not in b or "steps_per_s" not in m:
        return {"memory_ratio": None, "speedup": None, "speedup_over_allowed": None}
    speedup = m["steps_per_s"] / b["steps_per_s"]
    return {
        "memory_ratio": b["data_plane_peak_mib"] / m["data_plane_peak_mib"],
        "speedup": speedup,
        "allowed_speedup": b["cost_max_over_bound"],
        "allowed_speedup_mean": b["cost_max_over_mean"],
        "speedup_over_allowed": speedup / b["cost_max_over_bound"],
    }


COLUMNS = (
    "point",
    "S",
    "R",
    "W",
    "seq_len × rows",
    "memory MiB base / msd",
    "mem ratio",
    "steps/s base / msd",
    "msd speed-up",
    "perfect-balance speed-up base: max/mean (max/bound)",
    "msd speed-up / allowed",
    "msd cost max/mean (max/bound)",
    "images/s base / msd",
    "wait p50 ms base / msd",
    "wait p99 ms base / msd",
    "CPU s / 1k images base / msd",
    "decode CPU s / 1k images: workers / msd loaders",
    "msd loader processes",
    "CPU cores busy base / msd",
    "start-up s base / msd",
)

LEGEND = (
    "Memory: peak summed PSS of the data processes (DataLoader workers; or msd's Planner, "
    "loaders and Constructor) plus each rank's growth over its idle PSS; ratio = baseline / msd "
    f"(target ≥ {MEMORY_TARGET}× at S = 64). Steps/s after the warm-up steps. A rank's "
    "simulated compute: attn·Σlen² + lin·Σlen over its sequences (padding included) + "
    "enc_attn·Σp² + enc_lin·Σp over its images' patch counts. Perfect-balance speed-up on the "
    "baseline's own batches: Σ_steps max-rank cost / Σ_steps mean-rank cost, and (brackets) over "
    "Σ_steps max(mean-rank cost, costliest sample: its sequence + its images), the bound no "
    f"split beats; msd speed-up / allowed = msd speed-up / that bound (target ≥ {BALANCE_TARGET})."
    " CPU: the data processes' CPU seconds per second in the warm window, per 1,000 images "
    "delivered; decode CPU: the DataLoader workers' (read, decode, fuse, pack) against msd's "
    "loader processes' alone (read, decode, fuse, report, send), the Planner and Constructor "
    "left out. Wait: time a rank blocked getting its batch, all ranks' warm steps. W applies "
    "to the baseline only. Weights: all sources equal."
)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def kind_get(result: dict[str, Any] | None, kind: str, key: str) -> float | None:
    """A per-kind figure of a run (``by_kind``); None where it was not measured."""
    value = ((result or {}).get("by_kind") or {}).get(kind, {}).get(key)
    return None if value is None else float(value)


def table_row(entry: dict[str, Any]) -> str:
    b = entry.get("baseline") if "steps_per_s" in (entry.get("baseline") or {}) else None
    m = entry.get("msd") if "steps_per_s" in (entry.get("msd") or {}) else None
    p, r = entry["point"], ratios(entry)

    def get(result: dict[str, Any] | None, key: str) -> float | None:
        return None if result is None else result.get(key)

    def pair(key: str, digits: int = 2) -> str:
        return f"{_fmt(get(b, key), digits)} / {_fmt(get(m, key), digits)}"

    cells = [
        entry["key"],
        str(p["S"]),
        str(p["R"]),
        str(p["W"]),
        f"{p['seq_len']} × {p['rows']}",
        pair("data_plane_peak_mib", 0),
        _fmt(r["memory_ratio"], 1),
        pair("steps_per_s", 3),
        _fmt(r["speedup"], 3),
        f"{_fmt(get(b, 'cost_max_over_mean'), 3)} ({_fmt(get(b, 'cost_max_over_bound'), 3)})",
        _fmt(r["speedup_over_allowed"], 3),
        f"{_fmt(get(m, 'cost_max_over_mean'), 3)} ({_fmt(get(m, 'cost_max_over_bound'), 3)})",
        pair("images_per_s", 0),
        pair("wait_p50_ms", 1),
        pair("wait_p99_ms", 1),
        pair("cpu_s_per_kimage"),
        f"{_fmt(kind_get(b, 'worker', 'cpu_s_per_kimage'))} / "
        f"{_fmt(kind_get(m, 'loader', 'cpu_s_per_kimage'))}",
        _fmt(kind_get(m, "loader", "processes"), 0),
        pair("cpu_cores_busy"),
        pair("startup_s", 0),
    ]
    return "| " + " | ".join(cells) + " |"


def loaders_of(settings: dict[str, Any]) -> str:
    """How the msd runs' loader processes were decided."""
    per_process = settings.get("sources_per_process")
    if per_process:
        return f"loader.sources_per_process {per_process}"
    return "with its defaults for the loader processes (no loader: section, no loaders per source)"


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    s = results["settings"]
    lines = [
        "# msd vs per-rank DataLoaders: image-text sources",
        "",
        f"Machine: {m['platform']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
        f"{m['python']}, torch {m['torch']}, pyarrow {m['pyarrow']}; {m['date']}.",
        "",
        f"Runs: {s['steps']} steps ({s['warmup']} warm-up), an average rank computing "
        f"{s['target_step_s'] * 1000:.0f} ms a step; cost {s['cost']}; msd {loaders_of(s)}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *[table_row(e) for e in results["points"]],
    ]
    failed = [
        (e["key"], sys_, e[sys_]["error"])
        for e in results["points"]
        for sys_ in SYSTEMS
        if "error" in (e.get(sys_) or {})
    ]
    if failed:
        lines += ["", "Failed:", ""] + [f"- {k} {s_}: {why[:300]}" for k, s_, why in failed]
    data = [
        f"- {e['key']}: {e['data']['samples']} samples, {e['data']['images']} images, "
        f"{e['data']['bytes_on_disk'] / 2**20:.1f} MiB on disk"
        for e in results["points"]
    ]
    lines += ["", "Data:", "", *data, "", LEGEND, ""]
    return "\n".join(lines)


def write(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for entry in results["points"]:
        entry["ratios"] = ratios(entry)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(results, indent=1))
    paths[1].write_text(markdown(results))
    return paths


# ----------------------------------------------------------------------------- the CLI


def parse_point(text: str) -> VlmPoint:
    numbers = [int(x) for x in text.split(",")]
    if len(numbers) not in (3, 4, 5) or numbers[2] < 1:
        raise argparse.ArgumentTypeError(f"a VLM point is S,R,W[,seq_len[,rows]], got {text!r}")
    return VlmPoint(*numbers)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dataloader --vlm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--vlm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--point", type=parse_point, action="append", dest="points")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--target-step-ms", type=float, default=TARGET_STEP_S * 1000)
    parser.add_argument(
        "--sources-per-process",
        type=int,
        help="msd's loader.sources_per_process (default: none, msd's own partition)",
    )
    parser.add_argument("--images", type=int, default=VlmDataSpec.images, help="per source")
    parser.add_argument("--rg-images", type=int, default=VlmDataSpec.rg_images)
    parser.add_argument(
        "--real-images",
        type=Path,
        help="draw the images from the files under this folder (vlm_data.py) instead of rendering",
    )
    parser.add_argument("--max-pixels", type=int, default=MAX_PIXELS)
    parser.add_argument("--buffer-tokens", type=int, help="msd's loader.buffer_tokens")
    parser.add_argument("--buffer-bytes", type=int, help="msd's loader.buffer_bytes")
    parser.add_argument(
        "--balance-method", choices=("greedy", "karmarkar_karp", "none"), default="greedy"
    )
    parser.add_argument("--tag", default="", help="appended to each point's key")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--data-root", type=Path, default=DATA_ROOT)
    parser.add_argument("--report-only", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stem = "dataloader-vlm-quick" if args.quick else "dataloader-vlm"
    if args.report_only:
        results = json.loads((args.out / f"{stem}.json").read_text())
        print("wrote " + ", ".join(map(str, write(results, args.out, stem))))
        return
    settings = Settings(
        steps=args.steps or (QUICK_STEPS if args.quick else STEPS),
        warmup=args.warmup if not args.quick else min(args.warmup, 4),
        target_step_s=args.target_step_ms / 1000,
        cost=VLM_COST,
        sources_per_process=args.sources_per_process,
        timeout_s=args.timeout_s,
    )
    vision = Vision(max_pixels=args.max_pixels)
    MSD_OPTIONS.update(
        buffer_tokens=args.buffer_tokens,
        buffer_bytes=args.buffer_bytes,
        balance_method=args.balance_method,
    )
    results: dict[str, Any] = {
        "machine": machine(),
        "settings": {
            "steps": settings.steps,
            "warmup": settings.warmup,
            "target_step_s": settings.target_step_s,
            "cost": VLM_COST.__dict__,
            "sources_per_process": settings.sources_per_process,
            "seed": settings.seed,
            "weights": "equal (1.0 per source)",
        },
        "points": [],
    }
    path = args.out / f"{stem}.json"
    if not args.quick and path.exists():
        results["points"] = json.loads(path.read_text()).get("points", [])
    for point in args.points or (quick_points() if args.quick else vlm_points()):
        spec = VlmDataSpec(
            point.sources,
            args.images,
            args.rg_images,
            seed=settings.seed,
            real_images=str(args.real_images or ""),
        )
        entry = run_point(point, settings, spec, vision, tuple(args.systems), args.data_root)
        if args.tag:
            entry["key"] += f"-{args.tag}"
        results["points"] = [e for e in results["points"] if e["key"] != entry["key"]] + [entry]
        write(results, args.out, stem)
    print("wrote " + ", ".join(map(str, write(results, args.out, stem))))
    print((args.out / f"{stem}.md").read_text())
