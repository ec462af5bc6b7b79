"""What checkpoints cost and what recovery takes.

    python -m benchmarks.checkpoint [--data demo-data] [--pairs 3] [--kills 3]

Run it from the folder holding ``demo-data`` (made by ``msd synth demo-data`` if missing).
Three measurements, written to ``benchmarks/results/checkpoint.json``:

  * size and time — a snapshot and a log line of a job with 16 to 1,024 sources (the Planner's
    own encoder and store; 8 carried samples; a step that moves 40 cursors): bytes; encode time
    (what the Planner's loop pays: the file is written by a background thread), write time
    (encode, temp file, fsync, rename), read time; a log line's append (median of 20);
  * throughput — ``recipes/quickstart-bpe.yaml`` with a trainer that does no compute (the data
    plane is the bottleneck), runs alternating: a snapshot every step vs checkpoints off
    (``checkpoint.enabled: false``); steady tokens/s and the ratio (target ≥ 0.98);
  * many (``--parts many``) — a job of 1,000 tiny sources (`msd synth` data in a temporary
    folder; 5 loader processes of 200 sources; 4 ranks, 16,384 tokens a step; no compute),
    runs alternating: a snapshot every ``MANY_EVERY`` steps vs checkpoints off; tokens/s, the
    p99 and longest interval between a rank's batches, the snapshot's size and what encoding
    it costs the Planner's loop (median of 20);
  * recovery — the same recipe with the demo trainer computing 20 ms a step; one role killed
    (SIGKILL) at step 150 of 400, ``--kills`` times per role (and a loader of a source with a
    shadow): the stall, the longest a rank went without a batch from the last one before the
    kill on, against the run's median step time;
  * recovery-slurm — the same on SLURM (``--partition``, default ``debug``: the test cluster of
    ``tests/slurm/cluster/up.sh``), the trainers on two nodes: each role's process (found by
    its command line on this machine, so the cluster's nodes must be this machine, as the test
    cluster's are) killed once per ``--kills``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psutil

from benchmarks.quickstart import (
    _rank_records,
    _steady_tokens_per_s,
    ensure_demo_data,
    machine,
    paired_runs_parser,
    with_trainer,
)
from msd.checkpoint.format import Delta, decode_snapshot, encode_delta, encode_snapshot
from msd.checkpoint.signing import signing_key
from msd.checkpoint.snapshot import Snapshot, Totals
from msd.checkpoint.store import CheckpointStore
from msd.launch.local import LocalJob
from msd.plan.step import PlannerState
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe, Trainer, from_json, stream_fingerprint, to_json
from msd.synth.text import SynthSource, synth

ROLES = ("loader", "planner", "constructor", "trainer")


# -- size and time ------------------------------------------------------------------------------
def synthetic_recipe(sources: int) -> Recipe:
    doc = {
        "seq_len": 4096,
        "global_batch_tokens": 4096 * 64,
        "sources": [
            {"name": f"source-{i:04d}", "path": f"/data/source-{i:04d}/*.parquet", "weight": 1}
            for i in range(sources)
        ],
    }
    return from_json(json.dumps(doc).encode())


def size_and_time(sources: int, repeats: int = 20) -> dict[str, Any]:
    rng = np.random.default_rng(sources)
    recipe = synthetic_recipe(sources)
    cursors = tuple(int(c) for c in rng.integers(0, 10**9, size=sources))
    carry = tuple((int(rng.integers(sources)), int(rng.integers(10**9))) for _ in range(8))
    state = PlannerState(123_456, cursors, carry)
    snap = Snapshot(
        state=state,
        fingerprint=stream_fingerprint(recipe),
        recipe=json.loads(to_json(recipe)),
        num_rows=tuple(int(n) for n in rng.integers(10**6, 10**9, size=sources)),
        totals=Totals(10**12, cursors, cursors),
        created=time.time(),
    )
    moved = sorted(rng.choice(sources, size=min(sources, 40), replace=False).tolist())
    after = list(cursors)
    for s in moved:
        after[s] += int(rng.integers(1, 5))
    delta = Delta.between(state, PlannerState(state.step + 1, tuple(after), carry), 262_144)
    writes, reads, appends, encodes = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(Path(tmp), keep=2)
        for _ in range(repeats):
            started = time.perf_counter()
            encode_snapshot(snap)  # what the Planner's loop pays: the file is written aside
            encodes.append(time.perf_counter() - started)
            started = time.perf_counter()
            path = store.write_snapshot(snap)
            writes.append(time.perf_counter() - started)
            started = time.perf_counter()
            decode_snapshot(path.read_bytes(), path)
            reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.append(delta)
            appends.append(time.perf_counter() - started)
        store.close()
    return {
        "sources": sources,
        "snapshot_bytes": len(encode_snapshot(snap)),
        "snapshot_encode_ms": round(statistics.median(encodes) * 1000, 3),
        "snapshot_write_ms": round(statistics.median(writes) * 1000, 3),
        "snapshot_read_ms": round(statistics.median(reads) * 1000, 3),
        "log_line_bytes": len(encode_delta(delta)),
        "log_append_ms": round(statistics.median(appends) * 1000, 4),
    }


# -- throughput -----------------------------------------------------------------------------------
def with_checkpoints(recipe: Recipe, enabled: bool, every_steps: int = 1) -> Recipe:
    checkpoint = msgspec.structs.replace(
        recipe.checkpoint, every_steps=every_steps, enabled=enabled
    )
    recovery = msgspec.structs.replace(recipe.recovery, restarts=3 if enabled else 0)
    return msgspec.structs.replace(recipe, checkpoint=checkpoint, recovery=recovery)


def throughput(recipe: Recipe, run_root: Path, warmup: int) -> float:
    job = LocalJob(recipe, "# benchmark\n", run_root)
    job.start()
    outcome = job.watch(lambda status: None)
    if not outcome.ok:
        raise SystemExit(f"msd run failed: {outcome.message}")
    return _steady_tokens_per_s(_rank_records(outcome.job.root), warmup)


# -- many sources -------------------------------------------------------------------------------
MANY = 1000
MANY_EVERY = 10


def many_sources_recipe(data: Path, steps: int) -> Recipe:
    """A job of ``MANY`` tiny sources in ``data`` (written there if missing), no compute."""
    tiny = [
        SynthSource(f"s{i:04d}", median_tokens=30, sigma=0.5, max_tokens=200, num_samples=60)
        for i in range(MANY)
    ]
    if not (data / tiny[-1].name).exists():
        synth(data, tiny, seed=2, files_per_source=1, rows_per_row_group=20)
    doc = {
        "name": "many",
        "steps": steps,
        "seq_len": 2048,
        "global_batch_tokens": 16384,
        "distribute": {"dp": 4},
        "loader": {"sources_per_process": 200},
        "sources": [
            {"name": s.name, "path": str(data / s.name / "*.parquet"), "text_column": "text"}
            | {"weight": 1 + i % 7, "repeat": True}
            for i, s in enumerate(tiny)
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }
    return from_json(json.dumps(doc).encode())


def many_run(recipe: Recipe, run_root: Path, warmup: int) -> dict[str, Any]:
    """Steady tokens/s, the p99 interval between a rank's batches, the last snapshot's size."""
    job = LocalJob(recipe, "# benchmark\n", run_root)
    job.start()
    outcome = job.watch(lambda status: None)
    if not outcome.ok:
        raise SystemExit(f"msd run failed: {outcome.message}")
    records = _rank_records(outcome.job.root)
    gaps: list[float] = []
    for path in (outcome.job.root / "trainer").glob("rank-*.jsonl"):
        rank = sorted((json.loads(line) for line in path.read_text().splitlines()), key=_step)
        gaps += np.diff([r["time"] for r in rank[warmup:]]).tolist()
    snapshots = sorted((outcome.job.root / "checkpoints").glob("step-*.json"))
    found = {
        "tokens_per_s": _steady_tokens_per_s(records, warmup),
        "gap_p99_ms": float(np.percentile(gaps, 99)) * 1000,
        "gap_max_ms": max(gaps) * 1000,
    }
    if snapshots:
        data = snapshots[-1].read_bytes()
        snap = decode_snapshot(data, snapshots[-1])
        key = signing_key(outcome.job.keys())
        encodes = []
        for _ in range(20):
            started = time.perf_counter()
            encode_snapshot(snap, key)
            encodes.append(time.perf_counter() - started)
        found |= {"snapshot_bytes": len(data), "encode_ms": statistics.median(encodes) * 1000}
    return found


def _step(record: dict[str, Any]) -> int:
    return int(record["step"])


def many_sources(data: Path, runs: Path, steps: int, warmup: int, pairs: int) -> dict[str, Any]:
    base = many_sources_recipe(data, steps)
    many_run(with_checkpoints(base, False), runs, warmup)  # caches warm; not counted
    rows = []
    for pair in range(pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        got = {on: many_run(with_checkpoints(base, on, MANY_EVERY), runs, warmup) for on in order}
        rows.append({"every_step": got[True], "off": got[False]})
        print(json.dumps(rows[-1]), flush=True)
    on = statistics.mean(r["every_step"]["tokens_per_s"] for r in rows)
    off = statistics.mean(r["off"]["tokens_per_s"] for r in rows)
    return {"sources": MANY, "every_steps": MANY_EVERY, "pairs": rows, "ratio_of_means": on / off}


# -- recovery -----------------------------------------------------------------------------------
def recovery(recipe: Recipe, run_root: Path, role: str, at_step: int) -> dict[str, Any]:
    """Kill one process of ``role`` once every rank is past ``at_step``; the stall: the longest
    time a rank went without a new batch from the last one before the kill on (the batches
    built ahead keep a rank going for a while: that is part of the point)."""
    job = LocalJob(recipe, "# benchmark\n", run_root)
    job.start()
    killed: dict[str, float] = {}

    def kill_when_due(status: Any) -> None:
        if killed or status.consumed < at_step:
            return
        victims = [
            c
            for c in job.children
            if c.role == role and c.popen.poll() is None and "~shadow" not in c.name
        ]
        victim = victims[at_step % len(victims)]
        killed["time"] = time.time()
        os.kill(victim.popen.pid, signal.SIGKILL)

    outcome = job.watch(kill_when_due)
    if not outcome.ok:
        raise SystemExit(f"msd run failed: {outcome.message}")
    return {**_stalls(outcome.job.root, killed["time"]), "role": role}


def _stalls(job: Path, killed_at: float) -> dict[str, Any]:
    stalls = []
    for path in sorted((job / "trainer").glob("rank-*.jsonl")):
        times = sorted(json.loads(line)["time"] for line in path.read_text().splitlines())
        before = max(t for t in times if t <= killed_at)
        after = [before, *(t for t in times if t > killed_at)]
        stalls.append(max(b - a for a, b in itertools.pairwise(after)))
        steady = np.diff(times)
    return {
        "stall_s": round(max(stalls), 3),
        "median_step_s": round(float(np.median(steady)), 4),
        "recoveries": json.loads((job / "job.json").read_text())["recoveries"],
    }


def on_slurm(recipe: Recipe, partition: str) -> Recipe:
    trainer = msgspec.structs.replace(recipe.trainer or Trainer(), nodes=2)
    slurm = msgspec.structs.replace(recipe.slurm, partition=partition, time_min=15)
    return msgspec.structs.replace(recipe, cluster="slurm", trainer=trainer, slurm=slurm)


def slurm_victim(job: Path, role: str) -> int:
    """A process of ``role`` of the SLURM job ``job`` (not a shadow), by its command line."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
            if role == "trainer":
                if "msd.trainer.demo" in line and proc.environ().get("MSD_JOB") == str(job):
                    return int(proc.pid)
            elif f"msd.roles {role} --job {job}" in line and "~shadow" not in line:
                return int(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise SystemExit(f"no {role} process of {job} found")


def slurm_recovery(recipe: Recipe, run_root: Path, role: str, at_step: int) -> dict[str, Any]:
    """``recovery`` on SLURM."""
    from msd.launch.slurm import SlurmJob

    job = SlurmJob(recipe, "# benchmark\n", run_root)
    killed: dict[str, float] = {}

    def kill_when_due(status: Any) -> None:
        if killed or status.consumed < at_step:
            return
        victim = slurm_victim(job.job.root, role)
        killed["time"] = time.time()
        os.kill(victim, signal.SIGKILL)

    outcome = job.run(kill_when_due)
    if not outcome.ok:
        raise SystemExit(f"msd run failed: {outcome.message}")
    return {**_stalls(outcome.job.root, killed["time"]), "role": role}


def with_shadows(recipe: Recipe) -> Recipe:
    sources = tuple(msgspec.structs.replace(s, shadows=1) for s in recipe.sources)
    return msgspec.structs.replace(recipe, sources=sources)


def main() -> None:
    parser = paired_runs_parser(__doc__)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--partition", default="debug", help="SLURM partition (recovery-slurm)")
    parser.add_argument(
        "--parts", nargs="+", default=["size", "throughput", "recovery"], help="what to measure"
    )
    args = parser.parse_args()
    ensure_demo_data(args.data)
    out = args.out / "checkpoint.json"
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    results["machine"] = machine()
    runs = args.out / "runs"
    if "size" in args.parts:
        results["size_and_time"] = [size_and_time(n) for n in (16, 64, 256, 1024)]
        for row in results["size_and_time"]:
            print(json.dumps(row), flush=True)
    if "throughput" in args.parts:
        base = with_trainer(load_recipe(args.recipe), args.steps, 0.0)
        throughput(with_checkpoints(base, False), runs, args.warmup)  # caches warm; not counted
        pairs = []
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            got = {on: throughput(with_checkpoints(base, on), runs, args.warmup) for on in order}
            pairs.append(
                {"every_step": got[True], "off": got[False], "ratio": got[True] / got[False]}
            )
            print(json.dumps(pairs[-1]), flush=True)
        mean_on = statistics.mean(p["every_step"] for p in pairs)
        mean_off = statistics.mean(p["off"] for p in pairs)
        results["throughput"] = {"pairs": pairs, "ratio_of_means": mean_on / mean_off}
        print(json.dumps({"ratio_of_means": mean_on / mean_off}), flush=True)
    if "many" in args.parts:
        with tempfile.TemporaryDirectory() as tmp:
            many = many_sources(Path(tmp), runs, args.steps, args.warmup, args.pairs)
        results["many_sources"] = many
        print(json.dumps({"ratio_of_means": many["ratio_of_means"]}), flush=True)
    if "recovery" in args.parts:
        computing = with_trainer(load_recipe(args.recipe), 400, 20.0)
        cases = [(role, computing, role) for role in ROLES]
        cases.append(("loader with a shadow", with_shadows(computing), "loader"))
        kills = []
        for label, recipe, role in cases:
            for _ in range(args.kills):
                kills.append({"case": label, **recovery(recipe, runs, role, 150)})
                print(json.dumps({k: kills[-1][k] for k in ("case", "stall_s")}), flush=True)
        results["recovery"] = kills
        results["recovery_median_stall_s"] = {
            label: statistics.median(k["stall_s"] for k in kills if k["case"] == label)
            for label, _, _ in cases
        }
        print(json.dumps(results["recovery_median_stall_s"], indent=2))
    if "recovery-slurm" in args.parts:
        computing = on_slurm(with_trainer(load_recipe(args.recipe), 400, 20.0), args.partition)
        cases = [(role, computing, role) for role in ROLES]
        cases.append(("loader with a shadow", with_shadows(computing), "loader"))
        kills = []
        for label, recipe, role in cases:
            for _ in range(args.kills):
                kills.append({"case": label, **slurm_recovery(recipe, runs, role, 150)})
                print(json.dumps({k: kills[-1][k] for k in ("case", "stall_s")}), flush=True)
        results["recovery_slurm"] = kills
        results["recovery_slurm_median_stall_s"] = {
            label: statistics.median(k["stall_s"] for k in kills if k["case"] == label)
            for label, _, _ in cases
        }
        print(json.dumps(results["recovery_slurm_median_stall_s"], indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
