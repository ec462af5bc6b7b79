"""A real GCS emulator for the tests: gcp-storage-emulator (pure Python, from the dev extra) on
loopback, its objects on disk so that it can be stopped and started again with them.

It checks no credentials: msd reaches it signing nothing (an emulator endpoint without
credentials found), and the tests of refused credentials use the real client's own failures.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import pyarrow.fs as pafs

from tests.stores import process

KIND = "gcs"
SCHEME = "gs://"
MODULE = "gcp_storage_emulator"
PROJECT = "msd-tests"


def missing() -> str | None:
    """Why the emulator cannot start here (None: it can)."""
    if importlib.util.find_spec(MODULE) is None:
        return f"{MODULE} is not importable: pip install -e '.[dev]'"
    return None


def start(
    port: int | None = None, log_dir: Path | None = None, data_dir: Path | None = None
) -> process.Emulator:
    """Start the emulator on ``port`` (a free one if None), keeping objects in ``data_dir``."""
    port = port or process.free_port()
    root = Path(log_dir or tempfile.mkdtemp(prefix="msd-gcs-"))
    data = Path(data_dir or root / "data")
    argv = [sys.executable, "-m", MODULE, "-d", str(data), "start"]
    argv += ["--host", process.HOST, "--port", str(port), "--quiet"]
    return process.start(argv, port, root / "gcs.log", data)


def filesystem(emulator: process.Emulator) -> pafs.GcsFileSystem:
    """A pyarrow filesystem of the emulator (unsigned, as it checks nothing)."""
    authority = emulator.endpoint.removeprefix("http://")
    return pafs.GcsFileSystem(
        anonymous=True, endpoint_override=authority, scheme="http", project_id=PROJECT
    )


def env(emulator: process.Emulator, home: Path) -> dict[str, str | None]:
    """The environment of a test (None: unset): no Google credentials anywhere (so msd signs
    nothing), and a metadata server on loopback that nothing answers."""
    return {
        "GOOGLE_APPLICATION_CREDENTIALS": None,
        "STORAGE_EMULATOR_HOST": None,
        "CLOUDSDK_CONFIG": str(home / "gcloud"),
        "GCE_METADATA_ROOT": f"{process.HOST}:{process.free_port()}",
    }
