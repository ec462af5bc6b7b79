"""Real emulators of Google Cloud Storage (gcp-storage-emulator) and Azure Blob Storage (Azurite)
for the tests, started on loopback by ``tests/stores/up.sh`` (shared through state files) or by
the fixtures themselves; ``tests/s3`` is S3's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from tests.stores.process import Emulator


@dataclass
class Bucket:
    """One test's bucket (an Azure container) on an emulator, with a pyarrow filesystem of it."""

    kind: str  # "gcs", "azure"
    scheme: str  # "gs://", "az://"
    emulator: Emulator
    name: str
    fs: pafs.FileSystem

    def url(self, prefix: str = "") -> str:
        """``SCHEME://BUCKET/PREFIX`` (``SCHEME://BUCKET`` for no prefix)."""
        prefix = prefix.strip("/")
        return f"{self.scheme}{self.name}/{prefix}" if prefix else f"{self.scheme}{self.name}"

    def path(self, url: str) -> str:
        """``bucket/key`` of a URL of this bucket: the path the filesystem takes."""
        return url.removeprefix(self.scheme)

    def upload(self, local_dir: Path, prefix: str = "") -> str:
        """Copy every file under ``local_dir`` to ``url(prefix)``, keeping their paths relative
        to ``local_dir``; returns that URL."""
        url = self.url(prefix)
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                key = f"{self.path(url)}/{path.relative_to(local_dir).as_posix()}"
                with self.fs.open_output_stream(key, compression=None) as out:
                    out.write(path.read_bytes())
        return url

    @property
    def endpoint_url(self) -> str:
        """What a source's ``endpoint_url`` says to reach the emulator."""
        return self.emulator.endpoint
