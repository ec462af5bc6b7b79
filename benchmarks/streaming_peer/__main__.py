"""The command line of the Streaming peer benchmark.

    python -m benchmarks.streaming_peer [--sources 8 32] [--ranks 4] [--steps 400] [--out DIR]

Needs MosaicML Streaming: run under ``.venv-peer/bin/python`` (``setup_peer.sh`` builds it);
run under another interpreter that lacks Streaming, it re-runs itself under ``.venv-peer`` when
that exists. Writes ``streaming_peer.json`` and ``streaming_peer.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
SETUP = "bash benchmarks/streaming_peer/setup_peer.sh"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.streaming_peer import __doc__ as package_doc

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.streaming_peer",
        description=package_doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sources", type=int, nargs="+", default=[8, 32], help="S per point")
    parser.add_argument("--ranks", type=int, default=4, help="R trainer ranks")
    parser.add_argument("--workers", type=int, default=2, help="Streaming's workers per rank")
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--rows", type=int, default=2, help="rows of seq_len per rank per step")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rg-bytes", type=int, default=2 * 2**20, help="Parquet row group")
    parser.add_argument(
        "--shard-bytes", type=int, default=0, help="MDS shard size limit (0: the row-group size)"
    )
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=("streaming", "msd", "msd-local"),
        help="default: streaming msd; msd-local: msd on the Parquet on local disk (a reference)",
    )
    parser.add_argument("--target-step-ms", type=float, default=100.0)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add this run's points to the existing results as extra runs (repeats, references)",
    )
    parser.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json")
    return parser.parse_args(argv)


def ensure_streaming(argv: list[str] | None) -> None:
    """Return if Streaming imports here; else re-run under .venv-peer, or exit saying how."""
    if importlib.util.find_spec("streaming") is not None:
        return
    if PEER_PYTHON.exists() and Path(sys.executable) != PEER_PYTHON:
        args = sys.argv[1:] if argv is None else argv
        os.execv(PEER_PYTHON, [str(PEER_PYTHON), "-m", "benchmarks.streaming_peer", *args])
    sys.exit(f"MosaicML Streaming is not installed here; build .venv-peer first: {SETUP}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report_only:
        from benchmarks.streaming_peer.report import rewrite

        print(rewrite(args.out))
        return
    ensure_streaming(argv)
    from benchmarks.streaming_peer.bench import run

    run(args)


if __name__ == "__main__":
    main()
