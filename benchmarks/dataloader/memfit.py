"""Memory models: the estimate that decides whether a point is run, and a fit to what was measured.

Estimate (before a run): a baseline worker ends up holding one decoded row group of every
source, so the baseline needs about ``R·W·(S·rg·d + worker)``, where ``d`` is what pyarrow
allocates per byte of text it decodes (its string builders over-allocate: measured 1.6); an msd
loader holds a window of a source's current row group (``msd.roles.loader.visit.WINDOW_BYTES``) plus
its share of the read-ahead, so msd needs about ``S·(min(rg, window)·d + share) + processes·role``.
The estimates only decide which points to skip; the fits are what the note reports.

Fit (after the sweep): least squares of the measured peak data-plane PSS on the terms
``S·R·W, R·W, S, R`` and an intercept; the terms a system has no use for (msd has no W) are
left out for it so that the fit is not degenerate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from msd.roles.loader.visit import WINDOW_BYTES

DECODED_PER_TEXT_BYTE = 1.6  # pyarrow's allocation per byte of decoded text (measured)
WORKER_BASE_BYTES = 64 * 2**20  # a forked DataLoader worker's own pages (measured: ~40-60 MiB)
ROLE_BASE_BYTES = 60 * 2**20  # an msd role: Python, numpy, pyarrow, ZeroMQ
BASELINE_TERMS = ("S·R·W", "R·W", "S", "R")
MSD_TERMS = ("S·R", "S", "R")


def baseline_estimate_bytes(sources: int, ranks: int, workers: int, rg_bytes: float) -> float:
    return ranks * workers * (sources * rg_bytes * DECODED_PER_TEXT_BYTE + WORKER_BASE_BYTES)


def msd_estimate_bytes(
    sources: int, global_batch_tokens: int, rg_bytes: float, sources_per_process: int | None
) -> float:
    processes = 2 + math.ceil(sources / (sources_per_process or 1))
    share = 4 * max(16384, 8 * global_batch_tokens // sources)  # int32 tokens read ahead
    per_source = min(rg_bytes, WINDOW_BYTES) * DECODED_PER_TEXT_BYTE + share
    return sources * per_source + processes * ROLE_BASE_BYTES


def term_value(term: str, point: Mapping[str, float]) -> float:
    """``S·R·W`` -> S × R × W for ``point`` = {"S": .., "R": .., "W": ..}."""
    return float(np.prod([point[factor] for factor in term.split("·")]))


def fit(
    points: Sequence[Mapping[str, float]], memory: Sequence[float], terms: Sequence[str]
) -> dict[str, float]:
    """Coefficient of each term and ``intercept`` (least squares), ``r2``, ``points``.

    When the points cannot tell every term apart, the minimum-norm solution is returned and
    ``identifiable`` is 0.
    """
    design = np.array([[term_value(t, p) for t in terms] + [1.0] for p in points])
    target = np.asarray(memory, dtype=np.float64)
    coefficients, _, rank, _ = np.linalg.lstsq(design, target, rcond=None)
    predicted = design @ coefficients
    spread = float(np.square(target - target.mean()).sum())
    r2 = 1.0 - float(np.square(target - predicted).sum()) / spread if spread > 0 else 1.0
    result = {t: float(c) for t, c in zip([*terms, "intercept"], coefficients, strict=True)}
    return result | {
        "r2": r2,
        "points": float(len(points)),
        "identifiable": float(rank == len(terms) + 1),
    }
