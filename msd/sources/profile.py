"""A brief measurement of what one source costs a loader: read and tokenize its first samples.

``msd plan`` and ``loaders: auto`` use it to share the loader processes out by cost: a source
whose tokenizer is 20× slower needs 20× the loader time for the same tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa

from msd.recipe.schema import Recipe, Source
from msd.sources.chat_rows import tokenize_of
from msd.sources.formats.base import as_launched
from msd.sources.fuse import Fuser, FuseSpec, fuse_spec
from msd.sources.image_rows import ImageRowReader
from msd.sources.index import RowGroup, open_source
from msd.sources.read import RowGroupReader
from msd.sources.transforms import Ids
from msd.sources.vision import ImageGeometry


@dataclass(frozen=True)
class SourceProfile:
    samples: int
    tokens: int
    text_bytes: int
    read_s: float
    transform_s: float
    lengths: tuple[int, ...] = ()  # each profiled sample's tokens

    @property
    def tokens_per_sample(self) -> float:
        return self.tokens / max(1, self.samples)

    @property
    def seconds_per_token(self) -> float:
        return (self.read_s + self.transform_s) / max(1, self.tokens)


PROFILE_CHUNK = 64  # rows tokenized between looks at the clock


def profile_recipe_source(
    recipe: Recipe, i: int, max_samples: int = 512, max_s: float = 1.0
) -> SourceProfile:
    """`profile_source` of the recipe's source ``i`` as its loaders read it: as launched on the
    recipe's cluster, its samples made as the recipe makes them."""
    source = recipe.sources[i]
    fusing = fuse_spec(recipe, source.has_videos, source.clip)
    launched = as_launched(source, recipe.cluster)
    return profile_source(launched, f"sources[{i}]", max_samples, max_s, fusing)


def profile_source(
    spec: Source,
    where: str,
    max_samples: int = 512,
    max_s: float = 1.0,
    fusing: FuseSpec | None = None,
) -> SourceProfile:
    """Read row groups from the start until ``max_samples`` rows (or ``max_s`` seconds of
    tokenizing) and tokenize them as a loader would; an image source's images are decoded too
    (``fusing``: how its samples are made; decoding is most of what it costs)."""
    index = open_source(spec, where)
    tokenize = tokenize_of(spec, index.column_kind)
    reader = RowGroupReader()
    if index.has_images:
        images = ImageRowReader(spec, index, reader)
        fusing = fusing or FuseSpec(ImageGeometry(), 0, "<image>", 1 << 30)
        fuser = Fuser.of_source(spec, index.column_kind, fusing, False)

        def read(rg: RowGroup) -> pa.Array:
            return images.read(rg)

        def tokenize(column: pa.Array) -> list[Ids]:
            return fuser(column)[0]

    else:

        def read(rg: RowGroup) -> pa.Array:
            return reader.read(rg, index.column)

    samples = tokens = text_bytes = 0
    read_s = transform_s = 0.0
    lengths: list[int] = []
    for rg in index.row_groups:
        started = time.perf_counter()
        column = read(rg)
        read_s += time.perf_counter() - started
        column = column.slice(0, max_samples - samples)
        if samples == 0:
            tokenize(column.slice(0, 8))  # first-call costs (imports, caches) are not per token
        # A chunk at a time, so that the time budget holds within a row group of images too.
        for start in range(0, len(column), PROFILE_CHUNK):
            chunk = column.slice(start, PROFILE_CHUNK)
            text_bytes += _nbytes(chunk)
            started = time.perf_counter()
            ids = tokenize(chunk)
            transform_s += time.perf_counter() - started
            samples += len(ids)
            new = [len(t) for t in ids]
            lengths += new
            tokens += sum(new)
            if transform_s >= max_s:
                break
        if samples >= max_samples or transform_s >= max_s:
            break
    return SourceProfile(samples, tokens, text_bytes, read_s, transform_s, tuple(lengths))


def _nbytes(column: pa.Array) -> int:
    return int(column.nbytes)
