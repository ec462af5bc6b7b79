"""A real model step fed by msd or by per-rank DataLoaders: end-to-end steps/s and data-wait.

    python -m benchmarks.hf_trainer [--ranks 2] [--workers 1] [--steps 60] [--repeats 2]
        [--sources 8] [--seq-len 512] [--rows 2] [-- MODEL FLAGS of examples/hf_llama.py]

Both systems train the same Hugging Face Llama (examples/hf_llama.py: its model, optimizer and
step; by default sized so that a step takes 100-300 ms on a CPU core) with R ranks over gloo, on
the same synthetic Parquet sources (``benchmarks/dataloader/data.py``, reused between runs),
``seq_len`` and rows per rank:

* msd: ``msd launch`` of a recipe (``benchmarks/dataloader/msd_run.py``'s, greedy balancing)
  whose trainer is examples/hf_llama.py;
* baseline: each rank's own ``DataLoader(num_workers=W)`` over
  ``benchmarks/dataloader/baseline.py``'s ``MixedParquetStream`` (every worker opens every
  source, mixes by weight and packs its rank's rows), feeding the same step
  (``python -m benchmarks.hf_trainer rank ...``).

The runs alternate (msd, baseline, then baseline, msd, ...) so that a drift in the machine's
load falls on both alike. Per run: steps/s and tokens/s after ``--warmup`` steps
(``benchmarks/dataloader/metrics.py``), the ranks' data-wait p50/p99 and the model step's
median time. Writes ``benchmarks/results/hf_trainer.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch.utils.data import DataLoader

from benchmarks.dataloader.baseline import MixedParquetStream, StreamConfig
from benchmarks.dataloader.config import Point, Settings
from benchmarks.dataloader.data import ROOT, SMALL_RG_BYTES, Dataset, DataSpec, ensure_data
from benchmarks.dataloader.metrics import steps_by_rank, throughput
from benchmarks.dataloader.msd_run import recipe_dict, start_launcher, wait_launcher
from benchmarks.dataloader.run_baseline import start_ranks, stream_config, wait_ranks

EXAMPLE = ROOT / "examples" / "hf_llama.py"
RUN_ROOT = ROOT / "benchmarks" / "runs" / "hf_trainer"
RESULT = ROOT / "benchmarks" / "results" / "hf_trainer.json"
# ~0.85M parameters: about 170 ms a step for 2 rows of 512 tokens on one core.
MODEL_FLAGS = ("--hidden-size", "128", "--layers", "4", "--heads", "4", "--kv-heads", "2",
               "--intermediate-size", "384")  # fmt: skip
TIMEOUT_S = 1800.0


def load_example() -> ModuleType:
    """examples/hf_llama.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("hf_llama", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- a baseline rank ----------------------------------------------------------------------------
def baseline_rank(config_path: Path, log_dir: Path, model_flags: list[str]) -> None:
    """One rank: its own DataLoader, the example's model and step, a JSON line per step in the
    example's format (``log_dir/rank-R.jsonl``)."""
    config = StreamConfig.load(config_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    hf = load_example()
    args = hf.parse_args(model_flags)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = hf.build_model(args, config.seq_len)
    optimizer = hf.make_optimizer(model, args)
    ddp = hf.data_parallel(model, torch.device("cpu"))
    loader = DataLoader(
        MixedParquetStream(config, rank, world),
        num_workers=config.workers,
        batch_size=None,
        prefetch_factor=2,
        persistent_workers=True,
    )
    batches = iter(loader)
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"rank-{rank}.jsonl", "w") as log:
        for step in range(config.steps):
            asked = time.perf_counter()
            batch = next(batches)
            started = time.perf_counter()
            loss, _ = hf.train_step(ddp, optimizer, batch, step, args)
            record = {
                "step": step,
                "loss": loss,
                "tokens": int((batch["labels"] != hf.IGNORE_INDEX).sum()),
                "wait_ms": (started - asked) * 1e3,
                "step_ms": (time.perf_counter() - started) * 1e3,
                "time": time.time(),
            }
            log.write(json.dumps(record) + "\n")
    dist.destroy_process_group()


# -- one run of each system ---------------------------------------------------------------------
def summarise(logs: dict[int, list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    """Throughput after ``warmup`` steps, data-wait and model-step times over the warm steps."""
    table = steps_by_rank(logs)
    warm = [r for step in table[warmup:] for r in step]
    waits = np.array([r["wait_ms"] for r in warm])
    return {
        **{k: v for k, v in throughput(table, warmup).items() if not k.startswith("window")},
        "wait_p50_ms": float(np.percentile(waits, 50)),
        "wait_p99_ms": float(np.percentile(waits, 99)),
        "wait_max_ms": float(waits.max()),
        "step_ms_p50": statistics.median(r["step_ms"] for r in warm),
        "final_loss": table[-1][0]["loss"],
        "wait_ms_warm": [round(w, 3) for w in waits.tolist()],
    }


def read_logs(paths: list[Path]) -> dict[int, list[dict[str, Any]]]:
    return {
        rank: [json.loads(line) for line in path.read_text().splitlines()]
        for rank, path in enumerate(paths)
    }


def run_msd(
    point: Point, dataset: Dataset, settings: Settings, run_dir: Path, model_flags: list[str]
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", str(EXAMPLE), *model_flags])
    recipe = recipe_dict(point, dataset, settings, command, sources_per_process=64)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    started = time.time()
    error = wait_launcher(start_launcher(run_dir / "recipe.yaml", run_dir), settings.timeout_s)
    if error is not None:
        return {"error": error, "run_dir": str(run_dir)}
    job = Path(json.loads((run_dir / "launch.out").read_text())["job"])
    logs = read_logs([job / "trainer" / f"hf-rank-{r}.jsonl" for r in range(point.ranks)])
    return summarise(logs, settings.warmup) | {"wall_s": time.time() - started, "job": str(job)}


def run_baseline(
    point: Point, dataset: Dataset, settings: Settings, run_dir: Path, model_flags: list[str]
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    stream_config(point, dataset, settings).save(run_dir / "stream.json")
    argv = [sys.executable, "-m", "benchmarks.hf_trainer", "rank", str(run_dir / "stream.json"),
            str(run_dir / "ranks"), *model_flags]  # fmt: skip
    started = time.time()
    error = wait_ranks(start_ranks(point, run_dir, argv), settings.timeout_s)
    if error is not None:
        return {"error": error, "run_dir": str(run_dir)}
    logs = read_logs([run_dir / "ranks" / f"rank-{r}.jsonl" for r in range(point.ranks)])
    return summarise(logs, settings.warmup) | {"wall_s": time.time() - started}


RUNNERS = {"msd": run_msd, "baseline": run_baseline}


def order(repeat: int) -> tuple[str, str]:
    """msd first on even repeats, the baseline first on odd ones."""
    return ("msd", "baseline") if repeat % 2 == 0 else ("baseline", "msd")


def compare(args: argparse.Namespace, model_flags: list[str]) -> dict[str, Any]:
    point = Point(args.sources, args.ranks, args.workers, args.seq_len, SMALL_RG_BYTES, args.rows)
    settings = Settings(steps=args.steps, warmup=args.warmup, timeout_s=TIMEOUT_S)
    dataset = ensure_data(DataSpec(args.sources, rg_bytes=SMALL_RG_BYTES))
    runs = []
    for repeat in range(args.repeats):
        for system in order(repeat):
            run_dir = RUN_ROOT / f"{point.key}-{system}-{repeat}"
            print(f"repeat {repeat}: {system} ...", file=sys.stderr, flush=True)
            result = RUNNERS[system](point, dataset, settings, run_dir, model_flags)
            runs.append({"system": system, "repeat": repeat} | result)
            if "error" in result:
                raise SystemExit(f"{system} failed: {result['error']}")
    return {
        "point": point.as_dict() | {"steps": args.steps, "warmup": args.warmup},
        "model_flags": model_flags,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "summary": {system: pooled(runs, system) for system in RUNNERS},
        "msd_over_baseline_steps_per_s": paired(runs),
        "runs": runs,
    }


def paired(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """msd's steps/s over the baseline's within each repeat (the two ran back to back, so the
    machine's load changed least between them), and their geometric mean."""
    ratios = [
        next(r["steps_per_s"] for r in runs if r["repeat"] == k and r["system"] == "msd")
        / next(r["steps_per_s"] for r in runs if r["repeat"] == k and r["system"] == "baseline")
        for k in sorted({r["repeat"] for r in runs})
    ]
    return {"by_repeat": ratios, "geometric_mean": statistics.geometric_mean(ratios)}


def pooled(runs: list[dict[str, Any]], system: str) -> dict[str, float]:
    """One system over its repeats: mean steps/s, data-wait percentiles over every warm step."""
    mine = [r for r in runs if r["system"] == system]
    waits = np.array([w for r in mine for w in r["wait_ms_warm"]])
    return {
        "steps_per_s": statistics.mean(r["steps_per_s"] for r in mine),
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in mine),
        "wait_p50_ms": float(np.percentile(waits, 50)),
        "wait_p99_ms": float(np.percentile(waits, 99)),
        "step_ms_p50": statistics.median(r["step_ms_p50"] for r in mine),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:  # a baseline rank, started by run_baseline
        baseline_rank(Path(argv[1]), Path(argv[2]), argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="baseline DataLoader workers")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rows", type=int, default=2, help="rows per rank per step")
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("model_flags", nargs="*", help="after --: examples/hf_llama.py's flags")
    args = parser.parse_args(argv)
    result = compare(args, args.model_flags or list(MODEL_FLAGS))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(
        json.dumps({k: result[k] for k in ("summary", "msd_over_baseline_steps_per_s")}, indent=1)
    )


if __name__ == "__main__":
    main()
