"""What each stage of the data plane holds on an image job, per step, measured on a real run.

```bash
python -m benchmarks.held_bytes                     # this checkout
python -m benchmarks.held_bytes --before COMMIT     # and an earlier commit, side by side
```

Each of this checkout and ``COMMIT`` (its msd, CLI and templates, taken out with ``git archive``
into ``benchmarks/runs/held_bytes/tree-COMMIT``) runs the same short image job (``msd launch``,
local) on the VLM benchmark's sources (``benchmarks/dataloader/vlm_data.py``: captions and
interleaved documents, S sources, ``loader.sources_per_process`` of them a loader process), one
after the other. Its trainer ranks are this file's ``rank``: an ``msd.Client`` (``--pixels``)
that holds each batch for ``--step-s`` seconds, slower than the data plane, so every stage
fills what it may hold ahead.

Reported per checkout, over the steps after ``--warmup``, median and largest of samples taken
every 0.5 s:

* each role's import floor: the anonymous memory and PSS of ``python -c "import MODULE"``
  (``/proc/self/smaps_rollup``), MODULE the role's (``msd.roles.constructor`` ...) and, for a
  rank, ``msd.client``;
* each role process's anonymous memory and PSS, and what it reports (``msd status``): the
  Constructor's ``ready_bytes`` (built batches held until every rank has read them) and
  ``payload_bytes`` (payloads held for steps not built yet: 0 from a checkout that does not
  report it), the Planner's ``constructor_step_bytes`` (the bytes one built step takes), the
  loaders' tokens read and not routed yet (``queue_tokens``) and their patch budget
  (``loader_buffer_bytes``: decoded patches held unrouted, which loaders do not report);
* each rank's anonymous memory above its own before its first batch, and the bytes of the
  batches it was handed.

The checkout that runs is the one whose ``msd`` the job imports: the launcher runs in that
folder with it first on ``PYTHONPATH``; each rank records the ``msd`` it imported. Writes
``benchmarks/results/held_bytes.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "held_bytes.json"
RUNS = ROOT / "benchmarks" / "runs" / "held_bytes"
FLOORS = {  # what each process imports, written to work in earlier trees too
    "planner": "import msd.roles.planner",
    "loader": "import msd.roles.loader",
    "constructor": "import msd.roles.constructor",
    "rank": "from msd.client import Client",
}
MIB = 2**20


def rollup(pid: int | str = "self") -> dict[str, int]:
    """PSS and anonymous memory of a process, in bytes (empty once it is gone)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Pss", "Anonymous"):
                found[key.lower()] = int(rest.split()[0]) * 1024
    return found


# -- a trainer rank ---------------------------------------------------------------------------
def rank(log_dir: Path, step_s: float, pixels: str) -> None:
    """Hold each batch ``step_s`` seconds; log its bytes and this process's memory a step."""
    import msd
    from msd.client import Client

    client = Client(pixels=pixels)  # type: ignore[arg-type]
    idle = rollup()
    out = log_dir / f"rank-{client.rank}.jsonl"
    with out.open("w") as log:
        log.write(json.dumps({"idle": idle, "msd": msd.__file__}) + "\n")
        for step, batch in enumerate(client):
            held = sum(t.numel() * t.element_size() for t in batch.values())
            time.sleep(step_s)
            record = {"step": step, "batch_bytes": held, "wait_s": client.last_wait_s}
            log.write(json.dumps(record | rollup()) + "\n")


# -- one checkout's job -----------------------------------------------------------------------
def checkout(commit: str) -> Path:
    """``commit``'s msd in a folder of its own, its CLI and templates where msd finds them
    (``git archive``: this checkout's git is not touched)."""
    tree = RUNS / f"tree-{commit}"
    if not (tree / "msd").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", commit, "msd", "cli", "templates"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for name in ("cli", "templates"):
            (tree / "msd" / name).symlink_to(tree / name)
    return tree


def floors(tree: Path) -> dict[str, dict[str, int]]:
    """Each role module's import floor in ``tree``'s msd."""
    code = "import sys; exec(sys.argv[1]); "
    code += "print(open('/proc/self/smaps_rollup').read())"
    found = {}
    for role, statement in FLOORS.items():
        text = subprocess.run(
            [sys.executable, "-c", code, statement],
            cwd=tree,
            env=tree_env(tree),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        found[role] = {k.lower(): int(fields[k].split()[0]) * 1024 for k in ("Pss", "Anonymous")}
    return found


def tree_env(tree: Path) -> dict[str, str]:
    rank_variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MSD_JOB", "MSD_NODE")
    env = {k: v for k, v in os.environ.items() if k not in rank_variables}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def recipe(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    from benchmarks.dataloader.vlm_data import VlmDataSpec, ensure_vlm_data

    dataset = ensure_vlm_data(VlmDataSpec(args.sources))
    command = (
        f"python {Path(__file__).resolve()} rank --log-dir {run_dir / 'ranks'} "
        f"--step-s {args.step_s!r} --pixels {args.pixels}"
    )
    return {
        "name": "held-bytes",
        "seed": 0,
        "steps": args.steps,
        "seq_len": args.seq_len,
        "global_batch_tokens": args.ranks * args.rows * args.seq_len,
        "micro_batch_size": args.rows,
        "distribute": {"dp": args.ranks},
        "vision": {},
        "sources": [
            {
                "name": s.name,
                "path": s.path,
                "text_column": "text",
                "image_column": s.image_column,
                "transform": {"kind": "bytes"},
                "weight": s.weight,
                "repeat": True,
                "loaders": 1,
            }
            for s in dataset.sources
        ],
        "balance": {"long_samples": "truncate"},
        "loader": {"sources_per_process": args.sources_per_process},
        "trainer": {"command": command, "ranks": args.ranks},
    }


class Sampler:
    """Every 0.5 s: the job's status (its Planner's ``Status``) and each role's memory."""

    def __init__(self, jobs: Path) -> None:
        self.jobs = jobs
        self.samples: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def _loop(self) -> None:
        from msd.errors import MsdError

        while not self.done.wait(0.5):
            with contextlib.suppress(MsdError, OSError, ValueError):
                sample = self._sample()
                if sample is not None:
                    self.samples.append(sample)

    def _sample(self) -> dict[str, Any] | None:
        from msd.control.planner_connection import request
        from msd.jobdir import JobDir
        from msd.wire.protocol import Status, StatusRequest

        folders = list(self.jobs.glob("*/job.json"))
        if not folders:
            return None
        status: Status = request(JobDir(folders[0].parent), StatusRequest(), Status, 2.0)
        if status.view is None:
            return None
        memory = {f"{role}/{name}": rollup(pid) for role, name, pid in status.roles}
        view = status.view
        return {
            "consumed": status.consumed,
            "step_bytes": status.constructor_step_bytes,
            "memory": {k: v for k, v in memory.items() if v},
            "ready_bytes": {c.name: c.ready_bytes for c in view.constructors},
            "payload_bytes": {c.name: c.payload_bytes for c in view.constructors},
            "queue_tokens": sum(s.queue_tokens for s in view.sources),
            "ahead": statistics.median(r.ahead for r in view.ranks) if view.ranks else 0,
        }


def run_job(args: argparse.Namespace, label: str, tree: Path) -> dict[str, Any]:
    """The job, run with ``tree``'s msd: what each stage held."""
    from msd.recipe.load import load_recipe

    run_dir = RUNS / label.split()[0]
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "ranks").mkdir(parents=True)
    path = run_dir / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(args, run_dir), sort_keys=False))
    argv = [
        sys.executable,
        "-m",
        "msd.cli",
        "launch",
        str(path),
        "--run-dir",
        str(run_dir / "jobs"),
    ]
    sampler = Sampler(run_dir / "jobs")
    with open(run_dir / "launch.log", "wb") as out:
        code = subprocess.run(argv, cwd=tree, env=tree_env(tree), stdout=out, stderr=out).returncode
    sampler.stop()
    if code != 0:
        raise SystemExit(f"{label}: msd launch exited with {code}; see {run_dir / 'launch.log'}")
    loaded = load_recipe(path)
    return {
        "tree": str(tree),
        "floors": floors(tree),
        "roles": roles(sampler.samples, args.warmup),
        "ranks": ranks(run_dir / "ranks", args.warmup),
        "loader_buffer_bytes": loaded.loader_buffer_bytes,
        "prefetch_steps": loaded.constructor.prefetch_steps,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "max": max(values)} if values else {}


def roles(samples: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Median and largest of each measure over the samples after ``warmup`` steps."""
    warm = [s for s in samples if s["consumed"] >= warmup]
    names = sorted({n for s in warm for n in s["memory"]})
    found: dict[str, Any] = {
        name: {
            k: spread([s["memory"][name][k] for s in warm if name in s["memory"]])
            for k in ("anonymous", "pss")
        }
        for name in names
    }
    for key in ("ready_bytes", "payload_bytes"):
        found[key] = spread([sum(s[key].values()) for s in warm])
    found["step_bytes"] = max((s["step_bytes"] for s in warm), default=0)
    found["queue_tokens"] = spread([s["queue_tokens"] for s in warm])
    found["ahead"] = spread([s["ahead"] for s in warm])
    return found


def ranks(log_dir: Path, warmup: int) -> dict[str, Any]:
    """Each rank's anonymous memory above its own before the first batch, and its batches."""
    growth: list[float] = []
    batch: list[float] = []
    waits: list[float] = []
    imported: set[str] = set()
    for path in sorted(log_dir.glob("rank-*.jsonl")):
        head, *steps = (json.loads(line) for line in path.read_text().splitlines())
        imported.add(head["msd"])
        warm = [s for s in steps if s["step"] >= warmup and "anonymous" in s]
        growth += [s["anonymous"] - head["idle"]["anonymous"] for s in warm]
        batch += [s["batch_bytes"] for s in warm]
        waits += [s["wait_s"] for s in warm]
    return {
        "anon_growth": spread(growth),
        "batch_bytes": spread(batch),
        "wait_ms": {k: v * 1000 for k, v in spread(waits).items()},
        "msd": sorted(imported),
    }


# -- the report -------------------------------------------------------------------------------
def table(results: dict[str, Any]) -> str:
    labels = list(results["runs"])
    lines = ["| what (MiB: median / largest) | " + " | ".join(labels) + " |"]
    lines.append("|---" * (len(labels) + 1) + "|")

    def row(name: str, get: Any) -> None:
        cells = []
        for label in labels:
            value = get(results["runs"][label])
            cells.append(value if isinstance(value, str) else f"{value / MIB:.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    def pair(d: dict[str, float]) -> str:
        return f"{d['median'] / MIB:.1f} / {d['max'] / MIB:.1f}" if d else "-"

    first = results["runs"][labels[0]]
    for role in first["floors"]:
        row(f"{role}: import floor, anon", lambda r, role=role: r["floors"][role]["anonymous"])
    for name in sorted(k for k in first["roles"] if "/" in k):
        row(f"{name}: anon", lambda r, n=name: pair(r["roles"].get(n, {}).get("anonymous", {})))
        row(f"{name}: PSS", lambda r, n=name: pair(r["roles"].get(n, {}).get("pss", {})))
    row("Constructors: ready_bytes", lambda r: pair(r["roles"]["ready_bytes"]))
    row("Constructors: payload_bytes", lambda r: pair(r["roles"]["payload_bytes"]))
    row("one built step (step_bytes)", lambda r: r["roles"]["step_bytes"])
    row(
        "steps built ahead of a rank (not MiB)",
        lambda r: "{median:.1f} / {max:.0f}".format(**r["roles"]["ahead"]),
    )
    row("loaders: patch budget (loader_buffer_bytes)", lambda r: r["loader_buffer_bytes"])
    row("a rank: anon above its idle", lambda r: pair(r["ranks"]["anon_growth"]))
    row("a rank: one batch handed out", lambda r: pair(r["ranks"]["batch_bytes"]))
    row(
        "a rank: data-wait ms", lambda r: "{median:.1f} / {max:.1f}".format(**r["ranks"]["wait_ms"])
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.held_bytes", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("rank", help="a trainer rank (msd launch runs it)")
    one.add_argument("--log-dir", type=Path, required=True)
    one.add_argument("--step-s", type=float, required=True)
    one.add_argument("--pixels", choices=("uint8", "float"), default="uint8")
    parser.add_argument("--before", metavar="COMMIT", help="an earlier commit, run first")
    parser.add_argument("--sources", type=int, default=16)
    parser.add_argument("--sources-per-process", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.3)
    parser.add_argument("--pixels", choices=("uint8", "float"), default="uint8")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON written")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "rank":
        rank(args.log_dir, args.step_s, args.pixels)
        return
    trees = {f"before ({args.before})": checkout(args.before)} if args.before else {}
    trees["this checkout"] = ROOT
    runs = {label: run_job(args, label, tree) for label, tree in trees.items()}
    settings = {k: v for k, v in vars(args).items() if k not in ("command", "out")}
    results = {"settings": settings, "runs": runs}
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(table(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
