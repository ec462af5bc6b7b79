"""The recipe: a typed, frozen tree, validated once at load (see `msd.recipe.load`).

Every field here is part of the user-facing RECIPE contract; the stream-relevant subset is
hashed into the job fingerprint (`stream_fingerprint`), so a checkpoint can tell whether it
belongs to a recipe. Each field's meaning is the docstring under it (its first paragraph a
one-line summary): docs/recipe.md and the recipe `msd init` writes are generated from them
(`msd.recipe.reference`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any, Literal

import msgspec

from msd.sources.stores import SCHEMES


class Transform(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How a row becomes tokens."""

    kind: Literal["bytes", "tokenizer", "function"] = "bytes"
    """How a cell becomes token ids: ``bytes``, ``tokenizer`` or ``function``.

    ``bytes``: its UTF-8 bytes are the ids; ``tokenizer``: a Hugging Face ``tokenizer.json``
    at ``path``; ``function``: ``function`` maps the cell to a sequence of ints."""
    path: str | None = None
    """The ``tokenizer.json`` of ``kind: tokenizer``."""
    function: str | None = None
    """``module:function`` mapping one cell to a list of ints (``kind: function``)."""
    bos: int | str | None = None
    """A token put before every document: an id, or a token's name.

    Put there before packing and splitting, so the Planner counts it; with ``kind:
    tokenizer`` it may name one of the tokenizer's tokens, e.g. ``"<|endoftext|>"``. A null
    or empty cell stays empty: no document."""
    eos: int | str | None = None
    """A token put after every document (where one ends), as ``bos``."""


Format = Literal["parquet", "webdataset", "jsonl", "arrow", "megatron"]
# A path's ending names its format when ``format`` is not set (else Parquet).
FORMAT_ENDINGS: tuple[tuple[tuple[str, ...], Format], ...] = (
    ((".parquet", ".pq"), "parquet"),
    ((".tar",), "webdataset"),
    (tuple(e + z for e in (".jsonl", ".ndjson", ".json") for z in ("", ".gz", ".zst")), "jsonl"),
    ((".arrow",), "arrow"),
    ((".idx", ".bin"), "megatron"),
)


@functools.lru_cache(maxsize=256)
def _saved_dataset(path: str, endpoint_url: str | None = None, anonymous: bool = False) -> bool:
    """``path`` is a folder ``datasets.save_to_disk`` wrote (asked once per path a process:
    ``data_format`` is read on the data path); a URL is asked of its store."""
    if path.startswith(tuple(SCHEMES)):
        from msd.sources import storage  # pyarrow: only where a path is remote

        try:
            return storage.is_file(
                storage.join(path, "state.json"), storage.Store(endpoint_url, anonymous)
            )
        except OSError:
            return False  # reported where the source is opened
    return os.path.isfile(os.path.join(os.path.expanduser(path), "state.json"))


class PinnedFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """A file of a source as ``msd launch`` found it (``Source.files``)."""

    path: str
    size: int
    mtime_ns: int


class Chat(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A source of conversations: each row's ``text_column`` cell is one (OpenAI / Hugging Face
    ``messages``: ``[{role, content}]``, or ShareGPT / LLaVA ``conversations``: ``[{from,
    value}]``; a list, its JSON, or an object holding it), rendered with the chat ``template``
    and tokenized with the source's tokenizer (docs/conversations.md)."""

    template: str
    """A ``tokenizer_config.json``, a ``.jinja`` file, or Jinja text."""
    loss: Literal["assistant", "all", "last"] = "assistant"
    """The tokens trained on: ``assistant``, ``all``, or ``last``.

    ``assistant``: those inside the template's ``{% generation %}`` blocks (the assistant
    turns and their end-of-turn tokens); ``all``; ``last``: the last assistant turn only."""
    system: str | None = None
    """The system prompt put first in a conversation that has none."""


class Clip(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Cut each video into clips of ``length_s`` seconds, one starting every ``stride_s``
    seconds, as many as fit whole; each clip is a sample of its own, with the video's text,
    sampled as a whole video would be. A video no longer than one clip is one sample. Samples
    holding more than one video are not cut."""

    length_s: float
    """Seconds of each clip."""
    stride_s: float | None = None
    """Seconds from one clip's start to the next (null: back to back)."""

    @property
    def stride(self) -> float:
        return self.length_s if self.stride_s is None else self.stride_s


class Cache(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Keep what sources on an object store read on local disk, so that a second epoch (or a
    restart, or another loader of the node) reads it from there (`msd.sources.cache`)."""

    dir: str
    """The folder; the processes of a node may share it.

    ``~`` and ``$VARS`` are expanded where the loaders run: ``$TMPDIR`` is a SLURM node's
    own."""
    max_bytes: int
    """The most bytes it holds; least recently used blocks go beyond it."""


class Source(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One data source: files matched by ``path`` (a glob), in one format."""

    name: str
    """The source's name, unique in the recipe.

    ``mix`` milestones, ``msd mix`` and ``msd status`` name it by this."""
    path: str
    """A glob of its files, or of objects by URL (``s3://``, ``gs://``, ``az://``).

    Also ``abfs[s]://``. A relative path is taken from the directory ``msd launch`` runs in;
    docs/sources.md has the formats and stores."""
    weight: float
    """Its share of the samples of each step (relative: need not sum to 1)."""
    format: Format | None = None
    """The files' format (unset: named by the path's ending).

    ``parquet``; ``webdataset`` (a sample = the members of one key; ``text_column`` names the
    text member's extension, default ``txt``; ``image_exts`` the image members'); ``jsonl``
    (one JSON object per line, ``.gz``/``.zst`` too; ``text_column`` or ``token_column`` is a
    key path, dots for nesting); ``arrow`` (Arrow IPC files, or the folder
    ``datasets.save_to_disk`` wrote); ``megatron`` (Megatron-LM ``.bin``/``.idx`` pairs, by
    ``.idx`` glob or prefix; a sample is a document; no column). Unset: named by the path's
    ending (``.parquet``, ``.tar``, ``.jsonl[.gz|.zst]``, ``.arrow``, ``.idx``/``.bin``; a
    folder holding ``state.json`` is ``arrow``), else ``parquet``."""
    text_column: str | None = None
    """The column of text; set it or ``token_column``.

    JSONL: a key path, dots for nesting; WebDataset: the text member's extension (default
    ``txt``)."""
    token_column: str | None = None
    """A column of ready token ids (a list of ints), instead of text."""
    image_column: str | None = None
    """A Parquet column of images: each sample is then text + images.

    Binary, the Hugging Face Image struct ``{bytes, path}``, or a list of either for
    interleaved documents; the text marks where each image goes (``vision.marker``)."""
    image_exts: tuple[str, ...] = ("jpg", "jpeg", "png", "webp")
    """The WebDataset members holding images, by extension."""
    video_column: str | None = None
    """A Parquet column of videos: each sample is then text + videos.

    Binary, a ``{bytes, path}`` struct, or a list of either; each video is marked in the text
    by ``video.marker``."""
    video_exts: tuple[str, ...] = ()
    """The WebDataset members holding videos: e.g. ``[mp4, webm, mkv, mov, gif]``."""
    clip: Clip | None = None
    """Cut this source's videos into clips, each a sample of its own.

    Its index then reads each video's header once (cached beside the WebDataset indexes) to
    count its clips."""
    chat: Chat | None = None
    """Its rows are conversations, rendered with a chat template.

    See docs/conversations.md."""
    transform: Transform = Transform()
    """How a row becomes tokens."""
    repeat: bool = True
    """Start a new, differently shuffled epoch when the source runs out."""
    loaders: int | Literal["auto"] | None = None
    """Its loader processes: a number, ``auto`` (see ``msd plan``), or unset.

    ``auto``: shared out by measured cost at launch. Unset: one of its own while the recipe's
    unset sources are few (at most the loader CPUs, and 4 at least), else as ``auto``, so that
    many sources do not mean as many processes. The stream does not change with it, nor with
    ``msd rescale`` mid-run."""
    shadows: int = 0
    """Hot-standby loaders: one takes a dead or hung loader's place at once.

    Each holds the source open; one takes over the work of a loader of it that dies or hangs
    (``loader.heartbeat_s``), and a new shadow is started."""
    endpoint_url: str | None = None
    """The object store's endpoint for a URL path (unset: the cloud's own).

    An S3-compatible store's for ``s3://`` (default: the AWS environment's
    ``AWS_ENDPOINT_URL``, else AWS), an emulator's for ``gs://`` (default:
    ``STORAGE_EMULATOR_HOST``, else Google's) or for ``az://``/``abfs[s]://``
    (``http://HOST:PORT``: Azurite); credentials come from each cloud's standard chain
    (docs/sources.md)."""
    anonymous: bool = False
    """Read a public bucket or container unsigned."""
    cache: Cache | None = None
    """Keep what it reads from an object store on local disk.

    Default: the job's ``cache``; a local source ignores it."""
    group_rows: int | None = None
    """Rows per row group (the shuffle's unit) of a JSONL or Megatron source.

    JSONL's default: lines of about 1 MiB; Megatron's: about 2^20 tokens of documents. Set it
    to the row-group size of Parquet files holding the same rows for the same stream."""
    files: tuple[PinnedFile, ...] = ()
    """Written by ``msd launch``, not in recipes: the files ``path`` named when the job
    started, so that every role, and every restore, reads exactly those."""

    @property
    def data_format(self) -> Format:
        """``format``, or the one the path names (see the class)."""
        if self.format is not None:
            return self.format
        path = self.path.lower().rstrip("/")
        for endings, name in FORMAT_ENDINGS:
            if path.endswith(endings):
                return name
        saved = _saved_dataset(self.path, self.endpoint_url, self.anonymous)
        return "arrow" if saved else "parquet"

    @property
    def has_images(self) -> bool:
        """Its samples are text with images or videos (read by ``msd.sources.image_rows``)."""
        return self.data_format == "webdataset" or self.image_column is not None or self.has_videos

    @property
    def has_videos(self) -> bool:
        return self.video_column is not None or (
            self.data_format == "webdataset" and bool(self.video_exts)
        )


class Vision(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How the images of image sources become patches and placeholder tokens (Qwen2-VL's
    defaults): resized to sides that are multiples of ``patch_size × merge_size`` with an area
    in ``[min_pixels, max_pixels]``, cut into ``patch_size``² patches; each image takes
    ``patches / merge_size²`` tokens ``image_token_id`` at its ``marker`` in the text (without
    markers the images precede the text). docs/multimodal.md.
    """

    patch_size: int = 14
    """Images are cut into patch_size² patches ..."""
    merge_size: int = 2
    """... and take patches / merge_size² placeholder tokens each."""
    min_pixels: int = 56 * 56
    """The least area an image is resized to."""
    max_pixels: int = 14 * 14 * 4 * 1280
    """The most area an image is resized to (the default: 1,280 tokens)."""
    temporal_patch_size: int = 1
    """Frames per image patch: a patch holds 3 × this × patch_size² values."""
    image_token_id: int = 151655
    """The placeholder token, put where the text has ``marker``."""
    marker: str = "<image>"
    """Where an image goes in the text (without markers, before it)."""
    mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    """Per channel: ``Client(pixels="float")`` subtracts it.

    Of values scaled to [0, 1], then divided by ``std``."""
    std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    """Per channel: ``Client(pixels="float")`` divides by it."""
    decode: Literal["exact", "fast"] = "exact"
    """``exact``: JPEGs at full size (Hugging Face's pixels); ``fast``: scaled.

    ``exact`` decodes every JPEG at full size before resizing, as Hugging Face's Qwen2-VL
    processor does; ``fast`` decodes a JPEG at 1/2, 1/4 or 1/8 scale when that still covers the
    resized size (Pillow's draft mode: less CPU on large photos, slightly different pixels)."""

    @property
    def bytes_per_image_token(self) -> int:
        """The uint8 patch values one placeholder token stands for: merge_size² patches."""
        return self.merge_size**2 * self.patch_values

    @property
    def patch_values(self) -> int:
        """The uint8 values of one image patch: channels × frames × patch_size²."""
        return 3 * self.temporal_patch_size * self.patch_size**2


class Video(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How the videos of video sources become patches and placeholder tokens (Qwen2-VL's video
    processor's defaults; patch and merge sizes are ``vision``'s): ``fps`` frames sampled per
    second of the stream, between ``min_frames`` and ``max_frames``, rounded down to a multiple
    of ``temporal_patch_size`` (the last frame repeated to fill); each frame resized within
    ``min_pixels`` .. ``max_pixels``, and the whole video within ``total_pixels``. A video takes
    ``patches / merge_size²`` tokens ``video_token_id`` at its ``marker``.
    """

    fps: float = 2.0
    """Frames sampled per second of the stream."""
    min_frames: int = 4
    """The fewest frames sampled from a video."""
    max_frames: int = 768
    """The most frames sampled from a video."""
    temporal_patch_size: int = 2
    """Frames per patch; a multiple of ``vision.temporal_patch_size``."""
    min_pixels: int = 128 * 28 * 28
    """The least area a frame is resized to."""
    max_pixels: int = 768 * 28 * 28
    """The most area a frame is resized to."""
    total_pixels: int | None = None
    """A cap on the area of all a video's frames together (null: none)."""
    max_duration_s: float = 24 * 3600.0
    """A longer video is left out (counted)."""
    max_decode_pixels: int = 1 << 36
    """A video whose decode passes more pixels is left out (counted).

    Every frame up to its last sampled one counts, from its header: a bound on a decode's work
    that does not depend on the machine."""
    threads: int = 1
    """FFmpeg threads per decode (0: FFmpeg's choice)."""
    video_token_id: int = 151656
    """The placeholder token, put where the text has ``marker``."""
    marker: str = "<video>"
    """Where a video goes in the text."""

    @property
    def seconds_per_grid(self) -> float:
        """Seconds of video one temporal patch spans (Qwen2.5-VL's ``second_per_grid_ts``)."""
        return self.temporal_patch_size / self.fps


class Distribute(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The trainer topology (the paper's ClientPlaceTree): sizes of each parallel axis.

    TP peers share one copy of a batch, CP ranks get their load-balanced slices of every
    sequence, and only the first and last pipeline stages get token tensors.
    """

    dp: int = 1
    """Data-parallel ranks; each gets global_batch_tokens / dp tokens a step."""
    pp: int = 1
    """Pipeline stages: the first gets inputs, the last labels.

    The stages between get the batch's metadata only."""
    cp: int = 1
    """Context-parallel ranks: load-balanced slices of every sequence."""
    tp: int = 1
    """Tensor-parallel peers: they share one copy of each batch."""
    order: tuple[str, ...] = ("tp", "cp", "dp", "pp")
    """The axes, fastest-varying first (Megatron's order)."""
    pad_to: int = 0
    """Pad every sample to a multiple of this many tokens (0: 2 × cp).

    0 pads to 2 × cp, or not at all without CP. Padding decides which samples fit a step, so a
    checkpoint restores under another CP size when 2 × its cp divides this: set it to a
    multiple of each you may use."""


def pad_multiple(distribute: Distribute) -> int:
    """The multiple of tokens every sample is padded to."""
    if distribute.pad_to:
        return distribute.pad_to
    return 2 * distribute.cp if distribute.cp > 1 else 1


class Milestone(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """From ``step`` on (or, with linear interpolation, reached at ``step``), these weights."""

    step: int
    """The step the weights hold from (with ``linear``: are reached at)."""
    weights: dict[str, float]
    """Source name: weight; a source not named keeps its course."""


class Mix(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A per-source weight schedule over steps; each source starts at its ``weight``."""

    interpolate: Literal["linear", "step"] = "linear"
    """``linear`` ramps weights between milestones; ``step`` holds them."""
    milestones: tuple[Milestone, ...] = ()
    """Weights set from (or reached at) a step."""


class Cost(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Per-sample cost from metadata, what balancing evens out over ranks: ``attn·len² +
    lin·len``, or ``function``. A sample with images adds the vision encoder's cost,
    ``enc_attn·p² + enc_lin·p`` per image of ``p`` patches."""

    attn: float = 1.0
    """The cost of a sample's attention: attn·len²."""
    lin: float = 256.0
    """The cost of the rest of a sample: lin·len."""
    function: str | None = None
    """Instead, ``module:fn``: an int64 array of lengths to a float array of costs."""
    enc_attn: float = 1.0
    """The vision encoder's attention: enc_attn·p² per image of p patches."""
    enc_lin: float = 256.0
    """The rest of the vision encoder: enc_lin·p per image of p patches."""


class Balance(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How a global batch is split over DP ranks and micro-batches."""

    method: Literal["greedy", "karmarkar_karp", "none"] = "greedy"
    """``greedy``, ``karmarkar_karp``, or ``none`` (for comparison)."""
    long_samples: Literal["split", "truncate", "drop"] = "split"
    """``split``, ``truncate`` or ``drop`` samples longer than seq_len.

    ``split``: into pieces, each its own sequence (at most one step's rows of them; the rest
    is cut off). The counts and the tokens cut off are reported, and warned about before a
    run."""
    objective: Literal["sum", "backbone"] = "sum"
    """A rank's cost: ``sum`` of vision encoder and backbone, or ``backbone`` alone.

    Both run on every rank; ``backbone`` is what balancing by tokens gives."""
    max_patches: int | None = None
    """The most image patches in one micro-batch of a rank (null: no limit).

    What its vision encoder takes at once, like the token budget of a row: never exceeded."""


class Autoscale(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The Planner starts and retires loaders as each source's demand (its share of the mix,
    looked ``lead_s`` seconds ahead, times the trainers' pace) meets what its loaders were
    measured to supply; the stream does not change."""

    enabled: bool = False
    """Start and retire loaders as the sources' demand changes."""
    max_loaders: int | None = None
    """Loader processes in all (default: the Planner's node's CPUs)."""
    lead_s: float = 10.0
    """How far ahead in the mix schedule to look, in seconds."""
    headroom: float = 0.7
    """The share of a loader's measured capacity to plan on."""
    every_s: float = 2.0
    """Seconds between decisions."""


class LoaderOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Knobs shared by every Source Loader."""

    block_row_groups: int = 1
    """Row groups per shuffle block (a loader reads whole blocks)."""
    buffer_tokens: int | None = None
    """Read-ahead of the whole data plane, shared over the sources by share.

    Shared out by each source's largest share of the mix (at least ``seq_len`` tokens each);
    default ``prefetch_steps + 4`` global batches (a few MB: tokens are small next to row
    groups)."""
    buffer_bytes: int | None = None
    """Image bytes the loaders hold unrouted, shared out the same way.

    An image's bytes as stored until its sample is routed, or its patches where those are
    fewer; an image source stops reading ahead at whichever of this and ``buffer_tokens`` it
    reaches first. Default: a global batch of image tokens' patches (``global_batch_tokens ×
    merge_size² × 3·t·patch_size²``). The Planner asks for what it waits for whatever the
    budget, so a small one costs wait, never data."""
    sources_per_process: int | None = None
    """Sources with ``loaders: 1`` (or unset) one loader process serves.

    In recipe order, so that many light sources do not mean as many processes; unset: one,
    and sources without ``loaders`` are shared out as ``auto`` when there are many."""
    cpus: int | None = None
    """Loader processes the ``loaders: auto`` sources share.

    Default: this machine's CPUs; ``msd plan`` shows how they are shared out."""
    groups: tuple[tuple[str, ...], ...] = ()
    """Lists of sources (by name) that share a loader process.

    ``loaders: auto`` writes them into the job's recipe."""
    autoscale: Autoscale = Autoscale()
    """Start and retire loaders from demand, ahead of mix changes."""
    heartbeat_s: float = 3.0
    """A loader silent this long is taken for dead.

    Loaders report every second; a shadow of its source takes its work over."""
    read_retry_s: float = 60.0
    """How long a loader retries a read an object store fails, backing off.

    Throttling or a lost connection; after it the job stops naming the source (``msd
    restore`` continues it); every retry is counted in ``msd status`` and the metrics."""


class ConstructorOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The Data Constructors, one a trainer node, which build each rank's batches."""

    prefetch_steps: int = 4
    """Steps planned and built ahead of the slowest trainer rank."""
    fanout: int | None = 32
    """The most Constructors a loader sends to (null: every one, directly).

    With more nodes than this, the Constructors relay payloads through a tree with this many
    children each (``msd.plan.fanout``)."""


class MetricsOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the Planner publishes of the job's progress (docs/operating.md)."""

    port: int | None = 0
    """The Planner's Prometheus endpoint (0: any free port; null: none).

    A free port is published in ``JOB/endpoints/metrics``."""
    every_s: float = 5.0
    """Seconds between lines of ``JOB/metrics.jsonl`` (what ``msd report`` plots)."""


class CheckpointOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Snapshots of the data plane, what ``msd restore`` continues from (docs/checkpoints.md)."""

    every_steps: int = 100
    """A snapshot every this many consumed steps (0: on ``msd checkpoint`` only).

    Each consumed step in between is a line of the log."""
    keep: int = 3
    """Snapshots kept (older ones and their logs are deleted)."""
    enabled: bool = True
    """``false`` writes nothing (then ``recovery.restarts`` must be 0).

    A restart would have nothing to continue from."""


class RecoveryOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the launcher does when a role dies."""

    restarts: int = 3
    """How often a role killed by a signal is restarted before the job stops.

    A kill -9 or the OOM killer: a Planner, loader or Constructor restarts the data plane from
    its checkpoints at the step every rank has consumed; a trainer rank restarts every rank
    (they resume from their own checkpoints). A role that fails with an error is not
    restarted: it would fail again."""


class DemoTrainer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The built-in trainer: "computes" ``step_ms`` scaled by its batch's attention cost."""

    step_ms: float = 10.0
    """Simulated compute of a rank whose rows are all full-length samples."""
    save_batches: bool = False
    """Also write every batch it receives to the job folder (for inspection)."""


class Trainer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The trainer ranks msd starts, on this machine or on SLURM."""

    command: str = "demo"
    """``demo`` (built in), or a command run per rank: ``python train.py``."""
    ranks: int | None = None
    """Trainer ranks: if set, exactly dp × pp × cp × tp (the default)."""
    demo: DemoTrainer = DemoTrainer()
    """The built-in trainer's settings."""
    nodes: int = 1
    """SLURM nodes the ranks fill."""
    tasks_per_node: int | None = None
    """Ranks on each SLURM node (default: all ranks over ``nodes``, evenly)."""
    gpus_per_node: int = 0
    """GPUs requested per SLURM node."""


class SlurmRole(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one role's SLURM job asks for."""

    cpus: int = 1
    """CPUs per task."""
    mem_gb: float | None = None
    """Memory in GB (null: the partition's default)."""
    partition: str | None = None
    """Overrides the job-wide partition (e.g. loaders on a CPU partition)."""


class Slurm(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where and how the roles are submitted with ``cluster: slurm`` (via submitit)."""

    partition: str | None = None
    """The partition the roles are submitted to (null: SLURM's default)."""
    account: str | None = None
    """The account charged (sbatch ``--account``)."""
    qos: str | None = None
    """The quality of service (sbatch ``--qos``)."""
    time_min: int = 60
    """Each SLURM job's time limit, in minutes."""
    constraint: str | None = None
    """Node features required (sbatch ``--constraint``)."""
    planner: SlurmRole = SlurmRole(mem_gb=2.0)
    """What the Planner's job asks for."""
    loader: SlurmRole = SlurmRole(mem_gb=4.0)
    """What each loader process's job asks for."""
    constructor: SlurmRole = SlurmRole(cpus=2)
    """What each task of the trainer job asks for.

    Its tasks are the trainer ranks and each node's Constructor."""
    additional: dict[str, str | int] = {}
    """Passed to sbatch as is: ``{exclusive: ""}`` becomes ``--exclusive``."""


class Recipe(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A whole job. Without a ``trainer`` section msd starts the data plane only; the user's own
    job starts the trainers and, on each node, a Constructor with ``msd sidecar``."""

    sources: tuple[Source, ...]
    """The data sources (at least one)."""
    seq_len: int
    """Tokens per packed row."""
    global_batch_tokens: int
    """Token capacity of one global step: a multiple of dp × seq_len."""
    name: str = "msd-job"
    """Job folders are called NAME-DATE-TIME under ``--run-dir`` (./runs)."""
    seed: int = 0
    """The same recipe and seed give the same batches, byte for byte."""
    steps: int | None = None
    """Steps to run; omit only if every source has ``repeat: false``.

    Then the job runs until every source has run out: one epoch."""
    micro_batch_size: int = 1
    """Rows per micro-batch (rows per DP rank must be a multiple)."""
    distribute: Distribute = Distribute()
    """The trainer topology; ranks = dp × pp × cp × tp."""
    mix: Mix = Mix()
    """Weights as a schedule over steps (curriculum)."""
    cost: Cost = Cost()
    """Per-sample cost, what balancing evens out over ranks."""
    balance: Balance = Balance()
    """How a global batch is split over DP ranks and micro-batches.

    See docs/balance.md."""
    vision: Vision = Vision()
    """How images become patches and tokens (Qwen2-VL's defaults)."""
    video: Video = Video()
    """How videos become patches and tokens (Qwen2-VL's defaults)."""
    loader: LoaderOptions = LoaderOptions()
    """Knobs shared by every Source Loader."""
    constructor: ConstructorOptions = ConstructorOptions()
    """The Data Constructors (one a trainer node), which build the batches."""
    metrics: MetricsOptions = MetricsOptions()
    """Prometheus endpoint and ``JOB/metrics.jsonl``."""
    checkpoint: CheckpointOptions = CheckpointOptions()
    """Data-plane snapshots, what ``msd restore`` continues from."""
    recovery: RecoveryOptions = RecoveryOptions()
    """Restarts of a role killed by a signal."""
    trainer: Trainer | None = None
    """The trainers msd starts; without it, the data plane only.

    Then the user's own job starts the trainers and, on each node, a Constructor with ``msd
    sidecar``."""
    cluster: Literal["local", "slurm"] = "local"
    """``local``: every role a process here; ``slurm``: placed with submitit."""
    slurm: Slurm = Slurm()
    """With ``cluster: slurm``: partitions and resources per role.

    recipes/slurm.yaml shows them."""
    cache: Cache | None = None
    """Keep what sources on an object store read on local disk.

    The cache of every source on an object store that sets none of its own
    (docs/sources.md)."""

    @property
    def world_size(self) -> int:
        d = self.distribute
        return d.dp * d.pp * d.cp * d.tp

    @property
    def ranks_per_node(self) -> int:
        """Trainer ranks on each of ``trainer.nodes`` nodes: ``tasks_per_node``, else the ranks
        shared out evenly (a valid recipe's nodes hold exactly ``world_size``)."""
        trainer = self.trainer or Trainer()
        return trainer.tasks_per_node or -(-self.world_size // max(1, trainer.nodes))

    @property
    def rows_per_rank(self) -> int:
        """Packed rows of ``seq_len`` tokens each DP rank receives per step."""
        return self.global_batch_tokens // (self.distribute.dp * self.seq_len)

    @property
    def has_images(self) -> bool:
        return any(s.has_images for s in self.sources)

    @property
    def has_videos(self) -> bool:
        return any(s.has_videos for s in self.sources)

    @property
    def has_masks(self) -> bool:
        """Some source's samples take the loss on some of their tokens only (conversations):
        its batches carry ``loss_mask``."""
        return any(s.chat is not None for s in self.sources)

    @property
    def video_rows_per_patch(self) -> int:
        """Rows of ``vision``'s patch width one video patch takes on the data path (a video
        patch holds ``video.temporal_patch_size`` frames, an image patch
        ``vision.temporal_patch_size``)."""
        return self.video.temporal_patch_size // self.vision.temporal_patch_size

    @property
    def micro_batches(self) -> int:
        return self.rows_per_rank // self.micro_batch_size

    @property
    def loader_buffer_tokens(self) -> int:
        default = (self.constructor.prefetch_steps + 4) * self.global_batch_tokens
        return self.loader.buffer_tokens or default

    @property
    def bytes_per_visual_token(self) -> int:
        """The most uint8 patch values one placeholder token (of an image or a video) stands for."""
        per_token = self.vision.bytes_per_image_token
        return per_token * self.video_rows_per_patch if self.has_videos else per_token

    @property
    def loader_buffer_bytes(self) -> int:
        per_token = self.bytes_per_visual_token
        return self.loader.buffer_bytes or self.global_batch_tokens * per_token


def _transform_key(transform: Transform) -> dict[str, Any]:
    """What a transform adds to the fingerprint: ``bos``/``eos`` only where set, so recipes
    without them keep their hash."""
    key: dict[str, Any] = msgspec.to_builtins(transform)
    return {k: v for k, v in key.items() if v is not None or k not in ("bos", "eos")}


def stream_fingerprint(recipe: Recipe) -> str:
    """Hash of everything that decides the sample stream (not loader counts, not placement)."""
    stream = {
        "seed": recipe.seed,
        "seq_len": recipe.seq_len,
        "global_batch_tokens": recipe.global_batch_tokens,
        "block_row_groups": recipe.loader.block_row_groups,
        "mix": msgspec.to_builtins(recipe.mix),
        "sources": [
            {
                "name": s.name,
                "weight": s.weight,
                "text_column": s.text_column,
                "token_column": s.token_column,
                "transform": _transform_key(s.transform),
                "repeat": s.repeat,
                # Image fields only where a source has images, the format where it is not
                # Parquet: Parquet text recipes keep their hash.
                **(
                    {"format": s.data_format, "image_column": s.image_column, "exts": s.image_exts}
                    if s.has_images
                    else {}
                ),
                **(
                    {"video_column": s.video_column, "video_exts": s.video_exts}
                    if s.has_videos
                    else {}
                ),
                **({"clip": msgspec.to_builtins(s.clip)} if s.clip is not None else {}),
                **({"chat": msgspec.to_builtins(s.chat)} if s.chat is not None else {}),
                **({"group_rows": s.group_rows} if s.group_rows is not None else {}),
                **(
                    {"format": s.data_format}
                    if not s.has_images and s.data_format != "parquet"
                    else {}
                ),
            }
            for s in recipe.sources
        ],
    }
    if recipe.has_images:
        stream["vision"] = _vision_fields(recipe.vision)
        if recipe.balance.max_patches is not None:
            stream["max_patches"] = recipe.balance.max_patches
    if recipe.has_videos:
        stream["video"] = msgspec.to_builtins(recipe.video)
    blob = json.dumps(stream, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _vision_fields(vision: Vision) -> dict[str, object]:
    """``vision`` as hashed: ``decode`` only when ``fast``, so that a recipe written before the
    key keeps its hash under the default, and its checkpoints restore (decoding exactly from
    then on)."""
    fields: dict[str, object] = msgspec.to_builtins(vision)
    if vision.decode == "exact":
        del fields["decode"]
    return fields


def to_json(recipe: Recipe) -> bytes:
    return msgspec.json.encode(recipe)


def from_json(blob: bytes) -> Recipe:
    return msgspec.json.decode(blob, type=Recipe)
