"""Warnings about a valid recipe that likely does not do what its author meant (pure: the CLI
prints them)."""

from __future__ import annotations

from msd.recipe.schema import Recipe


def missing_eos(recipe: Recipe) -> list[str]:
    """One warning per tokenizer source without ``eos``: its documents are packed back to back
    with nothing between them, so a model trained on them never learns where one ends."""
    return [
        f"sources[{i}] ({source.name}): its tokenizer transform has no eos, so its documents "
        "are packed with nothing between them; set transform.eos to the tokenizer's "
        'end-of-document token (e.g. eos: "<|endoftext|>")'
        for i, source in enumerate(recipe.sources)
        if source.transform.kind == "tokenizer" and source.transform.eos is None
    ]
