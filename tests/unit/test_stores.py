"""The object stores without a server: how ``gs://``, ``az://`` and ``abfs[s]://`` URLs name a
bucket (container), an account and a key; what pyarrow's GCS and Azure clients' failures mean
(their messages as the clients word them); where credentials may come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from msd.sources import storage
from msd.sources.storage import Store
from msd.sources.stores import Place, StoreError, azure, endpoint_parts, gcs


def test_urls_of_every_store_are_remote_and_join_like_s3s() -> None:
    for url in ("gs://b/k", "az://c/k", "abfs://c/k", "abfss://c@a.dfs.core.windows.net/k"):
        assert storage.is_remote(url)
        assert storage.sibling(f"{url}/corpus.idx", ".bin") == f"{url}/corpus.bin"
        assert storage.join(f"{url}/", "state.json") == f"{url}/state.json"
    assert not storage.is_remote("/gs:/b") and not storage.is_remote("az:/c")
    assert storage.bucket_word("gs://b/k") == "bucket"
    assert storage.bucket_word("az://c/k") == "container"


def test_gcs_urls_name_a_bucket_and_a_key() -> None:
    assert gcs.place("gs://bkt/a/b.parquet") == Place("gs://bkt", "bkt", "a/b.parquet")
    assert gcs.place("gs://bkt").inner == "bkt"


@pytest.mark.parametrize(
    ("url", "place"),
    [
        ("az://c/a/b.tar", Place("az://c", "c", "a/b.tar", "envacct")),
        ("abfs://c/a", Place("abfs://c", "c", "a", "envacct")),
        (
            "abfss://c@acct.dfs.core.windows.net/a/b",
            Place("abfss://c@acct.dfs.core.windows.net", "c", "a/b", "acct"),
        ),
        (
            "abfs://c@acct.blob.core.windows.net",
            Place("abfs://c@acct.blob.core.windows.net", "c", "", "acct"),
        ),
        (
            "abfss://acct.dfs.core.windows.net/c/a/b",
            Place("abfss://acct.dfs.core.windows.net/c", "c", "a/b", "acct"),
        ),
    ],
)
def test_azure_urls_name_a_container_an_account_and_a_key(
    url: str, place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "envacct")
    assert azure.place(url) == place
    assert f"{place.root}/{place.key}".rstrip("/") == url  # a key's URL is root/key


@pytest.mark.parametrize(
    "url", ["abfs://acct@127.0.0.1:10000/c/x", "abfss://c@example.com/x", "az://c@acct/x"]
)
def test_azure_urls_of_no_known_form_are_one_sentence(url: str) -> None:
    with pytest.raises(StoreError, match="names no Azure container; write it as az://"):
        azure.place(url)


def test_an_azure_url_without_an_account_says_how_to_name_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(StoreError, match="set AZURE_STORAGE_ACCOUNT_NAME") as raised:
        storage.stat("az://c/x.parquet", Store())
    assert not raised.value.transient and "abfss://c@ACCOUNT" in str(raised.value)


# The clients' own words (pyarrow 26), one line each as the first line of the exception.
_GCS_UNREACHABLE = (
    "google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of "
    "PerformWork() - CURL error [7]=Could not connect to server error_info={reason=, domain=, "
    "metadata={gcloud-cpp.retry.function=GetObjectMetadata}})"
)
_GCS_NO_KEY_FILE = (
    "Unknown error: google::cloud::Status(UNKNOWN: Permanent error, with a last message of "
    "Could not create a OAuth2 access token to authenticate the request. The request was not "
    "sent. The underlying error message was: Cannot open credentials file /k.json "
    "error_info={reason=UNKNOWN, domain=gcloud-cpp, metadata={}})"
)
_GCS_FORBIDDEN = (
    "google::cloud::Status(PERMISSION_DENIED: Permanent error, with a last message of "
    "Received HTTP status code: 403 error_info={reason=, domain=, metadata={}})"
)
_AZ_UNREACHABLE = (
    "GetProperties failed for 'http://127.0.0.1:10009/devstoreaccount1/c/x'. Cannot initialise "
    "an ObjectInputFile without knowing the file size. Azure Error: [] Fail to get a new "
    "connection for: http://127.0.0.1:10009. Could not connect to server"
)
_AZ_FORBIDDEN = (
    "Failed to list blobs in a directory: c: http://127.0.0.1:10000/devstoreaccount1/c Azure "
    "Error: [AuthorizationFailure] 403 Server failed to authenticate the request.\nRequestId:x"
)
_AZ_BUSY = "GetProperties failed for 'x'. Azure Error: [ServerBusy] 503 The server is busy."
_AZ_NO_CONTAINER = "Azure Error: [ContainerNotFound] 404 The specified container does not exist."


@pytest.mark.parametrize(
    ("url", "message", "says", "transient"),
    [
        ("gs://b/k", _GCS_UNREACHABLE, "did not serve 'gs://b/k' (UNAVAILABLE: PerformWork", True),
        ("gs://b/k", _GCS_NO_KEY_FILE, "(UNKNOWN: Cannot open credentials file /k.json)", False),
        ("gs://b/k", _GCS_FORBIDDEN, "refused access to 'gs://b/k' (PERMISSION_DENIED", False),
        ("gs://b/k", "google::cloud::Status(DEADLINE_EXCEEDED: slow)", "did not serve", True),
        ("az://c/x", _AZ_UNREACHABLE, "(Fail to get a new connection for", True),
        ("az://c/x", _AZ_FORBIDDEN, "refused access to 'az://c/x' ([AuthorizationFailure]", False),
        ("az://c/x", _AZ_BUSY, "did not serve 'az://c/x' ([ServerBusy] 503", True),
        ("az://c/x", _AZ_NO_CONTAINER, "the container 'c' does not exist at Azure storage", False),
    ],
)
def test_gcs_and_azure_failures_become_one_sentence_saying_whether_to_retry(
    url: str, message: str, says: str, transient: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/k.json")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    error = storage.store_error(OSError(message), url, Store("http://h:9"))
    assert says in str(error) and error.transient is transient, str(error)
    assert "\n" not in str(error) and "error_info" not in str(error)
    assert "http://h:9" in str(error)


def test_without_credentials_a_failure_says_where_credentials_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_CLIENT_ID",
        "AZURE_FEDERATED_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "azure"))
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setattr("msd.sources.stores.gcs.on_cloud_instance", lambda: False)
    monkeypatch.setattr("msd.sources.stores.azure.on_cloud_instance", lambda: False)
    assert not gcs.credentials_found() and not azure.credentials_found()
    error = storage.store_error(OSError(_GCS_UNREACHABLE), "gs://b/k", Store())
    assert "no Google Cloud credentials were found" in str(error) and not error.transient
    error = storage.store_error(OSError(_AZ_FORBIDDEN), "az://c/x", Store())
    assert "no Azure credentials were found" in str(error) and "AZURE_STORAGE_ACCOUNT_KEY" in str(
        error
    )
    # Anonymous requests, and an emulator that checks none, never lack credentials.
    for store in (Store(anonymous=True), Store("http://127.0.0.1:9")):
        assert storage.store_error(OSError(_GCS_UNREACHABLE), "gs://b/k", store).transient
    (tmp_path / "gcloud").mkdir()
    (tmp_path / "gcloud" / "application_default_credentials.json").write_text("{}")
    (tmp_path / "azure").mkdir()
    assert gcs.credentials_found() and azure.credentials_found()
    assert gcs.signs(Store("http://127.0.0.1:9"))  # credentials found: they are used


def test_emulator_endpoints_and_an_azure_key_for_its_own_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert endpoint_parts("http://127.0.0.1:10000/") == ("http", "127.0.0.1:10000")
    assert endpoint_parts("storage.example.com") == ("https", "storage.example.com")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:9023")
    assert gcs.endpoint(gcs.place("gs://b"), Store()) == "http://localhost:9023"
    assert gcs.endpoint(gcs.place("gs://b"), Store("https://x:1")) == "https://x:1"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "mine")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "a2V5")
    assert azure._secrets("mine") == ("a2V5", "") and azure._secrets("theirs") == ("", "")
