"""A real Azure Blob Storage emulator for the tests: Azurite's blob service (Node.js, installed by
``tests/stores/up.sh`` into ``tests/stores/azurite``, pinned by its package-lock.json) on
loopback, its objects on disk so that it can be stopped and started again with them.

Azurite checks credentials like Azure does: its development account ``devstoreaccount1`` and
that account's published key; a wrong key, a request without one, or a SAS it did not sign is
refused (403).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import tempfile
import urllib.parse
from pathlib import Path

import pyarrow.fs as pafs

from tests.stores import process

KIND = "azure"
SCHEME = "az://"
# Azurite's development account and its key, the same on every machine (Microsoft publishes
# them for the emulator; they open nothing elsewhere).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
FOLDER = Path(__file__).parent / "azurite"
AZURITE = FOLDER / "node_modules" / ".bin" / "azurite-blob"
SAS_VERSION = "2021-08-06"


def missing() -> str | None:
    """Why the emulator cannot start here (None: it can)."""
    if not AZURITE.exists():
        return f"Azurite is not installed in {FOLDER}/node_modules"
    return None


def start(
    port: int | None = None, log_dir: Path | None = None, data_dir: Path | None = None
) -> process.Emulator:
    """Start Azurite's blob service on ``port`` (a free one if None), its objects in
    ``data_dir``."""
    port = port or process.free_port()
    root = Path(log_dir or tempfile.mkdtemp(prefix="msd-azure-"))
    data = Path(data_dir or root / "data")
    argv = [str(AZURITE), "--blobHost", process.HOST, "--blobPort", str(port)]
    argv += ["--disableTelemetry", "--skipApiVersionCheck", "--loose", "--location", str(data)]
    return process.start(argv, port, root / "azurite.log", data)


def filesystem(emulator: process.Emulator) -> pafs.AzureFileSystem:
    """A pyarrow filesystem of the emulator, signed with the account's key."""
    authority = emulator.endpoint.removeprefix("http://")
    return pafs.AzureFileSystem(
        ACCOUNT,
        account_key=KEY,
        blob_storage_authority=authority,
        dfs_storage_authority=authority,
        blob_storage_scheme="http",
        dfs_storage_scheme="http",
    )


def env(emulator: process.Emulator, home: Path) -> dict[str, str | None]:
    """The environment of a test (None: unset): the development account and its key."""
    return {
        "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": KEY,
        "AZURE_STORAGE_SAS_TOKEN": None,
        "AZURE_CLIENT_ID": None,
        "AZURE_CONFIG_DIR": str(home / "azure"),
    }


def account_sas(permissions: str = "rl", key: str = KEY) -> str:
    """An account SAS token for the blob service's containers and objects, signed with ``key``
    (`KEY`: one Azurite accepts), valid for an hour."""
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    fields = {
        "sv": SAS_VERSION,
        "ss": "b",
        "srt": "co",
        "sp": permissions,
        "se": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "spr": "https,http",
    }
    signed = [ACCOUNT, fields["sp"], fields["ss"], fields["srt"], "", fields["se"], ""]
    signed += [fields["spr"], fields["sv"], ""]
    digest = hmac.new(base64.b64decode(key), ("\n".join(signed) + "\n").encode(), hashlib.sha256)
    fields["sig"] = base64.b64encode(digest.digest()).decode()
    return urllib.parse.urlencode(fields)
