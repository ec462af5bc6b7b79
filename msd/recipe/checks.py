"""Semantic checks over a structurally valid `Recipe`: pure, no I/O, so each rule is unit-testable.

Each check returns `Problem`s; `msd.recipe.load` turns their key paths into file lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgspec

from msd.recipe.plan_checks import check_plan
from msd.recipe.schema import Cache, Recipe, Source, Trainer, Transform, Video, Vision

# Source names end up in file names, metric labels and checkpoint keys, so keep them plain.
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_FUNCTION = re.compile(rf"{_DOTTED}:{_DOTTED}")
# Every int travels in msgpack and numpy as 64 bits; steps leave room for step + prefetch.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
STEPS_MAX = 2**62
# A local cache holds at least a few of its 4 MiB blocks (msd.sources.cache.BLOCK_BYTES).
CACHE_MIN_BYTES = 16 * 2**20


class Problem(NamedTuple):
    """One failed rule: the key path it is about and one sentence saying what to do."""

    key: str
    message: str


def check_recipe(recipe: Recipe) -> list[Problem]:
    """Every semantic problem of ``recipe``, in recipe order; empty when it is consistent."""
    too_big = _check_int_range(recipe)
    if too_big:  # the other rules compute with these numbers (numpy, products): stop here
        return too_big
    problems = _check_sources(recipe.sources)
    for i, source in enumerate(recipe.sources):
        problems += _check_source(f"sources[{i}]", source)
    problems += _check_batch(recipe) + _check_steps(recipe) + _check_rest(recipe)
    if recipe.has_images:
        problems += check_vision(recipe.vision, recipe.seq_len)
    if recipe.has_videos:
        problems += check_video(recipe.video, recipe.vision, recipe.seq_len)
    if recipe.balance.max_patches is not None:
        fix = "allow at least one patch per micro-batch, or remove it for no limit"
        problems += _at_least("balance.max_patches", recipe.balance.max_patches, 1, fix)
    return problems + [Problem(*p) for p in check_plan(recipe)]


def _check_int_range(recipe: Recipe) -> list[Problem]:
    fixes = {"seed": "use a seed from 0 to 2**63 - 1"}
    problems = [
        Problem(
            key,
            f"is {value}, beyond a 64-bit integer; "
            + fixes.get(key, "use a value from -2**63 to 2**63 - 1"),
        )
        for key, value in _ints(recipe, "")
        if not INT_MIN <= value <= INT_MAX
    ]
    if recipe.steps is not None and STEPS_MAX < recipe.steps <= INT_MAX:
        fix = f"run at most 2**62 = {STEPS_MAX} steps"
        problems.append(Problem("steps", f"is {recipe.steps}, too many; {fix}"))
    return problems


def _ints(value: Any, path: str) -> Iterator[tuple[str, int]]:
    """(key path, value) of every int in a recipe tree."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield path, value
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            yield from _ints(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from _ints(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _ints(item, f"{path}.{key}")


def _at_least(key: str, value: float, low: float, fix: str) -> list[Problem]:
    if value >= low:
        return []
    return [Problem(key, f"must be >= {low}, got {value}; {fix}")]


def _check_sources(sources: tuple[Source, ...]) -> list[Problem]:
    if not sources:
        return [Problem("sources", "must list at least one source; add a source")]
    problems = _check_names(sources)
    weights = [s.weight for s in sources]
    if all(w == 0 for w in weights):
        problems.append(Problem("sources", "all weights are 0; give one source a weight > 0"))
    return problems


def _check_names(sources: tuple[Source, ...]) -> list[Problem]:
    problems: list[Problem] = []
    first: dict[str, int] = {}
    for i, source in enumerate(sources):
        key = f"sources[{i}].name"
        if not _NAME.fullmatch(source.name):
            fix = "use only letters, digits, '_', '.' and '-'"
            problems.append(Problem(key, f"must match [A-Za-z0-9_.-]+, got {source.name!r}; {fix}"))
        elif source.name in first:
            dup = f"repeats the name {source.name!r} of sources[{first[source.name]}]"
            problems.append(Problem(key, f"{dup}; give every source a unique name"))
        first.setdefault(source.name, i)
    return problems


def _check_source(key: str, source: Source) -> list[Problem]:
    problems = _finite_at_least_0(f"{key}.weight", source.weight, "set a non-negative weight")
    if not source.path:
        problems.append(Problem(f"{key}.path", "is empty; set a glob of Parquet files"))
    problems += _check_columns(key, source) + _check_images(key, source)
    problems += _check_transform(f"{key}.transform", source.transform)
    problems += _check_group_rows(key, source)
    problems += check_cache(f"{key}.cache", source.cache)
    fix = "keep 0 or more hot-standby loaders"
    problems += _at_least(f"{key}.shadows", source.shadows, 0, fix)
    if source.loaders is None or source.loaders == "auto":
        return problems
    return problems + _at_least(
        f"{key}.loaders", source.loaders, 1, "use at least 1 loader or auto"
    )


def check_cache(key: str, cache: Cache | None) -> list[Problem]:
    """A local cache names a local folder and holds at least a few blocks."""
    if cache is None:
        return []
    problems = []
    if not cache.dir.strip():
        fix = "name a local folder, e.g. $TMPDIR/msd-cache (a SLURM node's own disk)"
        problems.append(Problem(f"{key}.dir", f"is empty; {fix}"))
    elif "://" in cache.dir:
        fix = "name a folder on the loaders' own disks"
        problems.append(Problem(f"{key}.dir", f"is {cache.dir!r}, a URL; {fix}"))
    if cache.max_bytes < CACHE_MIN_BYTES:
        fix = f"hold at least {CACHE_MIN_BYTES} bytes (16 MiB: four 4 MiB blocks)"
        problems.append(Problem(f"{key}.max_bytes", f"is {cache.max_bytes}, too small; {fix}"))
    return problems


def _check_group_rows(key: str, source: Source) -> list[Problem]:
    if source.group_rows is None:
        return []
    if source.data_format not in ("jsonl", "megatron"):
        return [
            Problem(
                f"{key}.group_rows",
                f"is for JSONL and Megatron sources; {source.data_format} files have their own "
                "row groups: remove it",
            )
        ]
    return _at_least(f"{key}.group_rows", source.group_rows, 1, "use at least 1 row per group")


def _finite_at_least_0(key: str, value: float, fix: str) -> list[Problem]:
    if not math.isfinite(value):
        return [Problem(key, f"must be a finite number, got {value}; {fix}")]
    return _at_least(key, value, 0, fix)


def _check_images(key: str, source: Source) -> list[Problem]:
    """An image source: WebDataset shards (images by extension) or Parquet with an image column,
    and text (not token ids) beside the images."""
    problems = []
    if source.data_format == "webdataset" and source.image_column is not None:
        fix = "WebDataset images are the members named by image_exts; remove image_column"
        problems.append(Problem(f"{key}.image_column", f"is for Parquet sources; {fix}"))
    elif source.data_format != "parquet" and source.image_column is not None:
        fix = "images come from Parquet image columns or WebDataset shards; remove image_column"
        problems.append(
            Problem(f"{key}.image_column", f"is not read from {source.data_format} files; {fix}")
        )
    if source.has_images and source.token_column is not None:
        fix = "an image source needs text_column (its text is tokenized around the images)"
        problems.append(Problem(f"{key}.token_column", f"cannot be used with images; {fix}"))
    if source.image_column == "":
        problems.append(Problem(f"{key}.image_column", "is empty; name a column of images"))
    if source.data_format == "webdataset" and not [e for e in source.image_exts if e.strip(".")]:
        fix = "list the image members' extensions, e.g. [jpg, png]"
        problems.append(Problem(f"{key}.image_exts", f"is empty; {fix}"))
    return problems + _check_videos(key, source)


def _check_videos(key: str, source: Source) -> list[Problem]:
    """Videos come from a Parquet column or WebDataset members, never both, and a member is an
    image or a video, not both."""
    problems = []
    fmt = source.data_format
    if source.video_column is not None and fmt != "parquet":
        fix = (
            "WebDataset videos are the members named by video_exts"
            if fmt == "webdataset"
            else ("videos come from Parquet video columns or WebDataset shards")
        )
        problems.append(Problem(f"{key}.video_column", f"is not read from {fmt} files; {fix}"))
    if source.video_column == "":
        problems.append(Problem(f"{key}.video_column", "is empty; name a column of videos"))
    if source.video_column is not None and source.video_column == source.image_column:
        fix = "name a column of images and another of videos"
        problems.append(Problem(f"{key}.video_column", f"is also the image column; {fix}"))
    if source.video_exts and fmt != "webdataset":
        fix = "use video_column for a Parquet source" if fmt == "parquet" else "remove it"
        problems.append(Problem(f"{key}.video_exts", f"is for WebDataset sources; {fix}"))
    video_exts = [e.strip(".").lower() for e in source.video_exts]
    if "" in video_exts:
        problems.append(Problem(f"{key}.video_exts", "lists an empty extension; remove it"))
    both = sorted(set(video_exts) & {e.strip(".").lower() for e in source.image_exts})
    if both and fmt == "webdataset":
        fix = "a member is read as an image or a video, not both: remove it from one list"
        problems.append(
            Problem(f"{key}.video_exts", f"shares {', '.join(both)} with image_exts; {fix}")
        )
    return problems + _check_clip(key, source) + _check_chat(key, source)


def _check_chat(key: str, source: Source) -> list[Problem]:
    """Conversations are a text column's, rendered and tokenized by a tokenizer."""
    chat = source.chat
    if chat is None:
        return []
    problems = []
    if source.text_column is None:
        fix = "name the column (or WebDataset member, or JSON key) that holds each conversation"
        problems.append(Problem(f"{key}.text_column", f"is needed with chat; {fix}"))
    if source.transform.kind != "tokenizer":
        fix = "set transform: {kind: tokenizer, path: tokenizer.json} (the chat template's model's)"
        problems.append(Problem(f"{key}.transform.kind", f"must be tokenizer with chat; {fix}"))
    if source.data_format == "megatron":
        fix = "conversations come from Parquet, JSONL, Arrow or WebDataset .json members"
        problems.append(Problem(f"{key}.chat", f"cannot read Megatron data; {fix}"))
    if not chat.template.strip():
        fix = "name a tokenizer_config.json or a .jinja file, or give the template itself"
        problems.append(Problem(f"{key}.chat.template", f"is empty; {fix}"))
    return problems


def _check_clip(key: str, source: Source) -> list[Problem]:
    """Clips are cut from the videos of a video source, of a positive length and stride."""
    clip = source.clip
    if clip is None:
        return []
    if not source.has_videos:
        fix = "set video_column or video_exts, or remove clip"
        return [Problem(f"{key}.clip", f"cuts videos, and this source has none; {fix}")]
    problems = []
    for name, value in (("length_s", clip.length_s), ("stride_s", clip.stride)):
        if not (math.isfinite(value) and value > 0):
            fix = "use a positive number of seconds"
            problems.append(Problem(f"{key}.clip.{name}", f"must be positive, got {value}; {fix}"))
    return problems


def check_video(video: Video, vision: Vision, seq_len: int) -> list[Problem]:
    """Videos sample a sensible number of frames into patches the encoder takes, and the
    smallest video fits a row."""
    problems = []
    for name in ("min_frames", "max_frames", "temporal_patch_size"):
        problems += _at_least(f"video.{name}", getattr(video, name), 1, "use at least 1")
    for name in ("fps", "max_duration_s"):
        value = getattr(video, name)
        if not (math.isfinite(value) and value > 0):
            problems.append(Problem(f"video.{name}", f"must be a positive number, got {value}"))
    problems += _at_least("video.threads", video.threads, 0, "use 0 (FFmpeg's choice) or more")
    problems += _at_least("video.max_decode_pixels", video.max_decode_pixels, 1, "use at least 1")
    if problems:
        return problems
    if video.min_frames > video.max_frames:
        fix = "set min_frames <= max_frames"
        problems.append(
            Problem("video.min_frames", f"is over max_frames ({video.max_frames}); {fix}")
        )
    if video.temporal_patch_size % vision.temporal_patch_size:
        fix = f"use a multiple of vision.temporal_patch_size ({vision.temporal_patch_size})"
        problems.append(
            Problem("video.temporal_patch_size", f"is {video.temporal_patch_size}; {fix}")
        )
    factor = vision.patch_size * vision.merge_size
    if not factor**2 <= video.min_pixels <= video.max_pixels:
        fix = f"set {factor}² = {factor**2} <= min_pixels <= max_pixels"
        got = f"got {video.min_pixels} and {video.max_pixels}"
        problems.append(Problem("video.min_pixels", f"is out of order ({got}); {fix}"))
    if video.total_pixels is not None and video.total_pixels < video.min_pixels:
        fix = "allow at least min_pixels, or remove it for no cap"
        problems.append(Problem("video.total_pixels", f"is under min_pixels; {fix}"))
    frames = -(-min(video.min_frames, video.max_frames) // video.temporal_patch_size)
    smallest = frames * max(1, video.min_pixels // factor**2)
    if smallest > seq_len:
        fix = "lower video.min_pixels or video.min_frames, or raise seq_len"
        problems.append(
            Problem("video.min_pixels", f"makes every video {smallest} tokens, over seq_len; {fix}")
        )
    if not 0 <= video.video_token_id < 2**31:
        fix = "use a token id of the vocabulary (below 2**31)"
        problems.append(Problem("video.video_token_id", f"is {video.video_token_id}; {fix}"))
    elif video.video_token_id == vision.image_token_id:
        fix = "images and videos need placeholder tokens of their own"
        problems.append(Problem("video.video_token_id", f"is vision.image_token_id too; {fix}"))
    if not video.marker or video.marker == vision.marker:
        fix = "use a marker of its own, e.g. <video>"
        problems.append(Problem("video.marker", f"is {video.marker!r}; {fix}"))
    return problems


def check_vision(vision: Vision, seq_len: int) -> list[Problem]:
    """The image geometry is one an encoder can use, and an image can fit a row."""
    problems = []
    for name in ("patch_size", "merge_size", "temporal_patch_size"):
        problems += _at_least(f"vision.{name}", getattr(vision, name), 1, "use at least 1")
    if problems:
        return problems
    factor = vision.patch_size * vision.merge_size
    if not factor**2 <= vision.min_pixels <= vision.max_pixels:
        fix = f"set {factor}² = {factor**2} <= min_pixels <= max_pixels"
        got = f"got {vision.min_pixels} and {vision.max_pixels}"
        problems.append(Problem("vision.min_pixels", f"is out of order ({got}); {fix}"))
    smallest = vision.min_pixels // factor**2 or 1
    if smallest > seq_len:
        fix = "lower vision.min_pixels or raise seq_len"
        problems.append(
            Problem(
                "vision.min_pixels", f"makes every image {smallest} tokens, over seq_len; {fix}"
            )
        )
    if not 0 <= vision.image_token_id < 2**31:
        fix = "use a token id of the vocabulary (below 2**31)"
        problems.append(Problem("vision.image_token_id", f"is {vision.image_token_id}; {fix}"))
    for name in ("mean", "std"):
        values = getattr(vision, name)
        low = 0.0 if name == "mean" else 1e-12
        if not all(math.isfinite(v) and v >= low for v in values):
            kind = "finite and >= 0" if name == "mean" else "finite and > 0"
            problems.append(Problem(f"vision.{name}", f"must be {kind} per channel, got {values}"))
    return problems


def _check_columns(key: str, source: Source) -> list[Problem]:
    text, token = source.text_column, source.token_column
    if source.data_format == "megatron":
        fix = "Megatron .bin/.idx data is already token ids, one sample per document; remove it"
        return [
            Problem(f"{key}.{name}", f"is not used by format megatron; {fix}")
            for name, value in (("text_column", text), ("token_column", token))
            if value is not None
        ]
    if source.data_format == "webdataset" and token is None:
        return (
            []
            if text != ""
            else [Problem(f"{key}.text_column", "is empty; name the text extension")]
        )
    if text is None and token is None:
        fix = "set text_column (raw text) or token_column (token ids)"
        return [Problem(f"{key}.text_column", f"is missing and so is token_column; {fix}")]
    if text is not None and token is not None:
        return [Problem(f"{key}.token_column", "is set together with text_column; keep only one")]
    if not (text or token):
        column = "text_column" if text is not None else "token_column"
        what = {
            "jsonl": "a key of the JSON lines (dots for nesting)",
            "arrow": "a column of the Arrow files",
        }
        named = what.get(source.data_format, "a column of the Parquet files")
        return [Problem(f"{key}.{column}", f"is empty; name {named}")]
    return []


def _check_transform(key: str, transform: Transform) -> list[Problem]:
    problems = _unexpected_transform_fields(key, transform)
    if transform.kind == "tokenizer" and not transform.path:
        fix = "set path to a HuggingFace tokenizer.json"
        problems.append(Problem(f"{key}.path", f"is required for kind tokenizer; {fix}"))
    if transform.kind == "function" and not _FUNCTION.fullmatch(transform.function or ""):
        got = f"got {transform.function!r}" if transform.function is not None else "it is missing"
        fix = "set function to module:attr, e.g. mypkg.tok:encode"
        problems.append(
            Problem(f"{key}.function", f"kind function needs module:attr, {got}; {fix}")
        )
    return problems


def _unexpected_transform_fields(key: str, transform: Transform) -> list[Problem]:
    # A field that the kind ignores is almost always a typo'd kind, so reject it, not drop it.
    allowed = {"bytes": (), "tokenizer": ("path",), "function": ("function",)}[transform.kind]
    problems: list[Problem] = []
    for field in ("path", "function"):
        if getattr(transform, field) is not None and field not in allowed:
            fix = f"remove it, or change kind from {transform.kind}"
            problems.append(
                Problem(f"{key}.{field}", f"is not used by kind {transform.kind}; {fix}")
            )
    return problems


def _check_batch(recipe: Recipe) -> list[Problem]:
    dp, seq_len, tokens = recipe.distribute.dp, recipe.seq_len, recipe.global_batch_tokens
    problems = _at_least("seq_len", seq_len, 2, "a sample needs at least 2 tokens")
    problems += _at_least("distribute.dp", dp, 1, "use at least 1 data-parallel rank")
    problems += _at_least("global_batch_tokens", tokens, 1, "use a positive batch size")
    if dp >= 1 and seq_len >= 1 and tokens >= 1 and tokens % (dp * seq_len):
        problems.append(Problem("global_batch_tokens", _multiple_message(tokens, dp, seq_len)))
    return problems


def _multiple_message(tokens: int, dp: int, seq_len: int) -> str:
    # Every rank gets whole rows of seq_len tokens, hence the multiple; offer the closest fits.
    unit = dp * seq_len
    below, above = tokens // unit * unit, (tokens // unit + 1) * unit
    nearest = f"{below} or {above}" if below else f"{above}"
    what = f"must be a multiple of distribute.dp * seq_len = {dp} * {seq_len} = {unit}"
    return f"{what}, got {tokens}; use {nearest}"


def _check_steps(recipe: Recipe) -> list[Problem]:
    if recipe.steps is not None:
        return _at_least("steps", recipe.steps, 1, "run at least 1 step")
    endless = [s.name for s in recipe.sources if s.repeat]
    if not endless:
        return []
    names = ", ".join(endless)
    fix = "set steps, or make every source finite with repeat: false"
    return [Problem("steps", f"is omitted but sources {names} repeat forever; {fix}")]


def _check_pad_to(recipe: Recipe) -> list[Problem]:
    pad_to, cp = recipe.distribute.pad_to, recipe.distribute.cp
    if pad_to == 0:
        return []
    if pad_to < 0 or pad_to > recipe.seq_len:
        fix = "use 0 (the default: 2 × cp) or a multiple of 2 × cp up to seq_len"
        return [Problem("distribute.pad_to", f"is {pad_to}; {fix}")]
    if cp > 1 and pad_to % (2 * cp):
        fix = f"use a multiple of {2 * cp} (each CP rank gets two equal chunks of a sample)"
        return [Problem("distribute.pad_to", f"is {pad_to}, not a multiple of 2 × cp; {fix}")]
    return []


def _check_rest(recipe: Recipe) -> list[Problem]:
    problems = _at_least("seed", recipe.seed, 0, "use a non-negative seed")
    problems += check_cache("cache", recipe.cache)
    problems += _check_trainer(recipe)
    rows = recipe.loader.block_row_groups
    problems += _at_least("loader.block_row_groups", rows, 1, "read at least 1 row group per block")
    buffer = recipe.loader.buffer_tokens
    if buffer is not None:
        fix = "buffer at least one row, or omit it for two global batches"
        problems += _at_least("loader.buffer_tokens", buffer, recipe.seq_len, fix)
    if recipe.loader.buffer_bytes is not None:
        fix = "hold at least 1 MiB of patches, or omit it for a global batch of image tokens"
        problems += _at_least("loader.buffer_bytes", recipe.loader.buffer_bytes, 2**20, fix)
    per_process = recipe.loader.sources_per_process
    if per_process is not None:
        fix = "serve at least 1 source per loader process"
        problems += _at_least("loader.sources_per_process", per_process, 1, fix)
    prefetch = recipe.constructor.prefetch_steps
    problems += _at_least("constructor.prefetch_steps", prefetch, 1, "prefetch at least 1 step")
    if recipe.constructor.fanout is not None:
        fix = "send to at least 1 Constructor, or null for direct transfer"
        problems += _at_least("constructor.fanout", recipe.constructor.fanout, 1, fix)
    problems += _check_groups(recipe)
    problems += _check_pad_to(recipe)
    if recipe.loader.cpus is not None:
        fix = "give the loaders at least one process"
        problems += _at_least("loader.cpus", recipe.loader.cpus, 1, fix)
    auto = recipe.loader.autoscale
    if auto.max_loaders is not None:
        fix = "allow at least one loader per source"
        problems += _at_least(
            "loader.autoscale.max_loaders", auto.max_loaders, len(recipe.sources), fix
        )
    problems += _finite_at_least_0(
        "loader.autoscale.lead_s", auto.lead_s, "look a few seconds ahead"
    )
    if not 0 < auto.headroom <= 1:
        fix = "plan on a share of a loader's capacity, e.g. 0.7"
        problems.append(
            Problem("loader.autoscale.headroom", f"must be in (0, 1], got {auto.headroom}; {fix}")
        )
    if not (math.isfinite(auto.every_s) and auto.every_s > 0):
        fix = "decide every few seconds, e.g. 2"
        problems.append(
            Problem("loader.autoscale.every_s", f"must be > 0, got {auto.every_s}; {fix}")
        )
    port = recipe.metrics.port
    if port is not None and not 0 <= port <= 65535:
        fix = "use a port from 1 to 65535, 0 for any free port, or null for none"
        problems.append(Problem("metrics.port", f"is {port}; {fix}"))
    every = recipe.metrics.every_s
    if not (math.isfinite(every) and every > 0):
        fix = "write a line every few seconds, e.g. 5"
        problems.append(Problem("metrics.every_s", f"must be a number > 0, got {every}; {fix}"))
    heartbeat = recipe.loader.heartbeat_s
    if not (math.isfinite(heartbeat) and heartbeat >= 2 * 1.0):
        fix = "loaders report every second: allow at least 2"
        problems.append(Problem("loader.heartbeat_s", f"must be >= 2, got {heartbeat}; {fix}"))
    fix = "snapshot every K steps, or 0 for only on `msd checkpoint`"
    problems += _at_least("checkpoint.every_steps", recipe.checkpoint.every_steps, 0, fix)
    problems += _at_least("checkpoint.keep", recipe.checkpoint.keep, 1, "keep at least 1")
    fix = "restart a role at most this many times, 0 for never"
    problems += _at_least("recovery.restarts", recipe.recovery.restarts, 0, fix)
    if not recipe.checkpoint.enabled and recipe.recovery.restarts > 0:
        why = "a restarted data plane continues from the job's checkpoints"
        problems.append(
            Problem(
                "recovery.restarts",
                f"is {recipe.recovery.restarts} with checkpoint.enabled false; {why}: "
                "set recovery.restarts: 0 or enable checkpoints",
            )
        )
    return problems


def _check_groups(recipe: Recipe) -> list[Problem]:
    """Each grouped source exists, is in one group, and has ``loaders: 1``."""
    names = {s.name: s for s in recipe.sources}
    seen: set[str] = set()
    problems = []
    for g, group in enumerate(recipe.loader.groups):
        for name in group:
            where = f"loader.groups[{g}]"
            if name not in names:
                problems.append(Problem(where, f"names {name!r}, not a source of this recipe"))
            elif name in seen:
                problems.append(Problem(where, f"names {name!r} again; a source is in one group"))
            elif names[name].loaders not in (1, None):
                fix = "a shared process serves sources with loaders: 1"
                problems.append(
                    Problem(
                        where, f"names {name!r}, which has loaders: {names[name].loaders}; {fix}"
                    )
                )
            elif names[name].shadows:
                fix = "a source with shadows has loader processes of its own"
                problems.append(Problem(where, f"names {name!r}, which has shadows; {fix}"))
            seen.add(name)
    return problems


def _check_trainer(recipe: Recipe) -> list[Problem]:
    trainer, world = recipe.trainer, recipe.world_size
    if trainer is None:
        return []
    problems: list[Problem] = []
    if not trainer.command.strip():
        fix = "use demo for the built-in trainer, or a shell command"
        problems.append(Problem("trainer.command", f"is empty; {fix}"))
    if trainer.ranks is not None and trainer.ranks != world:
        fix = f"set ranks to {world} or omit it"
        what = f"must equal dp * pp * cp * tp = {world}, got {trainer.ranks}"
        problems.append(Problem("trainer.ranks", f"{what}; {fix}"))
    problems += _check_nodes(trainer, world, recipe.ranks_per_node)
    fix = "use a non-negative time in milliseconds"
    return problems + _finite_at_least_0("trainer.demo.step_ms", trainer.demo.step_ms, fix)


def _check_nodes(trainer: Trainer, world: int, per_node: int) -> list[Problem]:
    """The ranks fill ``nodes`` nodes of ``tasks_per_node`` each (on SLURM, and locally, where
    each node is simulated by its own Constructor)."""
    problems = _at_least("trainer.nodes", trainer.nodes, 1, "run on at least 1 node")
    if problems:
        return problems
    if per_node * trainer.nodes != world:
        what = f"{trainer.nodes} nodes × {per_node} tasks per node is not the {world} ranks"
        fix = "set trainer.nodes and tasks_per_node to match dp * pp * cp * tp"
        problems.append(Problem("trainer.nodes", f"{what}; {fix}"))
    return problems
