"""``s3://bucket/key``: Amazon S3 and S3-compatible stores, through pyarrow's S3FileSystem.

Credentials and region come from the standard AWS chain (``AWS_ACCESS_KEY_ID``/
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/config``, instance roles); a source's
``endpoint_url`` (else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``) names an S3-compatible
store. pyarrow's own retries are off: msd retries, counted (`msd.sources.storage`).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from msd.sources.stores import Meaning, Place, bucket_place, classify, on_cloud_instance

if TYPE_CHECKING:
    from msd.sources.storage import Store

SCHEME = "s3://"
NAME = "AWS"
NOUN = "bucket"
CREDENTIALS = "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
SET_CREDENTIALS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
ENDPOINT_HINT = ", and endpoint_url for an S3-compatible store"
# A request whose transfer stalls this long fails (curl's low-speed time, not a total: a large
# read that keeps moving is never cut); under ``loader.heartbeat_s``, so a loader waiting on a
# store that stopped answering is not taken for dead.
CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 2.0
DEFAULT_REGION = "us-east-1"

# pyarrow's AWS error names and HTTP statuses, by what they mean.
_MISSING_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket")
_DENIED = (
    "ACCESS_DENIED",
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "HTTP status 403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "ExpiredToken",
    "MISSING_AUTHENTICATION_TOKEN",
)
_TRANSIENT = (
    "NETWORK_CONNECTION",
    "SLOW_DOWN",
    "THROTTL",
    "SERVICE_UNAVAILABLE",
    "INTERNAL_FAILURE",
    "REQUEST_TIMEOUT",
    "REQUEST_TIME_TOO_SKEWED",
    "HTTP status 5",
    "HTTP status 429",
    "curlCode",
    "imed out",
    "Connection reset",
    "Broken pipe",
    "Couldn't connect",
    "Could not connect",
)


def place(url: str) -> Place:
    return bucket_place(url, SCHEME)


def filesystem(place: Place, store: Store) -> pafs.FileSystem:
    return _filesystem(store)


@functools.lru_cache(maxsize=16)
def _filesystem(store: Store) -> pafs.S3FileSystem:
    endpoint = _endpoint(store)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    scheme = None
    if endpoint is not None:
        scheme = "http" if endpoint.startswith("http://") else "https"
        region = region or DEFAULT_REGION
    return pafs.S3FileSystem(
        anonymous=store.anonymous,
        region=region,
        endpoint_override=endpoint,
        scheme=scheme or "https",
        connect_timeout=CONNECT_TIMEOUT_S,
        request_timeout=REQUEST_TIMEOUT_S,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )


def signs(store: Store) -> bool:
    return not store.anonymous


def endpoint(place: Place, store: Store) -> str:
    return _endpoint(store) or "AWS S3"


def _endpoint(store: Store) -> str | None:
    """The store's ``endpoint_url``, else the AWS environment's; None: AWS's own."""
    env = os.environ
    return store.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")


def meaning(text: str) -> Meaning:
    return classify(text, _MISSING_BUCKET, _DENIED, _TRANSIENT)


def detail(line: str) -> str:
    return line.split(": ", 1)[-1] if "AWS Error" in line else line


def credentials_found() -> bool:
    """Whether the standard AWS chain has somewhere to take credentials from, short of an
    instance role (which only asking can tell)."""
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return True
    if any(
        env.get(name)
        for name in (
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        )
    ):
        return True
    files = (
        env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
        env.get("AWS_CONFIG_FILE") or "~/.aws/config",
    )
    if any(os.path.isfile(os.path.expanduser(f)) for f in files):
        return True
    return env.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true" and on_cloud_instance()
