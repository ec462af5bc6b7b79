"""Planner benchmark: what one ``balance`` call, and planning one whole global step, cost.

    python -m benchmarks.planner [--quick]     # prints the tables
    python -m benchmarks.balance [--quick]     # also runs this, into benchmarks/results/balance.*

``balance``: the median time of one call, for a number of ranks and samples, with rows of
16,384 tokens and just enough rows per rank for about 1.1× the batch's tokens.

``plan_step``: the whole of ``msd.plan.step.plan_step`` — drawing sources, looking up lengths,
packing into rows, balancing (``greedy``) — on a ``StreamSpec`` built directly: the `msd synth`
demo mixture (web / code / books, weights 0.5 / 0.3 / 0.2, ``repeat``), rows of ``SEQ_LEN``
tokens, longer samples split. The points with 1,000 sources add 997 small ones (weight
``SMALL_WEIGHT`` each, lengths like the demo's): a step draws from a few dozen of them, and
costs about what it costs with the three alone. The lookup reads the lengths from numpy arrays
(``msd.synth.text.sample_lengths``) a chunk of draws at once (``many``), as the Planner's own does
(``msd.roles.planner.reported``).

For each point: plan a few steps to warm up, then time consecutive steps (``gc.collect()``
before each), median wall clock and CPU time of the thread. ``plan_step`` returns the plan as
arrays; building its ``Slot`` objects (``plan.rows``, which the Planner no longer reads: it
works on the columns) is timed on its own. The split (selection / balance) times the two
halves of ``plan_step`` separately.
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from msd.plan import step as step_module
from msd.plan.balance import METHODS, balance
from msd.plan.cost import sample_cost
from msd.plan.schedule import constant
from msd.plan.step import PlannerState, StepPlan, StreamSpec, plan_step
from msd.roles.planner.reported import FEW
from msd.synth.text import DEFAULT_SOURCES, sample_lengths

MIX = (0.5, 0.3, 0.2)
POOLS = [sample_lengths(source) for source in DEFAULT_SOURCES]
# One ``balance`` call: (ranks, samples), rows of TIMING_ROW_TOKENS.
TIMING_POINTS = [
    (64, 1_000),
    (512, 8_000),
    (4096, 65_536),
    (64, 8_000),
    (512, 65_536),
    (1024, 65_536),
    (2048, 65_536),
    (4096, 16_384),
    (4096, 32_768),
    (4096, 131_072),
]
QUICK_TIMING_POINTS = TIMING_POINTS[:3]
TIMING_ROW_TOKENS = 16_384
# One ``plan_step``:
SEQ_LEN = 8192
WARMUP_STEPS = 2
# (dp, micro-batches, rows per micro-batch): the targets first, then how cost grows.
TARGETS = [(64, 1, 3), (512, 1, 3), (4096, 1, 3), (4096, 1, 4)]
GROWTH = [
    *[(4096, 1, rows) for rows in (1, 2, 6, 8)],  # more samples, same ranks
    *[(dp, 1, 12288 // dp) for dp in (512, 1024, 2048)],  # ~60k samples, fewer ranks
    (64, 1, 1),
    (64, 1, 12),
    (512, 3, 1),  # micro-batches: 3 of 1 row
    (4096, 3, 1),
]
QUICK = [(64, 1, 3), (512, 1, 3), (4096, 1, 3)]
# (dp, micro-batches, rows per micro-batch, sources): many sources, most of them small.
SOURCES = [(64, 1, 3, 1000), (4096, 1, 3, 1000)]
SMALL_WEIGHT = 1e-6


def stream(dp: int, micro_batches: int, rows: int, sources: int = 3) -> tuple[StreamSpec, Any]:
    tables = [POOLS[s % len(POOLS)] for s in range(sources)]
    spec = StreamSpec(
        seed=0,
        schedule=constant(MIX + (SMALL_WEIGHT,) * (sources - len(MIX))),
        num_rows=tuple(len(t) for t in tables),
        repeat=(True,) * len(tables),
        dp=dp,
        micro_batches=micro_batches,
        micro_batch_size=rows,
        seq_len=SEQ_LEN,
        steps=None,
    )
    return spec, PoolLookup(tables)


class PoolLookup:
    """Every sample's length, from the pools (repeated): one, or many at once."""

    def __init__(self, pools: list[np.ndarray]) -> None:
        self.pools = pools
        lists = {id(pool): pool.tolist() for pool in pools}  # the pools are shared
        self.lists = [lists[id(pool)] for pool in pools]

    def __call__(self, source: int, gpos: int) -> int:
        table: list[int] = self.lists[source]
        return table[gpos % len(table)]

    def many(self, sources: np.ndarray, gpos: np.ndarray) -> np.ndarray:
        if len(gpos) < FEW:  # as the Planner's: one by one
            return np.array(list(map(self, sources.tolist(), gpos.tolist())), dtype=np.int64)
        found = np.empty(len(gpos), dtype=np.int64)
        for source in np.unique(sources).tolist():
            which = sources == source
            pool = self.pools[source]
            found[which] = pool[gpos[which] % len(pool)]
        return found


def draw_lengths(rng: np.random.Generator, count: int, seq_len: int) -> np.ndarray:
    """Sample lengths drawn like the demo mixture, clipped to ``seq_len``."""
    source = rng.choice(len(POOLS), size=count, p=MIX)
    lengths = np.empty(count, dtype=np.int64)
    for s, pool in enumerate(POOLS):
        chosen = source == s
        lengths[chosen] = rng.choice(pool, size=int(chosen.sum()))
    return np.minimum(lengths, seq_len)


def timing_point(dp: int, samples: int, repeats: int) -> dict[str, Any]:
    """Median seconds of one ``balance`` call per method: wall clock, and CPU time of the
    calling thread (less sensitive to other work on the machine)."""
    lengths = draw_lengths(np.random.default_rng(dp + samples), samples, TIMING_ROW_TOKENS)
    costs = sample_cost(lengths)
    rows = max(1, math.ceil(1.1 * lengths.sum() / (dp * TIMING_ROW_TOKENS)))
    wall, cpu = {}, {}
    for method in METHODS:
        call = functools.partial(balance, lengths, costs, dp, 1, rows, TIMING_ROW_TOKENS, method)
        count = repeats if method != "karmarkar_karp" else max(1, repeats // 2)
        runs = [_timed(call) for _ in range(count)]
        wall[method] = statistics.median(w for w, _ in runs)
        cpu[method] = statistics.median(c for _, c in runs)
    capacity = dp * rows * TIMING_ROW_TOKENS
    return {
        "dp": dp,
        "samples": samples,
        "rows_per_rank": rows,
        "capacity_vs_tokens": capacity / float(lengths.sum()),
        "seconds": wall,
        "cpu_seconds": cpu,
    }


def _timed(call: Callable[[], object]) -> tuple[float, float]:
    gc.collect()  # start from a clean heap: a collection owed to earlier work is not counted
    wall, cpu = time.perf_counter(), time.thread_time()
    call()
    return time.perf_counter() - wall, time.thread_time() - cpu


def timing(quick: bool) -> list[dict[str, Any]]:
    points = QUICK_TIMING_POINTS if quick else TIMING_POINTS
    return [timing_point(dp, samples, 3 if quick else 7) for dp, samples in points]


def point(dp: int, micro_batches: int, rows: int, steps: int, sources: int = 3) -> dict[str, Any]:
    spec, lookup = stream(dp, micro_batches, rows, sources)
    state = PlannerState.initial(sources)
    for _ in range(WARMUP_STEPS):
        state = _plan(spec, state, lookup)[1]
    runs: dict[str, list[tuple[float, float]]] = {"plan_step": [], "rows": []}
    runs |= {"selection": [], "balance": []}
    pieces = []
    for _ in range(steps):
        plan, after = _plan(spec, state, lookup, runs)
        runs["rows"].append(_timed(functools.partial(getattr, plan, "rows")))
        _split(spec, state, lookup, runs)
        pieces.append(len(plan.pieces.columns[0]))
        state = after
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    samples = statistics.mean(pieces)
    return {
        "sources": sources,
        "dp": dp,
        "micro_batches": micro_batches,
        "rows_per_micro_batch": rows,
        "seq_len": SEQ_LEN,
        "steps": steps,
        "pieces_per_step": samples,
        "seconds": wall,
        "cpu_seconds": cpu,
        "us_per_piece": 1e6 * cpu["plan_step"] / samples,
        "ns_per_n_log2_n": 1e9 * cpu["plan_step"] / (samples * math.log2(samples)),
    }


def _plan(
    spec: StreamSpec,
    state: PlannerState,
    lookup: Any,
    runs: dict[str, list[tuple[float, float]]] | None = None,
) -> tuple[StepPlan, PlannerState]:
    result: Any = None

    def call() -> None:
        nonlocal result
        result = plan_step(spec, state, lookup)

    timing = _timed(call)
    if runs is not None:
        runs["plan_step"].append(timing)
    assert isinstance(result, tuple), result
    return result[0], result[1]


def _split(
    spec: StreamSpec, state: PlannerState, lookup: Any, runs: dict[str, list[tuple[float, float]]]
) -> None:
    """Time the selection and the balance of the same step on their own."""
    selected: Any = None

    def select() -> None:
        nonlocal selected
        selected = step_module._select(spec, state, lookup)

    runs["selection"].append(_timed(select))
    padded = selected[0].columns()[4]
    runs["balance"].append(_timed(lambda: step_module._split_over_ranks(spec, padded)))


def planner(quick: bool) -> dict[str, Any]:
    """Every point: the targets, and (full run) how the cost grows."""
    steps = 3 if quick else 7
    return {
        "targets": [point(*p, steps) for p in (QUICK if quick else TARGETS)],
        "growth": [] if quick else [point(*p, steps) for p in GROWTH],
        "sources": [point(dp, micro, rows, steps, n) for dp, micro, rows, n in SOURCES],
    }


def tables(result: dict[str, Any]) -> list[str]:
    lines = [
        "## Planner cost: one `plan_step`",
        "",
        f"Demo mixture, rows of {SEQ_LEN} tokens, `greedy`; the median over consecutive steps of "
        "the CPU time of the thread (wall clock in brackets), after a `gc.collect()`. `plan_step` "
        "returns the plan as arrays; `rows` is building its `Slot` objects, which only a caller "
        "reading `plan.rows` pays (the Planner reads the columns). Selection (draw, look up, "
        "pack rows) and balance are also timed on their own.",
        "",
        *_table(result["targets"]),
    ]
    if result["growth"]:
        lines += ["", "Growth with samples and ranks:", "", *_table(result["growth"])]
    if result.get("sources"):
        lines += [
            "",
            f"With 1,000 sources: the three, and 997 more of weight {SMALL_WEIGHT:g} each (a "
            "step draws from a few dozen of them):",
            "",
            *_table(result["sources"]),
        ]
    return lines


def timing_table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        "## Balance cost: one `balance` call",
        "",
        f"Rows of {TIMING_ROW_TOKENS} tokens, 1 micro-batch, rows per rank for ≥ 1.1× the "
        "tokens; median of several calls after a `gc.collect()`: wall clock (CPU time of the "
        "thread in brackets). `greedy` and `karmarkar_karp` include computing `none` for the "
        "guarantee.",
        "",
        "| DP | samples | rows/rank | capacity/tokens | none | greedy | karmarkar_karp |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        times = " | ".join(
            f"{p['seconds'][m] * 1e3:.1f} ms ({p['cpu_seconds'][m] * 1e3:.1f})"
            for m in ("none", "greedy", "karmarkar_karp")
        )
        rows.append(
            f"| {p['dp']} | {p['samples']} | {p['rows_per_rank']} "
            f"| {p['capacity_vs_tokens']:.2f} | {times} |"
        )
    return rows


def _table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| DP | micro-batches × rows | sources | pieces/step | plan_step | selection | balance "
        "| rows | µs/piece | ns/(n·log₂n) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        shape = f"{p['micro_batches']} × {p['rows_per_micro_batch']}"
        cells = " | ".join(
            f"{p['cpu_seconds'][k] * 1e3:.1f} ms ({p['seconds'][k] * 1e3:.1f})"
            for k in ("plan_step", "selection", "balance", "rows")
        )
        rows.append(
            f"| {p['dp']} | {shape} | {p.get('sources', 3):,} | {p['pieces_per_step']:,.0f} "
            f"| {cells} "
            f"| {p['us_per_piece']:.2f} | {p['ns_per_n_log2_n']:.0f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the target points only")
    args = parser.parse_args()
    print("\n".join([*timing_table(timing(args.quick)), "", *tables(planner(args.quick))]))


if __name__ == "__main__":
    main()
