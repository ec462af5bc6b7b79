"""The stream does not change: plans of many fixed-seed inputs hash to recorded digests.

Each case runs ``plan_step`` for a few steps (or to the end of finite sources) over a varied
spec — data-parallel size (below and above the sizes where ``greedy`` places in numpy
batches), micro-batches, rows, row length, padding, long-sample policy, balance method, patch
budget, encoder costs, empty samples, unknown lengths — and hashes every plan, count, carry and
state, and every ``NeedData``. ``placement`` is hashed the same way over random batches. The
digests in ``plan_digests.json`` were recorded from the planner; a change to any plan of any case
fails here. To record them again (only for a change of the stream that is meant, and tagged
SAMPLE-ORDER in the changelog): ``python -m tests.unit.test_plan_digests``. Below them, the
planner's batched shortcuts are checked against the one-at-a-time rule they stand for.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msd.plan.balance import hybrid_placement, placement
from msd.plan.phases import _merge_late
from msd.plan.rows import RowPacker
from msd.plan.schedule import MixChange, Schedule, constant
from msd.plan.step import (
    EndOfStream,
    NeedData,
    PlannerState,
    Slot,
    StepPlan,
    StreamSpec,
    plan_step,
)
from msd.synth.text import DEFAULT_SOURCES, sample_lengths

RECORDED = Path(__file__).with_name("plan_digests.json")


def _lengths(rng: np.random.Generator, count: int, seq_len: int, kind: str) -> np.ndarray:
    if kind == "short":
        return rng.integers(1, max(2, seq_len // 3), count)
    if kind == "tail":  # long tail: a few samples several rows long
        return np.minimum(
            rng.lognormal(np.log(seq_len / 6), 1.2, count).astype(np.int64), 5 * seq_len
        )
    if kind == "empty":  # many samples hold no tokens
        return np.where(rng.random(count) < 0.3, 0, rng.integers(1, seq_len + 1, count))
    return rng.integers(1, 2 * seq_len, count)  # "uniform": some longer than a row


def _case(seed: int) -> dict[str, Any]:
    """A random spec and the lengths of its sources."""
    rng = np.random.default_rng(seed)
    sources = int(rng.choice([1, 2, 3, 5, 12]))
    seq_len = int(rng.choice([16, 64, 100, 512, 2048]))
    dp = int(rng.choice([1, 2, 3, 5, 8, 64, 260, 300]))
    micro, per_micro = int(rng.choice([1, 1, 2, 3])), int(rng.choice([1, 2, 3, 4]))
    finite = rng.random() < 0.5
    rows = [
        int(rng.integers(20, 400)) if finite else int(rng.integers(200, 3000))
        for _ in range(sources)
    ]
    weights = rng.random(sources) * (rng.random(sources) < 0.8)
    weights[int(rng.integers(sources))] += 0.5
    schedule = constant(weights.tolist())
    if rng.random() < 0.3:  # a mix change part-way, one source switched off
        schedule = Schedule(schedule.points, False, (MixChange(2, ((0, 0.0),)),))
    kind = str(rng.choice(["short", "tail", "empty", "uniform"]))
    spec = StreamSpec(
        seed=seed,
        schedule=schedule,
        num_rows=tuple(rows),
        repeat=tuple(bool(not finite or rng.random() < 0.3) for _ in range(sources)),
        dp=dp,
        micro_batches=micro,
        micro_batch_size=per_micro,
        seq_len=seq_len,
        steps=int(rng.integers(3, 7)),
        pad_multiple=int(rng.choice([1, 1, 2, 8])),
        long_samples=str(rng.choice(["split", "truncate", "drop"])),
        method=str(rng.choice(["greedy", "greedy", "karmarkar_karp", "none"])),  # type: ignore[arg-type]
        max_patches=None if rng.random() < 0.7 else int(rng.integers(50, 2000)),
    )
    tables = [_lengths(rng, n, seq_len, kind) for n in rows]
    patches = [np.where(rng.random(n) < 0.5, rng.integers(0, 600, n), 0) for n in rows]
    return {
        "spec": spec,
        "tables": tables,
        "patches": patches,
        "encoder": rng.random() < 0.3,
        "unknown": int(rng.integers(50, 400)) if rng.random() < 0.2 else None,
    }


class _Many:
    """A lookup that also answers a chunk of draws at once (as the Planner's does)."""

    def __init__(self, one: Callable[[int, int], int | None]) -> None:
        self.one = one

    def __call__(self, source: int, gpos: int) -> int | None:
        return self.one(source, gpos)

    def many(self, sources: np.ndarray, gpos: np.ndarray) -> np.ndarray:
        found = map(self.one, sources.tolist(), gpos.tolist())
        return np.array([-1 if n is None else n for n in found], dtype=np.int64)


def _run(
    case: dict[str, Any],
    many: bool = False,
    reveal: np.random.Generator | None = None,
    soon: bool = True,
    ahead: int = 40,
) -> str:
    """The digest of a case's plans. ``reveal``: lengths become known a few positions of a
    source at a time (1 to ``ahead`` - 1 past the one asked for), when planning asks for them,
    and each retry resumes the last attempt.
    ``soon``: a final ``NeedData`` is hashed with the other unknown draws it names (which depend
    on how the draws were chunked), else only with the sample it waits for."""
    spec: StreamSpec = case["spec"]
    tables, patch_tables, unknown = case["tables"], case["patches"], case["unknown"]
    revealed = [0 if reveal is not None else 1 << 62] * len(tables)  # known below these

    def lookup(source: int, gpos: int) -> int | None:
        if unknown is not None and gpos >= unknown:
            return None
        if gpos >= revealed[source]:
            return None
        return int(tables[source][gpos % len(tables[source])])

    def patches(sources: np.ndarray, gpos: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        each = np.array(
            [patch_tables[s][g % len(patch_tables[s])] for s, g in zip(sources, gpos, strict=True)]
        )
        return np.where(offsets == 0, each, 0).astype(np.int64)

    def encoder(sources: np.ndarray, gpos: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        p = patches(sources, gpos, np.zeros(len(sources), dtype=np.int64)).astype(np.float64)
        return p * p + 64 * p

    digest = hashlib.sha256()
    state = PlannerState.initial(len(spec.num_rows))
    resume, steps = None, 0
    while steps < 12:
        result = plan_step(
            spec,
            state,
            _Many(lookup) if many else lookup,
            encoder if case["encoder"] else None,
            patches if spec.max_patches is not None else None,
            resume,
        )
        if (
            reveal is not None
            and isinstance(result, NeedData)
            and (unknown is None or result.gpos < unknown)
        ):
            assert result.gpos >= revealed[result.source]
            revealed[result.source] = result.gpos + int(reveal.integers(1, ahead))
            resume = result.resume
            continue
        resume, steps = None, steps + 1
        if isinstance(result, (NeedData, EndOfStream)):
            if soon or isinstance(result, EndOfStream):
                digest.update(repr(result).encode())
            else:
                digest.update(repr((result.source, result.gpos)).encode())
            break
        plan, state = result
        assert plan.rows == _rows(plan)
        for column in (*plan.pieces.columns, plan.pieces.bounds):
            digest.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
        digest.update(repr((plan.step, plan.counts, plan.dropped, state)).encode())
    return digest.hexdigest()


def _rows(plan: StepPlan) -> tuple[tuple[tuple[Slot, ...], ...], ...]:
    """``plan.rows`` built the plain way, one ``Slot`` call per piece."""
    columns = (c.tolist() for c in plan.pieces.columns)
    slots = [Slot(*piece) for piece in zip(*columns, strict=True)]
    bounds, per_rank = plan.pieces.bounds.tolist(), plan.rows_per_rank
    rows = [tuple(slots[bounds[g] : bounds[g + 1]]) for g in range(len(bounds) - 1)]
    return tuple(tuple(rows[r : r + per_rank]) for r in range(0, len(rows), per_rank))


def _placement(seed: int) -> str:
    rng = np.random.default_rng(1_000_000 + seed)
    ranks = int(rng.choice([1, 2, 7, 64, 256, 300]))
    micro, per_micro = int(rng.choice([1, 2, 3])), int(rng.choice([1, 2, 4]))
    row_tokens = int(rng.choice([64, 1000, 8192]))
    count = int(rng.integers(1, 3 * ranks * micro * per_micro + 2))
    lengths = np.minimum(
        rng.lognormal(np.log(row_tokens / 5), 1.0, count).astype(np.int64), 2 * row_tokens
    )
    how = str(rng.choice(["quadratic", "ties", "flat", "random"]))
    if how == "quadratic":
        costs = lengths.astype(np.float64) ** 2 + 256.0 * lengths
    elif how == "ties":
        costs = (lengths // 100).astype(np.float64)
    elif how == "flat":
        costs = np.ones(count)
    else:
        costs = rng.random(count) * 1000
    args = (ranks, micro, per_micro, row_tokens)
    digest = hashlib.sha256()
    for method in ("greedy", "karmarkar_karp", "none"):
        digest.update(placement(lengths, costs, *args, method).tobytes())  # type: ignore[arg-type]
    encoder = np.where(rng.random(count) < 0.3, rng.random(count) * costs.max(initial=1.0), 0.0)
    digest.update(hybrid_placement(lengths, costs, encoder, *args, "greedy").tobytes())
    return digest.hexdigest()


def _demo(dp: int, micro: int, per_micro: int, sources: int) -> str:
    """Steps like the benchmark's: the demo mixture (or ``sources`` sources, most drawn
    rarely, some finite), rows of 8,192 tokens."""
    pools = [sample_lengths(source) for source in DEFAULT_SOURCES]
    tables = [pools[s % len(pools)][s // len(pools) :].tolist() for s in range(sources)]
    weights = [0.5, 0.3, 0.2] if sources == 3 else [1.0 / (1 + s) ** 2 for s in range(sources)]
    spec = StreamSpec(
        seed=sources,
        schedule=constant(weights),
        num_rows=tuple(len(t) if s % 7 else 40 for s, t in enumerate(tables)),
        repeat=tuple(s % 7 != 6 for s in range(sources)),
        dp=dp,
        micro_batches=micro,
        micro_batch_size=per_micro,
        seq_len=8192,
        steps=None,
    )

    def lookup(source: int, gpos: int) -> int:
        table = tables[source]
        length: int = table[gpos % len(table)]
        return length

    digest = hashlib.sha256()
    state = PlannerState.initial(sources)
    for _ in range(3):
        result = plan_step(spec, state, lookup)
        assert isinstance(result, tuple)
        plan, state = result
        for column in (*plan.pieces.columns, plan.pieces.bounds):
            digest.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
        digest.update(repr((plan.step, plan.counts, plan.dropped, state)).encode())
    return digest.hexdigest()


STEP_CASES = 160
PLACEMENT_CASES = 120
DEMO_CASES = [(64, 1, 3, 3), (512, 3, 1, 3), (4096, 1, 3, 3), (1024, 1, 2, 1000)]


def _digests() -> Iterator[tuple[str, str]]:
    for seed in range(STEP_CASES):
        yield f"step-{seed}", _run(_case(seed))
    for seed in range(PLACEMENT_CASES):
        yield f"placement-{seed}", _placement(seed)
    for case in DEMO_CASES:
        yield "demo-{}-{}-{}-{}".format(*case), _demo(*case)


@pytest.fixture(scope="module")
def recorded() -> dict[str, str]:
    loaded: dict[str, str] = json.loads(RECORDED.read_text())
    return loaded


@pytest.mark.parametrize("seed", range(STEP_CASES))
def test_plans_are_the_recorded_ones(seed: int, recorded: dict[str, str]) -> None:
    assert _run(_case(seed)) == recorded[f"step-{seed}"]


@pytest.mark.parametrize("seed", range(0, STEP_CASES, 4))
def test_a_lookup_of_many_draws_at_once_plans_the_same(seed: int, recorded: dict[str, str]):
    assert _run(_case(seed), many=True) == recorded[f"step-{seed}"]


@pytest.mark.parametrize("seed", range(0, STEP_CASES, 3))
def test_a_retry_that_resumes_where_data_ran_out_plans_the_same(
    seed: int, recorded: dict[str, str]
) -> None:
    """Lengths known only a few positions ahead, each retry continuing the last attempt's
    selection (``NeedData.resume``): the plans of planning with every length known."""
    case, many, rng = _case(seed), seed % 2 == 0, np.random.default_rng(seed)
    spec = case["spec"]
    rows = spec.dp * spec.micro_batches * spec.micro_batch_size
    ahead = 40 * max(1, rows // 256)  # a step of thousands of rows: tens of retries, not 1,000s
    if case["unknown"] is None:
        assert _run(case, many, reveal=rng, ahead=ahead) == recorded[f"step-{seed}"]
    else:  # planning ends waiting for a length that never comes
        got = _run(case, many, reveal=rng, soon=False, ahead=ahead)
        assert got == _run(case, many, soon=False)


@pytest.mark.parametrize("seed", range(PLACEMENT_CASES))
def test_placements_are_the_recorded_ones(seed: int, recorded: dict[str, str]) -> None:
    assert _placement(seed) == recorded[f"placement-{seed}"]


def _merge_late_one_by_one(
    pool: list[int], late: list[int], joins: list[int], steps: int
) -> dict[int, int]:
    """``_merge_late`` a step at a time: the lightest of the pool's next and the late ranks
    joined so far."""
    taken_at: dict[int, int] = {}
    waiting: list[int] = []
    head = k = 0
    for step in range(steps):
        while k < len(late) and joins[k] <= step:
            heapq.heappush(waiting, late[k])
            k += 1
        if waiting and (head == len(pool) or waiting[0] < pool[head]):
            taken_at[step] = heapq.heappop(waiting)
        elif head < len(pool):
            head += 1
        else:
            break
    return taken_at


@pytest.mark.parametrize("seed", range(300))
def test_late_ranks_merge_as_one_by_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(int(rng.integers(1, 60)))
    is_late = rng.random(len(ranks)) < rng.random()
    pool = sorted(ranks[~is_late].tolist())
    steps = int(rng.integers(1, len(ranks) + 5))
    late = ranks[is_late]
    joins = rng.integers(1, max(2, steps), len(late))
    order = np.argsort(joins, kind="stable")
    args = (pool, late[order].tolist(), joins[order].tolist(), steps)
    assert _merge_late(*args) == _merge_late_one_by_one(*args)


def _place_one_by_one(packer: RowPacker, lengths: list[int]) -> bool:
    """``RowPacker.place`` a piece at a time, undoing the moves if one does not fit."""
    moved: list[tuple[int, int]] = []
    for length in lengths:
        k = bisect.bisect_left(packer.rooms, length)
        if k == len(packer.rooms):
            for before, after in reversed(moved):
                packer._move(after, before)
            return False
        room = packer.rooms[k]
        moved.append((room, room - length))
        packer._move(room, room - length, k)
    packer.count += len(lengths)
    return True


@pytest.mark.parametrize("seed", range(200))
def test_groups_are_placed_as_one_piece_at_a_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, row_tokens = int(rng.integers(0, 7)), int(rng.integers(1, 20))
    ours, reference = RowPacker(rows, row_tokens), RowPacker(rows, row_tokens)
    for _ in range(30):
        if rng.random() < 0.6:  # a split sample: whole rows, then the rest
            group = [row_tokens] * int(rng.integers(1, 4)) + [int(rng.integers(1, row_tokens + 1))]
        else:
            group = rng.integers(0, row_tokens + 1, int(rng.integers(1, 4))).tolist()
        assert ours.place(group) == _place_one_by_one(reference, group)
        assert (ours.rooms, ours.count) == (reference.rooms, reference.count)
        assert ours.free_rooms() == reference.free_rooms()


@pytest.mark.parametrize("linear", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_schedule_weights_are_worked_out_as_at_each_step(seed: int, linear: bool) -> None:
    """``weights_at`` keeps each stretch between breakpoints: the same as working it out."""
    rng = np.random.default_rng(seed)
    points = tuple(
        tuple(sorted({(0, 1.0)} | {(int(t), float(w)) for t, w in rng.random((2, 2)) * (30, 3)}))
        for _ in range(int(rng.integers(1, 5)))
    )
    points = tuple(tuple(dict(p).items()) for p in points)  # one weight per step
    changes = tuple(
        MixChange(int(rng.integers(0, 40)), ((int(rng.integers(len(points))), 0.5),))
        for _ in range(int(rng.integers(0, 3)))
    )
    schedule, fresh = Schedule(points, linear, changes), Schedule(points, linear, changes)
    for step in rng.permutation(60).tolist() + list(range(60)):
        assert schedule.weights_at(step) == fresh._weights_at(step)


@pytest.mark.parametrize("case", DEMO_CASES)
def test_demo_steps_are_the_recorded_ones(
    case: tuple[int, int, int, int], recorded: dict[str, str]
) -> None:
    assert _demo(*case) == recorded["demo-{}-{}-{}-{}".format(*case)]


if __name__ == "__main__":
    RECORDED.write_text(json.dumps(dict(_digests()), indent=1) + "\n")
