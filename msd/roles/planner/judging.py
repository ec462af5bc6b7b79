"""Pure judgments about a planned step: each DP rank's cost, why an all-empty step stops the
job, and which sources' truncation has to be told once."""

from __future__ import annotations

import logging

import numpy as np

from msd.plan.step import StepPlan, StreamSpec
from msd.recipe.schema import Recipe

log = logging.getLogger(__name__)


def rank_costs(spec: StreamSpec, plan: StepPlan) -> np.ndarray:
    """Each DP rank's cost in this step (what balance is judged by)."""
    pieces = plan.pieces
    running = np.concatenate(([0.0], np.cumsum(spec.cost(pieces.columns[2]))))
    row_costs = running[pieces.bounds[1:]] - running[pieces.bounds[:-1]]
    return np.asarray(row_costs.reshape(-1, plan.rows_per_rank).sum(axis=1))


def no_tokens(recipe: Recipe, plan: StepPlan) -> str:
    """Why a step that holds nothing but empty samples stops the job (it would be padding)."""
    drawn = sorted({recipe.sources[s].name for s in plan.pieces.columns[0].tolist()})
    return (
        f"step {plan.step} holds no tokens: all {plan.counts.empty} samples drawn for it from "
        f"{', '.join(drawn)} are empty (null or empty text, or 0 tokens after the transform); "
        "check those sources' text_column and transform"
    )


def warn_truncated(
    recipe: Recipe,
    spec: StreamSpec,
    truncated_tokens: tuple[tuple[int, int], ...],
    warned: set[int],
) -> None:
    """Once per source (``warned`` holds those told): its samples lose tokens to
    ``long_samples`` (the run summary counts every one)."""
    for source, tokens in truncated_tokens:
        if source not in warned:
            warned.add(source)
            log.warning(
                "source %s: a sample lost %d tokens to long_samples: %s (seq_len %d, "
                "%d rows a step); the run summary counts every one (truncated_tokens)",
                recipe.sources[source].name,
                tokens,
                recipe.balance.long_samples,
                recipe.seq_len,
                spec.global_rows,
            )
