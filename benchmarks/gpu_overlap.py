"""On a GPU: does the Client's copy to the device overlap the model's step? Data-wait and steps/s
with ``Client(device="cuda")`` against the trainer copying batches itself.

    python -m benchmarks.gpu_overlap [--workload text|vlm] [--steps 200] [--warmup 30]
        [--repeats 2] [--seq-len 4096] [--rows 4] [-- MODEL FLAGS of examples/hf_llama.py]

Needs a CUDA device. One trainer rank on GPU 0 trains the Hugging Face Llama of
examples/hf_llama.py (its model, inputs, loss and learning rate; bf16 autocast; by default
~100 M parameters) under ``msd launch`` (``LocalJob``) on the demo sources (``msd synth``, made
in ``benchmarks/runs/gpu_overlap/`` if missing): ``text``, the three text sources; ``vlm``,
examples-vlm.yaml's image-text sources, whose ``pixel_values`` (``pixels="float"``) also go
through two stand-in vision layers in the step. It gets each batch onto the GPU in three ways:

* ``device``: ``msd.Client(device="cuda")``: the Client's thread copies the compact frames
  (uint8 pixels) from pinned memory on a side stream while the previous step computes, and
  widens and normalises them there; the trainer's stream waits for that work (an event);
* ``pinned``: ``msd.Client(pin_memory=True)``, then ``.to(device, non_blocking=True)`` in the
  loop (what ``DataLoader(pin_memory=True)`` gives a trainer);
* ``pageable``: ``msd.Client()``, then ``.to(device)`` in the loop.

Per step a rank logs: the host's data-wait (asking for the batch until its tensors are usable on
the device from the host's view: ``next()`` plus the copies the loop makes), the step's time,
and the GPU's gap (CUDA events: from the end of the previous step's work to the start of this
step's forward on the trainer's stream; what the GPU waited for data, the copies and the
host's own work between steps), and every ``--check-every`` steps a digest of the batch
(moved back to the host after the step): the three ways must see the same bytes at those
steps. That check costs tens of milliseconds with images, so steps/s (from the cycle between
two requests), waits and gaps leave out the steps it touches. The runs alternate their order
between repeats so that a drift falls on all alike. Writes
``benchmarks/results/gpu_overlap_WORKLOAD.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

from benchmarks.hf_trainer import load_example
from msd.launch.local import LocalJob
from msd.recipe.load import recipe_from_data
from msd.synth.text import synth
from msd.synth.vlm import write_vlm_sources

ROOT = Path(__file__).resolve().parents[1]
RUN_ROOT = ROOT / "benchmarks" / "runs" / "gpu_overlap"
RESULTS = ROOT / "benchmarks" / "results"
MODES = ("device", "pinned", "pageable")
# ~100 M parameters: about 83 ms a step of 4 × 4,096 tokens on one H200 (text).
MODEL_FLAGS = ("--hidden-size", "1024", "--layers", "8", "--heads", "16", "--kv-heads", "8",
               "--intermediate-size", "2816")  # fmt: skip
VLM_FLAGS = ("--vocab-size", "257")  # the bytes transform's 256 ids and the image token
DIGESTED = ("input_ids", "labels", "position_ids", "cu_seqlens", "pixel_values", "image_grid_thw")
log = logging.getLogger("gpu_overlap")


# -- a trainer rank (run by msd launch) ---------------------------------------------------------
def client_for(mode: str, device: torch.device) -> Any:
    import msd

    if mode == "device":
        return msd.Client(device=device, pixels="float")
    return msd.Client(pin_memory=mode == "pinned", pixels="float")


def on_device(batch: dict[str, torch.Tensor], mode: str, device: torch.device) -> dict[str, Any]:
    if mode == "device":
        return batch
    return {name: t.to(device, non_blocking=mode == "pinned") for name, t in batch.items()}


def digest(batch: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in DIGESTED:
        if name not in batch:
            continue
        tensor = batch[name].cpu()
        h.update(str(tensor.dtype).encode() + str(tuple(tensor.shape)).encode())
        h.update(tensor.numpy().tobytes())
    return h.hexdigest()


class Marks:
    """A point on the trainer's CUDA stream (nothing on a CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.event = None
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self.event.record(torch.cuda.current_stream(device))

    def ms_until(self, later: Marks) -> float:
        if self.event is None or later.event is None:
            return 0.0
        return float(self.event.elapsed_time(later.event))


def vision_stand_in(vision: Any, hidden: int) -> torch.nn.Module:
    """Two layers over each patch's values: the GPU work a vision tower starts with, so that
    the step uses the pixels (a real tower's cost is not the point here: their copy is)."""
    values = 3 * vision.temporal_patch_size * vision.patch_size**2
    return torch.nn.Sequential(
        torch.nn.Linear(values, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden)
    )


def train_step(
    hf: Any,
    model: torch.nn.Module,
    vision: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    step: int,
    args: argparse.Namespace,
) -> float:
    """examples/hf_llama.py's step (its inputs, loss and learning rate), plus the stand-in
    vision layers over ``pixel_values`` when there are any; the mean loss (synchronises)."""
    device = next(model.parameters()).device
    for group in optimizer.param_groups:
        group["lr"] = hf.learning_rate(step, args)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(**hf.model_inputs(batch, args.attn_implementation, device)).logits
        extra = None
        if vision is not None and "pixel_values" in batch and len(batch["pixel_values"]):
            extra = vision(batch["pixel_values"].to(device)).float().pow(2).mean()
    loss, mean, _ = hf.packed_loss(logits, batch["labels"], 1)
    if extra is not None:
        loss = loss + 1e-3 * extra
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    optimizer.step()
    return float(mean)


def rank_main(mode: str, check_every: int, model_flags: list[str]) -> int:
    """One rank: the example's model and step fed in ``mode``; a JSON line per step in
    ``JOB/trainer/gpu-rank-R.jsonl``, with the batch's digest every ``check_every`` steps."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu_overlap: %(message)s")
    hf = load_example()
    args = hf.parse_args(model_flags)
    gpu = torch.cuda.is_available()  # without one (a check of this script): CPU, no GPU gap
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    client = client_for(mode, device)
    backend = "nccl" if gpu else "gloo"
    dist.init_process_group(backend, rank=client.rank, world_size=client.world_size)
    recipe = client.job.recipe()
    model = hf.build_model(args, recipe.seq_len).to(device)
    vision = None
    if any(s.data_format == "webdataset" or s.image_column for s in recipe.sources):
        vision = vision_stand_in(recipe.vision, args.hidden_size).to(device)
        model.add_module("vision_stand_in", vision)
    optimizer = hf.make_optimizer(model, args)
    ended = Marks(device)
    checked = False  # whether the host checked the previous step's batch
    batches = iter(client)
    path = client.job.trainer / f"gpu-rank-{client.rank}.jsonl"
    with open(path, "w") as out:
        for step in range(client.job.recipe().steps):
            asked = time.perf_counter()
            try:
                batch = on_device(next(batches), mode, device)
            except StopIteration:
                break
            began = time.perf_counter()
            started = Marks(device)
            loss = train_step(hf, model, vision, optimizer, batch, step, args)
            done = time.perf_counter()
            gap_ms = ended.ms_until(started)
            ended = Marks(device)
            record = {
                "step": step,
                "loss": loss,
                "tokens": int(batch["input_ids"].numel()),
                "pixel_bytes": int(batch["pixel_values"].nbytes) if "pixel_values" in batch else 0,
                "asked": asked,
                "wait_ms": (began - asked) * 1e3,
                "step_ms": (done - began) * 1e3,
                "gpu_gap_ms": gap_ms,
                "after_check": checked,  # this step's wait and gap include that check
                "time": time.time(),
            }
            checked = step % check_every == 0
            if checked:  # the batch back to the host and hashed: tens of ms with images
                record["digest"] = digest(batch)
            out.write(json.dumps(record) + "\n")
    client.close()
    dist.destroy_process_group()
    return 0


# -- one run per mode ---------------------------------------------------------------------------
# The example recipes' sources (their paths under the data made here) and vision settings; an
# image source gets 2 loaders, so that one rank's images are decoded fast enough.
EXAMPLE_RECIPES = {"text": "examples-hf-llama.yaml", "vlm": "examples-vlm.yaml"}


def recipe(mode: str, args: argparse.Namespace, data: Path, model_flags: list[str]) -> Any:
    example = yaml.safe_load((ROOT / "recipes" / EXAMPLE_RECIPES[args.workload]).read_text())
    sources = []
    for source in example["sources"]:
        path = str(data / source["path"].split("/", 1)[1])  # demo-data/web/*.parquet: web/...
        images = source.get("format") == "webdataset" or "image_column" in source
        sources.append(source | {"path": path} | ({"loaders": 2} if images else {}))
    rank = ["rank", mode, str(args.check_every), "--", *model_flags]
    command = " ".join([sys.executable, "-m", "benchmarks.gpu_overlap", *rank])
    body: dict[str, Any] = {
        "name": f"gpu-overlap-{args.workload}-{mode}",
        "seed": 1234,
        "steps": args.steps,
        "seq_len": args.seq_len,
        "global_batch_tokens": args.rows * args.seq_len,
        "distribute": {"dp": 1},
        "sources": sources,
        "trainer": {"command": command},
    }
    if "vision" in example:
        body["vision"] = example["vision"]
    return recipe_from_data(body, "benchmarks.gpu_overlap")


def ensure_data(workload: str) -> Path:
    """The demo sources (``msd synth demo-data``; ``--kind vlm``: image-text ones too)."""
    data = RUN_ROOT / f"demo-{workload}"
    if not (data / "books").exists():
        synth(data)
    if workload == "vlm" and not (data / "interleaved-parquet").exists():
        write_vlm_sources(data)
    return data


def run(mode: str, args: argparse.Namespace, data: Path, model_flags: list[str]) -> dict[str, Any]:
    job = LocalJob(recipe(mode, args, data, model_flags), "# benchmark\n", RUN_ROOT / "jobs")
    started = time.perf_counter()
    job.start()
    outcome = job.watch(lambda status: None)
    if not outcome.ok:
        raise SystemExit(f"gpu_overlap: the {mode} run failed: {outcome.message}")
    lines = (outcome.job.root / "trainer" / "gpu-rank-0.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return summarise(records, args.warmup) | {
        "wall_s": time.perf_counter() - started,
        "digests": {r["step"]: r["digest"] for r in records if "digest" in r},
    }


def summarise(records: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Figures over the steps from ``warmup`` on that no check touched: a step's cycle (from
    asking for its batch to asking for the next) and the next step's wait and gap include the
    check of its batch, when it was checked."""
    warm = [r for r in records if r["step"] >= warmup]
    clean = [r for r in warm if not r["after_check"]]
    waits = np.array([r["wait_ms"] for r in clean])
    gaps = np.array([r["gpu_gap_ms"] for r in clean])
    cycles = [b["asked"] - a["asked"] for a, b in itertools.pairwise(warm) if not b["after_check"]]
    cycle_s = statistics.mean(cycles)
    return {
        "steps": len(records),
        "steps_used": len(clean),
        "steps_per_s": 1 / cycle_s,
        "tokens_per_s": statistics.mean(r["tokens"] for r in warm) / cycle_s,
        "wait_p50_ms": float(np.percentile(waits, 50)),
        "wait_p99_ms": float(np.percentile(waits, 99)),
        "gpu_gap_p50_ms": float(np.percentile(gaps, 50)),
        "gpu_gap_p99_ms": float(np.percentile(gaps, 99)),
        "step_ms_p50": statistics.median(r["step_ms"] for r in warm),
        "step_ms_mean": statistics.mean(r["step_ms"] for r in warm),
        "pixel_mb_per_step": statistics.mean(r["pixel_bytes"] for r in warm) / 1e6,
        "final_loss": records[-1]["loss"],
    }


def compare(args: argparse.Namespace, model_flags: list[str]) -> dict[str, Any]:
    data = ensure_data(args.workload)
    runs = []
    for repeat in range(args.repeats):
        order = MODES if repeat % 2 == 0 else MODES[::-1]
        for mode in order:
            log.info("repeat %d: %s ...", repeat, mode)
            runs.append({"mode": mode, "repeat": repeat} | run(mode, args, data, model_flags))
            shown = {k: v for k, v in runs[-1].items() if k != "digests"}
            log.info("%s", json.dumps(shown))
    reference = runs[0]["digests"]
    same = bool(reference) and all(r["digests"] == reference for r in runs)
    for r in runs:
        del r["digests"]
    return {
        "point": {
            "workload": args.workload,
            "seq_len": args.seq_len,
            "rows": args.rows,
            "steps": args.steps,
            "warmup": args.warmup,
        },
        "model_flags": model_flags,
        "machine": {
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "same_batches_in_every_mode": same,
        "summary": {mode: pooled([r for r in runs if r["mode"] == mode]) for mode in MODES},
        "runs": runs,
    }


def pooled(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("steps_per_s", "wait_p50_ms", "wait_p99_ms", "gpu_gap_p50_ms", "gpu_gap_p99_ms",
            "step_ms_p50", "step_ms_mean", "pixel_mb_per_step")  # fmt: skip
    return {k: statistics.mean(r[k] for r in runs) for k in keys}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:  # a trainer rank, started by msd launch
        flags = argv[4:] if argv[3:4] == ["--"] else argv[3:]
        return rank_main(argv[1], int(argv[2]), flags)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=4, help="rows per step")
    parser.add_argument("--workload", choices=("text", "vlm"), default="text")
    parser.add_argument("--check-every", type=int, default=10, help="digest a batch every N")
    parser.add_argument("--out", type=Path)
    parser.add_argument("model_flags", nargs="*", help="after --: examples/hf_llama.py's flags")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu_overlap: %(message)s")
    if not torch.cuda.is_available():
        log.error("benchmarks.gpu_overlap needs a CUDA device, and torch sees none here")
        return 1
    flags = args.model_flags or [*MODEL_FLAGS, *(VLM_FLAGS if args.workload == "vlm" else ())]
    result = compare(args, flags)
    out = args.out or RESULTS / f"gpu_overlap_{args.workload}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    summary = {k: result[k] for k in ("same_batches_in_every_mode", "summary")}
    sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
