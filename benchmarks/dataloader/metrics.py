"""What a run's rank logs and process samples say, the same way for both systems.

* throughput: steps and real tokens per second between the end of step ``warmup - 1`` and the
  end of the last step (start-up left out);
* data-wait: the time ranks blocked getting a batch, over all ranks' warm steps;
* balance: ``Σ_steps max-rank cost / Σ_steps mean-rank cost`` — on the baseline's own batches,
  the speed-up that perfectly balancing them would allow (steps wait for the slowest rank); and
  the same over ``Σ_steps max(mean-rank cost, costliest sequence)``, a bound no split beats;
* memory: peak over samples of the data processes' summed PSS plus each rank's PSS growth over
  its idle size (not clamped at zero: a rank that forks workers shares pages with them, so its
  own PSS drops by what theirs gains);
* CPU: the data processes' CPU seconds per second in the warm window, per 1M tokens delivered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.dataloader.procmon import Sample

Record = dict[str, Any]


def read_rank_logs(log_dir: Path) -> dict[int, list[Record]]:
    logs = {}
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        logs[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return logs


def read_idle(log_dir: Path) -> dict[int, int]:
    """pid -> PSS of every rank before it read data."""
    records = [json.loads(p.read_text()) for p in log_dir.glob("rank-*.idle.json")]
    return {int(r["pid"]): int(r["idle_pss"]) for r in records}


def steps_by_rank(logs: dict[int, list[Record]]) -> list[list[Record]]:
    """``table[s][r]``: rank r's record of step s, for the steps every rank logged."""
    count = min(len(records) for records in logs.values())
    return [[logs[r][s] for r in sorted(logs)] for s in range(count)]


def throughput(table: list[list[Record]], warmup: int) -> dict[str, float]:
    if len(table) <= warmup:
        raise ValueError(f"the run has {len(table)} steps; it needs more than {warmup} (warm-up)")
    start = (
        max(r["time"] for r in table[warmup - 1]) if warmup else min(r["time"] for r in table[0])
    )
    end = max(r["time"] for r in table[-1])
    warm = table[warmup:]
    tokens = sum(r["tokens"] for step in warm for r in step)
    elapsed = end - start
    return {
        "warm_steps": len(warm),
        "warm_elapsed_s": elapsed,
        "steps_per_s": len(warm) / elapsed,
        "tokens_per_s": tokens / elapsed,
        "tokens_per_step": tokens / len(warm),
        "window_start": start,
        "window_end": end,
    }


def waits(table: list[list[Record]], warmup: int) -> dict[str, float]:
    warm = [r for step in table[warmup:] for r in step]
    wait = np.array([r["wait_ms"] for r in warm])
    # The part of each wait the rank's thread spent runnable without a CPU: the machine's
    # queueing (many ranks and data processes on few cores), not the data path.
    queued = np.array([r.get("run_delay_ms", np.nan) for r in warm])
    return {
        "wait_p99_less_cpu_queue_ms": float(np.percentile(wait - queued, 99)),
        "cpu_queue_p99_ms": float(np.percentile(queued, 99)),
        "wait_p50_ms": float(np.percentile(wait, 50)),
        "wait_p99_ms": float(np.percentile(wait, 99)),
        "wait_max_ms": float(wait.max()),
        "wait_mean_ms": float(wait.mean()),
        "fetch_cpu_mean_ms": float(np.mean([r["fetch_cpu_ms"] for r in warm])),
    }


def balance(table: list[list[Record]], warmup: int) -> dict[str, float]:
    """How much slower the slowest rank makes each step than an even split would."""
    warm = table[warmup:]
    costs = np.array([[r["cost"] for r in step] for step in warm])
    largest = np.array([[r["max_sequence_cost"] for r in step] for step in warm])
    # No split of a step does better than its mean, nor than its costliest sequence.
    bound = np.maximum(costs.mean(axis=1), largest.max(axis=1))
    compute = np.array([[r["compute_ms"] for r in step] for step in warm])
    return {
        "cost_max_over_mean": float(costs.max(axis=1).sum() / costs.mean(axis=1).sum()),
        "cost_max_over_bound": float(costs.max(axis=1).sum() / bound.sum()),
        "compute_max_over_mean": float(compute.max(axis=1).sum() / compute.mean(axis=1).sum()),
        "compute_mean_ms": float(compute.mean()),
        "compute_max_mean_ms": float(compute.max(axis=1).mean()),
        "step_cost_ratio_p99": float(np.percentile(costs.max(axis=1) / costs.mean(axis=1), 99)),
    }


def memory(samples: list[Sample], idle: dict[int, int]) -> dict[str, float]:
    """Peak data-plane PSS: data processes plus the ranks' growth over their idle PSS."""
    if not samples:
        return {"data_plane_peak_mib": float("nan")}
    totals = [s.data_pss + _growth(s, idle) for s in samples]
    peak = int(np.argmax(totals))
    return {
        "data_plane_peak_mib": totals[peak] / 2**20,
        "data_processes_pss_at_peak_mib": samples[peak].data_pss / 2**20,
        "rank_growth_at_peak_mib": _growth(samples[peak], idle) / 2**20,
        "data_processes_peak_mib": max(s.data_pss for s in samples) / 2**20,
        "ranks_idle_pss_mib": sum(idle.values()) / 2**20,
        "data_processes": max(s.data_processes for s in samples),
    }


def _growth(sample: Sample, idle: dict[int, int]) -> int:
    return sum(pss - idle[pid] for pid, pss in sample.rank_pss.items() if pid in idle)


def cpu(samples: list[Sample], start: float, end: float, tokens_per_s: float) -> dict[str, float]:
    """Data-plane CPU seconds per 1M tokens, from the samples inside the warm window."""
    inside = [s for s in samples if start <= s.time <= end]
    if len(inside) < 2:
        return {"cpu_s_per_mtok": float("nan"), "cpu_cores_busy": float("nan")}
    busy = (inside[-1].data_cpu_s - inside[0].data_cpu_s) / (inside[-1].time - inside[0].time)
    return {"cpu_s_per_mtok": busy / tokens_per_s * 1e6, "cpu_cores_busy": busy}


def by_kind(samples: list[Sample], start: float, end: float) -> dict[str, dict[str, float]]:
    """Per kind of data process (where the sampler named kinds): CPU cores busy in the warm
    window, peak summed PSS (MiB), and the most processes of the kind at once."""
    inside = [s for s in samples if start <= s.time <= end]
    kinds = sorted({k for s in samples for k in s.pss_by_kind})
    found: dict[str, dict[str, float]] = {}
    for kind in kinds:
        busy = float("nan")
        if len(inside) >= 2:
            used = inside[-1].cpu_by_kind.get(kind, 0.0) - inside[0].cpu_by_kind.get(kind, 0.0)
            busy = used / (inside[-1].time - inside[0].time)
        found[kind] = {
            "cpu_cores_busy": busy,
            "peak_pss_mib": max(s.pss_by_kind.get(kind, 0) for s in samples) / 2**20,
            "processes": max(s.count_by_kind.get(kind, 0) for s in samples),
        }
    return found


def measure(log_dir: Path, samples: list[Sample], warmup: int) -> dict[str, Any]:
    """Every metric of one run."""
    table = steps_by_rank(read_rank_logs(log_dir))
    rate = throughput(table, warmup)
    first = max(r["time"] for r in table[0])
    result: dict[str, Any] = {"steps": len(table), "first_step_end": first, **rate}
    result |= waits(table, warmup)
    result |= balance(table, warmup) | memory(samples, read_idle(log_dir))
    result |= cpu(samples, rate["window_start"], rate["window_end"], rate["tokens_per_s"])
    kinds = by_kind(samples, rate["window_start"], rate["window_end"])
    if kinds:
        result["by_kind"] = kinds
    result["wait_ms_warm"] = [round(r["wait_ms"], 3) for step in table[warmup:] for r in step]
    return result
