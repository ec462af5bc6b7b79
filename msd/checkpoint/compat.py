"""Whether a checkpoint may continue under a recipe: pure comparisons, one message per
difference.

The global batches from the checkpoint's step on are the same when everything that decides
which samples form a step is the same: the seed, the sources (and their rows), the mix, the
sequence length, the tokens per step and how samples are padded and cut. The topology (DP, TP,
PP) decides only how a step is split over ranks, so it may change: the same global batches are
re-split. A change of tokens per step is refused unless allowed: then the cursors carry over
and nothing is lost or repeated, but the steps differ from the run's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from msd.recipe.schema import Recipe


def _pad_multiple(recipe: Recipe) -> int:
    cp = recipe.distribute.cp
    return 2 * cp if cp > 1 else 1


def _source_view(recipe: Recipe, i: int) -> dict[str, Any]:
    s = recipe.sources[i]
    return {
        "weight": s.weight,
        "text_column": s.text_column,
        "token_column": s.token_column,
        "transform": msgspec.to_builtins(s.transform),
        "repeat": s.repeat,
    }


def differences(
    saved: Recipe,
    saved_rows: tuple[int, ...],
    recipe: Recipe,
    rows: tuple[int, ...],
    allow_batch_change: bool = False,
) -> list[str]:
    """What keeps ``recipe`` (its sources having ``rows`` rows) from continuing a checkpoint
    taken under ``saved`` (``saved_rows``); empty when it may."""
    found: list[str] = []
    old_names = [s.name for s in saved.sources]
    new_names = [s.name for s in recipe.sources]
    if old_names != new_names:
        found.append(f"sources: {old_names} in the checkpoint, {new_names} in the recipe")
        return found
    for i, name in enumerate(new_names):
        if saved_rows[i] != rows[i]:
            found.append(
                f"source {name!r} has {rows[i]:,} rows; it had {saved_rows[i]:,} at the checkpoint"
            )
        old, new = _source_view(saved, i), _source_view(recipe, i)
        for key in old:
            if old[key] != new[key]:
                found.append(f"sources[{i}] ({name}).{key}: {old[key]!r} → {new[key]!r}")
    scalars = {
        "seed": (saved.seed, recipe.seed),
        "seq_len": (saved.seq_len, recipe.seq_len),
        "loader.block_row_groups": (
            saved.loader.block_row_groups,
            recipe.loader.block_row_groups,
        ),
        "balance.long_samples": (saved.balance.long_samples, recipe.balance.long_samples),
        "mix": (msgspec.to_builtins(saved.mix), msgspec.to_builtins(recipe.mix)),
    }
    for key, (old_value, new_value) in scalars.items():
        if old_value != new_value:
            found.append(f"{key}: {old_value!r} → {new_value!r}")
    if saved.global_batch_tokens != recipe.global_batch_tokens and not allow_batch_change:
        found.append(
            f"global_batch_tokens: {saved.global_batch_tokens} → {recipe.global_batch_tokens} "
            "(pass --allow-batch-change to continue the sources' cursors with other steps)"
        )
    if _pad_multiple(saved) != _pad_multiple(recipe):
        found.append(
            f"distribute.cp: {saved.distribute.cp} → {recipe.distribute.cp} pads samples to "
            f"multiples of {_pad_multiple(recipe)}, not {_pad_multiple(saved)}, so steps would "
            "hold other samples"
        )
    return found
