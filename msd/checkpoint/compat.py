"""Whether a checkpoint may continue under a recipe: pure comparisons, one message per
difference.

The global batches from the checkpoint's step on are the same when everything that decides
which samples form a step is the same: the seed, the sources (and their rows), the mix, the
sequence length, the tokens per step and how samples are padded and cut. The topology (DP, CP,
TP, PP) decides only how a step is split over ranks, so it may change: the same global batches
are re-split. CP pads samples (to multiples of 2 × cp), which decides which fit a step: another
CP size keeps the checkpoint's padding where it can (``keeping_padding``). A change of tokens
per step is refused unless allowed: then the cursors carry over and nothing is lost or
repeated, but the steps differ from the run's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from msd.recipe.schema import Recipe, pad_multiple


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
    old_pad, new_pad = pad_multiple(saved.distribute), pad_multiple(recipe.distribute)
    if old_pad != new_pad:
        found.append(
            f"distribute.cp {recipe.distribute.cp} pads samples to multiples of {new_pad}, the "
            f"checkpoint's run to multiples of {old_pad}, so steps would hold other samples "
            f"(a run launched with distribute.pad_to a multiple of {2 * recipe.distribute.cp} "
            "restores under this CP size)"
        )
    return found


def keeping_padding(saved: Recipe, recipe: Recipe) -> Recipe:
    """``recipe``, padding as the checkpoint's run did when its own CP size allows it (2 × cp
    divides that multiple) and it does not set ``distribute.pad_to``: then the same global
    batches continue under another CP size."""
    old_pad = pad_multiple(saved.distribute)
    cp = recipe.distribute.cp
    if recipe.distribute.pad_to or old_pad == pad_multiple(recipe.distribute):
        return recipe
    if cp > 1 and old_pad % (2 * cp):
        return recipe
    return msgspec.structs.replace(
        recipe, distribute=msgspec.structs.replace(recipe.distribute, pad_to=old_pad)
    )
