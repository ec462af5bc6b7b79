"""Every message msd sends, declared once.

A message is one msgpack header (a tagged, frozen struct) followed by zero or more raw buffers
(token payloads, batch tensors) sent as separate ZeroMQ frames so they are never copied into the
header. Nothing on the wire is pickled; a peer that sends anything else gets a ProtocolError.
The protocol version travels in ``Hello``; the Planner refuses a peer of another version.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from typing import Any, Union

import msgspec
import numpy as np

from msd.errors import ProtocolError
from msd.wire.views import StatusView

# 13: Stats' cache figures; 12: the tokens a loss is taken on (Payload.trained, Payload.spans);
# 11: Meta.frames; 10: videos (Payload.videos, SourceLoad's video figures); 9: relayed payloads
# (Payload.to, Welcome.index); 8: compact tokens
PROTOCOL_VERSION = 13
DISCARD = -1  # a Route destination: the loader forgets the sample (dropped by the plan)


class Kind(enum.IntEnum):
    HELLO = 1
    WELCOME = 2
    META = 3
    ROUTE = 4
    PAYLOAD = 5
    PLAN = 6
    END = 7
    GET = 8
    BATCH = 9
    ENDED = 10
    PROGRESS = 11
    STATUS_REQUEST = 12
    STATUS = 13
    STOP = 14
    FAILURE = 15
    REFUSED = 16
    WANT = 17
    STATS = 18
    SET_MIX = 19
    MIX_SET = 20
    RESCALE = 21
    RESCALING = 22
    CUT = 23
    CUT_AT = 24
    GENERATION_START = 25
    RETIRED = 26
    TAKE_CHECKPOINT = 27
    CHECKPOINT_TAKEN = 28
    BEHIND = 29
    REWIND = 30
    REWINDING = 31
    ADOPT = 32
    LOADER_LOST = 33
    ARRIVE = 34
    RELEASE = 35


class _Msg(msgspec.Struct, frozen=True, array_like=True, tag_field="kind"):
    pass


class Hello(_Msg, frozen=True, tag=int(Kind.HELLO)):
    """A role announces itself to the Planner. ``endpoints`` are the addresses it serves."""

    role: str
    name: str
    version: int
    pid: int
    node: str = ""
    endpoints: dict[str, str] = {}
    ranks: tuple[int, ...] = ()
    sources: tuple[int, ...] = ()
    generations: tuple[int, ...] = ()  # a loader: the generation of each source's shard
    standby: int = -1  # a shadow loader: the source it stands by for


class ConstructorInfo(msgspec.Struct, frozen=True, array_like=True):
    name: str
    payload_endpoint: str


class Welcome(_Msg, frozen=True, tag=int(Kind.WELCOME)):
    """Planner → loader: where to send payloads (index = the constructor number in ``Route``).

    Planner → Constructor, when payloads are relayed (``msd.plan.fanout``): the same list, and
    ``index``, the receiver's own number in it (-1 in a loader's).
    """

    constructors: tuple[ConstructorInfo, ...]
    index: int = -1


class Meta(_Msg, frozen=True, tag=int(Kind.META)):
    """Loader → Planner: lengths of the samples at positions ``gpos_start ...`` of one source.

    For an image source, ``images[i]`` is how many images sample i holds and ``patches`` the
    patch count of every image, sample after sample (empty for a text source); ``lengths`` are
    then of the fused sequence, image placeholder tokens included. ``frames``: each image's or
    video's temporal patches (the vision encoder attends within each), empty when all are 1.
    """

    source: int
    gpos_start: int
    lengths: tuple[int, ...]
    sample_ids: tuple[int, ...]
    images: tuple[int, ...] = ()
    patches: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()  # per sample: its images left out (``msd.sources.fuse``)
    # per image: the piece of its sample it lies in (a sample split into rows is cut at
    # multiples of seq_len, never inside an image); empty when no sample is split
    image_rows: tuple[int, ...] = ()
    frames: tuple[int, ...] = ()
    # per sample of a conversation source: how many [start, end) spans of its tokens the loss is
    # taken on, the spans back to back in ``spans`` (empty: every token of every sample)
    trained: tuple[int, ...] = ()
    spans: tuple[int, ...] = ()


class Route(_Msg, frozen=True, tag=int(Kind.ROUTE)):
    """Planner → loader: for ``step``, send sample ``gpos[i]`` of source ``source[i]`` to
    constructor ``constructor[i]`` (a sample may appear once per constructor; ``DISCARD`` means
    forget it). One per loader process and step, whatever the sources it serves."""

    step: int
    source: tuple[int, ...]
    gpos: tuple[int, ...]
    constructor: tuple[int, ...]


class Want(_Msg, frozen=True, tag=int(Kind.WANT)):
    """Planner → the loaders of ``source``: planning waits for position ``gpos``; read up to it
    even if your buffer is full."""

    source: int
    gpos: int


class Payload(_Msg, frozen=True, tag=int(Kind.PAYLOAD)):
    """Loader → Constructor: the token ids of some samples for one step; sample i is position
    ``gpos[i]`` of source ``source[i]``. One per loader process, step and constructor.

    One buffer of ``token_dtype`` follows (the smallest integer type that holds them: uint8,
    uint16, uint32 or int32): the samples' tokens back to back, ``lengths`` long each. With
    images, a second, uint8 buffer: their patches back to back, image after image in sample
    order; sample i holds ``images[i]`` of them (all 0, or empty, for text), image k has grid
    ``grids[3k : 3k + 3]`` (frames, patch rows, patch columns), so ``frames × rows × columns``
    patches of ``patch_values`` bytes. ``videos[k]`` is 1 where item k is a video (empty: none
    is), whose patches take ``video_rows`` rows of ``patch_values`` bytes each.

    ``to``: relayed payloads (``msd.plan.fanout``) name, per sample, the Constructor it is for;
    empty when every sample is for the receiver.

    ``trained``: per sample, how many spans of its tokens the loss is taken on (a conversation's
    assistant turns), their ``[start, end)`` pairs back to back in ``spans``; empty when the
    loss is taken on every token of every sample.
    """

    step: int
    source: tuple[int, ...]
    gpos: tuple[int, ...]
    lengths: tuple[int, ...]
    images: tuple[int, ...] = ()
    grids: tuple[int, ...] = ()
    patch_values: int = 0
    token_dtype: str = "int32"
    to: tuple[int, ...] = ()
    videos: tuple[int, ...] = ()
    video_rows: int = 1
    trained: tuple[int, ...] = ()
    spans: tuple[int, ...] = ()


TOKEN_DTYPES = frozenset({"uint8", "uint16", "uint32", "int32"})


class PayloadLayout(msgspec.Struct, frozen=True):
    """Where each sample of a payload lies in its buffers: its tokens are ``bounds[i] ..
    bounds[i + 1]``, its images ``first[i] .. first[i + 1]``, image k's patches ``rows[k] ..
    rows[k + 1]`` (``grids``: an image a row of frames, patch rows, patch columns). A payload
    without images (``msg.images`` empty) has only ``bounds``; the rest stay empty."""

    bounds: list[int]
    first: list[int]
    rows: list[int]
    grids: np.ndarray

    @classmethod
    def of(cls, msg: Payload) -> PayloadLayout:
        bounds = np.cumsum((0, *msg.lengths)).tolist()
        if not msg.images:  # text: nothing more to work out on the data path
            return cls(bounds=bounds, first=[], rows=[], grids=_NO_GRIDS)
        grids = np.asarray(msg.grids, dtype=np.int64).reshape(-1, 3)
        return cls(
            bounds=bounds,
            first=np.cumsum((0, *msg.images)).tolist(),
            rows=np.cumsum(np.concatenate(([0], item_rows(msg, grids)))).tolist(),
            grids=grids,
        )


def trained_spans(msg: Payload | Meta) -> list[np.ndarray] | None:
    """Each sample's trained ``[start, end)`` spans as an int64 [k, 2] array; None when the
    loss is taken on every token (``msg.trained`` empty)."""
    if not msg.trained:
        return None
    flat = np.asarray(msg.spans, dtype=np.int64).reshape(-1, 2)
    ends = np.cumsum((0, *msg.trained)).tolist()
    return [flat[a:b] for a, b in itertools.pairwise(ends)]


def item_rows(msg: Payload, grids: np.ndarray) -> np.ndarray:
    """Rows of the patch buffer each image or video of a payload takes."""
    patches: np.ndarray = grids[:, 0] * grids[:, 1] * grids[:, 2]
    if not msg.videos:
        return patches
    scale: np.ndarray = np.where(np.asarray(msg.videos, dtype=bool), msg.video_rows, 1)
    rows: np.ndarray = patches * scale
    return rows


_NO_GRIDS = np.zeros((0, 3), dtype=np.int64)
_NO_GRIDS.flags.writeable = False


class Plan(_Msg, frozen=True, tag=int(Kind.PLAN)):
    """Planner → Constructor: the rows of one step for the DP ranks it serves.

    Piece ``i`` (in packing order) goes into row ``row[i]`` of DP rank ``dp[i]``: tokens
    ``[offset[i], offset[i] + length[i])`` of position ``gpos[i]`` of source ``source[i]``
    (its row ``sample_id[i]`` in the source), taking ``padded[i]`` tokens of the row. Every
    column has one entry per piece.
    """

    step: int
    dp: tuple[int, ...]
    row: tuple[int, ...]
    source: tuple[int, ...]
    gpos: tuple[int, ...]
    sample_id: tuple[int, ...]
    length: tuple[int, ...]
    offset: tuple[int, ...]
    padded: tuple[int, ...]


PLAN_COLUMNS = ("dp", "row", "source", "gpos", "sample_id", "length", "offset", "padded")


class End(_Msg, frozen=True, tag=int(Kind.END)):
    """Planner → Constructor: the stream has exactly ``num_steps`` steps."""

    num_steps: int


class Get(_Msg, frozen=True, tag=int(Kind.GET)):
    """Client → Constructor: the batch of ``step`` for ``rank``.

    ``consumed``: the rank has finished every step before it (a Client asks for the next step
    while the trainer still computes on the current one). ``wait_s``: its last data-wait.
    """

    rank: int
    step: int
    consumed: int
    wait_s: float = 0.0


class TensorSpec(msgspec.Struct, frozen=True, array_like=True):
    name: str
    dtype: str
    shape: tuple[int, ...]


class Batch(_Msg, frozen=True, tag=int(Kind.BATCH)):
    """Constructor → Client: the ``tensors`` a trainer gets, carried by ``frames``
    (``msd.wire.compact``: token ids narrowed, labels and position ids as the little that does
    not follow from the token ids). One buffer follows: the frames back to back, in order, each
    starting at a multiple of `FRAME_ALIGN` bytes (`frame_offsets`); one buffer, not one per
    frame, as each ZeroMQ frame costs more to send than a few kilobytes do."""

    step: int
    tensors: tuple[TensorSpec, ...]
    frames: tuple[TensorSpec, ...]


FRAME_ALIGN = 8  # a frame of a Batch's buffer starts at a multiple of this (aligned arrays)


def frame_offsets(frames: Sequence[TensorSpec]) -> list[int]:
    """Where each of ``frames`` starts in a Batch's buffer, then the buffer's length."""
    offsets, at = [], 0
    for spec in frames:
        offsets.append(at)
        size = int(np.prod(spec.shape, dtype=np.float64)) * np.dtype(spec.dtype).itemsize
        at += -(-size // FRAME_ALIGN) * FRAME_ALIGN
    return [*offsets, at]


class Ended(_Msg, frozen=True, tag=int(Kind.ENDED)):
    """Constructor → Client: the stream ended after ``num_steps`` steps."""

    num_steps: int


class Refused(_Msg, frozen=True, tag=int(Kind.REFUSED)):
    """Any server → its peer: the request cannot be served, and why (one sentence)."""

    reason: str


class Progress(_Msg, frozen=True, tag=int(Kind.PROGRESS)):
    """Constructor → Planner: every served rank has consumed all steps before ``consumed``.

    ``step_bytes``: the most bytes one step's ready batches took in the Constructor;
    ``built``: every step before it is built.
    """

    consumed: int
    waits_s: tuple[float, ...] = ()
    step_bytes: int = 0
    built: int = 0


class StatusRequest(_Msg, frozen=True, tag=int(Kind.STATUS_REQUEST)):
    pass


class Status(_Msg, frozen=True, tag=int(Kind.STATUS)):
    """Planner → anyone asking: a snapshot of the job; ``view`` is what ``msd status`` shows
    (``msd.wire.views``)."""

    state: str
    planned: int
    consumed: int
    steps: int | None
    elapsed_s: float
    tokens_consumed: int
    source_names: tuple[str, ...]
    source_samples: tuple[int, ...]
    wait_p50_ms: float
    wait_p99_ms: float
    truncated: int
    roles: tuple[tuple[str, str, int], ...]
    failure: str = ""
    split: int = 0
    dropped: int = 0
    constructor_step_bytes: int = 0
    lifecycle: dict[str, int] = {}
    view: StatusView | None = None
    truncated_tokens: tuple[int, ...] = ()  # per source: tokens truncation cut off
    empty: int = 0  # samples delivered holding no tokens (null or empty text)
    images: int = 0  # images delivered
    skipped_images: tuple[int, ...] = ()  # per source: images of delivered samples left out
    trained_tokens: tuple[int, ...] = ()  # per source: tokens of delivered samples trained on


class SourceLoad(msgspec.Struct, frozen=True, array_like=True):
    """What one loader process did for one source since it started."""

    source: int
    samples_read: int
    tokens_read: int
    held_samples: int
    held_tokens: int
    errors: int = 0
    busy_s: float = 0.0  # wall time spent reading and tokenizing it
    images_read: int = 0
    # (what, how many): images and samples left out as they were read, e.g. an undecodable image
    skipped: tuple[tuple[str, int], ...] = ()
    videos_read: int = 0
    video_s: float = 0.0  # seconds of video decoded
    video_cpu_s: float = 0.0  # CPU time those decodes took


class RankLoad(msgspec.Struct, frozen=True, array_like=True):
    """One trainer rank as its Constructor sees it: steps consumed, batches built ahead of it,
    and its data-wait over the recent steps."""

    rank: int
    consumed: int
    ahead: int
    wait_p50_ms: float
    wait_p99_ms: float


class Stats(_Msg, frozen=True, tag=int(Kind.STATS)):
    """Loader or Constructor → Planner, about once a second: how the process is doing.

    ``cpu_s``: CPU seconds the process has used; ``pss_bytes``: its proportional set size.
    """

    role: str
    name: str
    node: str
    pid: int
    cpu_s: float
    pss_bytes: int
    sources: tuple[SourceLoad, ...] = ()
    ranks: tuple[RankLoad, ...] = ()
    ready_bytes: int = 0
    rejected: dict[str, int] = {}  # messages dropped since the process started, by reason
    relayed: int = 0  # a Constructor: payload messages it passed on to others (and their bytes)
    relayed_bytes: int = 0
    # A loader reading through a local cache (msd.sources.cache): blocks read from it, blocks
    # fetched from the store, and the bytes fetched.
    cache_hits: int = 0
    cache_misses: int = 0
    cache_fetched_bytes: int = 0
    payload_bytes: int = 0  # a Constructor: payloads held for steps not built yet


class SetMix(_Msg, frozen=True, tag=int(Kind.SET_MIX)):
    """Control → Planner: from step ``at_step`` on (-1: the first step not yet planned), the
    named sources take these weights; the others keep their course."""

    weights: dict[str, float]
    at_step: int = -1


class MixSet(_Msg, frozen=True, tag=int(Kind.MIX_SET)):
    """Planner → control: the change is recorded in the job's mix history and applies from
    ``at_step``."""

    at_step: int
    weights: dict[str, float]


class Rescale(_Msg, frozen=True, tag=int(Kind.RESCALE)):
    """Control → Planner: read ``source`` with ``loaders`` loader processes from now on."""

    source: str
    loaders: int


class Rescaling(_Msg, frozen=True, tag=int(Kind.RESCALING)):
    """Planner → control: generation ``generation`` of the source's loaders is starting (its
    processes are named in ``JOB/loaders.json``)."""

    source: str
    generation: int
    loaders: int


class Cut(_Msg, frozen=True, tag=int(Kind.CUT)):
    """Planner → the current loaders of ``source``: open no new visit of it; say which is
    your next."""

    source: int


class CutAt(_Msg, frozen=True, tag=int(Kind.CUT_AT)):
    """Loader → Planner: the first visit of ``source`` this shard has not opened."""

    source: int
    visit: int


class GenerationStart(_Msg, frozen=True, tag=int(Kind.GENERATION_START)):
    """Planner → every loader of ``source``: generation ``generation`` reads from visit
    ``start`` on; older shards finish the visits before it, then retire."""

    source: int
    generation: int
    start: int


class Retired(_Msg, frozen=True, tag=int(Kind.RETIRED)):
    """Loader → Planner: every shard of this process was replaced and holds nothing; it
    exits."""

    name: str


class TakeCheckpoint(_Msg, frozen=True, tag=int(Kind.TAKE_CHECKPOINT)):
    """Control → Planner: snapshot the state at the step every rank has consumed, now."""


class CheckpointTaken(_Msg, frozen=True, tag=int(Kind.CHECKPOINT_TAKEN)):
    """Planner → control: the snapshot of ``step`` is at ``path`` (``bytes`` long, written in
    ``seconds``)."""

    step: int
    path: str
    bytes: int
    seconds: float


class Behind(_Msg, frozen=True, tag=int(Kind.BEHIND)):
    """Constructor → Client: every rank of its group consumed ``step`` already (the Constructor
    serves from ``first`` on); a trainer restored an earlier checkpoint of its own."""

    step: int
    first: int


class Rewind(_Msg, frozen=True, tag=int(Kind.REWIND)):
    """Client → Planner: continue the stream from ``step``, consumed already (the data plane
    restarts from its checkpoints at that step)."""

    step: int


class Rewinding(_Msg, frozen=True, tag=int(Kind.REWINDING)):
    """Planner → Client: the data plane restarts at ``step``."""

    step: int


class Adopt(_Msg, frozen=True, tag=int(Kind.ADOPT)):
    """Planner → a shadow: become loader ``name`` (lost); read its shards from positions
    ``first`` (one per source of it) on."""

    name: str
    first: tuple[int, ...]


class LoaderLost(_Msg, frozen=True, tag=int(Kind.LOADER_LOST)):
    """Launcher → Planner: the process of loader ``name`` has died."""

    name: str


class Stop(_Msg, frozen=True, tag=int(Kind.STOP)):
    reason: str = ""


class Failure(_Msg, frozen=True, tag=int(Kind.FAILURE)):
    """Any role → Planner: it failed; travels as data so status and the launcher can show it."""

    role: str
    name: str
    error: str
    traceback: str = ""


class Arrive(_Msg, frozen=True, tag=int(Kind.ARRIVE)):
    """Demo trainer rank → rank 0: it finished ``step`` (-1: it started) and waits for the
    others, as a data-parallel gradient all-reduce waits (``msd.trainer.barrier``)."""

    rank: int
    step: int


class Release(_Msg, frozen=True, tag=int(Kind.RELEASE)):
    """Rank 0 → every demo trainer rank: all ranks arrived at ``step``; go on."""

    step: int


Message = Union[  # noqa: UP007 - msgspec needs a runtime Union of the tagged structs
    Hello,
    Welcome,
    Meta,
    Route,
    Want,
    Payload,
    Plan,
    End,
    Get,
    Batch,
    Ended,
    Refused,
    Progress,
    StatusRequest,
    Status,
    Stop,
    Failure,
    Stats,
    SetMix,
    MixSet,
    Rescale,
    Rescaling,
    Cut,
    CutAt,
    GenerationStart,
    Retired,
    TakeCheckpoint,
    CheckpointTaken,
    Behind,
    Rewind,
    Rewinding,
    Adopt,
    LoaderLost,
    Arrive,
    Release,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message, buffers: Sequence[Any] = ()) -> list[Any]:
    """Frames for one message: the header, then the raw buffers."""
    return [_encoder.encode(msg), *buffers]


def decode(frames: Sequence[Any]) -> tuple[Message, list[memoryview]]:
    """Header and buffers of one message (buffers are views on the received frames)."""
    if not frames:
        raise ProtocolError("received an empty message")
    try:
        msg = _decoder.decode(_as_bytes(frames[0]))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"received a malformed message header: {exc}") from None
    buffers = [_as_view(f) for f in frames[1:]]
    _check_buffers(msg, buffers)
    return msg, buffers


def _as_bytes(frame: Any) -> bytes | memoryview:
    return memoryview(frame.buffer if hasattr(frame, "buffer") else frame)


def _as_view(frame: Any) -> memoryview:
    return memoryview(frame.buffer if hasattr(frame, "buffer") else frame)


# The dtypes a batch tensor may have on the wire (a dtype string is never handed to numpy
# unchecked: numpy parses structured and object dtypes from strings too).
TENSOR_DTYPES = frozenset(
    {"int64", "int32", "int16", "uint32", "uint16", "uint8", "float32", "float16", "bool"}
)


def _check_columns(msg: Route | Plan) -> None:
    """A Route's or Plan's columns: as long as each other, no entry negative (but a Route's
    ``DISCARD`` destination)."""
    if isinstance(msg, Route):
        columns = {"source": msg.source, "gpos": msg.gpos, "constructor": msg.constructor}
    else:
        columns = {f: getattr(msg, f) for f in PLAN_COLUMNS}
    name = type(msg).__name__
    if len({len(c) for c in columns.values()}) > 1:
        shown = ", ".join(f"{len(c)} {f}" for f, c in columns.items())
        raise ProtocolError(f"a {name} has columns of different lengths: {shown}")
    if msg.step < 0:
        raise ProtocolError(f"a {name} for step {msg.step}")
    for f, c in columns.items():
        if c and min(c) < (DISCARD if f == "constructor" else 0):
            raise ProtocolError(f"a {name} has {f} {min(c)}")


def _check_buffers(msg: Message, buffers: list[memoryview]) -> None:
    if isinstance(msg, Route | Plan):
        _check_columns(msg)
    if isinstance(msg, Meta):
        _check_meta(msg)
    if isinstance(msg, Payload):
        expected = 2 if msg.images else 1
        _check_payload(msg, buffers)
    elif isinstance(msg, Batch):
        expected = 1
        for spec in (*msg.tensors, *msg.frames):
            _check_spec(spec, "tensor" if spec in msg.tensors else "frame")
        size = frame_offsets(msg.frames)[-1]
        if buffers and buffers[0].nbytes != size:
            raise ProtocolError(f"a batch's frames take {buffers[0].nbytes} bytes, expected {size}")
        if len({s.name for s in msg.frames}) < len(msg.frames):
            raise ProtocolError("a batch carries two frames of one name")
    else:
        expected = 0
    if len(buffers) != expected:
        name = type(msg).__name__
        raise ProtocolError(f"{name} carries {len(buffers)} buffers, expected {expected}")


def _check_spec(spec: TensorSpec, what: str) -> None:
    if spec.dtype not in TENSOR_DTYPES or any(n < 0 for n in spec.shape):
        raise ProtocolError(f"{what} {spec.name!r} has dtype {spec.dtype!r}, {spec.shape}")


def _check_payload(msg: Payload, buffers: list[memoryview]) -> None:
    n = len(msg.gpos)
    if len(msg.source) != n or len(msg.lengths) != n:
        raise ProtocolError(
            f"a payload lists {len(msg.source)} sources, {n} positions, {len(msg.lengths)} lengths"
        )
    if msg.step < 0 or any(x < 0 for x in msg.lengths) or any(g < 0 for g in msg.gpos):
        raise ProtocolError("a payload has a negative step, position or length")
    if msg.to and (len(msg.to) != n or min(msg.to) < 0):
        raise ProtocolError(f"a payload of {n} samples names {len(msg.to)} destinations")
    if msg.token_dtype not in TOKEN_DTYPES:
        raise ProtocolError(f"a payload has tokens of type {msg.token_dtype!r}")
    if buffers and buffers[0].nbytes != np.dtype(msg.token_dtype).itemsize * sum(msg.lengths):
        raise ProtocolError(f"a payload of {n} samples does not match its buffer")
    _check_trained(msg)
    if not msg.images:
        if msg.grids or msg.videos:
            raise ProtocolError("a payload without images lists image grids")
        return
    if len(msg.images) != n or min(msg.images) < 0 or len(msg.grids) != 3 * sum(msg.images):
        raise ProtocolError(
            f"a payload of {n} samples lists {len(msg.images)} image counts and "
            f"{len(msg.grids)} grid values"
        )
    if msg.patch_values <= 0 or (msg.grids and min(msg.grids) <= 0):
        raise ProtocolError("a payload has an image grid or patch size below 1")
    if msg.videos and (len(msg.videos) != sum(msg.images) or not set(msg.videos) <= {0, 1}):
        raise ProtocolError(f"a payload of {sum(msg.images)} images flags {len(msg.videos)} videos")
    if not 1 <= msg.video_rows <= 64:
        raise ProtocolError(f"a payload's video patches take {msg.video_rows} rows each")
    grids = np.array(msg.grids, dtype=np.int64).reshape(-1, 3)
    if np.any(grids > 1 << 20):
        raise ProtocolError("a payload lists an image grid over 2**20 patches a side")
    size = int(np.sum(item_rows(msg, grids), dtype=np.float64)) * msg.patch_values
    if len(buffers) > 1 and buffers[1].nbytes != size:
        raise ProtocolError(f"a payload's images take {buffers[1].nbytes} bytes, expected {size}")


def _check_trained(msg: Payload | Meta) -> None:
    """Each sample's trained spans lie in its tokens, in order, apart."""
    what = type(msg).__name__.lower()
    if not msg.trained:
        if msg.spans:
            raise ProtocolError(f"a {what} lists trained spans without their counts")
        return
    n = len(msg.lengths)
    if len(msg.trained) != n or min(msg.trained) < 0 or 2 * sum(msg.trained) != len(msg.spans):
        raise ProtocolError(
            f"a {what} of {n} samples counts {len(msg.trained)} samples' trained spans and lists "
            f"{len(msg.spans)} span bounds"
        )
    at = 0
    for count, length in zip(msg.trained, msg.lengths, strict=True):
        bounds = msg.spans[at : at + 2 * count]
        at += 2 * count
        if any(b > c for b, c in itertools.pairwise((0, *bounds, length))):
            raise ProtocolError(f"a {what}'s trained spans are not ordered within their samples")


def _check_meta(msg: Meta) -> None:
    n = len(msg.lengths)
    if len(msg.sample_ids) != n or min((*msg.lengths, *msg.sample_ids, msg.gpos_start, 0)) < 0:
        raise ProtocolError(f"a Meta of {n} lengths has {len(msg.sample_ids)} ids, or one below 0")
    _check_trained(msg)
    if msg.images or msg.patches:
        if len(msg.images) != n or min(msg.images) < 0 or len(msg.patches) != sum(msg.images):
            raise ProtocolError(
                f"a Meta of {n} samples lists {len(msg.images)} image counts and "
                f"{len(msg.patches)} patch counts"
            )
        if msg.patches and min(msg.patches) < 1:
            raise ProtocolError("a Meta lists an image of no patches")
    if msg.image_rows and (len(msg.image_rows) != len(msg.patches) or min(msg.image_rows) < 0):
        raise ProtocolError(f"a Meta lists {len(msg.image_rows)} image rows")
    if msg.skipped and (len(msg.skipped) != n or min(msg.skipped) < 0):
        raise ProtocolError(f"a Meta of {n} samples lists {len(msg.skipped)} skipped counts")
    if msg.frames and (
        len(msg.frames) != len(msg.patches)
        or any(t < 1 or p % t for t, p in zip(msg.frames, msg.patches, strict=True))
    ):
        raise ProtocolError(
            f"a Meta lists {len(msg.frames)} frame counts that do not divide its patch counts"
        )
