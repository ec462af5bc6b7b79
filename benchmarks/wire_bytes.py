"""Bytes per token crossing msd's data sockets, before and after the compact wire.

    python -m benchmarks.wire_bytes [--data demo-data] [--steps 30] [--out benchmarks/results]

Runs `recipes/quickstart.yaml` (the ``bytes`` transform: a byte is a token) and
`recipes/quickstart-bpe.yaml` (a 4,096-token BPE) through `msd launch` with the demo trainer
saving every rank's batches, then, for every saved batch:

  * trainer socket (Constructor → Client): the previous wire sent every tensor as it is (three
    int64 per token and the metadata), the compact wire sends ``msd.wire.compact.encode`` of it;
  * payload socket (loader → Constructor): the previous wire sent int32 tokens, the compact wire
    the smallest integer type that holds each payload's tokens (measured here per batch, whose
    tokens are a superset of any payload's values: an upper bound).

Bytes are counted per real token (padding excluded, as delivered tokens/s counts them).
Writes ``wire_bytes.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.quickstart import ensure_demo_data, machine
from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe
from msd.wire import compact

ROOT = Path(__file__).resolve().parent.parent


def measure(recipe_file: Path, data: Path, steps: int, work: Path) -> dict[str, Any]:
    doc = yaml.safe_load(recipe_file.read_text())
    for source in doc["sources"]:
        source["path"] = str(data.resolve() / Path(source["path"]).relative_to("demo-data"))
        transform = source.get("transform", {})
        if "path" in transform:
            transform["path"] = str(data.resolve() / Path(transform["path"]).name)
    doc["steps"] = steps
    doc["trainer"] = {"command": "demo", "demo": {"step_ms": 0, "save_batches": True}}
    path = work / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    outcome = LocalJob(load_recipe(path), path.read_text(), work / "runs").run(lambda s: None)
    if not outcome.ok:
        raise SystemExit(f"{recipe_file.name}: {outcome.message}")
    before = after = payload_before = payload_after = tokens = 0
    for saved in sorted(outcome.job.trainer.glob("rank-*/step-*.npz")):
        with np.load(saved) as z:
            batch = {name: z[name] for name in z.files}
        real = int((batch["labels"] != compact.IGNORE_INDEX).sum()) + len(batch["sample_ids"])
        tokens += real
        before += sum(a.nbytes for a in batch.values())
        after += sum(f.nbytes for f in compact.encode(batch, batch).values())
        payload_before += 4 * real
        payload_after += compact.narrowed(batch["input_ids"]).dtype.itemsize * real
    return {
        "recipe": recipe_file.name,
        "tokens": tokens,
        "trainer_socket_bytes_per_token": {"before": before / tokens, "after": after / tokens},
        "payload_socket_bytes_per_token": {
            "before": payload_before / tokens,
            "after": payload_after / tokens,
        },
        "total_ratio": (before + payload_before) / (after + payload_after),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("demo-data"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    ensure_demo_data(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            measure(ROOT / "recipes" / name, args.data, args.steps, Path(tmp))
            for name in ("quickstart.yaml", "quickstart-bpe.yaml")
        ]
    report = {"machine": machine(), "steps": args.steps, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wire_bytes.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
