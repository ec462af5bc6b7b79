"""The recipe: a typed, frozen tree, validated once at load (see `msd.recipe.load`).

Every field here is part of the user-facing RECIPE contract; the stream-relevant subset is
hashed into the job fingerprint (`stream_fingerprint`), so a checkpoint can tell whether it
belongs to a recipe.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

import msgspec


class Transform(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How a row becomes tokens.

    kind: ``bytes`` (UTF-8 bytes are the token ids), ``tokenizer`` (a HuggingFace
    ``tokenizer.json`` at ``path``) or ``function`` (``module:function`` mapping one cell to a
    sequence of ints).
    """

    kind: Literal["bytes", "tokenizer", "function"] = "bytes"
    path: str | None = None
    function: str | None = None


class Source(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One data source: Parquet files matched by ``path`` (a glob)."""

    name: str
    path: str
    weight: float
    text_column: str | None = None
    token_column: str | None = None
    transform: Transform = Transform()
    repeat: bool = True
    loaders: int = 1


class Distribute(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The trainer topology. Only data parallelism so far."""

    dp: int = 1


class LoaderOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Knobs shared by every Source Loader.

    block_row_groups: row groups per shuffle block (a loader reads whole blocks).
    buffer_tokens: read-ahead per loader; default two global batches.
    """

    block_row_groups: int = 1
    buffer_tokens: int | None = None


class ConstructorOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """prefetch_steps: steps the Planner plans, and Constructors build, ahead of trainers."""

    prefetch_steps: int = 4


class DemoTrainer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The built-in trainer: "computes" ``step_ms`` scaled by its batch's attention cost."""

    step_ms: float = 10.0


class Trainer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``command: demo`` runs the built-in trainer; anything else is a command run per rank."""

    command: str = "demo"
    ranks: int | None = None
    demo: DemoTrainer = DemoTrainer()


class Recipe(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A whole job. ``steps`` may be omitted only when every source has ``repeat: false``."""

    sources: tuple[Source, ...]
    seq_len: int
    global_batch_tokens: int
    name: str = "msd-job"
    seed: int = 0
    steps: int | None = None
    distribute: Distribute = Distribute()
    loader: LoaderOptions = LoaderOptions()
    constructor: ConstructorOptions = ConstructorOptions()
    trainer: Trainer = Trainer()
    cluster: Literal["local", "slurm"] = "local"

    @property
    def world_size(self) -> int:
        return self.distribute.dp

    @property
    def rows_per_rank(self) -> int:
        """Packed rows of ``seq_len`` tokens each DP rank receives per step."""
        return self.global_batch_tokens // (self.distribute.dp * self.seq_len)

    @property
    def loader_buffer_tokens(self) -> int:
        return self.loader.buffer_tokens or 2 * self.global_batch_tokens


def stream_fingerprint(recipe: Recipe) -> str:
    """Hash of everything that decides the sample stream (not loader counts, not placement)."""
    stream = {
        "seed": recipe.seed,
        "seq_len": recipe.seq_len,
        "global_batch_tokens": recipe.global_batch_tokens,
        "block_row_groups": recipe.loader.block_row_groups,
        "sources": [
            {
                "name": s.name,
                "path": s.path,
                "weight": s.weight,
                "text_column": s.text_column,
                "token_column": s.token_column,
                "transform": msgspec.to_builtins(s.transform),
                "repeat": s.repeat,
            }
            for s in recipe.sources
        ],
    }
    blob = json.dumps(stream, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def to_json(recipe: Recipe) -> bytes:
    return msgspec.json.encode(recipe)


def from_json(blob: bytes) -> Recipe:
    return msgspec.json.decode(blob, type=Recipe)
