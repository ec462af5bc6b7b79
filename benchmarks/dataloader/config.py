"""A benchmark point, the settings shared by every run, and the sweep's points.

The sweep is not the full product of S ∈ {16, 64, 256, 1024}, R ∈ {4, 8, 16}, W ∈ {1, 2, 4},
seq_len ∈ {4096, 16384}: it varies one thing at a time around the central point S=256, R=8,
W=2, seq_len=16384 (R and W are varied at S=64, where every baseline point fits in memory),
plus seq_len 4096 and small (64 KB) row groups at the central point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.dataloader.cost import CostModel
from benchmarks.dataloader.data import DEFAULT_RG_BYTES, ROOT, SMALL_RG_BYTES

ROWS = 2  # rows per rank per step (one micro-batch), as in benchmarks/balance.py


@dataclass(frozen=True)
class Point:
    """S sources, R ranks, W workers per rank (baseline only), seq_len, row-group size, and the
    rows of ``seq_len`` tokens each rank gets per step (one micro-batch)."""

    sources: int
    ranks: int
    workers: int
    seq_len: int
    rg_bytes: int = DEFAULT_RG_BYTES
    rows: int = ROWS

    @property
    def global_batch_tokens(self) -> int:
        return self.ranks * self.rows * self.seq_len

    @property
    def key(self) -> str:
        return (
            f"S{self.sources}-R{self.ranks}-W{self.workers}-L{self.seq_len}x{self.rows}"
            f"-rg{self.rg_bytes}"
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "S": self.sources,
            "R": self.ranks,
            "W": self.workers,
            "seq_len": self.seq_len,
            "rg_bytes": self.rg_bytes,
            "rows": self.rows,
        }


@dataclass(frozen=True)
class Settings:
    """What every run of an invocation shares."""

    steps: int = 100
    warmup: int = 10
    target_step_s: float = 0.1
    cost: CostModel = field(default_factory=CostModel)
    sources_per_process: int | None = 64
    max_memory_gib: float = 18.0
    timeout_s: float = 900.0
    sample_interval_s: float = 0.5
    sharing_strategy: str = "file_descriptor"  # how baseline workers hand tensors to ranks
    seed: int = 0
    run_root: Path = ROOT / "benchmarks" / "runs" / "dataloader"


CENTRAL = Point(256, 8, 2, 16384)


def sweep_points() -> list[Point]:
    """The sweep, central point first."""
    points = [CENTRAL]
    points += [Point(s, 8, 2, 16384) for s in (16, 64, 1024)]
    points += [Point(64, r, 2, 16384) for r in (4, 16)]
    points += [Point(64, 8, w, 16384) for w in (1, 4)]
    points += [Point(256, 4, 2, 16384)]  # off both lines: makes every memory term identifiable
    points += [Point(256, 8, 2, 4096), Point(256, 8, 2, 16384, rg_bytes=SMALL_RG_BYTES)]
    points += [Point(256, 8, 2, 16384, rows=4)]  # a larger batch: capacity binds balance less
    return points


def quick_points() -> list[Point]:
    """A smoke check: small, short, under ~3 minutes with data generation."""
    return [Point(16, 4, 1, 4096), Point(16, 4, 2, 16384, rg_bytes=SMALL_RG_BYTES)]
