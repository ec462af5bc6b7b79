"""``gs://bucket/key``: Google Cloud Storage, through pyarrow's GcsFileSystem.

Credentials come from Google's application default credentials (``GOOGLE_APPLICATION_CREDENTIALS``
naming a key file, ``gcloud auth application-default login``, or the metadata server of a Google
Cloud VM); ``anonymous: true`` reads a public bucket without any. A source's ``endpoint_url``
(else ``STORAGE_EMULATOR_HOST``) names an emulator, e.g. ``http://127.0.0.1:9023``; requests
to it are unsigned unless credentials are found (emulators check none).

The client's own retries stop after `RETRY_LIMIT_S` (pyarrow takes whole seconds, and 0 stops it
before its first request): msd retries, counted (`msd.sources.storage`). pyarrow sets no request
timeout for GCS: a store that accepts connections and never answers holds a read until the
client gives up.
"""

from __future__ import annotations

import datetime
import functools
import os
import re
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from msd.sources.stores import Meaning, Place, bucket_place, endpoint_parts, on_cloud_instance

if TYPE_CHECKING:
    from msd.sources.storage import Store

SCHEME = "gs://"
NAME = "Google Cloud"
NOUN = "bucket"
CREDENTIALS = "(GOOGLE_APPLICATION_CREDENTIALS, or gcloud auth application-default login)"
SET_CREDENTIALS = (
    "GOOGLE_APPLICATION_CREDENTIALS to a key file (or run gcloud auth application-default login)"
)
ENDPOINT_HINT = ", and endpoint_url for an emulator"
RETRY_LIMIT_S = 1

# google::cloud::Status(CODE: MESSAGE error_info={...}), as pyarrow words a failure.
_STATUS = re.compile(r"Status\((\w+): (.*?)(?: error_info=\{.*)?\)?$", re.MULTILINE)
_TRANSIENT_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "ABORTED"}
_DENIED_CODES = {"PERMISSION_DENIED", "UNAUTHENTICATED"}
# A credential that could not make a token (a key file missing or damaged): no request was sent.
_NO_TOKEN = "Could not create a OAuth2 access token"


def place(url: str) -> Place:
    return bucket_place(url, SCHEME)


def filesystem(place: Place, store: Store) -> pafs.FileSystem:
    return _filesystem(store)


@functools.lru_cache(maxsize=16)
def _filesystem(store: Store) -> pafs.GcsFileSystem:
    endpoint = _endpoint(store)
    options: dict[str, Any] = {
        "anonymous": not signs(store),
        "retry_time_limit": datetime.timedelta(seconds=RETRY_LIMIT_S),
    }
    if endpoint is not None:
        scheme, authority = endpoint_parts(endpoint)
        options.update(endpoint_override=authority, scheme=scheme)
    return pafs.GcsFileSystem(**options)


def signs(store: Store) -> bool:
    """Whether requests are signed: not for ``anonymous``, nor for an emulator while no
    credentials are found (it checks none, and asking for a token would fail before the first
    request; Google's own clients sign nothing there either)."""
    if store.anonymous:
        return False
    return _endpoint(store) is None or credentials_found()


def endpoint(place: Place, store: Store) -> str:
    return _endpoint(store) or "Google Cloud Storage"


def _endpoint(store: Store) -> str | None:
    """The source's ``endpoint_url``, else the emulator that ``STORAGE_EMULATOR_HOST`` names
    (``http://`` unless it says otherwise); None: Google's own."""
    if store.endpoint_url:
        return store.endpoint_url
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if not emulator:
        return None
    return emulator if "://" in emulator else f"http://{emulator}"


def meaning(text: str) -> Meaning:
    found = _STATUS.search(text)
    code = found.group(1) if found else ""
    if "The specified bucket does not exist" in text:
        return Meaning.MISSING_BUCKET
    if code in _TRANSIENT_CODES:
        return Meaning.TRANSIENT
    if code in _DENIED_CODES or _NO_TOKEN in text:
        return Meaning.DENIED
    if "CURL error" in text:
        return Meaning.TRANSIENT
    return Meaning.OTHER


def detail(line: str) -> str:
    """``CODE: the last message`` of a google::cloud::Status (what went wrong underneath, where
    the client says)."""
    found = _STATUS.search(line)
    if found is None:
        return line
    code, message = found.groups()
    for marker in ("The underlying error message was: ", "with a last message of "):
        if marker in message:
            message = message.split(marker, 1)[1]
            break
    return f"{code}: {message}"


def credentials_found() -> bool:
    """Whether application default credentials have somewhere to come from."""
    env = os.environ
    if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return True
    config = env.get("CLOUDSDK_CONFIG") or os.path.expanduser("~/.config/gcloud")
    if os.path.isfile(os.path.join(config, "application_default_credentials.json")):
        return True
    return on_cloud_instance()
