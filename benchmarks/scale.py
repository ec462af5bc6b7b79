"""Scale harness: a real Planner, real loaders and real Constructors of up to 512 simulated nodes
(4,096 ranks) on one machine, over real CURVE-authenticated ZeroMQ sockets.

    python -m benchmarks.scale --quick                 # 8, 16 nodes, 100 sources, direct and 8
    python -m benchmarks.scale                         # nodes 8,64,256,512 x sources 100,1000,
                                                       # direct and fanout 32: about 25 minutes
    python -m benchmarks.scale --nodes 8,64 --sources 100 --fanout direct --steps 30

Each point is one job (``benchmarks.scale_job``): the Planner and ``--loaders`` loader processes
(``loader.sources_per_process`` packs the tiny synthetic Parquet sources into them) started as
``msd launch`` starts them, and N nodes, each a real Constructor
(``msd.roles.constructor.loop.Constructor``) on its own thread, ``--nodes-per-process`` to a
process with their simulated ranks (``benchmarks.scale_nodes``: a rank asks for step s, waits for
its batch, asks for s + 1). Every rank is its own DP rank and gets one row of ``--seq-len``
tokens per step, so the data is tiny while the messages and connections are those of a job of
that many ranks. ``--fanout`` sets the recipe's ``constructor.fanout`` (``direct``: every loader
sends to every Constructor).

Per point, from step ``--warmup`` on (see ``docs/scale.md`` for what each figure is):
steps/s; the Planner's plan time p50/p99 (its own ``msd status`` figures); TCP connections of
each process (``/proc/PID/fd`` x ``/proc/net/tcp``); PSS per role; CPU ms per step per role
(``/proc/PID/stat``); messages and bytes per step that the Constructors
and ranks sent and received, counted by type. Results are merged by point into
``benchmarks/results/scale.json`` (``scale-quick.json`` for ``--quick``), with a markdown table
and, if matplotlib is installed, ``scale.png`` (steps/s and connections per loader vs ranks).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from benchmarks import scale_proc as proc
from benchmarks.quickstart import machine
from benchmarks.scale_job import Fanout, Point, fanout_supported, run_point

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = ROOT / "benchmarks" / "runs"
MIB = 2**20
DEFAULT_FANOUT = 32  # the recipe's default constructor.fanout
QUICK_FANOUT = 8


def parse_fanouts(text: str) -> list[Fanout]:
    """``direct,8`` -> [None, 8]."""
    out: list[Fanout] = []
    for part in text.split(","):
        part = part.strip()
        if part == "direct":
            out.append(None)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"--fanout takes 'direct' or an int >= 1, got {part}")
    return out


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# -- one point's figures ----------------------------------------------------------------------
def summarise(point: Point, raw: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run, from what ``run_point`` collected."""
    nodes_out = raw.get("nodes_out", [])
    done_at = proc.step_done_at({int(s): t for s, t in out["done_at"].items()} for out in nodes_out)
    counts: dict[str, dict[str, list[int]]] = {}
    for out in nodes_out:
        proc.add_counts(counts, out["counts"])
    steps = max(done_at, default=-1) + 1
    gaps = proc.step_gaps_ms(done_at, point.warmup)
    planner = (raw.get("status") or {}).get("planner", {})
    figures: dict[str, Any] = {
        "nodes": point.nodes,
        "ranks": point.ranks,
        "sources": point.sources,
        "mode": point.mode,
        "fanout": point.fanout,
        "loader_processes": len(raw["end"]["roles"].get("loader", [])),
        "node_processes": len(nodes_out),
        "steps_done": steps,
        "capped": raw["capped"],
        "wall_s": round(raw["wall_s"], 1),
        "startup_s": None if raw["startup_s"] is None else round(raw["startup_s"], 1),
        "steps_per_s": round(proc.steps_per_s(done_at, point.warmup), 3),
        "step_ms_p50": round(proc.percentile(gaps, 50), 1),
        "step_ms_p99": round(proc.percentile(gaps, 99), 1),
        "plan_ms_p50": planner.get("plan_ms_p50"),
        "plan_ms_p99": planner.get("plan_ms_p99"),
        "steps_per_s_planner": planner_steps_per_s(raw),
        "constructors_running_at_end": sum(out.get("constructors_running", 0) for out in nodes_out),
        "errors": (missing_outputs(point, nodes_out) + [e for o in nodes_out for e in o["errors"]])[
            :5
        ],
    }
    if "started_at" in raw:
        figures["startup"] = proc.startup_phases(
            raw["started_at"],
            raw["planner_up_at"],
            Path(raw["job"]) / "logs",
            (out["started"] for out in nodes_out),
            done_at[min(done_at)] if done_at else None,
        )
    figures |= connection_figures(point, raw["warm"] or raw["end"])
    figures |= memory_figures(point, raw)
    figures["messages_per_step"] = {
        role: proc.per_step(kinds, steps) for role, kinds in sorted(counts.items())
    }
    figures |= cost_figures(raw, figures["messages_per_step"])
    figures["estimated_per_step"] = estimates(figures["messages_per_step"], figures)
    return figures


def planner_steps_per_s(raw: dict[str, Any]) -> float | None:
    """Steps consumed per second between the warm and the end snapshots, as the Planner counted
    them: a check on the ranks' own figure, and the only one if a nodes process wrote none."""
    warm, end = raw.get("warm"), raw.get("end")
    if not warm or not end or end["time"] <= warm["time"]:
        return None
    return round((end["step"] - warm["step"]) / (end["time"] - warm["time"]), 3)


def missing_outputs(point: Point, nodes_out: list[dict[str, Any]]) -> list[str]:
    missing = point.node_processes - len(nodes_out)
    if missing <= 0:
        return []
    return [f"{missing} of {point.node_processes} nodes processes wrote no figures"]


def connection_figures(point: Point, snap: dict[str, Any]) -> dict[str, Any]:
    roles = snap["roles"]
    loaders = [r["connections"] for r in roles.get("loader", [])]
    nodes = roles.get("nodes", [])
    inbound = sum(r["inbound"] for r in nodes)
    return {
        "connections_at_step": snap.get("step"),
        "connections_planner": sum(r["connections"] for r in roles.get("planner", [])),
        "connections_per_loader": max(loaders, default=0),
        "connections_per_loader_mean": round(proc.median_or_zero(loaders), 1),
        "connections_into_constructor": round(inbound / max(1, point.nodes), 1),
        "connections_per_node_process": max((r["connections"] for r in nodes), default=0),
    }


def memory_figures(point: Point, raw: dict[str, Any]) -> dict[str, Any]:
    roles = (raw["warm"] or raw["end"])["roles"]
    peak = raw["peak_pss"]

    def peak_of(role: str) -> list[int]:
        return [peak.get(str(r["pid"]), r["pss"]) for r in roles.get(role, [])]

    return {
        "pss_mib_planner": round(sum(peak_of("planner")) / MIB, 1),
        "pss_mib_per_loader": round(max(peak_of("loader"), default=0) / MIB, 1),
        "pss_mib_per_node_process": round(max(peak_of("nodes"), default=0) / MIB, 1),
        "pss_mib_per_constructor": round(sum(peak_of("nodes")) / MIB / max(1, point.nodes), 2),
    }


def cost_figures(raw: dict[str, Any], messages: dict[str, Any]) -> dict[str, Any]:
    """CPU ms per step of each role between the warm and the end snapshot (and the cores it
    kept busy), and the nodes processes' CPU per message their Constructors and ranks handled
    (idle polling and Stats included: a fair per-message cost only where steps are fast)."""
    warm, end = raw["warm"], raw["end"]
    if warm is None or end["step"] <= warm["step"]:
        return {"cpu_ms_per_step": {}, "cpu_cores": {}, "cpu_us_per_node_message": None}
    steps, seconds = end["step"] - warm["step"], max(1e-9, end["time"] - warm["time"])
    cpu: dict[str, float] = {}
    cores: dict[str, float] = {}
    for role, entries in end["roles"].items():
        before = {e["pid"]: e["cpu_s"] for e in warm["roles"].get(role, [])}
        spent = sum(e["cpu_s"] - before[e["pid"]] for e in entries if e["pid"] in before)
        cpu[role] = spent * 1000 / steps
        cores[role] = spent / seconds
    handled = sum(
        v["messages"] for role in ("constructor", "ranks") for v in messages.get(role, {}).values()
    )
    per_message = 1000 * cpu.get("nodes", 0.0) / handled if handled else None
    return {
        "cpu_ms_per_step": {k: round(v, 1) for k, v in cpu.items()},
        "cpu_cores": {k: round(v, 2) for k, v in cores.items()},
        "cpu_us_per_node_message": None if per_message is None else round(per_message, 1),
    }


def estimates(measured: dict[str, Any], figures: dict[str, Any]) -> dict[str, float]:
    """Messages per step of the roles this process does not host, from what the Constructors
    received: every Plan came from the Planner, every Payload from a loader (direct mode; in a
    tree a relayed Payload was also sent by a Constructor, which is subtracted)."""
    got = measured.get("constructor", {})

    def n(kind: str) -> float:
        return float(got.get(kind, {}).get("messages", 0.0))

    relayed = n("sent:Payload")
    return {
        "planner_sent_plans": n("received:Plan"),
        "planner_sent_routes_at_most": float(figures["loader_processes"]),
        "loaders_sent_payloads": n("received:Payload") - relayed,
        "constructors_relayed_payloads": relayed,
    }


# -- the table and the plot -------------------------------------------------------------------
COLUMNS = (
    ("ranks", "ranks"),
    ("nodes", "nodes"),
    ("sources", "sources"),
    ("mode", "mode"),
    ("steps_done", "steps"),
    ("steps_per_s", "steps/s"),
    ("steps_per_s_planner", "steps/s (Planner)"),
    ("plan_ms_p50", "plan p50 ms"),
    ("plan_ms_p99", "plan p99 ms"),
    ("connections_per_loader", "conns/loader"),
    ("connections_planner", "conns planner"),
    ("connections_into_constructor", "conns into a constructor"),
    ("pss_mib_planner", "planner PSS MiB"),
    ("pss_mib_per_loader", "loader PSS MiB"),
    ("pss_mib_per_constructor", "PSS MiB/constructor"),
    ("startup_s", "start s"),
)


def table(points: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for p in sorted(points, key=key_of):
        cells = [
            str(p.get(k, "")) + ("*" if k == "steps_done" and p["capped"] else "")
            for k, _ in COLUMNS
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def costs_table(points: list[dict[str, Any]]) -> str:
    """Per step, summed over the job: CPU of each role, Payloads and Plans, step times."""
    lines = [
        "| ranks | sources | mode | CPU ms/step: Planner | all loaders | all nodes processes "
        "| Payloads from loaders/step | relayed/step | Plans/step | Batches/step "
        "| nodes CPU µs/message | step ms p50 / p99 |",
        "|" + "---|" * 12,
    ]
    for p in sorted(points, key=key_of):
        cpu, est = p["cpu_ms_per_step"], p["estimated_per_step"]
        batches = p["messages_per_step"].get("constructor", {}).get("sent:Batch", {})
        cells = [
            p["ranks"], p["sources"], p["mode"],
            *(f"{cpu.get(role, 0):.0f}" for role in ("planner", "loader", "nodes")),
            *(f"{est[k]:.0f}" for k in ("loaders_sent_payloads", "constructors_relayed_payloads",
                                         "planner_sent_plans")),
            f"{batches.get('messages', 0):.0f}", p["cpu_us_per_node_message"],
            f"{p['step_ms_p50']:.0f} / {p['step_ms_p99']:.0f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def messages_table(points: list[dict[str, Any]]) -> str:
    """Messages per step by role and kind, measured where the Constructors and ranks are."""
    lines = [
        "| ranks | sources | mode | role | kind | messages/step | KiB/step |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in sorted(points, key=key_of):
        for role, kinds in p["messages_per_step"].items():
            for kind, v in sorted(kinds.items()):
                if kind.endswith(("Stats", "Hello", "Stop", "End", "Ended")):
                    continue
                row = (p["ranks"], p["sources"], p["mode"], role, kind, f"{v['messages']:.1f}")
                lines.append("| " + " | ".join(map(str, row)) + f" | {v['bytes'] / 1024:.1f} |")
    return "\n".join(lines)


STARTUP_PHASES = (
    ("planner_up", "planner up"),
    ("loaders_ready", "last loader ready"),
    ("nodes_up", "last nodes process up"),
    ("registered", "every role registered"),
    ("first_step", "first step at every rank"),
)


def startup_table(points: list[dict[str, Any]]) -> str:
    """Seconds from a point's start to each phase of its start-up (points that recorded them)."""
    lines = [
        "| ranks | nodes | sources | mode | " + " | ".join(h for _, h in STARTUP_PHASES) + " |",
        "|---|---|---|---|" + "---|" * len(STARTUP_PHASES),
    ]
    for p in sorted((p for p in points if "startup" in p), key=key_of):
        cells = [p["ranks"], p["nodes"], p["sources"], p["mode"]]
        cells += ["" if (v := p["startup"][k]) is None else v for k, _ in STARTUP_PHASES]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def key_of(p: dict[str, Any]) -> tuple[int, int, str]:
    return (p["sources"], p["ranks"], p["mode"])


def plot(points: list[dict[str, Any]], path: Path) -> bool:
    """Steps/s and connections per loader vs ranks, a line per mode and source count; False
    (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    lines: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in points:
        lines.setdefault((p["mode"], p["sources"]), []).append(p)
    for (mode, sources), ps in sorted(lines.items()):
        ps.sort(key=lambda p: p["ranks"])
        ranks = [p["ranks"] for p in ps]
        style = "-o" if mode == "direct" else "--s"
        label = f"{mode}, {sources} sources"
        left.plot(ranks, [p["steps_per_s"] for p in ps], style, label=label)
        right.plot(ranks, [p["connections_per_loader"] for p in ps], style, label=label)
    for ax, title in ((left, "steps/s"), (right, "TCP connections per loader process")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("simulated ranks (8 per node)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle("msd scale harness on this machine (all processes on its CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- the sweep --------------------------------------------------------------------------------
def merged(path: Path, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points of ``path`` with ``new`` replacing those of the same ranks, sources, mode."""
    old = json.loads(path.read_text())["points"] if path.exists() else []
    keys = {key_of(p) for p in new}
    return sorted([p for p in old if key_of(p) not in keys] + new, key=key_of)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 and 16 nodes, 100 sources")
    parser.add_argument("--nodes", type=parse_ints, default=[8, 64, 256, 512])
    parser.add_argument("--sources", type=parse_ints, default=[100, 1000])
    parser.add_argument(
        "--fanout",
        type=parse_fanouts,
        help=f"direct and/or N, comma-separated (default: direct,{DEFAULT_FANOUT})",
    )
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="steps measured, at most")
    parser.add_argument("--measure-s", type=float, default=30.0, help="seconds measured, at most")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the rates")
    parser.add_argument("--max-s", type=float, default=240.0, help="wall-clock cap per point")
    parser.add_argument("--loaders", type=int, default=4, help="loader processes")
    parser.add_argument(
        "--nodes-per-process", type=int, default=32, help="Constructors (threads) per process"
    )
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--redraw", action="store_true", help="only rewrite the table and plot")
    args = parser.parse_args()
    if args.redraw:
        write(args.out, "scale-quick" if args.quick else "scale", [])
        return
    if args.quick:
        args.nodes, args.sources, args.measure_s, args.max_s = [8, 16], [100], 5.0, 30.0
    tree = QUICK_FANOUT if args.quick else DEFAULT_FANOUT  # quick: 16 nodes still make a tree
    fanouts = args.fanout or ([None, tree] if fanout_supported() else [None])
    if any(f is not None for f in fanouts) and not fanout_supported():
        parser.error("this msd has no constructor.fanout yet: only --fanout direct can run")
    # Every process a point starts is stopped in a finally block: let both signals reach it
    # (a shell starting this in the background would leave SIGINT ignored).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    new = []
    for sources in args.sources:
        for nodes in args.nodes:
            for fanout in fanouts:  # both modes of a point back to back: the same machine load
                point = Point(
                    nodes=nodes, sources=sources, fanout=fanout,
                    ranks_per_node=args.ranks_per_node, steps=args.steps, warmup=args.warmup,
                    seq_len=args.seq_len, loaders=args.loaders, measure_s=args.measure_s,
                    nodes_per_process=args.nodes_per_process, max_s=args.max_s,
                )  # fmt: skip
                print(f"{point.ranks} ranks ({nodes} nodes), {sources} sources, {point.mode}")
                raw = run_point(point, RUNS / "scale", RUNS / "scale-data")
                new.append(summarise(point, raw))
                print(table(new[-1:]).splitlines()[-1])
                write(args.out, "scale-quick" if args.quick else "scale", new[-1:])
    print(table(new))


def write(out: Path, name: str, new: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    points = merged(path, new)
    path.write_text(json.dumps({"machine": machine(), "points": points}, indent=1) + "\n")
    tables = (table(points), costs_table(points), messages_table(points), startup_table(points))
    text = "\n\n".join(tables) + "\n"
    (out / f"{name}.md").write_text(text)
    drew = plot(points, out / f"{name}.png")
    print(f"wrote {path}" + (f" and {name}.png" if drew else " (no matplotlib: no plot)"))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted; every process the point had started was stopped")
