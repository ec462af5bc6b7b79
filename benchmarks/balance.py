"""Balance benchmark: how even each method makes a step, and what planning costs.

    python -m benchmarks.balance [--quick] [--out benchmarks/results]   # full: ~2 min

Quality: for each context length and data-parallel size, global batches are drawn from the
`msd synth` demo length distributions (web / code / books mixed 0.5 / 0.3 / 0.2, clipped to the
context length) until the next sample would pass 95 % of the step's capacity (every rank has
1 micro-batch of 2 rows of `seq_len` tokens), and costed `len² + 256·len`. Over the steps it
sums each method's maximum rank cost (the step time), the lower bound
`max(mean rank cost, largest sample)` of each step, and a capacity-aware lower bound that also
knows a row holds at most `seq_len` tokens (``capacity_bound``). The same for 2, 4 and 8 rows per
rank at DP 64.

Cost: one `balance` call and one whole `plan_step` (``benchmarks/planner.py``).

Writes `balance.md` (the tables) and `balance.json` (every number) to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.planner import draw_lengths, planner, tables, timing, timing_table
from msd.plan.balance import METHODS, Method, lower_bound, placement
from msd.plan.cost import sample_cost
from msd.plan.greedy import pack_greedy
from msd.plan.karmarkar_karp import pack_karmarkar_karp
from msd.plan.placement import Shape, rank_loads

ROOT = Path(__file__).resolve().parent.parent
SEQ_LENS = (4096, 8192, 16384)
FILL = 0.95
MICRO_BATCHES, ROWS_PER_MICRO_BATCH = 1, 2
# Steps per data-parallel size: the largest sizes are sampled with fewer steps.
STEPS = {8: 500, 64: 200, 512: 50, 4096: 12}
QUICK_STEPS = {8: 40, 64: 20, 512: 3}
ROWS_PER_RANK = (2, 4, 8)  # the rows-per-rank table: DP 64, this many steps
ROWS_DP, ROWS_STEPS, QUICK_ROWS_STEPS = 64, 50, 5


class Lengths:
    """Sample lengths drawn like the demo mixture."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def batch(self, budget_tokens: int, seq_len: int) -> np.ndarray:
        """Samples until the next one would pass ``budget_tokens``."""
        lengths = np.empty(0, dtype=np.int64)
        while lengths.sum() <= budget_tokens:
            more = draw_lengths(self.rng, max(64, len(lengths)), seq_len)
            lengths = np.concatenate([lengths, more])
        return lengths[: int(np.searchsorted(np.cumsum(lengths), budget_tokens, side="right"))]


def quality_point(
    seq_len: int, dp: int, steps: int, seed: int, rows: int = ROWS_PER_MICRO_BATCH
) -> dict[str, Any]:
    """Sums over ``steps`` global batches of each method's maximum rank cost."""
    lengths_of = Lengths(seed)
    capacity = dp * MICRO_BATCHES * rows * seq_len
    totals: dict[str, Any] = {m: _zero() for m in METHODS}
    bound, capacity_aware, tokens, samples = 0.0, 0.0, 0, 0
    for _ in range(steps):
        lengths = lengths_of.batch(int(FILL * capacity), seq_len)
        costs = sample_cost(lengths)
        bound += lower_bound(costs, dp)
        capacity_aware += capacity_bound(lengths, costs, dp, MICRO_BATCHES * rows, seq_len)
        tokens, samples = tokens + int(lengths.sum()), samples + len(lengths)
        for method in METHODS:
            _step(totals[method], lengths, costs, dp, rows, seq_len, method)
    return {
        "seq_len": seq_len,
        "dp": dp,
        "rows_per_rank": MICRO_BATCHES * rows,
        "steps": steps,
        "samples_per_step": samples / steps,
        "tokens": tokens,
        "lower_bound": bound,
        "capacity_bound": capacity_aware,
        "methods": {
            m: _summary(t, bound, capacity_aware, tokens, totals["none"]) for m, t in totals.items()
        },
    }


def _zero() -> dict[str, Any]:
    return {"max_cost": 0.0, "placed_tokens": 0, "fell_back": 0, "seconds": 0.0}


def _step(
    total: dict[str, Any],
    lengths: np.ndarray,
    costs: np.ndarray,
    dp: int,
    rows: int,
    seq_len: int,
    method: Method,
) -> None:
    shape = Shape(dp, MICRO_BATCHES, rows, seq_len)
    started = time.perf_counter()
    row_of = placement(lengths, costs, dp, MICRO_BATCHES, rows, seq_len, method)
    total["seconds"] += time.perf_counter() - started
    total["max_cost"] += float(rank_loads(shape, row_of, costs).max())
    total["placed_tokens"] += int(lengths[row_of >= 0].sum())
    if method != "none":  # did the guarantee return (a relieved) ``none`` instead?
        own = (pack_greedy if method == "greedy" else pack_karmarkar_karp)(shape, lengths, costs)
        total["fell_back"] += int(not np.array_equal(row_of, own))


def capacity_bound(
    lengths: np.ndarray, costs: np.ndarray, ranks: int, rows_per_rank: int, row_tokens: int
) -> float:
    """A lower bound on the slowest rank of any split that places every sample, and that knows
    rows hold ``row_tokens`` tokens: the least C (to 1e-4) that passes ``_could_fit``. Both of
    its tests only get easier as C grows, so a bisection finds it."""
    lo = lower_bound(costs, ranks)
    if not len(costs):
        return lo
    hi = lo * 1.01
    while not _could_fit(hi, lengths, costs, ranks, rows_per_rank, row_tokens):
        lo, hi = hi, hi * 1.1
    while hi - lo > 1e-4 * lo:
        mid = (lo + hi) / 2
        lo, hi = (
            (lo, mid)
            if _could_fit(mid, lengths, costs, ranks, rows_per_rank, row_tokens)
            else (mid, hi)
        )
    return lo


def _could_fit(
    c: float, lengths: np.ndarray, costs: np.ndarray, ranks: int, per_rank: int, row_tokens: int
) -> bool:
    """Necessary for a split with every rank's cost <= c. Samples costing more than c/2
    ("heavy") go to distinct ranks. (1) Samples longer than half a row take a row each: a heavy
    rank has room for one more only if its sum stays <= c (Hall's condition on these rows).
    (2) The other samples, split fractionally, fit the heavy ranks' leftover tokens and cost
    together and the other ranks' tokens and cost together."""
    heavy = costs > c / 2
    if costs.sum() > ranks * c or heavy.sum() > ranks:
        return False
    return _long_rows_fit(c, lengths, costs, heavy, ranks, per_rank, row_tokens) and _rest_fits(
        c, lengths, costs, heavy, ranks, per_rank, row_tokens
    )


def _long_rows_fit(
    c: float,
    lengths: np.ndarray,
    costs: np.ndarray,
    heavy: np.ndarray,
    ranks: int,
    per_rank: int,
    row_tokens: int,
) -> bool:
    long = lengths > row_tokens / 2
    order = np.argsort(c - costs[heavy], kind="stable")
    room = (c - costs[heavy])[order]  # the cost a heavy rank can still take, ascending
    slots = np.where(long[heavy], per_rank - 1, per_rank)[order]
    need = np.sort(costs[long & ~heavy])[::-1]
    taking = np.concatenate([np.cumsum(slots[::-1])[::-1], [0]])[np.searchsorted(room, need)]
    free = per_rank * (ranks - int(heavy.sum()))
    return bool(np.all(np.arange(1, len(need) + 1) <= free + taking))


def _rest_fits(
    c: float,
    lengths: np.ndarray,
    costs: np.ndarray,
    heavy: np.ndarray,
    ranks: int,
    per_rank: int,
    row_tokens: int,
) -> bool:
    count = int(heavy.sum())
    tokens_a = count * per_rank * row_tokens - lengths[heavy].sum()
    cost_a = count * c - costs[heavy].sum()
    tokens_n, cost_n = (ranks - count) * per_rank * row_tokens, (ranks - count) * c
    tok, cost = lengths[~heavy].astype(np.float64), costs[~heavy]
    # the cheapest cost of t tokens: lowest cost per token first (fractional)
    by_density = np.argsort(cost / np.maximum(tok, 1e-9), kind="stable")
    cum_tok = np.concatenate([[0.0], np.cumsum(tok[by_density])])
    cum_cost = np.concatenate([[0.0], np.cumsum(cost[by_density])])
    total_tok, total_cost = cum_tok[-1], cum_cost[-1]
    least, most = max(0.0, total_tok - tokens_n), min(total_tok, tokens_a)
    if least > most or np.interp(least, cum_tok, cum_cost) > cost_a:
        return False
    # the most tokens the heavy ranks can take within their cost, at the cheapest density
    t = min(most, float(np.interp(cost_a, cum_cost, cum_tok)))
    dearest = total_cost - np.interp(total_tok - t, cum_tok, cum_cost)
    return bool(dearest >= total_cost - cost_n - 1e-9 * total_cost)


def _summary(
    total: dict[str, Any], bound: float, capacity_aware: float, tokens: int, none: dict[str, Any]
) -> dict[str, Any]:
    per_token = total["max_cost"] / total["placed_tokens"]
    none_per_token = none["max_cost"] / none["placed_tokens"]
    return {
        **total,
        "vs_lower_bound": total["max_cost"] / bound,
        "vs_capacity_bound": total["max_cost"] / capacity_aware,
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


def rows_quality(quick: bool) -> list[dict[str, Any]]:
    steps = QUICK_ROWS_STEPS if quick else ROWS_STEPS
    return [
        quality_point(seq_len, ROWS_DP, steps, seed=seq_len + ROWS_DP, rows=rows)
        for rows in ROWS_PER_RANK
        for seq_len in SEQ_LENS
    ]


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
        *_rows_table(result["rows_quality"]),
        "",
        *_speedup_table(result["quality"]),
        "",
        *timing_table(result["timing"]),
        "",
        *tables(result["planner"]),
    ]
    return "\n".join(lines) + "\n"


def _quality_table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        "## Balance quality",
        "",
        f"Each rank: {MICRO_BATCHES} micro-batch × {ROWS_PER_MICRO_BATCH} rows of `seq_len` "
        f"tokens; batches filled to {FILL:.0%} of capacity; cost `len² + 256·len`. "
        "Σ max = the sum over steps of the most expensive rank's cost, relative to the sum of "
        "per-step lower bounds max(mean rank cost, largest sample) (LB), or to the sum of "
        "capacity-aware lower bounds (CB: no split that places every sample does better). "
        "Placed = share of the batch's tokens placed (the rest is carried to the next step). "
        "Fallback = steps where the method's own split was worse than `none`, so `none`'s was "
        "returned (for `greedy`, relieved by exchanges).",
        "",
        "| seq_len | DP | steps | samples/step | none Σmax/LB | greedy Σmax/LB "
        "| KK Σmax/LB | CB/LB | greedy Σmax/CB | placed none / greedy / KK "
        "| fallback greedy / KK |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        m = p["methods"]
        placed = " / ".join(f"{m[k]['placed_share']:.1%}" for k in METHODS[::-1])
        rows.append(
            f"| {p['seq_len']} | {p['dp']} | {p['steps']} | {p['samples_per_step']:.0f} "
            f"| {m['none']['vs_lower_bound']:.3f} | {m['greedy']['vs_lower_bound']:.3f} "
            f"| {m['karmarkar_karp']['vs_lower_bound']:.3f} "
            f"| {p['capacity_bound'] / p['lower_bound']:.3f} "
            f"| {m['greedy']['vs_capacity_bound']:.3f} | {placed} "
            f"| {m['greedy']['fell_back']} / {m['karmarkar_karp']['fell_back']} |"
        )
    means = _means(points)
    rows.append(
        f"| **mean** | | | | {means['none']:.3f} | **{means['greedy']:.3f}** "
        f"| {means['karmarkar_karp']:.3f} | {means['cb']:.3f} | | | |"
    )
    return rows


def _means(points: list[dict[str, Any]]) -> dict[str, float]:
    """Mean Σmax/LB of each method over the points, and of CB/LB: how close any split could
    come to LB."""
    means: dict[str, float] = {
        m: statistics.mean(p["methods"][m]["vs_lower_bound"] for p in points) for m in METHODS
    }
    means["cb"] = statistics.mean(p["capacity_bound"] / p["lower_bound"] for p in points)
    return means


def _rows_table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        f"### More rows per rank (DP {ROWS_DP})",
        "",
        "The same, with 1 micro-batch of 2, 4 or 8 rows per rank: the more a rank holds, the "
        "less row capacity decides its cost.",
        "",
        "| rows/rank | seq_len | steps | samples/step | none Σmax/LB | greedy Σmax/LB "
        "| KK Σmax/LB | CB/LB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        m = p["methods"]
        rows.append(
            f"| {p['rows_per_rank']} | {p['seq_len']} | {p['steps']} "
            f"| {p['samples_per_step']:.0f} | {m['none']['vs_lower_bound']:.3f} "
            f"| {m['greedy']['vs_lower_bound']:.3f} | {m['karmarkar_karp']['vs_lower_bound']:.3f} "
            f"| {p['capacity_bound'] / p['lower_bound']:.3f} |"
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
        "rows_quality": rows_quality(args.quick),
        "timing": timing(args.quick),
        "planner": planner(args.quick),
    }
    result["mean_speedup_vs_none"] = _mean_speedups(result["quality"])
    result["mean_vs_lower_bound"] = _means(result["quality"])
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
