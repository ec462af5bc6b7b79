"""What ``msd status`` shows: the job, its sources, processes, ranks and Planner, as plain structs.

They live in the wire package because the protocol carries them: the Planner builds a
``StatusView`` (``msd.control.view``) and sends it inside the protocol's ``Status`` message;
``msd status``, its ``--json`` and the Prometheus endpoint read it. The field names are the
``--json`` keys (docs/status.md); ``StatusView.version`` versions that shape.
"""

from __future__ import annotations

import msgspec


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    step: int
    planned: int
    steps: int | None
    steps_per_s: float
    tokens_per_s: float
    tokens: int
    uptime_s: float
    failure: str


class SourceView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    weight: float
    samples_per_s: float
    tokens_per_s: float
    samples: int
    tokens: int
    loaders: int
    queue_samples: int
    queue_tokens: int
    errors: int
    skipped_images: int = 0  # images of delivered samples left out (undecodable, no bytes, ...)
    # tokens of delivered samples the loss is taken on (a conversation's trained turns; every
    # token of other samples)
    trained_tokens: int = 0
    # What the running loaders of an image or video source left out as they read, by reason
    # (e.g. "videos undecodable (truncated)"), and the videos they decoded: how many, their
    # seconds, and the CPU seconds the decodes took.
    left_out: dict[str, int] = {}
    videos_read: int = 0
    video_s: float = 0.0
    video_cpu_s: float = 0.0


class LoaderView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    node: str
    pid: int
    state: str
    cpu_percent: float
    cpu_seconds: float
    pss_bytes: int
    samples_per_s: float
    sources: int
    # As of the same report as cpu_seconds, over all its sources: the tokens it read and the
    # wall time it spent reading and tokenizing (so two reports give its CPU per token).
    tokens_read: int = 0
    busy_s: float = 0.0
    # Its local cache of an object store's files (msd.sources.cache): blocks read from it,
    # blocks fetched from the store, and the bytes fetched.
    cache_hits: int = 0
    cache_misses: int = 0
    cache_fetched_bytes: int = 0


class ConstructorView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    node: str
    pid: int
    state: str
    cpu_percent: float
    cpu_seconds: float
    pss_bytes: int
    ready_bytes: int
    rejected: dict[str, int] = {}  # messages dropped, by reason (docs/security.md)
    relayed: int = 0  # payload messages passed on to other Constructors (msd.plan.fanout)
    relayed_bytes: int = 0
    payload_bytes: int = 0  # payloads held for steps not built yet (and not relayed yet)


class RankView(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    constructor: str
    step: int
    ahead: int
    wait_p50_ms: float
    wait_p99_ms: float


class PlannerView(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    plan_ms_p50: float
    plan_ms_p99: float
    balance_max_over_mean: float
    planned_ahead: int
    lifecycle: dict[str, int]
    split: int
    truncated: int
    dropped: int
    rejected: dict[str, int] = {}  # messages dropped, by reason (docs/security.md)
    empty: int = 0  # samples delivered holding no tokens (null or empty text)
    images: int = 0  # images delivered
    skipped_images: int = 0  # images of delivered samples left out


class StatusView(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    job: JobView
    sources: tuple[SourceView, ...]
    loaders: tuple[LoaderView, ...]
    constructors: tuple[ConstructorView, ...]
    ranks: tuple[RankView, ...]
    planner: PlannerView
    wait_p50_ms: float
    wait_p99_ms: float
