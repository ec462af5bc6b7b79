"""What a trainer pays to import msd: wall time, memory and modules of ``from msd.client import
Client`` (and of ``import msd.client`` and ``import msd``), this msd against another version of
it, side by side in one run.

    python -m benchmarks.import_cost [--python PYTHON] [--baseline-python PYTHON] [--runs 15]

Each run is a fresh interpreter (``PYTHON -c ...``, started in an empty folder so that it
imports its own installed msd, not one in the current folder). Inside it:

  * import time: ``time.perf_counter`` around the import alone (interpreter start-up left out);
  * PSS after the import: ``Pss:`` of ``/proc/self/smaps_rollup``, the process's share of the
    memory it maps (a bare interpreter's is reported too, for scale), and its RSS: PSS shares
    the pages of libraries other processes map too (torch's), so it moves with what else runs;
  * modules: how many ``msd`` modules, and how many modules in all, the import loaded.

The two interpreters alternate run by run, so a slower moment of the machine hits both.
Reported: each version's median per import, and the ratios this / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.quickstart import machine

ROOT = Path(__file__).resolve().parent.parent
# What each fresh interpreter runs; "": a bare interpreter, for scale.
IMPORTS = ("from msd.client import Client", "import msd.client", "import msd", "")

# Run in the child: the standard-library modules it needs are imported before the clock starts.
_CHILD = """
import json, sys, time
before = set(sys.modules)
started = time.perf_counter()
{statement}
import_s = time.perf_counter() - started
kib = {{}}
with open("/proc/self/smaps_rollup") as f:
    for line in f:
        if line.startswith(("Pss:", "Rss:")):
            kib[line.split(":")[0]] = int(line.split()[1])
loaded = set(sys.modules) - before
msd = sys.modules.get("msd")
print(json.dumps({{
    "import_ms": import_s * 1000,
    "pss_mib": kib.get("Pss", 0) / 1024,
    "rss_mib": kib.get("Rss", 0) / 1024,
    "msd_modules": sum(1 for m in sys.modules if m == "msd" or m.startswith("msd.")),
    "modules_loaded": len(loaded),
    "torch": "torch" in sys.modules,
    "msd_file": getattr(msd, "__file__", None),
}}))
"""


def measure(python: str, statement: str, cwd: str) -> dict[str, Any]:
    """One fresh interpreter running the import ``statement`` (nothing when empty)."""
    statement = statement or "pass"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each its own msd
    done = subprocess.run(
        [python, "-c", _CHILD.format(statement=statement)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} could not {statement!r}:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the measured figures; what does not vary run to run, as is."""
    last = runs[-1]
    return {
        "import_ms": statistics.median(r["import_ms"] for r in runs),
        "pss_mib": statistics.median(r["pss_mib"] for r in runs),
        "rss_mib": statistics.median(r["rss_mib"] for r in runs),
        "msd_modules": last["msd_modules"],
        "modules_loaded": last["modules_loaded"],
        "torch": last["torch"],
        "msd_file": last["msd_file"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="the msd to measure")
    parser.add_argument("--baseline-python", help="the msd to compare with (optional)")
    parser.add_argument("--runs", type=int, default=15, help="fresh interpreters per import")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    trees = {"this": args.python}
    if args.baseline_python:
        trees["baseline"] = args.baseline_python
    found: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {statement: [] for statement in IMPORTS} for name in trees
    }
    with tempfile.TemporaryDirectory() as empty:
        for i in range(args.runs):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for statement in IMPORTS:
                for name in order:
                    found[name][statement].append(measure(trees[name], statement, empty))
            print(f"run {i + 1}/{args.runs}", flush=True)
    medians = {
        name: {statement or "(bare)": summary(runs) for statement, runs in by_statement.items()}
        for name, by_statement in found.items()
    }
    results: dict[str, Any] = {
        "machine": machine(),
        "pythons": trees,
        "runs": args.runs,
        "median": medians,
    }
    if "baseline" in medians:
        results["this_over_baseline"] = {
            statement: {
                key: medians["this"][statement][key] / medians["baseline"][statement][key]
                for key in ("import_ms", "pss_mib", "rss_mib")
            }
            for statement in medians["this"]
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "import_cost.json").write_text(json.dumps(results, indent=2))
    shown = {k: results[k] for k in ("median", "this_over_baseline") if k in results}
    print(json.dumps(shown, indent=2))


if __name__ == "__main__":
    main()
