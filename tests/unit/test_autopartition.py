"""``loaders: auto``: the loader processes shared out by measured cost, at two levels."""

from __future__ import annotations

import msgspec
import pytest

from msd.plan.autopartition import OWN_PROCESSES_AT_LEAST, allocate, with_default_loaders
from msd.recipe.schema import Recipe


def test_heavy_sources_get_their_own_processes_and_light_ones_share() -> None:
    # one slow source (20x the cost per token) at 60 % of the tokens, 40 light ones
    shares = [0.6] + [0.01] * 40
    costs = [20.0] + [1.0] * 40
    a = allocate(shares, costs, cpus=8)
    assert a.need[0] == pytest.approx(12 / 12.4)
    assert a.loaders[0] == 8 and all(n == 0 for n in a.loaders[1:])
    assert sorted(s for g in a.groups for s in g) == list(range(1, 41))  # each light source once
    assert len(a.groups) == 1  # 40 light sources: one process, not 40


def test_light_sources_are_packed_to_about_one_process_each() -> None:
    a = allocate([0.1] * 10, [1.0] * 10, cpus=4)  # each needs 10 %: a process carries 25 %
    assert all(n == 0 for n in a.loaders)
    assert [len(g) for g in a.groups] == [2, 2, 2, 2, 2]
    b = allocate([0.5, 0.5], [3.0, 1.0], cpus=4)  # 75 % and 25 % of the loader time
    assert b.loaders == (3, 1) and b.groups == ()


def test_unset_loaders_are_one_each_while_few_and_auto_when_many() -> None:
    def recipe(n: int, **loader: object) -> Recipe:
        doc = {
            "seq_len": 64,
            "global_batch_tokens": 256,
            "steps": 3,
            "sources": [
                {"name": f"s{i}", "path": "x", "text_column": "t", "weight": 1} for i in range(n)
            ],
            "loader": loader,
        }
        return msgspec.convert(doc, Recipe)

    def loaders(r: Recipe) -> list[object]:
        return [s.loaders for s in r.sources]

    assert OWN_PROCESSES_AT_LEAST == 4
    assert loaders(with_default_loaders(recipe(4), cpus=2)) == [1] * 4
    assert loaders(with_default_loaders(recipe(5), cpus=2)) == ["auto"] * 5
    assert loaders(with_default_loaders(recipe(16), cpus=16)) == [1] * 16
    assert loaders(with_default_loaders(recipe(64, sources_per_process=8), cpus=2)) == [1] * 64
    mixed = recipe(6)
    sources = (msgspec.structs.replace(mixed.sources[0], loaders=3), *mixed.sources[1:])
    mixed = msgspec.structs.replace(mixed, sources=sources)
    assert loaders(with_default_loaders(mixed, cpus=2)) == [3, *["auto"] * 5]  # set: kept
