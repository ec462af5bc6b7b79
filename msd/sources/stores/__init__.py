"""The object stores a source's files may live in, one module each (`s3`, `gcs`, `azure`),
behind one interface (`ObjectStore`) that `msd.sources.storage` dispatches to by a URL's scheme.

A store module knows only its own: how a URL names a bucket and a key (`Place`), how to build
pyarrow's filesystem for it, where credentials come from, and what its client's failures mean
(`Meaning`). Retries, globs and the sentences a user reads are `msd.sources.storage`'s, the same
for every store.

This module imports no pyarrow: the recipe tells a URL from a local path with `SCHEMES` alone.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from msd.sources.storage import Store

# A URL's scheme -> the module of its store. ``az://`` is the short form (the account from
# AZURE_STORAGE_ACCOUNT_NAME); ``abfs[s]://`` is the form pyarrow's FileSystem.from_uri reads.
SCHEMES: dict[str, str] = {
    "s3://": "s3",
    "gs://": "gcs",
    "az://": "azure",
    "abfs://": "azure",
    "abfss://": "azure",
}


class Place(NamedTuple):
    """Where a URL points: its ``root`` (the URL up to its bucket: ``s3://bkt``; a key's URL is
    ``root/key``), the ``bucket`` (an Azure container), the ``key`` in it (may be empty), and
    the ``account`` that holds the bucket where a store has accounts (Azure; else empty)."""

    root: str
    bucket: str
    key: str
    account: str = ""

    @property
    def inner(self) -> str:
        """The path pyarrow's filesystem takes: ``bucket/key``."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket


class StoreError(OSError):
    """An object store refused or did not answer; ``transient``: retrying may help."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class Meaning(enum.Enum):
    """What a store's failure means to msd."""

    MISSING_BUCKET = "missing bucket"
    DENIED = "denied"  # the credentials were refused, or could not be used
    TRANSIENT = "transient"  # trying again may help
    OTHER = "other"


class ObjectStore(Protocol):
    """What msd needs of one kind of object store (implemented by the modules beside this)."""

    NAME: str  # whose credentials, in messages: "AWS"
    NOUN: str  # what holds objects: "bucket", "container"
    CREDENTIALS: str  # where credentials come from, for a refusal
    SET_CREDENTIALS: str  # what to set when none were found
    ENDPOINT_HINT: str  # when a bucket is not found, what else to check: ", and ..."

    def place(self, url: str) -> Place:
        """Where ``url`` points (a `StoreError` if it cannot point anywhere)."""
        ...

    def filesystem(self, place: Place, store: Store) -> pafs.FileSystem:
        """pyarrow's filesystem for ``place`` on ``store`` (cached: one a store and account)."""
        ...

    def signs(self, store: Store) -> bool:
        """Whether requests to ``store`` are signed (not ``anonymous`` ones)."""
        ...

    def endpoint(self, place: Place, store: Store) -> str:
        """Where requests for ``place`` go, in words, for messages and cache keys."""
        ...

    def meaning(self, text: str) -> Meaning:
        """What a failure whose message is ``text`` means."""
        ...

    def detail(self, line: str) -> str:
        """The telling part of the first line of a failure's message."""
        ...

    def credentials_found(self) -> bool:
        """Whether the store's standard chain has somewhere to take credentials from."""
        ...


def classify(
    text: str, missing: tuple[str, ...], denied: tuple[str, ...], transient: tuple[str, ...]
) -> Meaning:
    """What a failure whose message is ``text`` means, by the words a store's client uses for
    a missing bucket, refused credentials and a transient failure (checked in that order)."""
    for found, words in (
        (Meaning.MISSING_BUCKET, missing),
        (Meaning.DENIED, denied),
        (Meaning.TRANSIENT, transient),
    ):
        if any(t in text for t in words):
            return found
    return Meaning.OTHER


def bucket_place(url: str, scheme: str) -> Place:
    """Where a ``scheme://bucket/key`` URL points."""
    bucket, _, key = url[len(scheme) :].partition("/")
    return Place(f"{scheme}{bucket}", bucket, key)


def on_cloud_instance() -> bool:
    """An instance's own credentials may answer (the machine looks like a cloud VM)."""
    try:
        vendor = Path("/sys/class/dmi/id/sys_vendor").read_text().strip().lower()
    except OSError:
        return False
    return any(v in vendor for v in ("amazon", "google", "microsoft"))


def endpoint_parts(url: str) -> tuple[str, str]:
    """``http://host:port`` as (``http``, ``host:port``); no scheme is ``https``."""
    scheme, found, rest = url.partition("://")
    if not found:
        return "https", url.rstrip("/")
    return scheme.lower(), rest.rstrip("/")
