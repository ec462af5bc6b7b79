"""Quickstart benchmark: delivered tokens/s, trainer data-wait and memory of every msd process.

    python -m benchmarks.quickstart [--data demo-data] [--steps 300] [--out benchmarks/results]

Run it from the folder holding ``demo-data`` (made by ``msd synth demo-data`` if missing).
It measures two recipes: ``quickstart`` (the ``bytes`` transform, nearly free, so the
data plane's own cost shows) and ``quickstart-bpe`` (a BPE tokenizer, a realistic cost).

Side by side in one run, on the same files:
  * reference — one process reads every row group of every source with pyarrow (only the text
    column) and tokenizes it with the same transform: the tokens/s a single reader achieves;
  * msd throughput — `recipes/quickstart.yaml` with a trainer that does no compute, so the data
    plane is the bottleneck: delivered tokens/s;
  * msd data-wait — the same recipe with the demo trainer computing (``--step-ms``): how long
    trainers wait for data per step once warm (the first ``--warmup`` steps are left out), and
    the summed PSS of the Planner, loaders and Constructor (sampled through the run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import psutil

from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe
from msd.sources.index import open_source
from msd.sources.read import RowGroupReader
from msd.sources.transforms import make_transform
from msd.synth.text import synth, train_tokenizer

ROOT = Path(__file__).resolve().parent.parent


def reference_tokens_per_s(recipe: Recipe) -> float:
    """One process: read every row group's column with pyarrow and tokenize it."""
    tokens = 0
    started = time.perf_counter()
    for i, source in enumerate(recipe.sources):
        index = open_source(source, f"sources[{i}]")
        tokenize = make_transform(source.transform, index.column_kind)
        reader = RowGroupReader()
        for rg in index.row_groups:
            tokens += sum(len(t) for t in tokenize(reader.read(rg, index.column)))
    return tokens / (time.perf_counter() - started)


class PssSampler(threading.Thread):
    """Peak of the summed PSS of the launcher's role processes (not the trainers)."""

    def __init__(self, job: LocalJob) -> None:
        super().__init__(daemon=True)
        self.job = job
        self.peak_roles_mib = 0.0
        self.peak_trainers_mib = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            roles = [c for c in self.job.children if c.role != "trainer"]
            self.peak_roles_mib = max(self.peak_roles_mib, _pss_mib(roles))
            self.peak_trainers_mib = max(self.peak_trainers_mib, _pss_mib(self.job.trainers))


def _pss_mib(children: list[Any]) -> float:
    total = 0
    for child in children:
        try:
            total += psutil.Process(child.popen.pid).memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**20


def run_msd(recipe: Recipe, run_root: Path, warmup: int) -> dict[str, Any]:
    job = LocalJob(recipe, "# benchmark\n", run_root)
    sampler = PssSampler(job)
    started = time.perf_counter()
    job.start()
    sampler.start()
    outcome = job.watch(lambda status: None)
    sampler.done.set()
    if not outcome.ok or outcome.status is None:
        raise SystemExit(f"msd run failed: {outcome.message}")
    records = _rank_records(outcome.job.root)
    warm = [r for r in records if r["step"] >= warmup]
    waits = np.array([r["wait_ms"] for r in warm])
    status = outcome.status
    return {
        "steps": status.consumed,
        "tokens": status.tokens_consumed,
        "tokens_per_s": _steady_tokens_per_s(records, warmup),
        "wall_s_with_startup": time.perf_counter() - started,
        "wait_p50_ms": float(np.percentile(waits, 50)),
        "wait_p99_ms": float(np.percentile(waits, 99)),
        "wait_max_ms": float(np.max(waits)),
        "data_plane_pss_mib": sampler.peak_roles_mib,
        "trainers_pss_mib": sampler.peak_trainers_mib,
        "processes": len(job.children),
    }


def _rank_records(job_root: Path) -> list[dict[str, Any]]:
    records = []
    for path in (job_root / "trainer").glob("rank-*.jsonl"):
        records += [json.loads(line) for line in path.read_text().splitlines()]
    return records


def _steady_tokens_per_s(records: list[dict[str, Any]], warmup: int) -> float:
    """Tokens delivered to all ranks per second, from step ``warmup`` on (start-up left out)."""
    last = max(r["step"] for r in records)
    start = max(r["time"] for r in records if r["step"] == warmup)
    end = max(r["time"] for r in records if r["step"] == last)
    tokens = sum(r["tokens"] for r in records if warmup < r["step"] <= last)
    return tokens / (end - start)


def ensure_demo_data(data: Path) -> None:
    """``msd synth`` sources and a BPE tokenizer in ``data``, unless they are there."""
    if not (data / "tokenizer.json").exists():
        synth(data)
        train_tokenizer(data)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def paired_runs_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments of a benchmark that alternates runs of one recipe."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "quickstart-bpe.yaml")
    parser.add_argument("--data", type=Path, default=Path("demo-data"))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return parser


def with_trainer(recipe: Recipe, steps: int, step_ms: float) -> Recipe:
    demo = msgspec.structs.replace(recipe.trainer.demo, step_ms=step_ms)
    trainer = msgspec.structs.replace(recipe.trainer, command="demo", demo=demo)
    return msgspec.structs.replace(recipe, steps=steps, trainer=trainer)


def measure(recipe_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    recipe = load_recipe(recipe_path)
    run_root = args.out / "runs"
    reference = reference_tokens_per_s(recipe)
    throughput = run_msd(with_trainer(recipe, args.steps, 0.0), run_root, args.warmup)
    computing = run_msd(with_trainer(recipe, args.steps, args.step_ms), run_root, args.warmup)
    return {
        "recipe": str(recipe_path),
        "reference_tokens_per_s": reference,
        "msd_throughput": throughput,
        "msd_with_compute": computing,
        "delivered_vs_reference": throughput["tokens_per_s"] / reference,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--recipes",
        type=Path,
        nargs="+",
        default=[ROOT / "recipes" / "quickstart.yaml", ROOT / "recipes" / "quickstart-bpe.yaml"],
    )
    parser.add_argument("--data", type=Path, default=Path("demo-data"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    ensure_demo_data(args.data)
    results = {
        "machine": machine(),
        "runs": [measure(path, args) for path in args.recipes],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quickstart.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
