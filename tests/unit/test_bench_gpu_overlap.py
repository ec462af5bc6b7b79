"""benchmarks.gpu_overlap: the batch check's cost stays out of the figures."""

from __future__ import annotations

import pytest

from benchmarks.gpu_overlap import summarise


def records(check_every: int, steps: int = 40) -> list[dict]:
    """Steps of 100 ms; a checked step's check adds 500 ms to its cycle, and the next step's
    wait and GPU gap include it."""
    out, asked, after_check = [], 0.0, False
    for step in range(steps):
        checked = step % check_every == 0
        out.append({
            "step": step, "loss": 1.0, "tokens": 1000, "pixel_bytes": 0, "asked": asked,
            "wait_ms": 500.0 if after_check else 1.0, "step_ms": 90.0,
            "gpu_gap_ms": 500.0 if after_check else 2.0, "after_check": after_check,
        })  # fmt: skip
        asked += 0.1 + (0.5 if checked else 0.0)
        after_check = checked
    return out


def test_checked_steps_are_left_out_of_steps_per_s_waits_and_gaps() -> None:
    got = summarise(records(check_every=10), warmup=5)
    assert got["steps_per_s"] == pytest.approx(10.0)
    assert got["tokens_per_s"] == pytest.approx(10_000.0)
    assert got["wait_p99_ms"] == pytest.approx(1.0)
    assert got["gpu_gap_p99_ms"] == pytest.approx(2.0)
    assert got["steps_used"] == 35 - 3  # steps 5..39 less those right after 10, 20, 30


def test_without_the_exclusion_the_check_would_show() -> None:
    """The same records with the marks dropped: the check's cost is what was left out."""
    plain = [r | {"after_check": False} for r in records(check_every=10)]
    got = summarise(plain, warmup=5)
    assert got["steps_per_s"] < 9.0 and got["wait_p99_ms"] > 100.0
