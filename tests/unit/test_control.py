"""The control plane's pure parts: job keys, the mix history, schedules with changes, the
status view, and the `msd mix` argument parser."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from cli.mix import parse_weights
from msd.control.view import JobObserver, metrics_line
from msd.errors import LaunchError, RecipeError
from msd.jobdir.history import load_history, make_change, write_history
from msd.plan.schedule import MixChange, peak_shares, schedule_of
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe
from msd.wire.keys import create_keys, load_keys
from msd.wire.protocol import Hello, RankLoad, SourceLoad, Stats


def _recipe(tmp_path: Path, milestones: str = "") -> Recipe:
    text = f"""
seq_len: 64
global_batch_tokens: 128
steps: 100
sources:
  - {{name: a, path: {tmp_path}/a.parquet, text_column: text, weight: 1}}
  - {{name: b, path: {tmp_path}/b.parquet, text_column: text, weight: 3}}
{milestones}
"""
    (tmp_path / "r.yaml").write_text(text)
    return load_recipe(tmp_path / "r.yaml")


def test_keys_are_private_and_damaged_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.key"
    keys = create_keys(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_keys(path) == keys
    with pytest.raises(LaunchError, match="does not exist"):
        load_keys(tmp_path / "none.key")
    path.write_text(json.dumps({"server_public": "x"}))
    with pytest.raises(LaunchError, match="not a valid job key"):
        load_keys(path)


def test_a_change_overrides_named_sources_from_its_step_on(tmp_path: Path) -> None:
    milestones = "mix: {interpolate: linear, milestones: [{step: 50, weights: {a: 5}}]}"
    recipe = _recipe(tmp_path, milestones)
    base = schedule_of(recipe)
    changed = base.with_change(make_change(recipe, {"a": 0.5}, 20))
    for step in range(20):
        assert changed.weights_at(step) == base.weights_at(step)
    assert changed.weights_at(20) == (0.5, 3.0)
    assert changed.weights_at(70) == (0.5, 3.0)  # the recipe's later milestone no longer applies
    # peak shares see the change: b's share was at most 0.75 and is now 3 / 3.5 from step 20
    assert peak_shares(changed)[1] == pytest.approx(3 / 3.5)


def test_history_round_trips_and_bad_changes_say_what_is_wrong(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    changes = (make_change(recipe, {"b": 0.0, "a": 2}, 10), make_change(recipe, {"b": 1}, 30))
    path = tmp_path / "mix-history.json"
    write_history(path, recipe, changes)
    assert load_history(path, recipe) == changes
    assert changes[0] == MixChange(10, ((0, 2.0), (1, 0.0)))
    assert load_history(tmp_path / "missing.json", recipe) == ()
    with pytest.raises(RecipeError, match="no source named 'c'"):
        make_change(recipe, {"c": 1.0}, 3)
    with pytest.raises(RecipeError, match="finite number >= 0"):
        make_change(recipe, {"a": -1.0}, 3)
    path.write_text(json.dumps({"version": 1, "changes": [{"step": 4, "weights": {"zz": 1}}]}))
    with pytest.raises(RecipeError, match="change 0: no source named 'zz'"):
        load_history(path, recipe)


def test_parse_weights() -> None:
    assert parse_weights(["a=0.5", " b = 2"]) == {"a": 0.5, "b": 2.0}
    with pytest.raises(LaunchError, match="not SOURCE=WEIGHT"):
        parse_weights(["a"])
    with pytest.raises(LaunchError, match="is not a number"):
        parse_weights(["a=x"])


def test_the_view_reports_rates_queues_and_ranks() -> None:
    obs = JobObserver(("a", "b"))
    loader = Hello(role="loader", name="a+1", version=3, pid=7, sources=(0, 1))
    constructor = Hello(role="constructor", name="n0", version=3, pid=8, node="n0", ranks=(0, 1))
    obs.on_hello("l", loader)
    obs.on_hello("c", constructor)
    loads = (SourceLoad(0, 100, 1000, 5, 50), SourceLoad(1, 10, 900, 2, 180))
    obs.on_stats("l", Stats("loader", "a+1", "h", 7, 1.0, 2**20, sources=loads), now=0.0)
    later = tuple(
        SourceLoad(
            s.source, 2 * s.samples_read, 3 * s.tokens_read, 1, 9, busy_s=0.25 * (1 + s.source)
        )
        for s in loads
    )
    blocks = {"cache_hits": 9, "cache_misses": 4, "cache_fetched_bytes": 5 << 20}
    obs.on_stats("l", Stats("loader", "a+1", "h", 7, 1.5, 2**20, sources=later, **blocks), now=1.0)
    ranks = (RankLoad(0, 9, 2, 0.1, 0.4), RankLoad(1, 10, 1, 0.2, 0.3))
    obs.on_stats("c", Stats("constructor", "n0", "n0", 8, 0.2, 2**21, ranks=ranks), now=1.0)
    obs.on_plan(0.002, np.array([1.0, 3.0]))
    obs.on_waits((0.001, 0.003))
    obs.on_tick(0.0, 0, 0, np.array([0, 0]), np.array([0, 0]))
    obs.on_tick(2.0, 10, 4000, np.array([30, 10]), np.array([1000, 3000]))
    view = obs.view(
        state="running",
        planned=14,
        steps=100,
        uptime_s=3.0,
        failure="",
        weights=(1.0, 3.0),
        lifecycle={"delivered": 4},
        counts={"split": 1},
        planner_pid=1,
        now=2.0,
    )
    assert view.job.steps_per_s == 5.0 and view.job.tokens_per_s == 2000.0
    assert [s.weight for s in view.sources] == [0.25, 0.75]
    assert [s.tokens_per_s for s in view.sources] == [500.0, 1500.0]
    assert [s.queue_samples for s in view.sources] == [1, 1] and view.sources[1].loaders == 1
    (lo,) = view.loaders
    assert lo.cpu_percent == 50.0 and lo.samples_per_s == 110.0 and lo.state == "running"
    assert lo.tokens_read == 3 * 1900 and lo.busy_s == 0.75  # as of its last report
    assert [r.rank for r in view.ranks] == [0, 1] and view.ranks[0].ahead == 2
    assert view.planner.balance_max_over_mean == 1.5 and view.planner.planned_ahead == 4
    assert view.wait_p99_ms == pytest.approx(2.98)
    line = metrics_line(view, 123.0)
    assert line["step"] == 10 and line["sources"]["b"]["tokens_per_s"] == 1500.0
    assert (lo.cache_hits, lo.cache_misses, lo.cache_fetched_bytes) == (9, 4, 5 << 20)
    assert line["cache"] == {"hits": 9, "misses": 4, "fetched_bytes": 5 << 20}


def test_the_view_sums_what_video_loaders_left_out_and_decoded_per_source() -> None:
    obs = JobObserver(("v", "t"))
    for key, name in (("a", "v+0"), ("b", "v+1")):
        obs.on_hello(key, Hello(role="loader", name=name, version=3, pid=7, sources=(0,)))
    lost = (("videos undecodable (truncated)", 2), ("videos without a marker", 1))
    obs.on_stats(
        "a",
        Stats(
            "loader",
            "v+0",
            "h",
            7,
            1.0,
            1,
            sources=(
                SourceLoad(
                    0, 9, 90, 0, 0, skipped=lost, videos_read=5, video_s=10.0, video_cpu_s=0.5
                ),
            ),
        ),
        now=0.0,
    )
    obs.on_stats(
        "b",
        Stats(
            "loader",
            "v+1",
            "h",
            8,
            1.0,
            1,
            sources=(
                SourceLoad(
                    0, 9, 90, 0, 0, skipped=lost[:1], videos_read=3, video_s=4.0, video_cpu_s=0.25
                ),
            ),
        ),
        now=0.0,
    )
    view = obs.view(
        state="running",
        planned=1,
        steps=2,
        uptime_s=1.0,
        failure="",
        weights=(1.0, 1.0),
        lifecycle={},
        counts={},
        planner_pid=1,
        now=1.0,
    )
    v, t = view.sources
    assert v.left_out == {"videos undecodable (truncated)": 4, "videos without a marker": 1}
    assert (v.videos_read, v.video_s, v.video_cpu_s) == (8, 14.0, 0.75)
    assert t.left_out == {} and t.videos_read == 0


def test_each_sources_row_is_its_own_numbers_among_thousands() -> None:
    """The rows are worked out a column at a time: each is still its own source's figures
    (rounded as shown: to 1e-6 of the mix, 0.01 samples/s, 0.1 tokens/s)."""
    rng = np.random.default_rng(7)
    count = 3000
    obs = JobObserver(tuple(f"s{i}" for i in range(count)))
    for n, sources in enumerate(np.array_split(np.arange(count), 3)):
        hello = Hello(
            role="loader", name=f"l{n}", version=3, pid=n, sources=tuple(sources.tolist())
        )
        obs.on_hello(f"l{n}", hello)
        loads = tuple(
            SourceLoad(int(s), 0, 0, int(s) % 5, 7 * int(s), errors=int(s) % 3) for s in sources
        )
        obs.on_stats(f"l{n}", Stats("loader", f"l{n}", "h", n, 1.0, 1, sources=loads), now=1.0)
    before, after = rng.integers(0, 10**6, (2, count)), rng.integers(0, 10**6, (2, count))
    after += before
    obs.on_tick(0.0, 0, 0, before[0], before[1])
    obs.on_tick(3.0, 9, 90, after[0], after[1])
    weights = tuple((rng.random(count) * (rng.random(count) < 0.9)).tolist())
    view = obs.view(
        state="running",
        planned=9,
        steps=None,
        uptime_s=3.0,
        failure="",
        weights=weights,
        lifecycle={},
        counts={},
        planner_pid=1,
        skipped_images=tuple(range(count)),
        now=3.0,
    )
    norm = sum(weights)
    assert [s.name for s in view.sources] == [f"s{i}" for i in range(count)]
    for s, row in enumerate(view.sources):
        assert abs(row.weight - weights[s] / norm) <= 0.5e-6 + 1e-12
        assert abs(row.samples_per_s - (after[0][s] - before[0][s]) / 3.0) <= 0.005 + 1e-9
        assert abs(row.tokens_per_s - (after[1][s] - before[1][s]) / 3.0) <= 0.05 + 1e-9
        assert (row.samples, row.tokens) == (after[0][s], after[1][s])
        assert (row.queue_samples, row.queue_tokens, row.errors) == (s % 5, 7 * s, s % 3)
        assert row.loaders == 1 and row.skipped_images == s
