"""Which shard a loader reads next: ``NextRead``, which looks again only at the shards that
changed, picks what the rule picks when every shard is looked at before each read (the first
the Planner waits for, else the emptiest hungry one, a shard in an outage only once its retry
is due), through reads, routes, wants and outages."""

from __future__ import annotations

import random

import msgspec
import pytest

from msd.plan.partition import Shard
from msd.recipe.schema import Recipe
from msd.roles.loader import shard as shard_module
from msd.roles.loader.outage import Outage
from msd.roles.loader.pick import NextRead
from msd.roles.loader.shard import SourceShard
from msd.sources.read import RowGroupReader
from msd.synth.text import SynthSource, synth

SOURCES = 8


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    root = tmp_path_factory.mktemp("pick")
    tiny = [
        SynthSource(f"s{i}", median_tokens=40, sigma=0.8, max_tokens=400, num_samples=300)
        for i in range(SOURCES)
    ]
    synth(root, tiny, seed=3, files_per_source=1, rows_per_row_group=25)
    doc = {
        "seq_len": 256,
        "global_batch_tokens": 1024,
        "steps": 1,
        "loader": {"buffer_tokens": 4096},
        "sources": [
            {"name": s.name, "path": str(root / s.name / "*.parquet"), "text_column": "text"}
            | {"weight": 1 + i, "repeat": True, "transform": {"kind": "bytes"}}
            for i, s in enumerate(tiny)
        ],
    }
    return msgspec.convert(doc, Recipe)


def shards_of(recipe: Recipe) -> list[SourceShard]:
    reader = RowGroupReader()
    return [SourceShard(recipe, Shard(s, 0), reader, (0, None, 1)) for s in range(SOURCES)]


def rule(shards: list[SourceShard], now: float) -> SourceShard | None:
    """Every shard looked at: the first waited for, else the emptiest hungry (the first of
    equals), skipping shards whose retry is not due."""
    due = [s for s in shards if s.outage is None or s.outage.retry_at <= now]
    waited = [s.waited_for for s in shards]
    hungry = [s.hungry for s in shards]
    for shard, w in zip(shards, waited, strict=True):
        if w and shard in due:
            return shard
    fills = [(s.fill, i) for i, (s, h) in enumerate(zip(shards, hungry, strict=True)) if h]
    fills = [(f, i) for f, i in fills if shards[i] in due]
    return shards[min(fills)[1]] if fills else None


def source_of(shard: SourceShard | None) -> int | None:
    return None if shard is None else shard.source


@pytest.mark.parametrize("seed", range(6))
def test_the_shard_picked_is_the_one_the_rule_picks(
    recipe: Recipe, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # chunks of a fixed size (not sized by the tokenizer's speed), so both sets read alike
    monkeypatch.setattr(shard_module, "CHUNK_SECONDS", 1e9)
    monkeypatch.setattr(shard_module, "CHUNK_BYTES", 700)
    rng = random.Random(seed)
    mine, theirs = shards_of(recipe), shards_of(recipe)
    picker = NextRead(mine)
    now, reads, idle = 0.0, 0, 0
    for _ in range(400):
        now += 0.05
        got, want = picker.pick(now), rule(theirs, now)
        assert source_of(got) == source_of(want)
        if got is not None and rng.random() < 0.7:
            assert want is not None
            got.read_next(), want.read_next()
            picker.changed(got.source)
            reads += 1
        else:
            idle += got is None
        action = rng.random()
        source = rng.randrange(SOURCES)
        if action < 0.5 and mine[source].held:  # a route takes some of its oldest samples
            for gpos in sorted(mine[source].held)[: rng.randint(1, 30)]:
                mine[source].forget(gpos), theirs[source].forget(gpos)
            picker.changed(source)
        elif action < 0.6:  # the Planner waits for a position a little ahead
            position = mine[source].next_gpos()
            if position is not None:
                mine[source].want = theirs[source].want = position + rng.randint(0, 40)
                picker.changed(source)
        elif action < 0.65:  # its store failed a read: set aside for a while
            retry_at = now + rng.choice([0.0, 0.2, 1.0])
            for shard in (mine[source], theirs[source]):
                shard.outage = Outage(since=now, budget_s=60.0, retry_at=retry_at)
        elif action < 0.75:
            mine[source].outage = theirs[source].outage = None
    assert reads > 100 and idle > 0  # both branches were taken, many times
