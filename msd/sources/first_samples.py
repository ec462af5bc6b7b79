"""Each source's transform tried on its first samples, read and tokenized as ``msd plan`` does
(`msd.sources.profile`): what ``msd validate`` checks, so that a transform function that raises
on the data fails there, naming the source, and not later in a loader."""

from __future__ import annotations

import os

from msd.errors import SourceError
from msd.recipe.load import line_of
from msd.recipe.schema import Recipe, Source
from msd.sources.profile import profile_recipe_source
from msd.sources.transforms import FunctionFailed

FIRST_SAMPLES = 8  # samples of each source tokenized


def check_first_samples(recipe: Recipe, recipe_path: str | os.PathLike[str]) -> None:
    """Tokenize each source's first `FIRST_SAMPLES` samples as a loader would; raise
    `SourceError`, prefixed with the recipe file and line, on the first source that fails."""
    for i, source in enumerate(recipe.sources):
        try:
            profile_recipe_source(recipe, i, max_samples=FIRST_SAMPLES)
        except FunctionFailed as e:
            where = line_of(recipe_path, f"sources[{i}].transform.function")
            raise SourceError(f"{where}: {function_failed(source, e.__cause__)}") from None
        except SourceError as e:
            where = line_of(recipe_path, f"sources[{i}]")
            raise SourceError(f"{where}: source '{source.name}': {e}") from None


def function_failed(source: Source, raised: BaseException | None) -> str:
    """One sentence: the function of ``source``'s transform raised ``raised`` on its first
    samples."""
    return (
        f"source '{source.name}': transform '{source.transform.function}' raised "
        f"{type(raised).__name__} on one of its first {FIRST_SAMPLES} samples: {raised}; "
        "fix the function or the data"
    )
