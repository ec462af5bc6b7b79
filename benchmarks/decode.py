"""Decode throughput: images per loader CPU-second in msd's Source Loaders, against one process
decoding the same files with the same library, in the same run; and the trainers' data wait
at steady state with enough loaders.

    python -m benchmarks.decode [--samples 96] [--max-pixels 1003520] [--out benchmarks/results]

Data: ``msd.synth.vlm.write_vlm_sources`` (``--samples`` samples per source, 2 files each) in a
temporary folder: WebDataset captions, Parquet captions (Hugging Face Image struct) and
interleaved documents (1-5 images each), 32 to 2,048 px, JPEG / PNG / WebP. The geometry is
``recipes/vlm.yaml``'s (Qwen2-VL's defaults, ``max_pixels`` 1,003,520: at most 1,280 tokens an
image).

1. Baseline, in this process: every image's bytes are read from the same files (tar members by
   ``msd.sources.webdataset.index_tar`` + ``read_member``, Parquet cells with pyarrow) and
   decoded with ``msd.sources.vision.decode`` (Pillow open, a JPEG at full size as
   ``vision.decode: exact`` has it, EXIF, RGB, bicubic resize, patchify). CPU seconds are
   ``time.process_time()`` (every thread of the process); the read and the decode are timed
   apart. Also a per-stage profile of the same images
   (open + pixel decode, upright + RGB, resize, patchify), to show where the time goes.
2. msd, one epoch: the three image sources only (``repeat: false``, ``loaders: 1`` each), DP 2,
   the demo trainer at ``step_ms`` 1 so the loaders are the bottleneck. Images handled are the
   summary's ``images + skipped_images`` (every image of every sample: the ones left out were
   decoded too, or failed to). Loader CPU: this process starts ``msd launch`` itself and polls,
   every ``POLL_S``, each loader process (a child of the launcher whose command line is
   ``-m msd.roles loader``) for its ``psutil`` ``cpu_times`` (user + system, every thread,
   plus any children it reaped), keeping the last value read before it exits. A loader's
   counter is cumulative from its fork (0 at its ``create_time``), so nothing before the first
   poll is lost; only what it uses in its last ``POLL_S`` (exiting, once it has sent
   everything) is. That total includes the loader's start-up (interpreter, imports, recipe,
   opening the files and indexing the shards); its CPU at the moment its log says
   ``ready in`` (interpolated between readings) is taken as that, and a second rate leaves it
   out. The loaders also read, tokenize, fuse and send the patches (ZeroMQ, one raw buffer a
   sample) and report to the Planner: the baseline does only the read and the decode.
3. Steady state: the same sources repeated (``repeat: true``) for ``--steady-steps`` steps with
   ``--steady-loaders`` loaders each; the demo trainer's ``step_ms`` is set so that a step
   takes ``--pace`` × the loader-bound step time of run 2 (the demo trainer sleeps
   ``step_ms × cost / (rows × seq_len²)``, so the mean cost fraction of run 2's steps converts
   one into the other). Reported: data-wait p50 / p99 over every rank's steps after the first
   ``--warmup`` (from ``JOB/trainer/rank-R.jsonl``'s ``wait_ms``; the summary's p99 covers
   start-up), and the summary's whole-run figures beside them.
4. ``vision.decode: exact`` against ``fast`` (``benchmarks.decode_modes``): images per CPU-second
   of ``decode`` in each mode, taking turns image by image, on the demo sources' images and on
   one detailed JPEG of each of 640×480, 1920×1080, 4032×3024 and 6000×4000 (resized by the
   benchmark's ``max_pixels`` and by 256 tokens' 200,704), with the mean |difference| of their
   pixels.

Targets (the issue's): msd's images per loader CPU-second ≥ 70 % of the baseline's; data-wait
p99 < 5 ms at steady state.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq

from benchmarks import decode_modes
from benchmarks.quickstart import machine
from msd.sources.vision import (
    FORMATS,
    RESAMPLE,
    DecodedImage,
    ImageGeometry,
    _to_rgb,
    decode,
    fit,
    patchify,
)
from msd.sources.webdataset import index_tar, read_member
from msd.synth.vlm import INTERLEAVED_SOURCE, PARQUET_SOURCE, WDS_SOURCE, write_vlm_sources

ROOT = Path(__file__).resolve().parents[1]
MAX_PIXELS = 1_003_520  # recipes/vlm.yaml: 1,280 merged tokens at most an image
IMAGE_TOKEN = 151655
SEQ_LEN = 4096
ROWS_PER_RANK = 1
DP = 2
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
POLL_S = 0.05
DISCOVER_S = 0.1
TARGET_RATIO = 0.70
TARGET_P99_MS = 5.0


# The math ------------------------------------------------------------------------------------


def rate(images: int, cpu_s: float) -> float:
    """Images per CPU-second (0 when no CPU was measured)."""
    return images / cpu_s if cpu_s > 0 else 0.0


def ratio(measured: float, baseline: float) -> float:
    """``measured / baseline``; NaN without a baseline."""
    return measured / baseline if baseline > 0 else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation, NumPy's default); NaN for no values."""
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def wait_stats(waits: Sequence[float]) -> dict[str, float | int]:
    """p50 / p99 / mean / max of data waits (ms), and how many there were."""
    arr = np.asarray(waits, dtype=np.float64)
    return {
        "n": len(arr),
        "p50_ms": round(percentile(arr, 50), 3),
        "p99_ms": round(percentile(arr, 99), 3),
        "mean_ms": round(float(arr.mean()), 3) if len(arr) else math.nan,
        "max_ms": round(float(arr.max()), 3) if len(arr) else math.nan,
    }


def steady_waits(records: dict[int, list[dict[str, Any]]], warmup: int) -> list[float]:
    """Every rank's ``wait_ms`` for steps at or after ``warmup`` (rank → its log records)."""
    return [r["wait_ms"] for rs in records.values() for r in rs if r["step"] >= warmup]


def pace_step_ms(target_step_ms: float, costs: Sequence[float], rows: int, seq_len: int) -> float:
    """The demo trainer's ``step_ms`` for steps of ``target_step_ms`` on average: it sleeps
    ``step_ms × cost / (rows × seq_len²)`` a step, so divide by the mean cost fraction."""
    full = rows * float(seq_len) ** 2
    fraction = float(np.mean(costs)) / full if len(costs) else 1.0
    return target_step_ms / max(fraction, 1e-6)


def cpu_total(samples: dict[int, float]) -> float:
    """The sum of each process's last CPU reading (pid → CPU seconds)."""
    return float(sum(samples.values()))


def cpu_at(readings: Sequence[tuple[float, float]], when: float) -> float:
    """CPU seconds at ``when`` from ``(time, CPU seconds)`` readings in time order, linearly
    interpolated; the first (last) reading before (after) them; 0 without readings."""
    if not readings:
        return 0.0
    times = [t for t, _ in readings]
    values = [c for _, c in readings]
    return float(np.interp(when, times, values))


_READY = re.compile(r"^(\S+ \S+),(\d{3}) .*loader (\S+) \(\d+ sources?\) ready in")


def ready_times(log_text: str) -> dict[str, float]:
    """loader name → the unix time its log says it was ready (the last such line)."""
    found = {}
    for line in log_text.splitlines():
        m = _READY.match(line)
        if m:
            stamp = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S"))
            found[m[3]] = stamp + int(m[2]) / 1000
    return found


# The data ------------------------------------------------------------------------------------


def make_data(root: Path, samples: int, seed: int = 0) -> dict[str, Any]:
    written = write_vlm_sources(root, seed=seed, samples=samples, files_per_source=2)
    return {s.name: {"samples": s.samples, "images": s.images, "bytes": s.bytes} for s in written}


def image_bytes(root: Path) -> Iterator[bytes | None]:
    """Every image's bytes, from the files the job reads: tar members, then Parquet cells."""
    for path in sorted((root / WDS_SOURCE).glob("*.tar")):
        for sample in index_tar(path).samples:
            for ext in IMAGE_EXTS:
                if ext in sample.members:
                    offset, size = sample.members[ext]
                    yield read_member(path, offset, size)
    for folder, column in ((PARQUET_SOURCE, "image"), (INTERLEAVED_SOURCE, "images")):
        for path in sorted((root / folder).glob("*.parquet")):
            for cell in pq.read_table(path, columns=[column]).column(column).to_pylist():
                for struct in cell if isinstance(cell, list) else [cell]:
                    yield None if struct is None else struct["bytes"]


# 1. The baseline -----------------------------------------------------------------------------


def baseline(root: Path, geometry: ImageGeometry) -> dict[str, Any]:
    """Read and decode every image in this process; images and CPU seconds."""
    started = time.process_time()
    blobs = list(image_bytes(root))
    read_s = time.process_time() - started
    started = time.process_time()
    decoded = [decode(b or b"", geometry) for b in blobs]
    decode_s = time.process_time() - started
    ok = [d for d in decoded if isinstance(d, DecodedImage)]
    return {
        "images": len(blobs),
        "decoded": len(ok),
        "failed": len(blobs) - len(ok),
        "patches": sum(len(d.patches) for d in ok),
        "patch_bytes": sum(d.patches.nbytes for d in ok),
        "image_bytes": sum(len(b or b"") for b in blobs),
        "read_cpu_s": round(read_s, 4),
        "decode_cpu_s": round(decode_s, 4),
        "cpu_s": round(read_s + decode_s, 4),
        "images_per_cpu_s": round(rate(len(blobs), read_s + decode_s), 2),
        "images_per_decode_cpu_s": round(rate(len(blobs), decode_s), 2),
    }


STAGES = ("open_and_decode", "upright_rgb", "resize", "patchify")


def stage_profile(root: Path, geometry: ImageGeometry) -> dict[str, float]:
    """CPU seconds of each stage of ``msd.sources.vision.decode``, redone step by step on
    the same images (the checks against bombs and odd shapes left out: they cost nothing)."""
    from PIL import Image, ImageOps

    spent = dict.fromkeys(STAGES, 0.0)
    for data in image_bytes(root):
        if not data:
            continue
        t0 = time.process_time()
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            swapped = image.getexif().get(0x0112) in (5, 6, 7, 8)
            width, height = image.size
            if swapped:
                width, height = height, width
            h, w = fit(height, width, geometry)
            if image.format == "JPEG" and geometry.decode == "fast":
                image.draft("RGB", (h, w) if swapped else (w, h))
            image.load()
            t1 = time.process_time()
            rgb = _to_rgb(ImageOps.exif_transpose(image))
            t2 = time.process_time()
            rgb = rgb.resize((w, h), RESAMPLE)
            t3 = time.process_time()
        patchify(np.asarray(rgb, dtype=np.uint8), geometry)
        t4 = time.process_time()
        for name, dt in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[name] += dt
    return {k: round(v, 4) for k, v in spent.items()}


# 2./3. Jobs ----------------------------------------------------------------------------------


def recipe(
    data: Path,
    name: str,
    loaders: int | str,
    step_ms: float,
    steps: int | None = None,
    dp: int = DP,
    max_pixels: int = MAX_PIXELS,
) -> dict[str, Any]:
    """The three image sources; one epoch (``steps`` None) or repeated for ``steps``."""
    repeat = steps is not None

    def source(src: str, glob: str, **extra: Any) -> dict[str, Any]:
        return {
            "name": src,
            "path": str(data / glob),
            "weight": 1 / 3,
            "repeat": repeat,
            "loaders": loaders,
            **extra,
        }

    doc: dict[str, Any] = {
        "name": name,
        "seed": 7,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": dp * ROWS_PER_RANK * SEQ_LEN,
        "distribute": {"dp": dp},
        "vision": {"max_pixels": max_pixels, "image_token_id": IMAGE_TOKEN},
        "sources": [
            source("captions-wds", f"{WDS_SOURCE}/*.tar", format="webdataset", text_column="txt"),
            source(
                "captions-parquet",
                f"{PARQUET_SOURCE}/*.parquet",
                text_column="text",
                image_column="image",
            ),
            source(
                "interleaved",
                f"{INTERLEAVED_SOURCE}/*.parquet",
                text_column="text",
                image_column="images",
            ),
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": step_ms}},
    }
    if steps is not None:
        doc["steps"] = steps
    return doc


@dataclass
class LoaderCpu:
    """Each loader process's CPU readings, ``(unix time, CPU seconds)``, and their names."""

    readings: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    @property
    def cpu_s(self) -> dict[int, float]:
        """pid → its last reading."""
        return {pid: r[-1][1] for pid, r in self.readings.items() if r}

    def total(self) -> float:
        return cpu_total(self.cpu_s)

    def at(self, pid: int, when: float) -> float:
        """The process's CPU seconds at ``when`` (interpolated between readings)."""
        return cpu_at(self.readings.get(pid, []), when)


def _is_loader(proc: psutil.Process) -> str | None:
    """The loader's ``--name`` if the process is a loader, else None."""
    argv = proc.cmdline()
    if "msd.roles" not in argv or "loader" not in argv:
        return None
    return argv[argv.index("--name") + 1] if "--name" in argv else "?"


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def launch(
    workdir: Path, doc: dict[str, Any], timeout_s: float = 600
) -> tuple[Path, dict, LoaderCpu]:
    """``msd launch`` the recipe to its end, polling its loaders' CPU; job folder, summary."""
    import yaml

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MSD_CACHE_DIR": str(workdir / "cache"),
    }
    launcher = subprocess.Popen(
        [sys.executable, "-m", "msd.cli", "launch", f"{doc['name']}.yaml", "--json"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = LoaderCpu()
    tracked: dict[int, psutil.Process] = {}
    parent = psutil.Process(launcher.pid)
    deadline = time.monotonic() + timeout_s
    next_discover = 0.0
    try:
        while launcher.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"msd launch {doc['name']} ran past {timeout_s} s")
            if time.monotonic() >= next_discover:
                next_discover = time.monotonic() + DISCOVER_S
                try:
                    children = parent.children(recursive=True)
                except psutil.NoSuchProcess:
                    children = []
                for child in children:
                    if child.pid in tracked or child.pid in seen.names:
                        continue
                    try:
                        name = _is_loader(child)
                        born = child.create_time()
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
                    if name is not None:
                        tracked[child.pid], seen.names[child.pid] = child, name
                        # Its counter is 0 when it is created: a reading before the first.
                        seen.readings[child.pid] = [(born, 0.0)]
            for pid, proc in list(tracked.items()):
                try:
                    seen.readings.setdefault(pid, []).append((time.time(), _cpu(proc)))
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    del tracked[pid]  # exited: its last reading stands
            time.sleep(POLL_S)
        out, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    if launcher.returncode != 0:
        raise RuntimeError(f"msd launch {doc['name']} failed:\n{out}{err}")
    summary = json.loads(out[out.index("{") :])
    return Path(summary["job"]), summary, seen


def rank_logs(job: Path) -> dict[int, list[dict[str, Any]]]:
    """rank → its ``JOB/trainer/rank-R.jsonl`` records."""
    found = {}
    for path in sorted((job / "trainer").glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        found[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return found


def startup_cpu(job: Path, cpu: LoaderCpu) -> dict[str, float]:
    """loader name → CPU seconds it had used when its log said it was ready (interpreter,
    imports, recipe, opening its sources and indexing shards: before it reads a row)."""
    ready: dict[str, float] = {}
    for log in (job / "logs").glob("loader-*.log"):
        ready.update(ready_times(log.read_text(errors="replace")))
    return {
        cpu.names[pid]: round(cpu.at(pid, ready[cpu.names[pid]]), 4)
        for pid in cpu.readings
        if cpu.names[pid] in ready
    }


def step_interval_ms(records: dict[int, list[dict[str, Any]]], first: int = 1) -> float:
    """Mean time between rank 0's steps from step ``first`` on (its log's ``time``), in ms."""
    times = sorted(r["time"] for r in records.get(0, []) if r["step"] >= first)
    if len(times) < 2:
        return math.nan
    return 1000 * (times[-1] - times[0]) / (len(times) - 1)


def msd_throughput(workdir: Path, data: Path, max_pixels: int) -> dict[str, Any]:
    """Run 2: one loader-bound epoch; images per loader CPU-second."""
    doc = recipe(data, "decode-epoch", loaders=1, step_ms=1, max_pixels=max_pixels)
    started = time.monotonic()
    job, summary, cpu = launch(workdir, doc)
    wall = time.monotonic() - started
    images = summary["images"] + summary["skipped_images"]
    loader_cpu = cpu.total()
    startup = startup_cpu(job, cpu)
    working = max(loader_cpu - sum(startup.values()), 1e-9)
    logs = rank_logs(job)
    return {
        "job": str(job),
        "loaders": len(cpu.readings),
        "loader_cpu_s": {cpu.names[p]: round(s, 4) for p, s in cpu.cpu_s.items()},
        "loader_startup_cpu_s": startup,
        "steps": summary["steps"],
        "elapsed_s": summary["elapsed_s"],
        "wall_s": round(wall, 2),
        "images": summary["images"],
        "skipped_images": summary["skipped_images"],
        "images_handled": images,
        "cpu_s": round(loader_cpu, 4),
        "images_per_cpu_s": round(rate(images, loader_cpu), 2),
        "cpu_s_less_startup": round(working, 4),
        "images_per_cpu_s_less_startup": round(rate(images, working), 2),
        "step_ms": round(step_interval_ms(logs), 2),
        "wait_p50_ms": summary["wait_p50_ms"],
        "wait_p99_ms": summary["wait_p99_ms"],
        "costs": [r["cost"] for rs in logs.values() for r in rs],
    }


def steady_state(
    workdir: Path,
    data: Path,
    max_pixels: int,
    loaders: int | str,
    steps: int,
    step_ms: float,
    warmup: int,
) -> dict[str, Any]:
    """Run 3: a pace the loaders sustain; the trainers' data wait after warm-up."""
    doc = recipe(
        data, "decode-steady", loaders=loaders, step_ms=step_ms, steps=steps, max_pixels=max_pixels
    )
    job, summary, cpu = launch(workdir, doc)
    logs = rank_logs(job)
    stats = wait_stats(steady_waits(logs, warmup))
    return {
        "job": str(job),
        "loaders_per_source": loaders,
        "loader_processes": len(cpu.cpu_s),
        "demo_step_ms": round(step_ms, 2),
        "steps": summary["steps"],
        "elapsed_s": summary["elapsed_s"],
        "measured_step_ms": round(step_interval_ms(logs, warmup), 2),
        "images": summary["images"],
        "warmup_steps": warmup,
        "wait_after_warmup": stats,
        "summary_wait_p50_ms": summary["wait_p50_ms"],
        "summary_wait_p99_ms": summary["wait_p99_ms"],
        "loader_cpu_s": round(cpu.total(), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=96, help="samples per source")
    parser.add_argument("--max-pixels", type=int, default=MAX_PIXELS)
    parser.add_argument("--steady-loaders", default="2", help="loaders per source, or auto")
    parser.add_argument("--steady-steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--pace", type=float, default=2.5, help="steady step time ÷ loader-bound step time"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    loaders: int | str = args.steady_loaders
    if loaders != "auto":
        loaders = int(loaders)
    geometry = ImageGeometry(max_pixels=args.max_pixels)
    load_before = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="msd-decode-") as tmp:
        workdir = args.workdir or Path(tmp)
        data = workdir / "data"
        sources = make_data(data, args.samples)
        base = baseline(data, geometry)
        stages = stage_profile(data, geometry)
        modes = {
            "demo": decode_modes.on_images(list(image_bytes(data)), geometry),
            "sizes": decode_modes.on_sizes(
                [geometry, ImageGeometry(max_pixels=decode_modes.SMALL_MAX_PIXELS)]
            ),
        }
        epoch = msd_throughput(workdir / "epoch", data, args.max_pixels)
        costs = epoch.pop("costs")
        step_ms = pace_step_ms(args.pace * epoch["step_ms"], costs, ROWS_PER_RANK, SEQ_LEN)
        steady = steady_state(
            workdir / "steady",
            data,
            args.max_pixels,
            loaders,
            args.steady_steps,
            step_ms,
            args.warmup,
        )

    epoch["ratio_to_baseline"] = round(
        ratio(epoch["images_per_cpu_s"], base["images_per_cpu_s"]), 3
    )
    epoch["ratio_to_baseline_less_startup"] = round(
        ratio(epoch["images_per_cpu_s_less_startup"], base["images_per_cpu_s"]), 3
    )
    from PIL import __version__ as pillow

    result = {
        "machine": {
            **machine(),
            "pillow": pillow,
            # Set, every role process compiles msd from source at start-up (its start-up CPU).
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        },
        "settings": {
            "samples_per_source": args.samples,
            "max_pixels": args.max_pixels,
            "seq_len": SEQ_LEN,
            "dp": DP,
            "rows_per_rank": ROWS_PER_RANK,
            "poll_s": POLL_S,
            "steady_loaders": loaders,
            "steady_steps": args.steady_steps,
            "warmup": args.warmup,
            "pace": args.pace,
            # Other work on the machine: CPU times stretch when cores are oversubscribed.
            "load_average_1m_before_after": [
                round(load_before[0], 2),
                round(os.getloadavg()[0], 2),
            ],
        },
        "sources": sources,
        "baseline": {**base, "stages_cpu_s": stages},
        "msd": epoch,
        "steady": steady,
        "modes": modes,
        "targets": {
            "ratio": TARGET_RATIO,
            "ratio_met": epoch["ratio_to_baseline"] >= TARGET_RATIO,
            "p99_ms": TARGET_P99_MS,
            "p99_met": steady["wait_after_warmup"]["p99_ms"] < TARGET_P99_MS,
        },
    }
    print_table(result)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "decode.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written: {path}")


def print_table(r: dict[str, Any]) -> None:
    b, m, s = r["baseline"], r["msd"], r["steady"]
    w = s["wait_after_warmup"]
    print("| | images | CPU s | images / CPU s | vs baseline |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(
        f"| baseline: read + decode | {b['images']} | {b['cpu_s']:.2f} | "
        f"{b['images_per_cpu_s']:.1f} | 1.00 |"
    )
    print(
        f"| baseline: decode only | {b['images']} | {b['decode_cpu_s']:.2f} | "
        f"{b['images_per_decode_cpu_s']:.1f} | |"
    )
    print(
        f"| msd loaders ({m['loaders']}) | {m['images_handled']} | {m['cpu_s']:.2f} | "
        f"{m['images_per_cpu_s']:.1f} | {m['ratio_to_baseline']:.2f} |"
    )
    print(
        f"| msd loaders, less start-up | {m['images_handled']} | {m['cpu_s_less_startup']:.2f} | "
        f"{m['images_per_cpu_s_less_startup']:.1f} | {m['ratio_to_baseline_less_startup']:.2f} |"
    )
    print(f"stages (CPU s): {b['stages_cpu_s']}")
    print(
        f"steady: {s['loader_processes']} loaders, {s['steps']} steps of "
        f"{s['measured_step_ms']} ms; "
        f"wait after step {s['warmup_steps']}: p50 {w['p50_ms']} ms, p99 {w['p99_ms']} ms "
        f"(n={w['n']}); whole run p50 {s['summary_wait_p50_ms']} p99 {s['summary_wait_p99_ms']}"
    )
    decode_modes.print_table(r["modes"], r["settings"]["max_pixels"])


if __name__ == "__main__":
    main()
