"""A job of thousands of tiny sources: what validating it, starting it and each step cost.

    python -m benchmarks.many_sources [--sources 1000,10000] [--steps 300] [--warmup 30]

Per source count S: S `msd synth`-made Parquet sources of 60 short samples (written once under
``--data``), in a recipe of 4 ranks, 16,384 tokens a step, the demo trainer with no compute and
5 loader processes sharing the sources (``loader.sources_per_process`` = S / 5). Measured:

  * ``msd validate`` of the recipe: wall seconds (its own process, as a user runs it);
  * the job under ``msd launch``'s local launcher: seconds from start to the first step every
    rank consumed, steps/s once warm (from step ``--warmup`` on), and each role's CPU per
    step over the warm steps (``/proc`` of each process, read every 50 ms; the trainers
    together, the loaders together).

And, in one process, what choosing the shard to read next costs a loader of ``--pick-shards``
sources (one loader's share of 10,000 sources over 5 processes): real shards of the same data,
read ahead and drained at random the way routes drain them, ``NextRead`` (which looks again
only at the shards that changed) against looking at every shard before each read: microseconds
per choice, the two run over the same sequence.

Writes ``benchmarks/results/many_sources.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.quickstart import _rank_records, machine
from msd.launch.local import LocalJob
from msd.plan.partition import Shard
from msd.recipe.load import load_recipe
from msd.roles.loader.pick import NextRead
from msd.roles.loader.shard import SourceShard
from msd.sources.read import RowGroupReader
from msd.synth.text import SynthSource, synth
from msd.wire.protocol import Status

ROOT = Path(__file__).resolve().parents[1]
LOADER_PROCESSES = 5


def tiny_sources(count: int) -> list[SynthSource]:
    return [
        SynthSource(f"s{i:05d}", median_tokens=30, sigma=0.5, max_tokens=200, num_samples=60)
        for i in range(count)
    ]


def write_recipe(data: Path, count: int, steps: int, path: Path) -> None:
    """The recipe of ``count`` tiny sources under ``data`` (written there if missing)."""
    tiny = tiny_sources(count)
    folder = data / f"sources-{count}"
    if not (folder / tiny[-1].name).exists():
        synth(folder, tiny, seed=2, files_per_source=1, rows_per_row_group=20)
    doc = {
        "name": f"many-{count}",
        "steps": steps,
        "seq_len": 2048,
        "global_batch_tokens": 16384,
        "distribute": {"dp": 4},
        "loader": {"sources_per_process": max(1, count // LOADER_PROCESSES)},
        "sources": [
            {"name": s.name, "path": str(folder / s.name / "*.parquet"), "text_column": "text"}
            | {"weight": 1 + i % 7, "repeat": True}
            for i, s in enumerate(tiny)
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def validate_s(recipe: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "msd.cli", "validate", str(recipe)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


class CpuSampler(threading.Thread):
    """Each child's CPU seconds, read every 50 ms (the last reading before it ended)."""

    def __init__(self, job: LocalJob) -> None:
        super().__init__(daemon=True)
        self.job, self.done = job, threading.Event()
        self.cpu: dict[str, float] = {}  # by process: (role, name)
        self.at_warm: dict[str, float] | None = None
        self.warm_step = 0

    def run(self) -> None:
        while not self.done.wait(0.05):
            for child in list(self.job.children):
                try:
                    t = psutil.Process(child.popen.pid).cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                self.cpu[f"{child.role}/{child.name}"] = t.user + t.system

    def on_status(self, status: Status, warmup: int) -> None:
        """Take the readings of the warm start once the ranks consumed ``warmup`` steps."""
        if self.at_warm is None and status.consumed >= warmup:
            self.at_warm, self.warm_step = dict(self.cpu), status.consumed


def run_job(recipe_path: Path, runs: Path, warmup: int) -> dict[str, Any]:
    recipe = load_recipe(recipe_path)
    job = LocalJob(recipe, recipe_path.read_text(), runs)
    sampler = CpuSampler(job)
    started = time.time()
    job.start()
    sampler.start()
    outcome = job.watch(lambda status: sampler.on_status(status, warmup))
    sampler.done.set()
    if not outcome.ok:
        raise SystemExit(f"msd run failed: {outcome.message}")
    records = _rank_records(outcome.job.root)
    ranks = len(list((outcome.job.root / "trainer").glob("rank-*.jsonl")))
    by_step: dict[int, list[float]] = {}
    for r in records:
        by_step.setdefault(r["step"], []).append(r["time"])
    done_at = {step: max(t) for step, t in by_step.items() if len(t) == ranks}
    first, last = min(done_at), max(done_at)
    warm_from = min(s for s in done_at if s >= warmup)
    steps_per_s = (last - warm_from) / (done_at[last] - done_at[warm_from])
    if sampler.at_warm is None:
        raise SystemExit("the job ended before it was warm: raise --steps")
    per_role: dict[str, float] = {}
    for process, seconds in sampler.cpu.items():
        role = process.split("/")[0]
        per_role[role] = per_role.get(role, 0.0) + seconds - sampler.at_warm.get(process, 0.0)
    warm_steps = max(1, last - sampler.warm_step)
    return {
        "first_step_s": done_at[first] - started,
        "steps_per_s": steps_per_s,
        "steps": last + 1,
        "cpu_ms_per_step": {k: 1000 * v / warm_steps for k, v in sorted(per_role.items())},
    }


def every_shard(shards: list[SourceShard], now: float) -> SourceShard | None:
    """The choice looking at every shard: the first the Planner waits for, else the emptiest
    hungry one (the loader's loop before ``NextRead``)."""
    best: SourceShard | None = None
    for shard in shards:
        if shard.outage is not None and shard.outage.retry_at > now:
            continue
        if shard.waited_for:
            return shard
        if shard.hungry and (best is None or shard.fill < best.fill):
            best = shard
    return best


def pick_cost(recipe_path: Path, count: int, choices: int = 4000) -> dict[str, float]:
    """Microseconds per choice of the next shard to read, both ways, over one sequence of
    reads and routes (the shards' reads are not timed)."""
    recipe = load_recipe(recipe_path)
    got: dict[str, float] = {}
    for way in ("every_shard", "next_read"):
        reader = RowGroupReader(max_open_files=64)
        shards = [SourceShard(recipe, Shard(s, 0), reader, (0, None, 1)) for s in range(count)]
        picker = NextRead(shards)
        rng, spent = random.Random(0), 0.0
        for _ in range(choices):
            started = time.perf_counter()
            shard = every_shard(shards, 0.0) if way == "every_shard" else picker.pick(0.0)
            spent += time.perf_counter() - started
            if shard is not None:
                shard.read_next()
                picker.changed(shard.source)
            drained = shards[rng.randrange(count)]  # a route takes a few of its samples
            for gpos in sorted(drained.held)[: rng.randint(1, 40)]:
                drained.forget(gpos)
            picker.changed(drained.source)
        got[f"{way}_us"] = 1e6 * spent / choices
    return got


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sources", default="1000,10000")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "runs" / "many-data")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--pick-shards", type=int, default=2000)
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": machine(), "points": []}
    for count in (int(s) for s in args.sources.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            recipe = Path(tmp) / "recipe.yaml"
            write_recipe(args.data, count, args.steps, recipe)
            point = {"sources": count, "validate_s": validate_s(recipe)}
            point |= run_job(recipe, Path(tmp) / "runs", args.warmup)
        print(json.dumps(point), flush=True)
        results["points"].append(point)
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "recipe.yaml"
        write_recipe(args.data, args.pick_shards, args.steps, recipe)
        results["pick"] = {"shards": args.pick_shards} | pick_cost(recipe, args.pick_shards)
    print(json.dumps(results["pick"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "many_sources.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
