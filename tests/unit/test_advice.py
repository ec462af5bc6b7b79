"""Advice on loader processes: when they are too many, and how a launch summarises them."""

from __future__ import annotations

from typing import Any

import msgspec

from msd.plan.advice import (
    count_processes,
    listing,
    process_limit,
    summary,
    too_many_loaders,
)
from msd.plan.partition import loader_processes
from msd.recipe.schema import Recipe


def recipe(sources: int, **loader: Any) -> Recipe:
    return msgspec.convert(
        {
            "seq_len": 64,
            "global_batch_tokens": 256,
            "steps": 10,
            "sources": [
                {"name": f"s{i}", "path": "x", "text_column": "t", "weight": 1}
                for i in range(sources)
            ],
            "loader": loader,
        },
        Recipe,
    )


def test_the_limit_is_64_or_4_per_cpu_locally_and_64_on_slurm():
    assert process_limit(2, "local") == 64
    assert process_limit(48, "local") == 192
    assert process_limit(48, "slurm") == 64


def test_no_advice_up_to_the_limit():
    assert too_many_loaders(64, 2, "local") is None
    assert too_many_loaders(192, 48, "local") is None


def test_advice_is_one_sentence_naming_the_count_and_the_keys():
    advice = too_many_loaders(10_000, 16, "local")
    assert advice is not None and advice.count(". ") == 0
    assert "10000 loader processes" in advice and "more than 64" in advice
    assert "sources_per_process" in advice and "loaders: auto" in advice
    on_slurm = too_many_loaders(65, 64, "slurm")
    assert on_slurm is not None and "SLURM job" in on_slurm


def test_few_sources_get_one_each_by_default_and_many_share_the_cpus():
    assert count_processes(recipe(8), cpus=8) == 8  # few: one process each
    assert count_processes(recipe(4), cpus=2) == 4  # at least 4 of their own
    assert count_processes(recipe(100), cpus=8) == 8  # many: shared out as auto
    assert count_processes(recipe(100, sources_per_process=16), cpus=8) == 7
    ones = recipe(100)
    ones = msgspec.structs.replace(
        ones, sources=tuple(msgspec.structs.replace(s, loaders=1) for s in ones.sources)
    )
    assert count_processes(ones, cpus=8) == 100  # loaders: 1, as the recipe says


def test_auto_sources_count_at_most_the_cpus_left_to_them():
    r = recipe(1000)
    sources = tuple(msgspec.structs.replace(s, loaders="auto") for s in r.sources[:990])
    mixed = msgspec.structs.replace(r, sources=sources + r.sources[990:])
    assert count_processes(mixed, cpus=32) == 10 + (32 - 10)
    assert count_processes(msgspec.structs.replace(mixed, sources=sources), cpus=32) == 32


def test_summary_counts_shared_and_own_processes_and_names_the_largest():
    r = recipe(256, sources_per_process=50)
    sources = list(r.sources)
    for i, n in ((3, 4), (7, 2), (9, 3), (11, 2)):
        sources[i] = msgspec.structs.replace(sources[i], loaders=n)
    sources[12] = msgspec.structs.replace(sources[12], shadows=1)
    r = msgspec.structs.replace(r, sources=tuple(sources))
    processes = loader_processes(r)
    text = summary(r, processes)
    assert text.startswith(f"256 sources on {len(processes)} loader processes: ")
    # s8 and s10, alone between sources with loaders > 1, and s12 (it has a shadow) have one
    # process each; 0-2, 4-6 and 13-255 (in fifties) share 7
    assert "own processes: s3 4, s9 3, s7 2 and 4 more sources" in text
    assert "249 sources share 7 of them" in text and "; 1 shadow standing by" in text
    assert "s100" not in text


def test_listing_has_every_process_and_every_source():
    r = recipe(40, sources_per_process=8)
    lines = listing(r, loader_processes(r)).splitlines()
    assert len(lines) == 5
    served = [name for line in lines for name in line.split("\t")[1].split(", ")]
    assert served == [f"s{i}" for i in range(40)]
