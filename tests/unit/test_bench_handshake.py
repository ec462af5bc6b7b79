"""benchmarks.handshake: a tiny point in each mode, and how the table is read from the points."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.handshake import MODES, per_connection, point, table


@pytest.mark.parametrize("mode", MODES)
def test_a_point_answers_every_connection_and_counts_each_sides_cpu(
    mode: str, tmp_path: Path
) -> None:
    result = point(12, 2, mode, tmp_path)
    assert (result["connections"], result["clients"], result["mode"]) == (12, 2, mode)
    assert 0 < result["wall_s"] < 60
    assert result["server_cpu_s"] > 0 and result["clients_cpu_s"] > 0
    assert result["server_cpu_ms_per_connection"] == pytest.approx(
        1e3 * result["server_cpu_s"] / 12
    )


def test_per_connection_takes_each_modes_median_over_rounds() -> None:
    def made(n: int, mode: str, wall: float, server: float) -> dict[str, object]:
        return {
            "connections": n,
            "mode": mode,
            "wall_s": wall,
            "server_cpu_ms_per_connection": server,
            "clients_cpu_ms_per_connection": 2 * server,
        }

    points = [
        made(8, "msd", 1.0, 0.9),
        made(8, "msd", 3.0, 1.1),
        made(8, "msd", 2.0, 5.0),
        made(8, "plain", 0.5, 0.1),
        made(64, "curve", 4.0, 0.6),
    ]
    rows = per_connection(points)
    assert [r["connections"] for r in rows] == [8, 64]
    assert rows[0]["msd_wall_s"] == 2.0 and rows[0]["msd_server_cpu_ms_per_connection"] == 1.1
    assert rows[0]["msd_clients_cpu_ms_per_connection"] == 2.2
    assert rows[0]["plain_wall_s"] == 0.5 and rows[0]["curve_wall_s"] is None
    assert rows[1]["curve_server_cpu_ms_per_connection"] == 0.6 and rows[1]["msd_wall_s"] is None
    lines = table(rows)
    assert "| 8 | 2.00 / - / 0.50 | 1.100 / - / 0.100 | 2.200 / - / 0.200 |" in lines
