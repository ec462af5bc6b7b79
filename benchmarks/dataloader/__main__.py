"""The command line of the benchmark.

    python -m benchmarks.dataloader [--quick] [--out DIR] [--point S,R,W,L[,RG[,ROWS]]] ...
    python -m benchmarks.dataloader --vlm [--quick] [--point S,R,W[,L[,ROWS]]] ...  (vlm.py)
    python -m benchmarks.dataloader --video [--quick] [--point S,R,W[,L[,ROWS]]] ...  (video.py)

Runs the sweep (or ``--quick``'s two small points, or the ``--point``s given), baseline then msd
at each point, and writes ``dataloader.json`` / ``.md`` / ``-*.png`` to ``--out``
(``dataloader-quick.*`` with ``--quick``). A full run merges its points into an existing
``dataloader.json``, replacing points measured again.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.dataloader import __doc__ as PACKAGE_DOC
from benchmarks.dataloader.config import Point, Settings, quick_points, sweep_points
from benchmarks.dataloader.cost import CostModel
from benchmarks.dataloader.data import DATA_ROOT, ROOT
from benchmarks.dataloader.msd_run import key_supported
from benchmarks.dataloader.report import machine, write
from benchmarks.dataloader.sweep import SYSTEMS, run_point

QUICK_STEPS = 40


def parse_point(text: str) -> Point:
    """``S,R,W,seq_len[,rg_bytes[,rows]]``, e.g. ``256,8,2,16384``."""
    numbers = [int(x) for x in text.split(",")]
    if len(numbers) >= 3 and numbers[2] < 1:
        raise argparse.ArgumentTypeError(f"W (DataLoader workers per rank) must be >= 1: {text!r}")
    if len(numbers) not in (4, 5, 6):
        raise argparse.ArgumentTypeError(
            f"a point is S,R,W,seq_len[,rg_bytes[,rows]], got {text!r}"
        )
    return Point(*numbers)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dataloader",
        description=PACKAGE_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="two small points (a smoke check)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--point",
        type=parse_point,
        action="append",
        dest="points",
        help="run this point only: S,R,W,seq_len[,rg_bytes[,rows]] (repeatable)",
    )
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--steps", type=int, help="steps per run (default 100; --quick 40)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--sources-per-process",
        type=int,
        default=64,
        help="msd's loader.sources_per_process; 0 leaves the key out",
    )
    parser.add_argument("--max-memory-gib", type=float, default=18.0)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    parser.add_argument(
        "--target-step-ms",
        type=float,
        default=100.0,
        help="an average rank's simulated compute per step",
    )
    parser.add_argument("--attn", type=float, default=CostModel.attn)
    parser.add_argument("--lin", type=float, default=CostModel.lin)
    parser.add_argument(
        "--baseline-sharing-strategy",
        choices=("file_descriptor", "file_system"),
        default="file_descriptor",
        help="torch.multiprocessing sharing strategy of the baseline (torch's default first)",
    )
    parser.add_argument("--data-root", type=Path, default=DATA_ROOT)
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the .md and plots from the .json"
    )
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(
        steps=args.steps or (QUICK_STEPS if args.quick else Settings.steps),
        warmup=args.warmup,
        target_step_s=args.target_step_ms / 1000,
        cost=CostModel(args.attn, args.lin),
        sources_per_process=args.sources_per_process or None,
        max_memory_gib=args.max_memory_gib,
        timeout_s=args.timeout_s,
        sharing_strategy=args.baseline_sharing_strategy,
    )


def previous_points(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    points: list[dict[str, Any]] = json.loads(path.read_text()).get("points", [])
    return points


def main(argv: list[str] | None = None) -> None:
    given = sys.argv[1:] if argv is None else argv
    if "--vlm" in given:  # image-text sources: vlm.py
        from benchmarks.dataloader.vlm import main as vlm_main

        vlm_main(argv)
        return
    if "--video" in given:  # video sources: video.py
        from benchmarks.dataloader.video import main as video_main

        video_main(argv)
        return
    args = parse_args(argv)
    stem = "dataloader-quick" if args.quick else "dataloader"
    if args.report_only:
        report(json.loads((args.out / f"{stem}.json").read_text()), args.out, stem)
        return
    settings = settings_of(args)
    with_key = settings.sources_per_process is not None and key_supported()
    if settings.sources_per_process is not None and not with_key:
        print(
            "note: this msd does not know loader.sources_per_process yet; msd runs leave it "
            "out (one loader process per source) and skip points past 64 sources",
            flush=True,
        )
        settings = replace(settings, sources_per_process=None)
    results: dict[str, Any] = {
        "machine": machine(),
        "settings": _settings_json(settings),
        "sources_per_process_supported": with_key,
        "points": [] if args.quick else previous_points(args.out / f"{stem}.json"),
    }
    for point in args.points or (quick_points() if args.quick else sweep_points()):
        entry = run_point(point, settings, with_key, tuple(args.systems), args.data_root)
        results["points"] = [e for e in results["points"] if e["key"] != entry["key"]] + [entry]
        write(results, args.out, stem)  # after every point: a stopped sweep keeps what it did
    report(results, args.out, stem)


def report(results: dict[str, Any], out: Path, stem: str) -> None:
    print("wrote " + ", ".join(str(p) for p in write(results, out, stem)))
    print((out / f"{stem}.md").read_text())


def _settings_json(settings: Settings) -> dict[str, Any]:
    return {
        "steps": settings.steps,
        "warmup": settings.warmup,
        "target_step_s": settings.target_step_s,
        "cost": {"attn": settings.cost.attn, "lin": settings.cost.lin},
        "sources_per_process": settings.sources_per_process,
        "max_memory_gib": settings.max_memory_gib,
        "seed": settings.seed,
        "weights": "equal (1.0 per source)",
    }


if __name__ == "__main__":
    main()
