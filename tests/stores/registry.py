"""The emulators by kind, and the shared ones: ``python -m tests.stores up|down`` (what
tests/stores/up.sh and down.sh run) starts the GCS and Azure emulators detached, their state
files in ``$MSD_STORES_STATE`` (else /tmp/msd-stores), or stops them. Idempotent: an emulator
that answers is left alone."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from pathlib import Path

from tests.stores import azure, gcs, process

STATE_ENV = "MSD_STORES_STATE"
DEFAULT_STATE_DIR = Path("/tmp/msd-stores")
KINDS = {"gcs": gcs, "azure": azure}

log = logging.getLogger("tests.stores")


def state_file(kind: str) -> Path:
    """Where the shared emulator of ``kind`` is described."""
    return Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR) / f"{kind}.json"


def up(kind: str) -> None:
    running = process.load(state_file(kind))
    if running is not None and running.answers():
        log.info("%s emulator already answers on %s", kind, running.endpoint)
        return
    if running is not None:
        running.stop()
    why = KINDS[kind].missing()
    if why is not None:
        raise SystemExit(f"cannot start the {kind} emulator: {why}")
    root = state_file(kind).parent / kind
    shutil.rmtree(root / "data", ignore_errors=True)  # a fresh emulator starts empty
    emulator = KINDS[kind].start(log_dir=root, data_dir=root / "data")
    process.save(emulator, state_file(kind))
    log.info("%s emulator answers on %s (log: %s)", kind, emulator.endpoint, emulator.log)


def down(kind: str) -> None:
    running = process.load(state_file(kind))
    if running is not None:
        running.stop()
    state_file(kind).unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="python -m tests.stores")
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("kinds", nargs="*", metavar="{gcs,azure}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown emulator {', '.join(unknown)}; use gcs or azure")
    for kind in args.kinds or KINDS:
        (up if args.action == "up" else down)(kind)
