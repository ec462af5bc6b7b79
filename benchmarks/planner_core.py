"""What the Planner spends per global step beyond ``plan_step``: the socket-free core driven alone.

    python -m benchmarks.planner_core [--quick] [--steps 30]

A ``PlannerCore`` (``msd.roles.planner.core``) of a job with the `msd synth` demo mixture (web /
code / books, weights 0.5 / 0.3 / 0.2, ``repeat``, 4 loaders each), rows of 8,192 tokens, 3 rows
per DP rank and one Constructor per 8 ranks (a node), is fed what its peers would send: the
loaders' ``Meta`` (sample lengths) whenever it asks for positions (``Want``), and, after each
step is planned, every Constructor's ``Progress`` (the step consumed and built), which writes
the step's checkpoint log line. No process, no socket: only the Planner's own work is timed.

Per step, medians over ``--steps`` consecutive steps (after a few to warm up):

  * ``core``: ``advance`` (``plan_step``, then ``Route``s and ``Plan``s for the step) plus the
    Constructors' ``Progress`` (log line, totals);
  * ``plan_step``: the part of ``core`` spent in ``plan_step`` (timed around its calls);
  * ``encode``: turning the step's messages into frames, as the loop does before sending;
  * messages and bytes the step sends; ``Meta`` intake per 1,000 samples reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from benchmarks.quickstart import machine
from msd.jobdir import JobDir
from msd.plan.partition import loader_processes
from msd.recipe.schema import Recipe
from msd.roles.planner import core as core_module
from msd.roles.planner.core import PlannerCore
from msd.synth.text import DEFAULT_SOURCES, sample_lengths
from msd.wire.keys import create_keys
from msd.wire.protocol import PROTOCOL_VERSION, Hello, Message, Meta, Progress, Want, encode

ROOT = Path(__file__).resolve().parents[1]
MIX = (0.5, 0.3, 0.2)
SEQ_LEN = 8192
ROWS_PER_RANK = 3
RANKS_PER_NODE = 8
LOADERS = 4
REPORT = 8192  # positions reported per Meta
WARMUP_STEPS = 3
POINTS = (64, 512, 4096)
QUICK_POINTS = (64, 512)


def recipe_for(dp: int) -> Recipe:
    sources = [
        {"name": s.name, "path": "x", "text_column": "t", "weight": w, "loaders": LOADERS}
        for s, w in zip(DEFAULT_SOURCES, MIX, strict=True)
    ]
    spec = {
        "name": "bench",
        "seq_len": SEQ_LEN,
        "global_batch_tokens": dp * ROWS_PER_RANK * SEQ_LEN,
        "distribute": {"dp": dp},
        "sources": sources,
        "checkpoint": {"every_steps": 100},
    }
    return msgspec.convert(spec, Recipe)


class Peers:
    """What a job's loaders and Constructors send, and the bytes the core sends back."""

    def __init__(self, core: PlannerCore, recipe: Recipe) -> None:
        self.core = core
        self.pools = [sample_lengths(s).tolist() for s in DEFAULT_SOURCES]
        self.reported = [0] * len(self.pools)
        self.loaders: dict[int, list[bytes]] = {}
        for process in loader_processes(recipe):
            hello = Hello(
                role="loader",
                name=process.name,
                version=PROTOCOL_VERSION,
                pid=1,
                sources=process.sources,
                generations=(0,) * len(process.sources),
            )
            core.handle(process.name.encode(), hello)
            self.loaders.setdefault(process.sources[0], []).append(process.name.encode())
        world = recipe.distribute.dp
        self.constructors = [f"node-{i}".encode() for i in range(0, world, RANKS_PER_NODE)]
        for i, identity in enumerate(self.constructors):
            ranks = tuple(range(i * RANKS_PER_NODE, min(world, (i + 1) * RANKS_PER_NODE)))
            hello = Hello(
                role="constructor",
                name=identity.decode(),
                version=PROTOCOL_VERSION,
                pid=1,
                ranks=ranks,
                endpoints={"payload": "tcp://127.0.0.1:1"},
            )
            core.handle(identity, hello)
        core.out.take()
        self.meta_s = 0.0

    def answer(self, sent: list[tuple[bytes, Message]]) -> None:
        """Report the positions the core asked for (and a block more)."""
        for _, msg in sent:
            if isinstance(msg, Want):
                while self.reported[msg.source] <= msg.gpos:
                    self._report(msg.source)

    def _report(self, source: int) -> None:
        first, pool = self.reported[source], self.pools[source]
        lengths = tuple(pool[g % len(pool)] for g in range(first, first + REPORT))
        loaders = self.loaders[source]
        meta = Meta(
            source=source,
            gpos_start=first,
            lengths=lengths,
            sample_ids=tuple(range(first, first + REPORT)),
        )
        started = time.perf_counter()
        self.core.handle(loaders[(first // REPORT) % len(loaders)], meta)
        self.meta_s += time.perf_counter() - started
        self.reported[source] += REPORT

    def progress(self, step: int) -> None:
        for identity in self.constructors:
            self.core.handle(identity, Progress(consumed=step, built=step))


def point(dp: int, steps: int) -> dict[str, Any]:
    recipe = recipe_for(dp)
    with tempfile.TemporaryDirectory() as tmp:
        job = JobDir(Path(tmp) / "job")
        job.create()
        create_keys(job.key_file)
        core = PlannerCore(job, recipe, tuple(len(s) for s in sample_lengths_all()))
        peers = Peers(core, recipe)
        rows: list[dict[str, float]] = []
        for step in range(WARMUP_STEPS + steps):
            rows.append(one_step(core, peers, step))
        core.close()
    timed = rows[WARMUP_STEPS:]
    reported = sum(peers.reported)
    return {
        "dp": dp,
        "constructors": len(peers.constructors),
        "loaders": sum(len(v) for v in peers.loaders.values()),
        **{k: statistics.median(r[k] for r in timed) for k in timed[0]},
        "meta_ms_per_1k_samples": 1000 * peers.meta_s / reported * 1000,
    }


def sample_lengths_all() -> list[np.ndarray]:
    return [sample_lengths(s) for s in DEFAULT_SOURCES]


_PLAN_STEP = core_module.plan_step
_plan_s = [0.0]


def _timed_plan_step(*args: Any) -> Any:
    started = time.perf_counter()
    try:
        return _PLAN_STEP(*args)
    finally:
        _plan_s[0] += time.perf_counter() - started


core_module.plan_step = _timed_plan_step  # type: ignore[assignment]


def one_step(core: PlannerCore, peers: Peers, step: int) -> dict[str, float]:
    """Every Constructor reports the steps before ``step`` consumed (a log line each), then
    the core plans what that frees: one step once warm (``prefetch_steps`` ahead)."""
    _plan_s[0] = 0.0
    started = time.perf_counter()
    peers.progress(step)
    elapsed = time.perf_counter() - started
    sent: list[tuple[bytes, Message]] = []
    while True:
        started = time.perf_counter()
        core.advance()
        elapsed += time.perf_counter() - started
        out = core.out.take()
        sent += out
        if not any(isinstance(msg, Want) for _, msg in out):
            break
        peers.answer(out)  # not timed: the loaders' side
    started = time.perf_counter()
    frames = [encode(msg) for _, msg in sent if not isinstance(msg, Want)]
    encode_s = time.perf_counter() - started
    plan_s = _plan_s[0]
    return {
        "core_ms": 1000 * elapsed,
        "plan_step_ms": 1000 * plan_s,
        "encode_ms": 1000 * encode_s,
        "messages": float(len(frames)),
        "bytes": float(sum(len(f) for fs in frames for f in fs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"DP {QUICK_POINTS} only")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    results = [point(dp, args.steps) for dp in (QUICK_POINTS if args.quick else POINTS)]
    print("| DP | Constructors | core | plan_step | encode | messages | KiB | Meta / 1k |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['dp']} | {r['constructors']} | {r['core_ms']:.1f} ms | "
            f"{r['plan_step_ms']:.1f} ms | {r['encode_ms']:.1f} ms | {r['messages']:.0f} | "
            f"{r['bytes'] / 1024:.0f} | {r['meta_ms_per_1k_samples']:.2f} ms |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "planner_core.json"
    path.write_text(json.dumps({"machine": machine(), "points": results}, indent=2) + "\n")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
