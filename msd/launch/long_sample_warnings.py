"""Warn before a run when ``balance.long_samples`` will cut tokens off a source's samples:
``msd validate``, ``msd plan`` and ``msd launch`` profile each source's first samples
(``msd.sources.profile``) and name each source whose samples do not fit whole."""

from __future__ import annotations

import time
from collections.abc import Sequence

from msd.errors import MsdError
from msd.plan.long_samples import loss, warning
from msd.recipe.schema import Recipe
from msd.sources.profile import SourceProfile, profile_recipe_source

PROFILE_BUDGET_S = 3.0  # at most this long profiling for the warnings (launch waits for it)


def step_rows(recipe: Recipe) -> int:
    """Rows of one global step: the most pieces ``split`` makes of a sample."""
    return recipe.distribute.dp * recipe.rows_per_rank


def long_sample_warnings(
    recipe: Recipe,
    profiles: Sequence[SourceProfile | None] | None = None,
    budget_s: float = PROFILE_BUDGET_S,
) -> list[str]:
    """One warning per source whose profiled samples lose tokens to ``long_samples``. Sources
    without a profile given are profiled, in order, while ``budget_s`` lasts (the rest are
    not checked here; the Planner still warns in its log when it first cuts one)."""
    policy, seq_len, rows = recipe.balance.long_samples, recipe.seq_len, step_rows(recipe)
    if policy == "drop":
        return []
    deadline = time.monotonic() + budget_s
    found = []
    for i, source in enumerate(recipe.sources):
        profile = profiles[i] if profiles is not None else None
        if profile is None and time.monotonic() < deadline:
            left = deadline - time.monotonic()
            try:
                profile = profile_recipe_source(recipe, i, max_s=min(1.0, left))
            except MsdError:  # a transform that fails: the loader reports it, with its name
                continue
        if profile is None:
            continue
        cut = loss(source.name, profile.lengths, seq_len, policy, rows)
        if cut is not None:
            found.append(warning(cut, seq_len, policy, rows))
    return found
