"""A job's figures as a Prometheus endpoint, scraped from the Planner's latest ``StatusView``.

The Planner calls ``MetricsServer.update`` about once a second; a scrape renders that snapshot, so
scraping never touches the Planner's loop. Labels are kept to ``source``, ``loader``,
``constructor``, ``state``, and ``role``/``reason`` for dropped messages: never a rank, whose
count would grow with the job.

Job
    msd_up                               gauge      1 while the endpoint answers
    msd_job_state{state}                 gauge      1 for the job's current state
    msd_steps_total                      counter    steps every rank has consumed
    msd_steps_planned_total              counter    steps the Planner has planned
    msd_tokens_total                     counter    tokens consumed by the trainer
    msd_steps_ahead                      gauge      steps planned beyond the slowest rank
    msd_balance_ratio                    gauge      max / mean DP-rank cost per step (recent median)
    msd_data_wait_seconds                histogram  how long the trainer waited for a batch
    msd_plan_duration_seconds            histogram  how long the Planner took to plan a step
Sources
    msd_source_weight{source}            gauge      the source's current mixing weight
    msd_source_samples_total{source}     counter    samples in steps every rank consumed
    msd_source_tokens_total{source}      counter    their tokens
    msd_source_queue_samples{source}     gauge      samples read but not yet routed
    msd_source_queue_tokens{source}      gauge      tokens read but not yet routed
    msd_source_loaders{source}           gauge      loader processes serving the source
    msd_source_errors_total{source}      counter    reads retried (object stores)
    msd_source_skipped_images_total{source}  counter  images of consumed samples left out
    msd_source_trained_tokens_total{source}  counter  their tokens the loss is taken on
Loaders and constructors
    msd_loader_cpu_seconds_total{loader}             counter  CPU time used
    msd_loader_pss_bytes{loader}                     gauge    proportional set size
    msd_loader_up{loader}                            gauge    1 while its state is "running"
    msd_loader_cache_hits_total{loader}              counter  blocks read from its local cache
    msd_loader_cache_misses_total{loader}            counter  blocks it fetched from the store
    msd_loader_cache_fetched_bytes_total{loader}     counter  their bytes
    msd_constructor_cpu_seconds_total{constructor}   counter  CPU time used
    msd_constructor_pss_bytes{constructor}           gauge    proportional set size
    msd_constructor_ready_bytes{constructor}         gauge    bytes of batches built ahead
    msd_constructor_payload_bytes{constructor}       gauge    payloads held, steps not built
    msd_constructor_relayed_messages_total{constructor} counter payloads passed on to others
    msd_constructor_relayed_bytes_total{constructor} counter  their bytes
    msd_rejected_messages_total{role,reason}         counter  messages dropped as malformed,
                                                              unexpected, unplanned, ...
Samples
    msd_lifecycle_samples{state}         gauge      samples in each lifecycle state
    msd_samples_split_total              counter    samples split across rows
    msd_samples_truncated_total          counter    samples cut to fit a row
    msd_samples_dropped_total            counter    samples dropped by the plan
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from msd.wire.views import ConstructorView, LoaderView, SourceView, StatusView

BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative counts, one per upper bound in ``bounds`` and a last one for +Inf."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    sum_s: float

    @property
    def count(self) -> int:
        return self.cumulative[-1]

    @classmethod
    def empty(cls, bounds: Sequence[float] = BUCKETS_S) -> HistogramSnapshot:
        return cls(tuple(bounds), (0,) * (len(bounds) + 1), 0.0)

    def buckets(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus writes them, ending with ``+Inf``."""
        les = [*(repr(float(b)) for b in self.bounds), "+Inf"]
        return list(zip(les, self.cumulative, strict=True))


class Histogram:
    """A cumulative histogram cheap enough for the Planner's loop: one bisect per value.

    Bounds are inclusive upper limits (Prometheus ``le``); values above the last go to +Inf.
    """

    def __init__(self, bounds: Sequence[float] = BUCKETS_S) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must be strictly increasing, got {bounds}")
        self._bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self._bounds) + 1)  # per bucket, not cumulative
        self._sum = 0.0

    def observe(self, value_s: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value_s)] += 1
        self._sum += value_s

    def observe_many(self, values: Iterable[float]) -> None:
        for value in values:
            self.observe(value)

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self._bounds, tuple(itertools.accumulate(self._counts)), self._sum)


# -- the families of one snapshot (pure: a view in, metric families out) -----------------------
Family = type[GaugeMetricFamily] | type[CounterMetricFamily]
G, C = GaugeMetricFamily, CounterMetricFamily  # a counter's exposition appends `_total`


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)
# (family, metric name, help, value of one item): one labelled family per row
_Table = tuple[tuple[Family, str, str, Callable[[N], float]], ...]

_SOURCE: _Table[SourceView] = (
    (G, "msd_source_weight", "Current mixing weight.", lambda s: s.weight),
    (C, "msd_source_samples", "Samples in steps every rank consumed.", lambda s: s.samples),
    (C, "msd_source_tokens", "Tokens of those samples.", lambda s: s.tokens),
    (G, "msd_source_queue_samples", "Samples read, not yet routed.", lambda s: s.queue_samples),
    (G, "msd_source_queue_tokens", "Tokens read, not yet routed.", lambda s: s.queue_tokens),
    (G, "msd_source_loaders", "Loader processes serving the source.", lambda s: s.loaders),
    (
        C,
        "msd_source_errors",
        "Reads an object store failed that were tried again.",
        lambda s: s.errors,
    ),
    (
        C,
        "msd_source_skipped_images",
        "Images of consumed samples left out (undecodable, no bytes, ...).",
        lambda s: s.skipped_images,
    ),
    (
        C,
        "msd_source_trained_tokens",
        "Tokens of those samples the loss is taken on.",
        lambda s: s.trained_tokens,
    ),
)
_LOADER: _Table[LoaderView] = (
    (C, "msd_loader_cpu_seconds", "CPU time used.", lambda x: x.cpu_seconds),
    (G, "msd_loader_pss_bytes", "Proportional set size.", lambda x: x.pss_bytes),
    (G, "msd_loader_up", "1 while the loader is running.", lambda x: x.state == "running"),
    (C, "msd_loader_cache_hits", "Blocks read from its local cache.", lambda x: x.cache_hits),
    (
        C,
        "msd_loader_cache_misses",
        "Blocks of its local cache fetched from the object store.",
        lambda x: x.cache_misses,
    ),
    (
        C,
        "msd_loader_cache_fetched_bytes",
        "Bytes of those blocks.",
        lambda x: x.cache_fetched_bytes,
    ),
)
_CONSTRUCTOR: _Table[ConstructorView] = (
    (C, "msd_constructor_cpu_seconds", "CPU time used.", lambda x: x.cpu_seconds),
    (G, "msd_constructor_pss_bytes", "Proportional set size.", lambda x: x.pss_bytes),
    (G, "msd_constructor_ready_bytes", "Bytes of batches built ahead.", lambda x: x.ready_bytes),
    (
        G,
        "msd_constructor_payload_bytes",
        "Bytes of payloads held for steps not built yet.",
        lambda x: x.payload_bytes,
    ),
    (C, "msd_constructor_relayed_messages", "Payloads passed on.", lambda x: x.relayed),
    (C, "msd_constructor_relayed_bytes", "Bytes of payloads passed on.", lambda x: x.relayed_bytes),
)


def _labelled(
    family: Family, name: str, doc: str, label: str, rows: Iterable[tuple[str, float]]
) -> Metric:
    metric = family(name, doc, labels=[label])
    for key, value in rows:
        metric.add_metric([key], float(value))
    return metric


def _per_item(label: str, items: Sequence[N], table: _Table[N]) -> list[Metric]:
    """One family per table row, one sample per item, labelled ``label=item.name``."""
    return [
        _labelled(family, name, doc, label, [(x.name, get(x)) for x in items])
        for family, name, doc, get in table
    ]


def _histogram(name: str, doc: str, snap: HistogramSnapshot) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=snap.buckets(), sum_value=snap.sum_s)


def _job(view: StatusView, waits: HistogramSnapshot, plans: HistogramSnapshot) -> list[Metric]:
    job, planner = view.job, view.planner
    return [
        _labelled(G, "msd_job_state", "1 for the job's current state.", "state", [(job.state, 1)]),
        C("msd_steps", "Steps every rank has consumed.", value=job.step),
        C("msd_steps_planned", "Steps the Planner has planned.", value=job.planned),
        C("msd_tokens", "Tokens consumed by the trainer.", value=job.tokens),
        G("msd_steps_ahead", "Steps planned beyond the slowest rank.", value=planner.planned_ahead),
        G(
            "msd_balance_ratio",
            "Max over mean DP-rank cost of a step, median of recent steps (1 is perfect).",
            value=planner.balance_max_over_mean,
        ),
        _histogram("msd_data_wait_seconds", "Time the trainer waited for a batch.", waits),
        _histogram("msd_plan_duration_seconds", "Time the Planner took to plan a step.", plans),
    ]


def _samples(view: StatusView) -> list[Metric]:
    p = view.planner
    lifecycle = sorted(p.lifecycle.items())
    return [
        _labelled(
            G, "msd_lifecycle_samples", "Samples in each lifecycle state.", "state", lifecycle
        ),
        C("msd_samples_split", "Samples split across rows.", value=p.split),
        C("msd_samples_truncated", "Samples cut to fit a row.", value=p.truncated),
        C("msd_samples_dropped", "Samples dropped by the plan.", value=p.dropped),
    ]


def _rejected(view: StatusView) -> Metric:
    """Messages each role dropped, by reason; Constructors summed (their count grows with the
    job's nodes, like ranks)."""
    metric = C(
        "msd_rejected_messages",
        "Messages a role dropped (malformed, unexpected, unplanned, ...).",
        labels=["role", "reason"],
    )
    by_role: dict[tuple[str, str], int] = {}
    for reason, n in view.planner.rejected.items():
        by_role[("planner", reason)] = n
    for c in view.constructors:
        for reason, n in c.rejected.items():
            by_role[("constructor", reason)] = by_role.get(("constructor", reason), 0) + n
    for (role, reason), n in sorted(by_role.items()):
        metric.add_metric([role, reason], float(n))
    return metric


def _up() -> Metric:
    return G("msd_up", "1 while the job's metrics endpoint answers.", value=1)


def families(view: StatusView, waits: HistogramSnapshot, plans: HistogramSnapshot) -> list[Metric]:
    """Every metric family of one snapshot, ``msd_up`` first."""
    return [
        _up(),
        *_job(view, waits, plans),
        *_per_item("source", view.sources, _SOURCE),
        *_per_item("loader", view.loaders, _LOADER),
        *_per_item("constructor", view.constructors, _CONSTRUCTOR),
        *_samples(view),
        _rejected(view),
    ]


# -- the endpoint ---------------------------------------------------------------------------
_Snapshot = tuple[StatusView, HistogramSnapshot, HistogramSnapshot]


class _LatestCollector(Collector):
    """Renders whatever snapshot was handed last, in the server's thread (so the Planner's loop
    never pays for a scrape)."""

    def __init__(self) -> None:
        self.latest: _Snapshot | None = None

    def collect(self) -> Iterator[Metric]:
        latest = self.latest  # read once: an update may swap the reference meanwhile
        yield from [_up()] if latest is None else families(*latest)


class MetricsServer:
    """The job's ``/metrics`` endpoint, served from a daemon thread.

    ``advertise`` is the host others should scrape (``host`` may be ``0.0.0.0``).
    """

    def __init__(self, host: str, port: int = 0, advertise: str | None = None) -> None:
        self._collector = _LatestCollector()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self._host = advertise or host

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def endpoint(self) -> str:
        return f"http://{self._host}:{self.port}/metrics"

    def update(self, view: StatusView, waits: HistogramSnapshot, plans: HistogramSnapshot) -> None:
        """Publish a new snapshot: one reference swap, atomic under the GIL."""
        self._collector.latest = (view, waits, plans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
