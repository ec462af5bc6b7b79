"""Loader processes and shards: who reads what, how much each may hold, and compaction."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from msd.plan.partition import (
    Generation,
    Placement,
    Shard,
    find_process,
    generations,
    loader_processes,
    placements,
    span,
)
from msd.plan.schedule import constant, peak_shares, schedule_of
from msd.recipe.schema import Recipe
from msd.roles.loader.budget import shard_budget
from msd.roles.loader.visit import Visit, cell_sizes


def recipe_with(loaders: list[int], per_process: int, **extra: Any) -> Recipe:
    sources = [
        {"name": f"s{i}", "path": "x/*.parquet", "text_column": "t", "weight": 1.0, "loaders": n}
        for i, n in enumerate(loaders)
    ]
    doc = {
        "seq_len": 64,
        "global_batch_tokens": 1024,
        "steps": 1,
        "sources": sources,
        "loader": {"sources_per_process": per_process, **extra.pop("loader", {})},
        **extra,
    }
    return msgspec.convert(doc, Recipe)


def test_one_process_per_shard_by_default() -> None:
    processes = loader_processes(recipe_with([1, 2, 1], per_process=1))
    assert [(p.name, p.shards) for p in processes] == [
        ("s0/0", (Shard(0, 0),)),
        ("s1/0", (Shard(1, 0),)),
        ("s1/1", (Shard(1, 1),)),
        ("s2/0", (Shard(2, 0),)),
    ]


def test_light_sources_share_processes_in_recipe_order() -> None:
    recipe = recipe_with([1, 1, 1, 3, 1, 1, 1, 1], per_process=3)
    processes = loader_processes(recipe)
    assert [p.name for p in processes] == ["s0+2", "s3/0", "s3/1", "s3/2", "s4+2", "s7/0"]
    assert processes[0].sources == (0, 1, 2)
    assert processes[4].shards == (Shard(4, 0), Shard(5, 0), Shard(6, 0))
    # every shard of every source is served exactly once
    shards = [shard for p in processes for shard in p.shards]
    assert sorted((s.source, s.index) for s in shards) == [
        (s, i) for s, n in enumerate([1, 1, 1, 3, 1, 1, 1, 1]) for i in range(n)
    ]
    assert find_process(recipe, "s4+2") == processes[4]
    with pytest.raises(KeyError, match=r"no loader process named 'nope'.*s0\+2"):
        find_process(recipe, "nope")


def test_placements_name_each_source_own_processes_or_the_index_of_the_one_it_shares() -> None:
    recipe = recipe_with([1, 1, 1, 3, 1, 1, 1, 1], per_process=3)
    places = placements(8, loader_processes(recipe))  # s0+2, s3/0..2, s4+2, s7/0
    assert places[:4] == [Placement(0, 0, 2)] * 3 + [Placement(3)]
    assert places[4:] == [Placement(0, 4, 2)] * 3 + [Placement(1)]


def test_peak_shares_look_at_every_milestone() -> None:
    assert peak_shares(constant([1.0, 3.0])) == (0.25, 0.75)
    mix = {
        "interpolate": "linear",
        "milestones": [{"step": 10, "weights": {"s1": 3.0}}, {"step": 20, "weights": {"s1": 0.0}}],
    }
    recipe = recipe_with([1, 1], per_process=1, mix=mix)
    assert peak_shares(schedule_of(recipe)) == (1.0, 0.75)


def test_budgets_follow_the_largest_share_and_hold_a_row() -> None:
    recipe = recipe_with([1, 2, 1, 1], per_process=1, loader={"buffer_tokens": 4000})
    # shares 1/4 each: 1000 tokens; the source with 2 shards splits its part
    budgets = [shard_budget(recipe, s, src.loaders) for s, src in enumerate(recipe.sources)]
    assert budgets == [1000, 500, 1000, 1000]
    assert shard_budget(recipe, 1, 4) == 250  # a rescale to 4 loaders shares it out again
    tiny = recipe_with([1] * 100, per_process=1, loader={"buffer_tokens": 1000})
    assert shard_budget(tiny, 7, 1) == 64  # never below one row (seq_len)


def read_all(visit: Visit, budget: int) -> list[tuple[int, int, bytes]]:
    """(visit position, block row, text) of every row of a visit, chunk by chunk."""
    out = []
    while not visit.done:
        start, rows, text = visit.next_chunk(budget)
        assert len(rows) == len(text) >= 1
        pairs = zip(rows.tolist(), text.to_pylist(), strict=True)
        out += [(start + k, r, t) for k, (r, t) in enumerate(pairs)]
    return out


def test_a_visit_reads_its_rows_in_order_holding_one_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(0)
    texts = pa.array(["x" * int(n) + str(i) for i, n in enumerate(rng.integers(1, 400, 500))])
    rows = rng.permutation(500)
    expected = [(k, int(r), texts[int(r)].as_py()) for k, r in enumerate(rows)]

    def read() -> pa.Array:  # the block as the file gives it, each time
        return pa.array(texts.to_pylist())

    def visit_of(column: pa.Array) -> Visit:
        def rows_of(wanted: np.ndarray) -> pa.Array:
            return read().take(pa.array(wanted))

        return Visit.of(0, 0, rows, cell_sizes(column), rows_of, column)

    for budget in (1, 700, 10**9):
        visit = visit_of(read())
        assert read_all(visit, budget) == expected
        assert visit.reads == 1  # the block (100 KB) fits one window: read once
    monkeypatch.setattr("msd.roles.loader.visit.WINDOW_BYTES", 4096)
    visit = visit_of(read())
    windows = len(visit.bounds) - 1
    assert windows > 20
    held = []
    while not visit.done:
        visit.next_chunk(1000)
        held.append(visit.held_bytes())
    assert max(held) < 4096 + 400 + 8 * 500  # a window's text (and offsets), never the block
    assert visit.reads == windows  # read again for each window
    assert read_all(visit_of(read()), 333) == expected


def test_rescales_add_processes_and_split_the_visits_once() -> None:
    recipe = recipe_with([2, 1, 1], per_process=2)
    rescales = (Generation(0, 1, 3, 10), Generation(0, 2, 1, None), Generation(2, 1, 2, 7))
    names = [p.name for p in loader_processes(recipe, rescales)]
    assert names == [
        "s0/0",
        "s0/1",
        "s1+1",
        "s0@1/0",
        "s0@1/1",
        "s0@1/2",
        "s0@2/0",
        "s2@1/0",
        "s2@1/1",
    ]
    assert find_process(recipe, "s0@1/2", rescales).shards == (Shard(0, 2, 1),)
    table = generations(recipe, rescales)
    assert span(table, Shard(0, 1)) == (0, 10, 2)
    assert span(table, Shard(0, 2, 1)) == (10, None, 3)  # generation 2 is not cut in yet
    assert span(table, Shard(0, 0, 2)) == (None, None, 1)
    assert span(table, Shard(2, 0)) == (0, 7, 1)
    # every visit of source 0 before 10 + 3k belongs to exactly one shard
    owners: dict[int, list[tuple[int, int]]] = {}
    for shard in [Shard(0, 0), Shard(0, 1), Shard(0, 0, 1), Shard(0, 1, 1), Shard(0, 2, 1)]:
        start, stop, stride = span(table, shard)
        assert start is not None
        for v in range(start + shard.index, 40 if stop is None else stop, stride):
            owners.setdefault(v, []).append((shard.generation, shard.index))
    assert sorted(owners) == list(range(40)) and all(len(o) == 1 for o in owners.values())
