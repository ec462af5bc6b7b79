"""Fail before you queue: open every source and build every transform before any process starts."""

from __future__ import annotations

import os
from dataclasses import dataclass

from msd.errors import RecipeError, SourceError
from msd.plan.cost import load_cost_function
from msd.recipe.load import line_of
from msd.recipe.schema import Recipe, Source
from msd.sources.chat_rows import tokenize_of
from msd.sources.first_rows import first_rows_problems
from msd.sources.first_video import first_video_problems
from msd.sources.formats.base import as_launched
from msd.sources.fuse import video_spec_of
from msd.sources.index import SourceIndex, open_source


@dataclass(frozen=True)
class SourceSummary:
    name: str
    files: int
    row_groups: int
    rows: int
    column: str
    weight: float
    loaders: int | str
    left_out: tuple[str, ...] = ()  # what the files hold that no sample comes from, per file
    videos: tuple[str, ...] = ()  # files whose first video is unusable, or that hold none
    conversations: tuple[str, ...] = ()  # files whose first rows hold a conversation left out

    def left_out_warning(self, shown: int = 3) -> str | None:
        """One sentence on what the source's files hold that is left out, or None."""
        if not self.left_out:
            return None
        first = "; ".join(self.left_out[:shown])
        more = f" (and {len(self.left_out) - shown} more)" if len(self.left_out) > shown else ""
        return f"source '{self.name}' leaves out what its files cannot give as samples: " + (
            first + more
        )

    def video_warnings(self, shown: int = 5) -> list[str]:
        """A sentence for each of the first ``shown`` files whose first video is unusable or
        that hold no video, and one for how many more."""
        return _shown(self.name, self.videos, shown)

    def conversation_warnings(self, shown: int = 5) -> list[str]:
        """A sentence for each of the first ``shown`` files whose first rows hold a
        conversation that is left out, and one for how many more."""
        return _shown(self.name, self.conversations, shown)


def _shown(name: str, problems: tuple[str, ...], shown: int) -> list[str]:
    more = len(problems) - shown
    rest = f"and {more} more files of source '{name}' like these" if more > 0 else None
    return list(problems[:shown]) + ([rest] if rest else [])


def check_sources(
    recipe: Recipe,
    recipe_path: str | os.PathLike[str] | None = None,
    probe_videos: bool = False,
) -> list[SourceSummary]:
    """Open every source's files (footers only) and its transform; raise SourceError on the first
    problem, prefixed with the recipe file and line of that source when ``recipe_path`` is given.
    ``probe_videos``: read the header of each video source file's first video too (one video a
    file; `msd.sources.first_video`), and render each conversation source file's first rows
    (`msd.sources.first_rows`)."""
    _check_cost_function(recipe, recipe_path)
    summaries = []
    for i, source in enumerate(recipe.sources):
        source = as_launched(source, recipe.cluster)
        videos: tuple[str, ...] = ()
        chats: tuple[str, ...] = ()
        try:
            index: SourceIndex = open_source(source, f"sources[{i}]")
            tokenize_of(source, index.column_kind)
            if probe_videos and source.has_videos:
                spec = video_spec_of(recipe.video, recipe.vision)
                videos = first_video_problems(source, index, f"sources[{i}]", spec)
            if probe_videos and source.chat is not None:
                markers = _markers(recipe, source)
                chats = first_rows_problems(source, index, f"sources[{i}]", markers)
        except SourceError as e:
            if recipe_path is None:
                raise
            raise SourceError(f"{line_of(recipe_path, f'sources[{i}]')}: {e}") from None
        summaries.append(
            SourceSummary(
                source.name,
                len(index.files),
                len(index.row_groups),
                index.num_rows,
                index.column,
                source.weight,
                "-" if source.loaders is None else source.loaders,
                index.problems,
                videos,
                chats,
            )
        )
    return summaries


def _markers(recipe: Recipe, source: Source) -> tuple[str, str]:
    """The image and video markers a conversation of ``source`` is cut at ("": none)."""
    if not source.has_images:
        return "", ""
    return recipe.vision.marker, recipe.video.marker if source.has_videos else ""


def _check_cost_function(recipe: Recipe, recipe_path: str | os.PathLike[str] | None) -> None:
    if recipe.cost.function is None:
        return
    try:
        load_cost_function(recipe.cost.function)
    except RecipeError as e:
        if recipe_path is None:
            raise
        raise RecipeError(f"{line_of(recipe_path, 'cost.function')}: {e}") from None
