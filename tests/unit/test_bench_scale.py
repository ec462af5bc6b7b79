"""The scale harness's helpers: connections read from /proc, and a run's figures."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from benchmarks import scale_proc as proc
from benchmarks.scale import parse_fanouts, summarise
from benchmarks.scale_job import Point, shares
from msd import logs

linux_proc = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")


@linux_proc
def test_a_connection_this_process_opens_is_counted_on_both_ends() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        before = proc.sockets(os.getpid(), proc.tcp_table())
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                mine = proc.sockets(os.getpid(), proc.tcp_table())
                ours = [c for c in proc.established(mine) if port in (c.local_port, c.remote_port)]
                client_port = client.getsockname()[1]
                assert sorted((c.local_port, c.remote_port) for c in ours) == sorted(
                    [(port, client_port), (client_port, port)]
                )
                # one end is inbound (to the listening port), the other is not
                assert proc.inbound(mine) - proc.inbound(before) == 1
    assert proc.LISTEN in {c.state for c in mine if c.local_port == port}


@linux_proc
def test_memory_and_cpu_of_this_process_are_read() -> None:
    assert proc.pss_bytes(os.getpid()) > 1 << 20
    assert proc.rss_bytes(os.getpid()) >= proc.pss_bytes(os.getpid()) // 2
    assert proc.cpu_seconds(os.getpid()) > 0
    assert proc.socket_inodes(2**22 + 7) == set()  # no such process: nothing, no error


def test_a_step_is_done_when_every_worker_had_it() -> None:
    a = {0: 1.0, 1: 2.0, 2: 3.0}
    b = {0: 1.5, 1: 1.9}  # step 2 not reached here
    assert proc.step_done_at([a, b]) == {0: 1.5, 1: 2.0}
    done = {s: 10.0 + 0.5 * s for s in range(11)}  # two steps a second
    assert proc.steps_per_s(done, warmup=3) == pytest.approx(2.0)
    assert proc.step_gaps_ms(done, warmup=9) == pytest.approx([500.0, 500.0])
    assert proc.steps_per_s({0: 1.0}, warmup=0) == 0.0


def test_percentile_interpolates_like_numpy() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert proc.percentile(values, 50) == 3.0
    assert proc.percentile(values, 99) == pytest.approx(4.96)
    assert proc.percentile([], 50) == 0.0


def test_nodes_are_shared_out_evenly() -> None:
    assert shares(10, 4) == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert shares(2, 4) == [(0, 1), (1, 1)]
    assert sum(n for _, n in shares(512, 4)) == 512


def test_fanout_flag() -> None:
    assert parse_fanouts("direct,8") == [None, 8]
    with pytest.raises(Exception, match="int >= 1"):
        parse_fanouts("0")


def test_summary_of_a_run() -> None:
    point = Point(nodes=2, sources=10, fanout=None, ranks_per_node=2, steps=4, warmup=1)
    roles = {
        "planner": [{"pid": 1, "connections": 7, "inbound": 6, "pss": 3 << 20, "cpu_s": 1.0}],
        "loader": [
            {"pid": 2, "connections": 3, "inbound": 0, "pss": 2 << 20, "cpu_s": 1.0},
            {"pid": 3, "connections": 3, "inbound": 0, "pss": 2 << 20, "cpu_s": 2.0},
        ],
        "nodes": [{"pid": 4, "connections": 12, "inbound": 8, "pss": 4 << 20, "cpu_s": 5.0}],
    }
    later = {r: [e | {"cpu_s": e["cpu_s"] + 0.4} for e in es] for r, es in roles.items()}
    counts = {"constructor": {"received:Payload": [16, 1600], "sent:Batch": [16, 3200]}}
    raw = {
        "nodes_out": [{"done_at": {"0": 1.0, "1": 1.5, "2": 2.0, "3": 2.5}, "counts": counts,
                       "errors": []}],
        "warm": {"roles": roles, "step": 1, "time": 100.0},
        "end": {"roles": later, "step": 3, "time": 102.0},
        "peak_pss": {"1": 5 << 20},
        "capped": False, "wall_s": 9.0, "startup_s": 1.0,
        "status": {"planner": {"plan_ms_p50": 1.5, "plan_ms_p99": 4.0}},
    }  # fmt: skip
    f = summarise(point, raw)
    assert f["steps_per_s"] == pytest.approx(2.0)
    assert f["connections_per_loader"] == 3 and f["connections_planner"] == 7
    assert f["connections_into_constructor"] == 4.0  # 8 inbound over 2 Constructors
    assert f["pss_mib_planner"] == 5.0 and f["pss_mib_per_constructor"] == 2.0
    assert f["cpu_ms_per_step"]["loader"] == pytest.approx(400.0)  # 0.8 s over 2 steps
    assert f["cpu_cores"]["loader"] == pytest.approx(0.4)  # ... and 2 s
    assert f["messages_per_step"]["constructor"]["sent:Batch"] == {"messages": 4, "bytes": 800}
    assert f["estimated_per_step"]["loaders_sent_payloads"] == 4
    assert f["cpu_us_per_node_message"] == pytest.approx(1000 * 200 / 8)
    assert f["steps_per_s_planner"] == pytest.approx(1.0)  # 2 steps in 2 s, as it counted them
    assert f["errors"] == [] and f["constructors_running_at_end"] == 0


def test_a_nodes_process_that_wrote_nothing_is_reported_not_read_as_no_steps() -> None:
    point = Point(nodes=4, sources=10, fanout=2, ranks_per_node=2, steps=4, warmup=1,
                  nodes_per_process=2)  # fmt: skip
    roles = {"planner": [], "loader": [], "nodes": []}
    raw = {
        "nodes_out": [{"done_at": {"0": 1.0, "1": 1.5}, "counts": {}, "errors": [],
                       "constructors_running": 2}],
        "warm": {"roles": roles, "step": 1, "time": 100.0},
        "end": {"roles": roles, "step": 7, "time": 103.0},
        "peak_pss": {}, "capped": False, "wall_s": 9.0, "startup_s": 1.0, "status": None,
    }  # fmt: skip
    f = summarise(point, raw)
    assert f["errors"] == ["1 of 2 nodes processes wrote no figures"]
    assert f["constructors_running_at_end"] == 2
    assert f["steps_per_s_planner"] == pytest.approx(2.0)


def _log_line(at: float, role: str, message: str) -> str:
    """A line as msd's roles log it (``msd.logs.FORMAT``), made at wall time ``at``."""
    record = logging.LogRecord("msd.x", logging.INFO, __file__, 1, message, None, None)
    record.created, record.msecs = at, (at % 1) * 1000
    record.role, record.step = role, "0"
    return logging.Formatter(logs.FORMAT).format(record)


def test_startup_phases_are_read_from_the_roles_logs(tmp_path: Path) -> None:
    t0 = 1_780_000_000.0
    (tmp_path / "planner-planner.log").write_text(
        _log_line(t0 + 1.25, "planner", "planner ready")
        + "\n"
        + _log_line(t0 + 9.5, "planner", "4 loaders, 512 constructors")
        + "\nnot a log line: 4 loaders, 512 constructors\n"
        + _log_line(t0 + 30.0, "planner", "4 loaders, 520 constructors")  # a later change
        + "\n"
    )
    for n, ready in enumerate((3.0, 4.75)):
        line = _log_line(t0 + ready, f"loader[l{n}]", f"loader l{n} (25 sources) ready in 2 s")
        (tmp_path / f"loader-l{n}.log").write_text(line + "\n")
    phases = proc.startup_phases(t0, t0 + 0.5, tmp_path, [t0 + 2.0, t0 + 6.5], t0 + 12.0)
    assert phases == {
        "planner_up": 0.5,
        "loaders_ready": 4.75,
        "nodes_up": 6.5,
        "registered": 9.5,
        "first_step": 12.0,
    }
    none = proc.startup_phases(t0, None, tmp_path / "missing", [], None)
    assert set(none.values()) == {None}
