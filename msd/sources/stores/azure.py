"""Azure Blob Storage (and Data Lake Storage Gen2), through pyarrow's AzureFileSystem.

A URL names a container and a path in it:

- ``az://CONTAINER/PATH``: the storage account is ``AZURE_STORAGE_ACCOUNT_NAME``'s;
- ``abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH`` (or ``.blob.``), or
  ``abfs[s]://ACCOUNT.dfs.core.windows.net/CONTAINER/PATH``: the forms pyarrow's
  ``FileSystem.from_uri`` reads, the account named in the URL (``abfs[s]://CONTAINER/PATH``
  takes it from the environment, as ``az://`` does).

Credentials: ``AZURE_STORAGE_ACCOUNT_KEY`` (the account's shared key), else
``AZURE_STORAGE_SAS_TOKEN``, each used for the account ``AZURE_STORAGE_ACCOUNT_NAME`` names (or
any account when that is unset); else Azure's default credential (``AZURE_CLIENT_ID`` with
``AZURE_CLIENT_SECRET`` and ``AZURE_TENANT_ID``, workload or managed identity, ``az login``).
``anonymous: true`` reads a public container. A source's ``endpoint_url`` (``http://HOST:PORT``)
names an emulator such as Azurite, which serves its accounts under the path.

pyarrow sets neither the client's retries nor its timeouts: the Azure SDK tries a failed request
4 times (about 6 s for a refused connection) before msd counts one retry, and a store that
accepts connections and never answers holds a read until the SDK gives up.
"""

from __future__ import annotations

import functools
import os
import re
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from msd.sources.stores import (
    Meaning,
    Place,
    StoreError,
    classify,
    endpoint_parts,
    on_cloud_instance,
)

if TYPE_CHECKING:
    from msd.sources.storage import Store

NAME = "Azure"
NOUN = "container"
CREDENTIALS = (
    "(AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN for AZURE_STORAGE_ACCOUNT_NAME, or "
    "Azure's default credential: AZURE_CLIENT_ID/AZURE_CLIENT_SECRET/AZURE_TENANT_ID, az login)"
)
SET_CREDENTIALS = (
    "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN (with AZURE_STORAGE_ACCOUNT_NAME), or "
    "AZURE_CLIENT_ID, AZURE_CLIENT_SECRET and AZURE_TENANT_ID"
)
ENDPOINT_HINT = (
    ", the storage account (AZURE_STORAGE_ACCOUNT_NAME or the URL), and endpoint_url for an "
    "emulator"
)
_HOSTS = (".dfs.core.windows.net", ".blob.core.windows.net")
# "...failed: N5Azure4Core11Credentials23AuthenticationExceptionE: what it says" (a C++ type name).
_EXCEPTION = re.compile(r"\w+(?:Exception|_error)E?: ")
_FORMS = "az://CONTAINER/PATH or abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH"

# What pyarrow's Azure errors say ("Azure Error: [ErrorCode] status reason"), by meaning.
_MISSING_CONTAINER = (
    "ContainerNotFound",
    "The specified container does not exist",
    "FilesystemNotFound",
    "The specified filesystem does not exist",
)
_DENIED = (
    "AuthorizationFailure",
    "AuthenticationFailed",
    "AuthorizationPermissionMismatch",
    "AuthorizationResourceTypeMismatch",
    "InsufficientAccountPermissions",
    "NoAuthenticationInformation",
    "InvalidAuthenticationInfo",
    "AuthenticationException",
    "CredentialUnavailable",
    "Base64",  # an account key that is not one
    "] 401 ",
    "] 403 ",
)
_TRANSIENT = (
    "Fail to get a new connection",
    "Could not connect",
    "ServerBusy",
    "OperationTimedOut",
    "InternalError",
    "] 429 ",
    "] 500 ",
    "] 502 ",
    "] 503 ",
    "] 504 ",
    "imed out",
    "Timeout",
    "Connection reset",
    "Connection was closed",
    "Broken pipe",
)


def place(url: str) -> Place:
    """Where ``url`` points; a `StoreError` naming the accepted forms if it is none of them."""
    scheme, _, rest = url.partition("://")
    host, _, path = rest.partition("/")
    container, at, account_host = host.partition("@")
    if at and account_host.endswith(_HOSTS):  # CONTAINER@ACCOUNT.dfs.core.windows.net
        return Place(f"{scheme}://{host}", container, path, account_host.partition(".")[0])
    if not at and host.endswith(_HOSTS) and scheme != "az":  # ACCOUNT.dfs.../CONTAINER/PATH
        container, _, key = path.partition("/")
        return Place(f"{scheme}://{host}/{container}", container, key, host.partition(".")[0])
    if at or "." in host or ":" in host:
        raise StoreError(f"'{url}' names no Azure container; write it as {_FORMS}", False)
    return Place(f"{scheme}://{host}", host, path, os.environ.get("AZURE_STORAGE_ACCOUNT_NAME", ""))


def filesystem(place: Place, store: Store) -> pafs.FileSystem:
    if not place.account:
        raise StoreError(
            f"no Azure storage account for '{place.root}': set AZURE_STORAGE_ACCOUNT_NAME, or "
            f"write the path as abfss://{place.bucket}@ACCOUNT.dfs.core.windows.net/...",
            transient=False,
        )
    return _filesystem(store, place.account)


@functools.lru_cache(maxsize=16)
def _filesystem(store: Store, account: str) -> pafs.FileSystem:
    if store.anonymous:
        return _anonymous(store, account)
    options: dict[str, Any] = {}
    if store.endpoint_url:
        scheme, authority = endpoint_parts(store.endpoint_url)
        options.update(
            blob_storage_authority=authority,
            dfs_storage_authority=authority,
            blob_storage_scheme=scheme,
            dfs_storage_scheme=scheme,
        )
    key, sas = _secrets(account)
    if key:
        options["account_key"] = key
    elif sas:
        options["sas_token"] = sas if sas.startswith("?") else f"?{sas}"
    return pafs.AzureFileSystem(account, **options)


def _anonymous(store: Store, account: str) -> pafs.FileSystem:
    """An unsigned filesystem: pyarrow's constructor has no such option, its URL form does."""
    query = "credential_kind=anonymous"
    if store.endpoint_url:
        scheme, authority = endpoint_parts(store.endpoint_url)
        query += (
            f"&blob_storage_authority={authority}&dfs_storage_authority={authority}"
            f"&enable_tls={str(scheme == 'https').lower()}"
        )
    fs, _ = pafs.FileSystem.from_uri(f"abfs://{account}.blob.core.windows.net/?{query}")
    return fs


def _secrets(account: str) -> tuple[str, str]:
    """The account key and SAS token of the environment, where they are ``account``'s."""
    env = os.environ
    if env.get("AZURE_STORAGE_ACCOUNT_NAME", account) != account:
        return "", ""
    return env.get("AZURE_STORAGE_ACCOUNT_KEY", ""), env.get("AZURE_STORAGE_SAS_TOKEN", "")


def signs(store: Store) -> bool:
    return not store.anonymous


def endpoint(place: Place, store: Store) -> str:
    if not place.account:
        return store.endpoint_url or "Azure Blob Storage"
    where = f" ({store.endpoint_url})" if store.endpoint_url else ""
    return f"Azure storage account '{place.account}'{where}"


def meaning(text: str) -> Meaning:
    return classify(text, _MISSING_CONTAINER, _DENIED, _TRANSIENT)


def detail(line: str) -> str:
    """What the service said (after ``Azure Error:``), or the client's exception's message."""
    if "Azure Error: " in line:
        return line.split("Azure Error: ", 1)[1].removeprefix("[] ")
    return _EXCEPTION.split(line)[-1]


def credentials_found() -> bool:
    """Whether a key, a SAS token or Azure's default credential has somewhere to come from."""
    env = os.environ
    names = (
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_CLIENT_ID",
        "AZURE_FEDERATED_TOKEN_FILE",
    )
    if any(env.get(name) for name in names):
        return True
    cli = env.get("AZURE_CONFIG_DIR") or os.path.expanduser("~/.azure")
    return os.path.isdir(cli) or on_cloud_instance()
