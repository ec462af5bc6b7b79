import re
import urllib.request

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from msd.control import metrics as metrics_module
from msd.control.metrics import BUCKETS_S, Histogram, HistogramSnapshot, MetricsServer
from msd.wire.views import (
    ConstructorView,
    JobView,
    LoaderView,
    PlannerView,
    RankView,
    SourceView,
    StatusView,
)


def source(name, weight, samples, tokens):
    return SourceView(
        name=name,
        weight=weight,
        samples_per_s=10.0,
        tokens_per_s=1000.0,
        samples=samples,
        tokens=tokens,
        loaders=2,
        queue_samples=7,
        queue_tokens=700,
        errors=1,
    )


def loader(name, state):
    return LoaderView(
        name=name,
        node="n0",
        pid=100,
        state=state,
        cpu_percent=50.0,
        cpu_seconds=12.5,
        pss_bytes=1 << 20,
        samples_per_s=3.0,
        sources=1,
        cache_hits=7,
        cache_misses=3,
        cache_fetched_bytes=12 << 20,
    )


def view():
    return StatusView(
        version=1,
        job=JobView(
            state="running",
            step=42,
            planned=50,
            steps=None,
            steps_per_s=2.0,
            tokens_per_s=8192.0,
            tokens=172_032,
            uptime_s=21.0,
            failure="",
        ),
        sources=(source("web", 0.7, 900, 36_000), source("code", 0.3, 300, 36_000)),
        loaders=(loader("web/0", "running"), loader("code/0", "failed")),
        constructors=(
            ConstructorView(
                name="c0",
                node="n0",
                pid=101,
                state="running",
                cpu_percent=20.0,
                cpu_seconds=4.0,
                pss_bytes=2 << 20,
                ready_bytes=4096,
                payload_bytes=512,
                rejected={"malformed": 2, "unplanned": 5},
            ),
        ),
        ranks=tuple(
            RankView(rank=r, constructor="c0", step=42, ahead=3, wait_p50_ms=0.1, wait_p99_ms=0.4)
            for r in range(4)
        ),
        planner=PlannerView(
            pid=99,
            plan_ms_p50=1.0,
            plan_ms_p99=3.0,
            balance_max_over_mean=1.04,
            planned_ahead=8,
            lifecycle={"read": 11, "routed": 5},
            split=3,
            truncated=2,
            dropped=1,
            rejected={"unexpected": 1},
        ),
        wait_p50_ms=0.1,
        wait_p99_ms=0.4,
    )


def scrape(server):
    with urllib.request.urlopen(server.endpoint, timeout=5) as response:
        text = response.read().decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def samples(families, sample_name):
    """{labels as a sorted tuple: value} of every sample called ``sample_name``."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in families.values()
        for s in f.samples
        if s.name == sample_name
    }


def value(families, sample_name, **labels):
    return samples(families, sample_name)[tuple(sorted(labels.items()))]


@pytest.fixture
def server():
    with MetricsServer("127.0.0.1") as s:
        yield s


# -- Histogram -------------------------------------------------------------------------------
def test_histogram_counts_are_cumulative_and_le_inclusive():
    h = Histogram((0.1, 1.0))
    h.observe_many([0.05, 0.1, 0.5, 3.0, 7.0])
    snap = h.snapshot()
    assert snap.cumulative == (2, 3, 5)  # 0.1 falls in le=0.1; 3 and 7 only in +Inf
    assert snap.count == 5
    assert snap.sum_s == pytest.approx(10.65)
    assert snap.buckets() == [("0.1", 2), ("1.0", 3), ("+Inf", 5)]


def test_histogram_default_bounds_and_empty_snapshot():
    h = Histogram()
    assert h.snapshot() == HistogramSnapshot.empty()
    h.observe(0.0003)
    snap = h.snapshot()
    assert snap.bounds == BUCKETS_S
    assert len(snap.cumulative) == len(BUCKETS_S) + 1
    assert all(c == 1 for c in snap.cumulative)


def test_snapshot_is_not_changed_by_later_observations():
    h = Histogram()
    h.observe(0.01)
    before = h.snapshot()
    h.observe(0.01)
    assert before.count == 1 and h.snapshot().count == 2


def test_histogram_rejects_unsorted_bounds():
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((1.0, 0.5))


# -- the endpoint ----------------------------------------------------------------------------
def test_endpoint_names_the_bound_port_and_the_advertised_host(server):
    assert server.port > 0
    assert server.endpoint == f"http://127.0.0.1:{server.port}/metrics"
    with MetricsServer("127.0.0.1", advertise="node7") as other:
        assert other.endpoint == f"http://node7:{other.port}/metrics"


def test_before_the_first_update_only_msd_up(server):
    _, families = scrape(server)
    assert list(families) == ["msd_up"]
    assert value(families, "msd_up") == 1


def test_scrape_exposes_the_view(server):
    waits, plans = Histogram(), Histogram()
    waits.observe_many([0.0001, 0.003, 0.003, 0.7, 9.0])
    plans.observe(0.002)
    server.update(view(), waits.snapshot(), plans.snapshot())
    text, f = scrape(server)

    assert value(f, "msd_up") == 1
    assert value(f, "msd_job_state", state="running") == 1
    assert value(f, "msd_steps_total") == 42
    assert value(f, "msd_steps_planned_total") == 50
    assert value(f, "msd_tokens_total") == 172_032
    assert value(f, "msd_steps_ahead") == 8
    assert value(f, "msd_balance_ratio") == pytest.approx(1.04)

    assert value(f, "msd_source_weight", source="web") == pytest.approx(0.7)
    assert value(f, "msd_source_samples_total", source="code") == 300
    assert value(f, "msd_source_tokens_total", source="web") == 36_000
    assert value(f, "msd_source_queue_samples", source="web") == 7
    assert value(f, "msd_source_queue_tokens", source="web") == 700
    assert value(f, "msd_source_loaders", source="code") == 2
    assert value(f, "msd_source_errors_total", source="code") == 1

    assert value(f, "msd_loader_up", loader="web/0") == 1
    assert value(f, "msd_loader_up", loader="code/0") == 0
    assert value(f, "msd_loader_cpu_seconds_total", loader="web/0") == 12.5
    assert value(f, "msd_loader_pss_bytes", loader="web/0") == 1 << 20
    assert value(f, "msd_loader_cache_hits_total", loader="web/0") == 7
    assert value(f, "msd_loader_cache_misses_total", loader="web/0") == 3
    assert value(f, "msd_loader_cache_fetched_bytes_total", loader="web/0") == 12 << 20
    assert value(f, "msd_constructor_cpu_seconds_total", constructor="c0") == 4.0
    assert value(f, "msd_constructor_pss_bytes", constructor="c0") == 2 << 20
    assert value(f, "msd_constructor_ready_bytes", constructor="c0") == 4096
    assert value(f, "msd_constructor_payload_bytes", constructor="c0") == 512

    assert samples(f, "msd_lifecycle_samples") == {
        (("state", "read"),): 11,
        (("state", "routed"),): 5,
    }
    assert value(f, "msd_samples_split_total") == 3
    assert value(f, "msd_samples_truncated_total") == 2
    assert value(f, "msd_samples_dropped_total") == 1

    # the histogram as Prometheus reads it: cumulative buckets, +Inf == count, the sum
    assert value(f, "msd_data_wait_seconds_bucket", le="0.0005") == 1
    assert value(f, "msd_data_wait_seconds_bucket", le="0.005") == 3
    assert value(f, "msd_data_wait_seconds_bucket", le="1.0") == 4
    assert value(f, "msd_data_wait_seconds_bucket", le="5.0") == 4
    assert value(f, "msd_data_wait_seconds_bucket", le="+Inf") == 5
    assert value(f, "msd_data_wait_seconds_count") == 5
    assert value(f, "msd_data_wait_seconds_sum") == pytest.approx(9.7061)
    assert value(f, "msd_plan_duration_seconds_count") == 1
    assert value(f, "msd_plan_duration_seconds_bucket", le="0.002") == 1

    # conventions: counters end in _total, and no family is labelled by rank
    assert "# TYPE msd_data_wait_seconds histogram" in text
    for family in f.values():
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        for s in family.samples:
            assert s.name.startswith("msd_")
            allowed = {"source", "loader", "constructor", "state", "role", "reason", "le"}
            assert set(s.labels) <= allowed


def test_an_update_replaces_the_previous_snapshot(server):
    empty = HistogramSnapshot.empty()
    server.update(view(), empty, empty)
    first = view()
    later = msgspec.structs.replace(
        first, job=msgspec.structs.replace(first.job, step=43, state="done")
    )
    server.update(later, empty, empty)
    _, f = scrape(server)
    assert value(f, "msd_steps_total") == 43
    assert samples(f, "msd_job_state") == {(("state", "done"),): 1}
    assert value(f, "msd_data_wait_seconds_count") == 0


def test_close_stops_serving():
    s = MetricsServer("127.0.0.1")
    url = s.endpoint
    s.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_the_module_docstring_lists_exactly_the_exposed_metrics(server):
    server.update(view(), HistogramSnapshot.empty(), HistogramSnapshot.empty())
    _, f = scrape(server)
    exposed = {name + "_total" if fam.type == "counter" else name for name, fam in f.items()}
    documented = set(re.findall(r"^\s+(msd_\w+)", metrics_module.__doc__, re.MULTILINE))
    assert exposed == documented
    assert sum(fam.type == "counter" for fam in f.values()) == 19


def test_rejected_messages_are_counted_by_role_and_reason(server):
    server.update(view(), HistogramSnapshot.empty(), HistogramSnapshot.empty())
    _, f = scrape(server)
    assert samples(f, "msd_rejected_messages_total") == {
        (("reason", "malformed"), ("role", "constructor")): 2,
        (("reason", "unplanned"), ("role", "constructor")): 5,
        (("reason", "unexpected"), ("role", "planner")): 1,
    }
