"""PNG plots of a sweep: memory vs S·R·W, steps/s vs S, the data-wait distribution.

matplotlib is imported here only, lazily: without it the plots are skipped with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

Entry = dict[str, Any]
SYSTEMS = (("baseline", "o-", "per-rank DataLoaders"), ("msd", "s--", "msd"))
COLORS = {"baseline": "tab:blue", "msd": "tab:orange"}


def plot_all(entries: Sequence[Entry], out: Path, stem: str) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install 'matplotlib>=3.8')", flush=True)
        return []
    paths = []
    for name, draw in (("memory", _memory), ("steps", _steps), ("wait", _wait)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if draw(ax, entries):
            path = out / f"{stem}-{name}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            paths.append(path)
        plt.close(fig)
    return paths


def _result(entry: Entry, system: str) -> Entry | None:
    result = entry.get(system) or {}
    return result if "steps_per_s" in result else None


def _memory(ax: Any, entries: Sequence[Entry]) -> bool:
    drawn = False
    for system, style, label in SYSTEMS:
        for small in (False, True):
            pts = sorted(
                (
                    e["point"]["S"] * e["point"]["R"] * e["point"]["W"],
                    r["data_plane_peak_mib"] / 1024,
                )
                for e in entries
                if (r := _result(e, system)) and (e["point"]["rg_bytes"] < 2**20) == small
            )
            if not pts:
                continue
            suffix = ", 64 KB row groups" if small else ""
            marker = style.replace("-", "")
            ax.plot(
                *zip(*pts, strict=True),
                marker,
                label=label + suffix,
                color=COLORS[system],
                fillstyle="none" if small else "full",
            )
            drawn = True
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="S·R·W (sources × ranks × workers per rank)",
        ylabel="peak data-plane PSS (GiB)",
        title="Data-plane memory",
    )
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8)
    return drawn


def _steps(ax: Any, entries: Sequence[Entry]) -> bool:
    drawn = False
    for system, style, label in SYSTEMS:
        pts = sorted(
            (e["point"]["S"], r["steps_per_s"])
            for e in entries
            if (r := _result(e, system)) and _is_s_sweep(e)
        )
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=label, color=COLORS[system])
            drawn = True
    ax.set(
        xscale="log",
        xlabel="sources S (R=8, W=2, 2 rows of 16384)",
        ylabel="steps/s",
        title="Training steps per second",
    )
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend()
    return drawn


def _is_s_sweep(entry: Entry) -> bool:
    p = entry["point"]
    central = p["R"] == 8 and p["W"] == 2 and p["seq_len"] == 16384 and p["rows"] == 2
    default = entry.get("sharing_strategy", "file_descriptor") == "file_descriptor"
    return bool(central and default and p["rg_bytes"] >= 2**20)


def _wait(ax: Any, entries: Sequence[Entry]) -> bool:
    """Box plots of every warm rank-step's data-wait: baseline and msd side by side per point."""
    data, positions, colors, ticks = [], [], [], []
    for i, entry in enumerate(entries):
        for j, (system, color) in enumerate(COLORS.items()):
            result = _result(entry, system)
            if result is not None and result.get("wait_ms_warm"):
                data.append(np.maximum(result["wait_ms_warm"], 1e-2))
                positions.append(3 * i + j)
                colors.append(color)
        ticks.append((3 * i + 0.5, _short(entry)))
    if not data:
        return False
    boxes = ax.boxplot(
        data, positions=positions, widths=0.8, whis=(1, 99), showfliers=False, patch_artist=True
    )
    for box, color in zip(boxes["boxes"], colors, strict=True):
        box.set_facecolor(color)
    ax.set_xticks([t for t, _ in ticks], [label for _, label in ticks], rotation=60, fontsize=7)
    ax.set(
        yscale="log",
        ylabel="data-wait per step (ms), whiskers p1-p99",
        title="Data-wait: baseline (blue) vs msd (orange)",
    )
    ax.grid(True, axis="y", which="both", alpha=0.3)
    return True


def _short(entry: Entry) -> str:
    p = entry["point"]
    rg = "" if p["rg_bytes"] >= 2**20 else f" rg{p['rg_bytes'] // 1024}K"
    return f"S{p['S']} R{p['R']} W{p['W']} L{p['seq_len']}x{p['rows']}{rg}"
