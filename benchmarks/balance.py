"""Balance benchmark: how even each method makes a step, and what one Planner call costs.

    python -m benchmarks.balance [--quick] [--out benchmarks/results]

Quality: for each context length and data-parallel size, global batches are drawn from the
`msd synth` demo length distributions (web / code / books mixed 0.5 / 0.3 / 0.2, clipped to the
context length) until the next sample would pass 95 % of the step's capacity (every rank has
1 micro-batch of 2 rows of `seq_len` tokens), and costed `len² + 256·len`. Over the steps it
sums each method's maximum rank cost (the step time), and the lower bound
`max(mean rank cost, largest sample)` of each step.

Planner cost: the median time of one `balance` call, for a number of ranks and samples, with rows
of 16,384 tokens and just enough rows per rank for about 1.1× the batch's tokens.

Writes `balance.md` (the tables) and `balance.json` (every number) to `--out`.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from msd.plan.balance import METHODS, Method, balance, lower_bound, rank_costs
from msd.plan.cost import sample_cost
from msd.synth import DEFAULT_SOURCES, sample_lengths

ROOT = Path(__file__).resolve().parent.parent
SEQ_LENS = (4096, 8192, 16384)
MIX = (0.5, 0.3, 0.2)  # web, code, books
FILL = 0.95
MICRO_BATCHES, ROWS_PER_MICRO_BATCH = 1, 2
# Steps per data-parallel size: the largest sizes are sampled with fewer steps.
STEPS = {8: 500, 64: 200, 512: 50, 4096: 12}
QUICK_STEPS = {8: 40, 64: 20, 512: 3}
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


class Lengths:
    """Sample lengths drawn like the demo mixture."""

    def __init__(self, seed: int) -> None:
        self.pools = [sample_lengths(source) for source in DEFAULT_SOURCES]
        self.rng = np.random.default_rng(seed)

    def draw(self, count: int, seq_len: int) -> np.ndarray:
        source = self.rng.choice(len(self.pools), size=count, p=MIX)
        lengths = np.empty(count, dtype=np.int64)
        for s, pool in enumerate(self.pools):
            chosen = source == s
            lengths[chosen] = self.rng.choice(pool, size=int(chosen.sum()))
        return np.minimum(lengths, seq_len)

    def batch(self, budget_tokens: int, seq_len: int) -> np.ndarray:
        """Samples until the next one would pass ``budget_tokens``."""
        lengths = np.empty(0, dtype=np.int64)
        while lengths.sum() <= budget_tokens:
            lengths = np.concatenate([lengths, self.draw(max(64, len(lengths)), seq_len)])
        return lengths[: int(np.searchsorted(np.cumsum(lengths), budget_tokens, side="right"))]


def quality_point(seq_len: int, dp: int, steps: int, seed: int) -> dict[str, Any]:
    """Sums over ``steps`` global batches of each method's maximum rank cost."""
    lengths_of = Lengths(seed)
    capacity = dp * MICRO_BATCHES * ROWS_PER_MICRO_BATCH * seq_len
    totals: dict[str, Any] = {m: _zero() for m in METHODS}
    bound, tokens, samples = 0.0, 0, 0
    for _ in range(steps):
        lengths = lengths_of.batch(int(FILL * capacity), seq_len)
        costs = sample_cost(lengths)
        bound += lower_bound(costs, dp)
        tokens, samples = tokens + int(lengths.sum()), samples + len(lengths)
        unbalanced = _step(totals["none"], lengths, costs, dp, seq_len, "none", None)
        for method in ("greedy", "karmarkar_karp"):
            _step(totals[method], lengths, costs, dp, seq_len, method, unbalanced)
    return {
        "seq_len": seq_len,
        "dp": dp,
        "steps": steps,
        "samples_per_step": samples / steps,
        "tokens": tokens,
        "lower_bound": bound,
        "methods": {m: _summary(t, bound, tokens, totals["none"]) for m, t in totals.items()},
    }


def _zero() -> dict[str, Any]:
    return {"max_cost": 0.0, "placed_tokens": 0, "fell_back": 0, "seconds": 0.0}


def _step(
    total: dict[str, Any],
    lengths: np.ndarray,
    costs: np.ndarray,
    dp: int,
    seq_len: int,
    method: Method,
    unbalanced: Any,
) -> Any:
    started = time.perf_counter()
    a = balance(lengths, costs, dp, MICRO_BATCHES, ROWS_PER_MICRO_BATCH, seq_len, method)
    total["seconds"] += time.perf_counter() - started
    total["max_cost"] += float(rank_costs(a, costs).max())
    total["placed_tokens"] += int(lengths.sum() - lengths[list(a.leftover)].sum())
    total["fell_back"] += int(a == unbalanced)
    return a


def _summary(
    total: dict[str, Any], bound: float, tokens: int, none: dict[str, Any]
) -> dict[str, Any]:
    per_token = total["max_cost"] / total["placed_tokens"]
    none_per_token = none["max_cost"] / none["placed_tokens"]
    return {
        **total,
        "vs_lower_bound": total["max_cost"] / bound,
        "placed_share": total["placed_tokens"] / tokens,
        "speedup_vs_none": none["max_cost"] / total["max_cost"],
        "speedup_per_token_vs_none": none_per_token / per_token,
    }


def quality(quick: bool) -> list[dict[str, Any]]:
    steps = QUICK_STEPS if quick else STEPS
    return [
        quality_point(seq_len, dp, n, seed=seq_len + dp)
        for seq_len in SEQ_LENS
        for dp, n in steps.items()
    ]


def timing_point(dp: int, samples: int, repeats: int) -> dict[str, Any]:
    """Median seconds of one ``balance`` call per method: wall clock, and CPU time of the
    calling thread (less sensitive to other work on the machine)."""
    lengths = Lengths(seed=dp + samples).draw(samples, TIMING_ROW_TOKENS)
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


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Balance benchmark ({'quick' if result['quick'] else 'full'} run)",
        "",
        f"Machine: {result['machine']['cpus']} cores {result['machine']['processor']}, "
        f"Python {result['machine']['python']}, numpy {result['machine']['numpy']}; "
        f"load average {result['machine']['load_average_1m_at_start']:.1f} at the start, "
        f"{result['machine']['load_average_1m_at_end']:.1f} at the end.",
        "",
        *_quality_table(result["quality"]),
        "",
        *_speedup_table(result["quality"]),
        "",
        *_timing_table(result["timing"]),
    ]
    return "\n".join(lines) + "\n"


def _quality_table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        "## Balance quality",
        "",
        f"Each rank: {MICRO_BATCHES} micro-batch × {ROWS_PER_MICRO_BATCH} rows of `seq_len` "
        f"tokens; batches filled to {FILL:.0%} of capacity; cost `len² + 256·len`. "
        "Σ max = the sum over steps of the most expensive rank's cost, relative to the sum of "
        "per-step lower bounds max(mean rank cost, largest sample). Placed = share of the "
        "batch's tokens placed (the rest is carried to the next step). Fallback = steps where "
        "the method's own split was worse than `none`, so `none`'s was returned.",
        "",
        "| seq_len | DP | steps | samples/step | none Σmax/LB | greedy Σmax/LB "
        "| KK Σmax/LB | placed none / greedy / KK | fallback greedy / KK |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        m = p["methods"]
        placed = " / ".join(f"{m[k]['placed_share']:.1%}" for k in METHODS[::-1])
        rows.append(
            f"| {p['seq_len']} | {p['dp']} | {p['steps']} | {p['samples_per_step']:.0f} "
            f"| {m['none']['vs_lower_bound']:.3f} | {m['greedy']['vs_lower_bound']:.3f} "
            f"| {m['karmarkar_karp']['vs_lower_bound']:.3f} | {placed} "
            f"| {m['greedy']['fell_back']} / {m['karmarkar_karp']['fell_back']} |"
        )
    return rows


def _speedup_table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        "## Implied step-time speed-up over `none`",
        "",
        "Σ none max / Σ method max (per token placed in brackets: `none` places fewer "
        "tokens per step). Mean over the DP sizes per context length.",
        "",
        "| seq_len | DP | greedy | KK |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        g, k = p["methods"]["greedy"], p["methods"]["karmarkar_karp"]
        rows.append(
            f"| {p['seq_len']} | {p['dp']} | {g['speedup_vs_none']:.2f}× "
            f"({g['speedup_per_token_vs_none']:.2f}×) | {k['speedup_vs_none']:.2f}× "
            f"({k['speedup_per_token_vs_none']:.2f}×) |"
        )
    for seq_len, means in _mean_speedups(points).items():
        rows.append(
            f"| **{seq_len}** | mean | **{means['greedy']:.2f}×** "
            f"| **{means['karmarkar_karp']:.2f}×** |"
        )
    return rows


def _mean_speedups(points: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    means = {}
    for seq_len in sorted({p["seq_len"] for p in points}):
        at = [p["methods"] for p in points if p["seq_len"] == seq_len]
        means[seq_len] = {
            m: statistics.mean(x[m]["speedup_vs_none"] for x in at)
            for m in ("greedy", "karmarkar_karp")
        }
    return means


def _timing_table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        "## Planner cost: one `balance` call",
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small subset, < 30 s")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    started = time.perf_counter()
    result: dict[str, Any] = {
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average_1m_at_start": os.getloadavg()[0],
        },
        "quality": quality(args.quick),
        "timing": timing(args.quick),
    }
    result["mean_speedup_vs_none"] = _mean_speedups(result["quality"])
    result["wall_s"] = time.perf_counter() - started
    result["machine"]["load_average_1m_at_end"] = os.getloadavg()[0]
    table = markdown(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "balance.md").write_text(table)
    (args.out / "balance.json").write_text(json.dumps(result, indent=2))
    print(table)
    print(f"({result['wall_s']:.0f} s; wrote {args.out / 'balance.md'} and balance.json)")


if __name__ == "__main__":
    main()
