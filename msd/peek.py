"""A packed batch as a person reads it: its rows, the samples in each, their text, and its
images (pure numpy and Pillow, no sockets; ``msd.launch.peek`` finds the batch, ``msd peek``
shows it).

A row holds samples back to back, then padding: ``cu_seqlens`` marks every sample and every
padding run, and ``sample_ids`` / ``source_ids`` / ``sample_offsets`` list the samples in row
order (``msd.batch.pack``). A token is trained when the label before it predicts it (``labels`` are
shifted), so a sample's first token never is, nor a placeholder, nor an untrained chat turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from msd.batch.pack import IGNORE_INDEX, PAD_ID

# ids of one sample (or a run of its tokens) → its text
Detokenize = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Span:
    """A run of a sample's tokens shown alike: text, or a count of placeholders."""

    kind: str  # "text", "image" or "video"
    start: int  # within the sample's piece
    stop: int
    trained: bool
    text: str  # the decoded text (""  where the source has no text to decode to)


@dataclass(frozen=True)
class PeekSample:
    """One sample (or piece of a split sample) in a row."""

    source: int
    source_name: str
    sample_id: int
    offset: int  # where this piece starts within its sample (> 0: a later piece of a split one)
    start: int  # where it starts in its row
    tokens: np.ndarray
    trained: np.ndarray  # bool per token
    spans: tuple[Span, ...]

    @property
    def length(self) -> int:
        return len(self.tokens)

    def placeholders(self, kind: str) -> int:
        """How many images (or videos) the piece's placeholder runs stand for."""
        return sum(1 for s in self.spans if s.kind == kind)


@dataclass(frozen=True)
class PeekRow:
    index: int
    samples: tuple[PeekSample, ...]
    padding: int  # pad tokens at the row's end


@dataclass(frozen=True)
class Placeholders:
    """The placeholder ids of a job's images and videos (None: the job has none)."""

    image: int | None = None
    video: int | None = None


def trained_tokens(labels: np.ndarray) -> np.ndarray:
    """Per token of flattened rows: whether the label before it predicts it."""
    flat = labels.reshape(-1)
    trained = np.zeros(len(flat), dtype=bool)
    trained[1:] = flat[:-1] != IGNORE_INDEX
    return trained


def segments(cu_seqlens: np.ndarray, seq_len: int) -> list[tuple[int, int, int]]:
    """(row, start, stop) in flattened tokens of every sequence ``cu_seqlens`` marks."""
    bounds = [int(b) for b in cu_seqlens.tolist()]
    return [(a // seq_len, a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _padding_flags(
    segs: list[tuple[int, int, int]], ids: np.ndarray, labels: np.ndarray, seq_len: int, n: int
) -> list[bool]:
    """Which segments are a row's closing padding: the last of a row ending short of a full
    sample count, all pad ids and ignored labels; as many as there are segments beyond the
    ``n`` samples."""
    extra = len(segs) - n
    flags = [False] * len(segs)
    for k, (row, a, b) in enumerate(segs):
        last_of_row = k + 1 == len(segs) or segs[k + 1][0] != row
        closing = extra > 0 and last_of_row and b == (row + 1) * seq_len
        if closing and (ids[a:b] == PAD_ID).all() and (labels[a:b] == IGNORE_INDEX).all():
            flags[k] = True
            extra -= 1
    return flags


def rows_of(
    batch: dict[str, np.ndarray],
    source_names: Sequence[str],
    detokenizers: Sequence[Detokenize | None],
    placeholders: Placeholders = Placeholders(),
) -> list[PeekRow]:
    """The rows of one DP rank's batch (``input_ids``, ``labels``, ``cu_seqlens`` and the
    sample lists), each with its samples decoded by their source's detokenizer."""
    ids = batch["input_ids"]
    num_rows, seq_len = ids.shape
    flat_ids, flat_labels = ids.reshape(-1), batch["labels"].reshape(-1)
    trained = trained_tokens(batch["labels"])
    segs = segments(batch["cu_seqlens"], seq_len)
    n = len(batch["sample_ids"])
    pads = _padding_flags(segs, flat_ids, flat_labels, seq_len, n)
    listed = zip(
        batch["source_ids"].tolist(),
        batch["sample_ids"].tolist(),
        batch["sample_offsets"].tolist(),
        strict=True,
    )
    rows: list[list[PeekSample]] = [[] for _ in range(num_rows)]
    padding = [0] * num_rows
    for (row, a, b), pad in zip(segs, pads, strict=True):
        if pad:
            padding[row] = b - a
            continue
        entry = next(listed, None)
        if entry is None:
            raise ValueError("the batch has more sequences than its sample_ids list")
        source, sample_id, offset = entry
        tokens, mask = flat_ids[a:b], trained[a:b].copy()
        mask[0] = False  # nothing before a sample predicts its first token
        detok = detokenizers[source] if 0 <= source < len(detokenizers) else None
        spans = spans_of(tokens, mask, detok, placeholders)
        name = source_names[source] if 0 <= source < len(source_names) else f"source {source}"
        rows[row].append(
            PeekSample(source, name, sample_id, offset, a - row * seq_len, tokens, mask, spans)
        )
    return [PeekRow(r, tuple(rows[r]), padding[r]) for r in range(num_rows)]


def spans_of(
    tokens: np.ndarray,
    trained: np.ndarray,
    detokenize: Detokenize | None,
    placeholders: Placeholders = Placeholders(),
) -> tuple[Span, ...]:
    """``tokens`` cut into runs of text of one trained-ness and runs of one image's or video's
    placeholders, each text run decoded."""
    kinds = np.full(len(tokens), "text", dtype=object)
    if placeholders.image is not None:
        kinds[tokens == placeholders.image] = "image"
    if placeholders.video is not None:
        kinds[tokens == placeholders.video] = "video"
    spans: list[Span] = []
    start = 0
    for k in range(1, len(tokens) + 1):
        if k < len(tokens) and kinds[k] == kinds[start] and trained[k] == trained[start]:
            continue
        kind = str(kinds[start])
        run = tokens[start:k].tolist()
        text = detokenize(run) if kind == "text" and detokenize is not None else ""
        spans.append(Span(kind, start, k, bool(trained[start]), text))
        start = k
    return tuple(_merge_placeholder_runs(spans))


def _merge_placeholder_runs(spans: list[Span]) -> list[Span]:
    """Placeholders are never trained, but the first of an image's run is predicted by nothing
    either way: join runs of one kind that only the trained flag split."""
    merged: list[Span] = []
    for s in spans:
        if merged and s.kind != "text" and merged[-1].kind == s.kind and merged[-1].stop == s.start:
            prev = merged.pop()
            s = Span(s.kind, prev.start, s.stop, prev.trained and s.trained, "")
        merged.append(s)
    return merged


def bytes_text(ids: Sequence[int]) -> str:
    """ids of the ``bytes`` transform as text: bytes decoded as UTF-8 (with replacement),
    any other id (a ``bos``/``eos`` above 255) as ``<id>``."""
    parts: list[str] = []
    for small, run in itertools.groupby(ids, key=lambda i: 0 <= i < 256):
        values = list(run)
        if small:
            parts.append(bytes(values).decode("utf-8", errors="replace"))
        else:
            parts.extend(f"<{i}>" for i in values)
    return "".join(parts)


def tokenizer_text(tokenizer: Any) -> Detokenize:
    """A Hugging Face ``tokenizers.Tokenizer``'s decode, special tokens kept."""

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False))

    return decode


# -- pixels -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tile:
    """One image (or one frame of a video) of a batch, and whose it is."""

    label: str
    rgb: np.ndarray  # [h, w, 3] uint8


def unpatchify(
    patches: np.ndarray, grid: tuple[int, int], patch_size: int, merge_size: int, temporal: int
) -> np.ndarray:
    """The [h, w, 3] uint8 image that ``msd.sources.vision.patchify`` cut into ``patches``
    [gh·gw, 3·t·p·p] (grid (gh, gw); a still image's frame is repeated t times: the first)."""
    gh, gw = grid
    p, m = patch_size, merge_size
    values = patches.reshape(gh // m, gw // m, m, m, 3, temporal, p, p)[:, :, :, :, :, 0]
    # (group row, group column, row in group, column in group, channel, py, px) → pixels
    return np.ascontiguousarray(values.transpose(0, 2, 5, 1, 3, 6, 4)).reshape(gh * p, gw * p, 3)


def unpatchify_frames(
    patches: np.ndarray, grid: tuple[int, int, int], patch_size: int, merge_size: int, tps: int
) -> np.ndarray:
    """The [T, h, w, 3] frames that ``msd.sources.video.patchify_frames`` cut into ``patches``
    (grid (T/tps, gh, gw))."""
    t, gh, gw = grid
    p, m = patch_size, merge_size
    values = patches.reshape(t, gh // m, gw // m, m, m, 3, tps, p, p)
    frames = values.transpose(0, 6, 1, 3, 7, 2, 4, 8, 5)
    return np.ascontiguousarray(frames).reshape(t * tps, gh * p, gw * p, 3)


def image_tiles(
    batch: dict[str, np.ndarray], source_names: Sequence[str], patch_size: int, merge_size: int
) -> list[Tile]:
    """The batch's images, then its videos' frames, as pictures labelled with their sample."""
    tiles: list[Tile] = []
    for kind in ("image", "video"):
        pixels = batch.get("pixel_values" if kind == "image" else "pixel_values_videos")
        if pixels is None or len(pixels) == 0:
            continue
        grids = batch[f"{kind}_grid_thw"].reshape(-1, 3).tolist()
        bounds = batch["vision_cu_seqlens" if kind == "image" else "video_cu_seqlens"].tolist()
        sources = batch[f"{kind}_source_ids"].tolist()
        samples = batch[f"{kind}_sample_ids"].tolist()
        owners = zip(grids, sources, samples, strict=True)
        for k, ((t, gh, gw), source, sample) in enumerate(owners):
            patches = pixels[bounds[k] : bounds[k + 1]]
            name = source_names[source] if 0 <= source < len(source_names) else str(source)
            label = f"{name} #{sample}"
            temporal = patches.shape[1] // (3 * patch_size * patch_size)
            if kind == "image":
                rgb = unpatchify(patches, (gh, gw), patch_size, merge_size, temporal)
                tiles.append(Tile(label, rgb))
                continue
            frames = unpatchify_frames(patches, (t, gh, gw), patch_size, merge_size, temporal)
            tiles += [Tile(f"{label} f{f}", frame) for f, frame in enumerate(frames)]
    return tiles


LABEL_H = 12  # pixels under each tile for its label


def sheet_layout(
    sizes: Sequence[tuple[int, int]], columns: int = 6, gap: int = 4
) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """For tiles of (height, width) ``sizes``, ``columns`` a line: the sheet's (width, height)
    and each tile's top-left (x, y)."""
    corners: list[tuple[int, int]] = []
    width, y = 0, gap
    for first in range(0, len(sizes), columns):
        line = sizes[first : first + columns]
        x = gap
        for _, w in line:
            corners.append((x, y))
            x += w + gap
        width = max(width, x)
        y += max(h for h, _ in line) + LABEL_H + gap
    return (width, y + gap), corners


def contact_sheet(tiles: Sequence[Tile], path: Path) -> None:
    """Write the tiles side by side, each at its own size and labelled under it, as a PNG."""
    from PIL import Image, ImageDraw

    size, corners = sheet_layout([(t.rgb.shape[0], t.rgb.shape[1]) for t in tiles])
    sheet = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(sheet)
    for tile, (x, y) in zip(tiles, corners, strict=True):
        sheet.paste(Image.fromarray(tile.rgb, "RGB"), (x, y))
        draw.text((x, y + tile.rgb.shape[0] + 1), tile.label, fill="black")
    sheet.save(path, format="PNG")


# -- as data ----------------------------------------------------------------------------------
def as_json(rows: Sequence[PeekRow]) -> list[dict[str, Any]]:
    """The rows as plain data (``msd peek --json``)."""
    return [
        {
            "row": row.index,
            "padding": row.padding,
            "samples": [
                {
                    "source": s.source_name,
                    "source_id": s.source,
                    "sample_id": s.sample_id,
                    "offset": s.offset,
                    "start": s.start,
                    "length": s.length,
                    "trained": int(s.trained.sum()),
                    "images": s.placeholders("image"),
                    "videos": s.placeholders("video"),
                    "text": "".join(span.text for span in s.spans if span.kind == "text"),
                    "input_ids": s.tokens.tolist(),
                }
                for s in row.samples
            ],
        }
        for row in rows
    ]
