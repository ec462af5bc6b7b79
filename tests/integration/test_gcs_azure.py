"""Sources in Google Cloud Storage (``gs://``) and Azure Blob Storage (``az://``, ``abfs[s]://``)
through real emulators (gcp-storage-emulator; Azurite, credentials checked) and pyarrow's own
clients: globs list what they list locally, a job's stream from either store is the stream from
the same files on local disk, WebDataset shards read as they do locally, a missing bucket or
refused credentials fail `msd validate` with one sentence, and a store stopped mid-read is a
transient failure that a retry gets past once it is back."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from msd.recipe.schema import Source
from msd.sources import storage
from msd.sources.image_rows import ImageRowReader
from msd.sources.index import SourceIndex, open_source
from msd.sources.read import RowGroupReader
from msd.sources.storage import Store
from msd.sources.stores import azure as azure_store
from msd.sources.stores import gcs as gcs_store
from msd.synth.vlm import WDS_SOURCE, write_captions_wds
from tests.conftest import SMALL_SOURCES, run_msd, set_env
from tests.integration.test_s3 import digests, launch, recipe
from tests.stores import Bucket, registry
from tests.stores import azure as azurite

SHARDS = 2
SAMPLES = 12


@pytest.fixture(autouse=True)
def fresh_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clients built anew for each test (they read credentials from the environment, which the
    tests change), and index caches of this test's own."""
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))
    gcs_store._filesystem.cache_clear()
    azure_store._filesystem.cache_clear()
    yield
    gcs_store._filesystem.cache_clear()
    azure_store._filesystem.cache_clear()


@pytest.fixture(scope="module")
def local_epoch(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> dict[Any, str]:
    """Every rank's digests of a finite epoch of the shared small sources from local disk."""
    paths = {s.name: str(small_data / s.name / "*.parquet") for s in SMALL_SOURCES}
    job, _, err, code = launch(tmp_path_factory.mktemp("local"), recipe(paths))
    assert code == 0, err[-2000:]
    found = digests(job)
    assert len(found) > 0
    return found


def remote_recipe(bucket: Bucket, prefix: str) -> dict[str, Any]:
    doc = recipe({s.name: bucket.url(f"{prefix}/{s.name}/*.parquet") for s in SMALL_SOURCES})
    for source in doc["sources"]:
        source["endpoint_url"] = bucket.endpoint_url
    return doc


def test_a_finite_epoch_from_the_store_is_the_local_epoch(
    cloud: Bucket, small_data: Path, tmp_path: Path, local_epoch: dict[Any, str]
) -> None:
    """Every row read exactly once, in the order it is read from local disk: byte-identical
    per-rank streams; the job records the URLs it listed, with their sizes."""
    cloud.upload(small_data, "data")
    job, _, err, code = launch(tmp_path, remote_recipe(cloud, "data"))
    assert code == 0, err[-2000:]
    assert digests(job) == local_epoch
    saved = json.loads((job / "recipe.json").read_text())
    files = [f for s in saved["sources"] for f in s["files"]]
    assert len(files) == 2 * len(SMALL_SOURCES)
    assert all(f[0].startswith(cloud.url("data/")) and f[1] > 0 and f[2] > 0 for f in files)


def test_globs_match_objects_as_they_match_local_files(cloud: Bucket, tmp_path: Path) -> None:
    tree = {"a.bin": 3, "b.txt": 5, "sub/c.bin": 70_000, "sub/deeper/d.bin": 1, "subx.bin": 2}
    for rel, size in tree.items():
        (tmp_path / "t" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "t" / rel).write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    url = cloud.upload(tmp_path / "t", "tree")
    store = Store(endpoint_url=cloud.endpoint_url)
    for pattern in ("*.bin", "**/*.bin", "sub/*", "sub/**", "s*", "?.txt", "[ab].*", "sub/c.bin"):
        remote = storage.glob(f"{url}/{pattern}", store)
        local = storage.glob(str(tmp_path / "t" / pattern))
        relative = [(f.path.removeprefix(str(tmp_path / "t")), f.size) for f in local]
        assert [(f.path.removeprefix(url), f.size) for f in remote] == relative, pattern
        assert all(r == storage.stat(r.path, store) and r.mtime_ns > 0 for r in remote)
    assert storage.glob(f"{url}/sub", store) == ()  # a folder is not a file
    assert storage.glob(f"{url}/nothing/*", store) == ()
    c = f"{url}/sub/c.bin"
    assert (
        storage.read_range(c, 60_000, 20, store)
        == (tmp_path / "t/sub/c.bin").read_bytes()[60_000:60_020]
    )
    assert storage.read_bytes(c, store) == (tmp_path / "t/sub/c.bin").read_bytes()


def test_webdataset_shards_in_the_store_read_as_locally(
    cloud: Bucket, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shards = tmp_path_factory.mktemp("wds") / WDS_SOURCE
    write_captions_wds(shards, seed=0, samples=SAMPLES, shards=SHARDS)
    url = cloud.upload(shards, "shards")
    local, local_reader = _opened(Source(name="w", path=str(shards / "*.tar"), weight=1))
    remote, reader = _opened(
        Source(name="w", path=f"{url}/*.tar", weight=1, endpoint_url=cloud.endpoint_url)
    )
    assert remote.num_rows == SAMPLES and remote.problems == ()
    assert len(remote.row_groups) == len(local.row_groups) == SHARDS
    for rg, local_rg in zip(remote.row_groups, local.row_groups, strict=True):
        rows = np.array([rg.num_rows - 1, 0, 2, 2])
        assert reader.read(rg).equals(local_reader.read(local_rg))
        assert reader.read(rg, rows).equals(local_reader.read(local_rg, rows))


def _opened(source: Source) -> tuple[SourceIndex, ImageRowReader]:
    src = open_source(source, "sources[0]")
    return src, ImageRowReader(source, src, RowGroupReader())


@pytest.mark.parametrize("change", ["bucket", "credentials", "no credentials"])
def test_a_missing_bucket_or_refused_credentials_fail_validate_with_one_sentence(
    cloud: Bucket,
    small_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    cloud.upload(small_data / "web", "data/web")
    doc = remote_recipe(cloud, "data")
    doc["sources"] = doc["sources"][:1]
    source = doc["sources"][0]
    expected = {
        "bucket": f"the {storage.bucket_word(cloud.url())} 'no-such-bucket' does not exist",
        "credentials": "refused access",
        "no credentials": "credentials were found; set",
    }[change]
    if change == "bucket":
        source["path"] = source["path"].replace(cloud.name, "no-such-bucket")
    elif change == "credentials" and cloud.kind == "gcs":
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    elif change == "credentials":
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", azurite.KEY.replace("Eby8", "Xby8"))
    elif cloud.kind == "gcs":  # Google's own endpoint: asking the metadata server for a token
        del source["endpoint_url"]  # fails (on loopback, GCE_METADATA_ROOT), before any request
    else:
        monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_msd("validate", "r.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert "source 'web'" in message and expected in message, message
    assert len(message.splitlines()) == 1, message


def test_an_azure_sas_token_reads_and_anonymous_requests_are_refused(
    azure: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"0123456789")
    url = azure.upload(tmp_path / "d", "p")
    store = Store(endpoint_url=azure.endpoint_url)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", azurite.account_sas("rl"))
    assert [f.path for f in storage.glob(f"{url}/*.bin", store)] == [f"{url}/x.bin"]
    assert storage.read_range(f"{url}/x.bin", 2, 3, store) == b"234"
    with pytest.raises(storage.StoreError) as refused:
        storage.glob(f"{url}/*.bin", Store(endpoint_url=azure.endpoint_url, anonymous=True))
    assert "refused access" in str(refused.value) and not refused.value.transient


def test_an_abfs_url_names_its_account(azure: Bucket, tmp_path: Path) -> None:
    """pyarrow's URL form, the account in the URL: the same objects as ``az://``."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(b"abc")
    azure.upload(tmp_path / "d", "p")
    store = Store(endpoint_url=azure.endpoint_url)
    root = f"abfss://{azure.name}@{azurite.ACCOUNT}.dfs.core.windows.net"
    for url in (root, f"abfs://{azurite.ACCOUNT}.blob.core.windows.net/{azure.name}"):
        (found,) = storage.glob(f"{url}/p/*", store)
        assert found.path == f"{url}/p/x.bin" and found.size == 3
        assert storage.read_bytes(found.path, store) == b"abc"


@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_a_store_stopped_mid_read_is_transient_and_a_retry_reads_once_it_is_back(
    kind: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """An emulator of this test's own (its objects on disk): a file open, the emulator stopped,
    the next read fails as transient; started again, a retry reads the same bytes."""
    request.getfixturevalue(f"{kind}_server")  # skips (or fails, in CI) where none can start
    module = registry.KINDS[kind]
    emulator = module.start(log_dir=tmp_path / "emulator")
    try:
        set_env(monkeypatch, module.env(emulator, tmp_path))
        bucket = Bucket(kind, module.SCHEME, emulator, "b-stop", module.filesystem(emulator))
        bucket.fs.create_dir(bucket.name)
        data = np.random.default_rng(0).bytes(300_000)
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "x.bin").write_bytes(data)
        url = f"{bucket.upload(tmp_path / 'd', 'p')}/x.bin"
        store = Store(endpoint_url=emulator.endpoint)
        with storage.open_input(url, store) as f:
            assert f.read_at(10, 0) == data[:10]
            emulator.stop()
            with pytest.raises(OSError) as failed:
                f.read_at(10, 100_000)
        assert storage.transient(failed.value, url, store)
        said = str(storage.store_error(failed.value, url, store))
        assert f"did not serve '{url}'" in said and len(said.splitlines()) == 1, said
        back = threading.Timer(1.0, emulator.restart)
        back.start()
        started = time.monotonic()
        got = storage.retrying(lambda: storage.read_range(url, 100_000, 10, store), url, store)
        back.join()
        assert got == data[100_000:100_010] and time.monotonic() - started >= 1.0
    finally:
        emulator.stop()
        shutil.rmtree(tmp_path / "emulator", ignore_errors=True)
