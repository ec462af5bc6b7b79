"""One image-text sample as the trainer sees it: text tokens with a run of placeholder tokens
at each image's (and video's) place, and their patches (pure: bytes in, arrays out, no sockets).

The text holds one ``marker`` per image, in order; without markers the images precede the
text. Image ``i`` takes ``patches_i / merge_size²`` tokens ``image_token_id`` where its marker
was. Videos are placed the same way, at their own ``video_marker``s, with ``video_token_id``
placeholders (without video markers they follow the unmarked images, before the text); what
is said of images below holds for videos.

What cannot be used is left out and counted by reason (`Skips`), the same way on every run: an
image that does not decode, or has no bytes (its marker goes with it); markers and images that
do not pair up (the extra ones); a sample without text.

An image is never cut across rows, so its pixels stay with its tokens. With ``long_samples:
split`` (the Planner cuts a long sample at multiples of ``seq_len``) fillers move an image that
would cross a row boundary to the next row; an image longer than a row, or past the step's
rows, is left out. Otherwise a sample with images is fitted into one row: an image whose
tokens would end past ``seq_len`` is left out with every later one, then the text past it.
With ``max_patches``, no piece holds more patches: an image that would pass it goes to the
next row (``split``) or is left out.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from msd.batch.sample import FILLER, EncodedImages, SampleImages
from msd.recipe.schema import Clip, Recipe, Source, Video, Vision
from msd.sources import video as videos
from msd.sources.chat import Conversations
from msd.sources.chat_rows import LEFT_OUT as CHAT_LEFT_OUT
from msd.sources.chat_rows import conversations_of, spans_of
from msd.sources.clips import ClipRule, clip_count, clip_window
from msd.sources.formats.base import ColumnKind
from msd.sources.transforms import Ids, Tokenize, boundaries, make_transform
from msd.sources.video import DecodedVideo, VideoHeader, VideoSpec, Window
from msd.sources.vision import (
    DecodedImage,
    DecodeFailure,
    EncodedImage,
    ImageGeometry,
    decode,
    decode_into,
    probe,
)

Image = DecodedImage | EncodedImage
Visual = DecodedImage | DecodedVideo | EncodedImage
Held = SampleImages | EncodedImages  # a sample's images as a loader holds them
_S = TypeVar("_S")  # a segment of a sample's text, or its index

Skips = Counter[str]
_EMPTY: Ids = np.zeros(0, dtype=np.int32)
# The reasons counted (what ``msd status`` shows per source).
UNDECODABLE = "images undecodable"
NO_BYTES = "images without bytes"
UNPAIRED_IMAGE = "images without a marker"
UNPAIRED_MARKER = "markers without an image"
PAST_ROW = "images past seq_len"
CUT_TOKENS = "text tokens cut after an image"
NO_TEXT = "samples without text"
OVER_PATCHES = "images over max_patches"
VIDEO_NO_BYTES = "videos without bytes"
UNPAIRED_VIDEO = "videos without a marker"
UNPAIRED_VIDEO_MARKER = "video markers without a video"
VIDEO_UNDECODABLE = "videos undecodable"  # followed by the reason, e.g. "(truncated)"
DAMAGED = "images undecodable once routed (sent black)"


@dataclass(frozen=True)
class FuseSpec:
    """``long_samples`` as in the recipe's ``balance``: ``split`` puts fillers before an image
    that would cross a multiple of ``seq_len`` (where the Planner cuts), so that an image is
    never split; ``max_rows``: a step's rows, the most pieces a sample may be cut into."""

    geometry: ImageGeometry
    image_token_id: int
    marker: str
    seq_len: int
    long_samples: str = "truncate"
    max_rows: int = 1
    max_patches: int | None = None  # of one piece (a row's share of a micro-batch's budget)
    video: VideoSpec | None = None  # None: the source's rows hold no videos
    video_token_id: int = 0
    video_marker: str = ""
    clip: ClipRule | None = None  # the source's videos are cut into clips, each a sample


def geometry_of(vision: Vision) -> ImageGeometry:
    """How a recipe's ``vision`` section cuts images into patches."""
    return ImageGeometry(
        patch_size=vision.patch_size,
        merge_size=vision.merge_size,
        min_pixels=vision.min_pixels,
        max_pixels=vision.max_pixels,
        temporal_patch_size=vision.temporal_patch_size,
        decode=vision.decode,
    )


def video_spec_of(video: Video, vision: Vision) -> VideoSpec:
    """How a recipe's ``video`` section (and ``vision``'s patch and merge sizes) cut videos."""
    return VideoSpec(
        fps=video.fps,
        min_frames=video.min_frames,
        max_frames=video.max_frames,
        patch_size=vision.patch_size,
        merge_size=vision.merge_size,
        temporal_patch_size=video.temporal_patch_size,
        min_pixels=video.min_pixels,
        max_pixels=video.max_pixels,
        total_pixels=video.total_pixels,
        max_duration_s=video.max_duration_s,
        max_decode_pixels=video.max_decode_pixels,
        threads=video.threads,
    )


def fuse_spec(recipe: Recipe, with_videos: bool = False, clip: Clip | None = None) -> FuseSpec:
    """How this recipe's image samples are made (``with_videos``: a source of videos too;
    ``clip``: its videos cut into clips, each a sample)."""
    v = recipe.vision
    geometry = geometry_of(v)
    rows = recipe.global_batch_tokens // recipe.seq_len
    spec = FuseSpec(
        geometry,
        v.image_token_id,
        v.marker,
        recipe.seq_len,
        recipe.balance.long_samples,
        rows,
        recipe.balance.max_patches,
    )
    if not with_videos:
        return spec
    return dataclasses.replace(
        spec,
        video=video_spec_of(recipe.video, v),
        video_token_id=recipe.video.video_token_id,
        video_marker=recipe.video.marker,
        clip=None if clip is None else ClipRule(clip.length_s, clip.stride),
    )


def decode_all(
    images: Sequence[bytes | None], geometry: ImageGeometry, skips: Skips, defer: bool = False
) -> list[Image | None]:
    """Each image decoded, or None (counted) when it has no bytes or does not decode.
    ``defer``: each known from its header (`vision.probe`), to be decoded when routed
    (`decode_held`); all of them decoded now where any one's header cannot tell, or where any
    one's bytes are more than its patches (a large photo: holding its patches costs less)."""
    found = [_probe_or_decode(data, geometry, defer) for data in images]
    if any(f is None or _larger_encoded(f, geometry) for f in found):
        found = [_probe_or_decode(data, geometry, False) for data in images]
    out: list[Image | None] = []
    for data, f in zip(images, found, strict=True):
        if data is None or not len(data):
            skips[NO_BYTES] += 1
        elif isinstance(f, DecodeFailure):
            skips[UNDECODABLE] += 1
        out.append(None if f is None or isinstance(f, DecodeFailure) else f)
    return out


def decode_held(
    images: EncodedImages, geometry: ImageGeometry, skips: Skips, out: np.ndarray | None = None
) -> SampleImages:
    """The patches of a sample's images known from their headers (written into ``out`` if
    given: their rows of a payload's buffer). An image whose bytes do not decode after all
    (damaged past its header) keeps the place and patches it was planned with, all zero
    (black), and is counted: what was planned is what is sent."""
    counts = images.counts
    if out is None:
        out = np.empty((sum(counts), geometry.patch_values), dtype=np.uint8)
    at = 0
    for data, grid, count in zip(images.encoded, images.grids, counts, strict=True):
        rows = out[at : at + count]
        if not decode_into(EncodedImage(data, grid, 0, (0, 0)), rows, geometry):
            skips[DAMAGED] += 1
            rows[:] = 0
        at += count
    return SampleImages(out, images.grids)


def _larger_encoded(found: Image | DecodeFailure, geometry: ImageGeometry) -> bool:
    """An image held as bytes that would take less memory as patches."""
    if not isinstance(found, EncodedImage):
        return False
    return len(found.data) > found.count * geometry.patch_values


def _probe_or_decode(
    data: bytes | None, geometry: ImageGeometry, defer: bool
) -> Image | DecodeFailure | None:
    if data is None or not len(data):
        return DecodeFailure("empty")
    return probe(bytes(data), geometry) if defer else decode(bytes(data), geometry)


@dataclass
class VideoCost:
    """What decoding a source's videos cost: seconds of video decoded, and the CPU time."""

    seconds: float = 0.0
    cpu_s: float = 0.0


def decode_videos(
    clips: Sequence[bytes | None],
    spec: VideoSpec,
    skips: Skips,
    cost: VideoCost | None = None,
    clip: tuple[ClipRule, int] | None = None,
) -> list[DecodedVideo | None]:
    """Each video decoded, or None (counted by reason) when it has no bytes or does not decode;
    ``cost`` adds up the seconds decoded and the CPU time it took. ``clip`` (a rule, and which
    clip): a sample's only video is decoded as that clip of it."""
    out: list[DecodedVideo | None] = []
    for data in clips:
        if data is None or not len(data):
            skips[VIDEO_NO_BYTES] += 1
            out.append(None)
            continue
        started = time.thread_time()
        header = videos.probe(bytes(data), spec)
        window: Window | None = None
        decoded: DecodedVideo | DecodeFailure
        if isinstance(header, DecodeFailure):
            decoded = header
        else:
            cut = None if clip is None or len(clips) != 1 else _window(header, *clip)
            if isinstance(cut, DecodeFailure):
                decoded = cut
            else:
                window = cut
                decoded = videos.decode(data, spec, header, window)
        if cost is not None:
            cost.cpu_s += time.thread_time() - started
        if isinstance(decoded, DecodeFailure):
            skips[f"{VIDEO_UNDECODABLE} ({decoded.reason})"] += 1
            out.append(None)
        else:
            assert not isinstance(header, DecodeFailure)
            if cost is not None:
                frames = header.frames if window is None else window.end - window.first
                cost.seconds += frames / header.fps
            out.append(decoded)
    return out


def _window(header: VideoHeader, rule: ClipRule, k: int) -> Window | DecodeFailure:
    """The frames of clip ``k``; a clip the video does not have (its file changed since its
    clips were counted) is damage."""
    if k >= clip_count(header, rule):
        return DecodeFailure("clip past the video's end")
    return clip_window(header, rule, k)


def fuse(
    segments: Sequence[Ids],
    images: Sequence[Image | None],
    spec: FuseSpec,
    skips: Skips,
    clips: Sequence[DecodedVideo | None] = (),
    kinds: Sequence[bool] | None = None,
    frame: tuple[int | None, int | None] = (None, None),
) -> tuple[Ids, Held | None]:
    """The fused ids of a sample whose text tokenized to ``segments`` (one more than markers,
    or one: no markers), its images and videos (None: not decoded; ``kinds``: which markers
    are video markers, None: none are), and the images and videos kept. ``frame``: the
    document's bos and eos, put around it (None: none) unless it holds nothing."""
    ids, kept, _ = fuse_masked(segments, None, images, spec, skips, clips, kinds, frame)
    return ids, kept


def fuse_masked(
    segments: Sequence[Ids],
    masks: Sequence[np.ndarray] | None,
    images: Sequence[Image | None],
    spec: FuseSpec,
    skips: Skips,
    clips: Sequence[DecodedVideo | None] = (),
    kinds: Sequence[bool] | None = None,
    frame: tuple[int | None, int | None] = (None, None),
) -> tuple[Ids, Held | None, np.ndarray | None]:
    """`fuse`, and with ``masks`` (a bool a token of each segment: trained or not), the fused
    sample's: its text tokens keep theirs; placeholders, fillers, bos and eos are not trained
    (None without ``masks``)."""
    order, head = _pair(list(range(len(segments))), images, skips, clips, kinds)
    bos, eos = frame
    parts: list[Ids] = [] if bos is None else [np.array([bos], dtype=np.int32)]
    trained: list[np.ndarray] = [np.zeros(len(p), dtype=bool) for p in parts]
    if head is not None:
        parts.append(segments[head])
        trained.append(_mask_of(masks, head, segments))
    length = sum(len(p) for p in parts)
    kept: list[Visual] = []
    full = False  # no later image fits
    piece_patches: dict[int, int] = {}  # piece → its images' patches so far
    for image, text in order:
        if image is not None:
            fill = None if full else _fill(length, image.tokens, spec)
            if fill is not None and spec.max_patches is not None:
                fill = _within_patches(length, fill, image, spec, piece_patches, skips)
            elif fill is None:
                skips[PAST_ROW] += 1
                full = full or spec.long_samples != "split" or image.tokens <= spec.seq_len
            if fill is not None:
                token = (
                    spec.video_token_id if isinstance(image, DecodedVideo) else spec.image_token_id
                )
                run = np.full(image.tokens, token, dtype=np.int32)
                if fill:
                    run = np.concatenate((np.full(fill, FILLER, dtype=np.int32), run))
                parts.append(run)
                trained.append(np.zeros(len(run), dtype=bool))
                length += len(run)
                kept.append(image)
        if text is not None:
            parts.append(segments[text])
            trained.append(_mask_of(masks, text, segments))
            length += len(segments[text])
    if not kept and not any(len(p) for p in parts[bos is not None :]):
        return np.zeros(0, dtype=np.int32), None, None  # nothing: no document to frame
    if eos is not None:
        parts.append(np.array([eos], dtype=np.int32))
        trained.append(np.zeros(1, dtype=bool))
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    ids = ids.astype(np.int32, copy=False)
    mask = None if masks is None else np.concatenate(trained) if trained else np.zeros(0, bool)
    if not kept:
        return ids, None, mask
    limit = _limit(spec)
    if limit is not None and len(ids) > limit:
        skips[CUT_TOKENS] += len(ids) - limit
        ids = ids[:limit]
        mask = None if mask is None else mask[:limit]
    return ids, _sample_images(kept, spec), mask


def _mask_of(masks: Sequence[np.ndarray] | None, i: int, segments: Sequence[Ids]) -> np.ndarray:
    """Segment ``i``'s trained tokens (all, without masks: unused then)."""
    return np.ones(len(segments[i]), dtype=bool) if masks is None else masks[i]


def _sample_images(kept: Sequence[Visual], spec: FuseSpec) -> Held:
    """The patches of ``kept`` as one array of the image patch width (a video patch, of more
    frames, takes several rows); images known from their headers, their bytes as they are."""
    width = spec.geometry.patch_values
    encoded = [v for v in kept if isinstance(v, EncodedImage)]
    if encoded:  # all of them, or none (`decode_all`)
        return EncodedImages(tuple(v.data for v in encoded), tuple(v.grid for v in encoded))
    decoded = [v for v in kept if not isinstance(v, EncodedImage)]
    if not any(isinstance(v, DecodedVideo) for v in decoded):
        return SampleImages(
            np.concatenate([im.patches for im in decoded]), tuple(im.grid for im in decoded)
        )
    assert spec.video is not None
    parts = [v.patches.reshape(-1, width) for v in decoded]
    # A sample of one video (the usual case) keeps its decoded array: no copy of its patches.
    patches = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return SampleImages(
        patches,
        tuple(v.grid for v in kept),
        tuple(isinstance(v, DecodedVideo) for v in kept),
        spec.video.patch_values // width,
    )


def _pair(
    segments: Sequence[_S],
    images: Sequence[Image | None],
    skips: Skips,
    clips: Sequence[DecodedVideo | None] = (),
    kinds: Sequence[bool] | None = None,
) -> tuple[list[tuple[Visual | None, _S | None]], _S | None]:
    """(image or video, the text after it) in order, and the text before the first one."""
    markers = len(segments) - 1
    if kinds is None:
        kinds = [False] * markers
    marked_videos = sum(kinds)
    marked_images = markers - marked_videos
    # Unmarked images, then unmarked videos, precede the text.
    order: list[tuple[Visual | None, _S | None]] = []
    if not marked_images:
        order += [(im, None) for im in images]
    if not marked_videos:
        order += [(clip, None) for clip in clips]
    if markers == 0:
        return [*order, (None, segments[0])], None
    for own, marked, unpaired, unmarked in (
        (images, marked_images, UNPAIRED_IMAGE, UNPAIRED_MARKER),
        (clips, marked_videos, UNPAIRED_VIDEO, UNPAIRED_VIDEO_MARKER),
    ):
        pairs = min(marked, len(own))
        if marked and len(own) > pairs:
            skips[unpaired] += len(own) - pairs
        if marked > pairs:
            skips[unmarked] += marked - pairs
    seen = [0, 0]  # images, videos paired so far
    paired: list[tuple[Visual | None, _S | None]] = []
    for k, is_video in enumerate(kinds):
        own = clips if is_video else images
        j = seen[is_video]
        seen[is_video] += 1
        paired.append((own[j] if j < len(own) else None, segments[k + 1]))
    if not order:
        return paired, segments[0]
    return [*order, (None, segments[0]), *paired], None


def paired_counts(markers: int, video_markers: int, images: int, clips: int) -> tuple[int, int]:
    """How many of a sample's images and videos are placed (and so decoded): all of a kind
    without markers, else as many as pair with its markers."""
    kept_images = images if markers == video_markers else min(images, markers - video_markers)
    kept_clips = clips if not video_markers else min(clips, video_markers)
    return kept_images, kept_clips


def _within_patches(
    length: int,
    fill: int,
    image: Visual,
    spec: FuseSpec,
    patches: dict[int, int],
    skips: Skips,
) -> int | None:
    """``fill``, or more fillers to move the image to the next row (``split``), so that no piece
    of the sample holds more than ``max_patches`` patches; None (counted): it cannot be."""
    assert spec.max_patches is not None
    own = image.count if isinstance(image, EncodedImage) else len(image.patches)
    split = spec.long_samples == "split"
    piece = (length + fill) // spec.seq_len if split else 0
    if own <= spec.max_patches and patches.get(piece, 0) + own > spec.max_patches and split:
        piece += 1  # the next row: no image is there yet
        fill = piece * spec.seq_len - length
        limit = _limit(spec)
        if limit is not None and length + fill + image.tokens > limit:
            skips[PAST_ROW] += 1
            return None
    if patches.get(piece, 0) + own > spec.max_patches:
        skips[OVER_PATCHES] += 1
        return None
    patches[piece] = patches.get(piece, 0) + own
    return fill


def _fill(length: int, tokens: int, spec: FuseSpec) -> int | None:
    """Fillers to put before an image of ``tokens`` placeholders starting at ``length`` so it
    does not cross a row boundary (``split``: the sample is cut at multiples of ``seq_len``);
    None: it cannot be placed."""
    s = spec.seq_len
    if spec.long_samples == "drop":
        return 0  # a sample that does not fit one row is dropped whole by the Planner
    if spec.long_samples != "split":
        return 0 if length + tokens <= s else None
    if tokens > s:
        return None
    boundary = (length // s + 1) * s
    fill = boundary - length if length + tokens > boundary else 0
    limit = _limit(spec)
    return None if limit is not None and length + fill + tokens > limit else fill


def _limit(spec: FuseSpec) -> int | None:
    """The most tokens a sample with images keeps: one row (``truncate``), a step's rows
    (``split``: the Planner never cuts it further), any (``drop``: it is dropped if long)."""
    if spec.long_samples == "drop":
        return None
    if spec.long_samples == "split":
        return spec.seq_len * spec.max_rows
    return spec.seq_len


@dataclass(frozen=True)
class _Text:
    """A row's text ready to fuse: the token ids between its markers, which of them are trained
    (None: all), and which markers are video markers (None: none are)."""

    segments: list[Ids]
    masks: list[np.ndarray] | None
    kinds: list[bool] | None


class Fuser:
    """Turns rows of an image source (``msd.sources.image_rows.ROW_TYPE``) into samples; counts
    what it leaves out in ``skips``. ``require_text``: a row without text is left out whole
    (a WebDataset key without its text member), else it is the images alone. A row's videos
    are read only when ``spec.video`` is set (a source of videos). ``tokenize`` tokenizes the
    text between markers; ``frame``, the bos and eos put around each sample (`of_source`).
    ``chat``: the rows' text is a conversation, rendered and tokenized by it, its markers where
    the template put them; ``trained`` then holds each sample's trained spans. ``defer``: a
    source of images only gives each sample's images as their bytes (`EncodedImages`), their
    places planned from their headers, decoded by `decoded` once the sample is routed."""

    @classmethod
    def of_source(
        cls,
        source: Source,
        column_kind: ColumnKind,
        spec: FuseSpec,
        require_text: bool,
        defer: bool = False,
    ) -> Fuser:
        """The Fuser of ``source``: its text pieces tokenized without bos and eos, which go
        around each whole sample; or its conversations rendered."""
        frame = boundaries(source.transform)
        if source.chat is not None:
            markers = (spec.marker, spec.video_marker if spec.video is not None else "")
            chat = conversations_of(source, markers)
            return cls(_untokenized, spec, require_text, frame, chat, defer)
        pieces = make_transform(source.transform, column_kind, documents=False)
        return cls(pieces, spec, require_text, frame, defer=defer)

    def __init__(
        self,
        tokenize: Tokenize,
        spec: FuseSpec,
        require_text: bool,
        frame: tuple[int | None, int | None] = (None, None),
        chat: Conversations | None = None,
        defer: bool = False,
    ) -> None:
        self.tokenize, self.spec, self.require_text = tokenize, spec, require_text
        self.defer = defer and spec.video is None
        self.frame = frame  # each sample's bos and eos
        self.chat = chat
        self.skips: Skips = Counter()
        self.images_read = 0
        self.videos_read = 0
        self.video_cost = VideoCost()
        # of the rows of the last call: images and videos left out, and (conversations) the
        # [start, end) spans of each sample's tokens the loss is taken on
        self.skipped_per_sample: list[int] = []
        self.trained: list[np.ndarray | None] = []
        self._marker = spec.marker.encode("utf-8")
        self._split: re.Pattern[bytes] | None = None
        if spec.video is not None:
            markers = [m.encode("utf-8") for m in (spec.marker, spec.video_marker) if m]
            self._video_marker = spec.video_marker.encode("utf-8")
            self._split = re.compile(b"(" + b"|".join(re.escape(m) for m in markers) + b")")

    def _segments(self, text: bytes) -> tuple[list[bytes], list[bool] | None]:
        """The text between markers, and which markers are video markers (None: no videos)."""
        if self._split is None:
            return (text.split(self._marker) if self._marker else [text]), None
        parts = self._split.split(text)
        return parts[::2], [m == self._video_marker for m in parts[1::2]]

    def _texts(self, texts: list[bytes | None]) -> list[_Text | None]:
        """Each row's text tokenized between its markers; None: left out (no text, or a
        conversation left out: counted)."""
        if self.chat is not None:
            return self._conversations(texts)
        segments: list[list[bytes]] = []
        kinds: list[list[bool] | None] = []
        for text in texts:
            if text is None and self.require_text:
                segments.append([])
                kinds.append(None)
            else:
                row, kind = self._segments(text or b"")
                segments.append(row)
                kinds.append(kind)
        flat = [seg for row in segments for seg in row]
        tokens = self.tokenize(pa.array(flat, pa.large_binary())) if flat else []
        out: list[_Text | None] = []
        at = 0
        for row, kind in zip(segments, kinds, strict=True):
            out.append(_Text(tokens[at : at + len(row)], None, kind) if row else None)
            at += len(row)
        return out

    def _conversations(self, texts: list[bytes | None]) -> list[_Text | None]:
        assert self.chat is not None
        out: list[_Text | None] = []
        for text, rendered in zip(texts, self.chat.render_batch(texts), strict=True):
            if text is None or isinstance(rendered, str):
                if text is not None:
                    self.skips[f"{CHAT_LEFT_OUT} ({rendered})"] += 1
                out.append(None)
                continue
            ids = [s.ids for s in rendered.segments]
            masks = [s.trained for s in rendered.segments]
            out.append(_Text(ids, masks, [m == "video" for m in rendered.media]))
        return out

    def __call__(self, rows: pa.StructArray) -> tuple[list[Ids], list[Held | None]]:
        texts: list[bytes | None] = rows.field("text").to_pylist()
        images: list[list[bytes | None] | None] = rows.field("images").to_pylist()
        with_videos = self.spec.video is not None
        clips: list[list[bytes | None] | None] = (
            rows.field("videos").to_pylist() if with_videos else [None] * len(texts)
        )
        which: list[int] = rows.field("clip").to_pylist()
        ids: list[Ids] = []
        kept: list[Held | None] = []
        self.skipped_per_sample, self.trained = [], []
        prepared = self._texts(texts)
        for text, row, own, own_clips, k in zip(texts, prepared, images, clips, which, strict=True):
            own, own_clips = own or [], own_clips or []
            self.images_read += len(own)
            self.videos_read += len(own_clips)
            if row is None:
                if self.chat is None or text is None:  # else counted with its reason
                    self.skips[NO_TEXT] += 1
                ids.append(_EMPTY)
                kept.append(None)
                self.trained.append(None)
                self.skipped_per_sample.append(len(own) + len(own_clips))
                continue
            decoded, decoded_clips = self._decoded(row, own, own_clips, k)
            sample, pixels, mask = fuse_masked(
                row.segments,
                row.masks,
                decoded,
                self.spec,
                self.skips,
                decoded_clips,
                row.kinds,
                self.frame,
            )
            ids.append(sample)
            kept.append(pixels)
            self.trained.append(None if mask is None else spans_of(mask))
            self.skipped_per_sample.append(
                len(own) + len(own_clips) - (0 if pixels is None else len(pixels.grids))
            )
        return ids, kept

    def decoded(self, images: Held, out: np.ndarray | None = None) -> SampleImages:
        """A sample's images as patches (decoded now if they were held as bytes; into ``out``
        if given, their rows of a payload's buffer)."""
        if isinstance(images, EncodedImages):
            return decode_held(images, self.spec.geometry, self.skips, out)
        if out is not None:
            out[:] = images.patches.reshape(out.shape)
        return images

    def _decoded(
        self, row: _Text, own: list[bytes | None], own_clips: list[bytes | None], k: int
    ) -> tuple[list[Image | None], list[DecodedVideo | None]]:
        """A row's images and videos decoded, those its markers pair with; None for the rest
        (counted by fuse)."""
        marked_videos = sum(row.kinds) if row.kinds else 0
        paired, paired_clips = paired_counts(
            len(row.segments) - 1, marked_videos, len(own), len(own_clips)
        )
        decoded = decode_all(own[:paired], self.spec.geometry, self.skips, self.defer)
        decoded += [None] * (len(own) - paired)
        decoded_clips: list[DecodedVideo | None] = []
        if own_clips:
            assert self.spec.video is not None
            rule = self.spec.clip
            decoded_clips = decode_videos(
                own_clips[:paired_clips],
                self.spec.video,
                self.skips,
                self.video_cost,
                None if rule is None or len(own_clips) != 1 else (rule, k),
            )
            decoded_clips += [None] * (len(own_clips) - paired_clips)
        return decoded, decoded_clips


def _untokenized(column: pa.Array) -> list[Ids]:
    raise AssertionError("a conversation source's text is tokenized by its chat template")
