"""The recipe: a typed, frozen tree, validated once at load (see `msd.recipe.load`).

Every field here is part of the user-facing RECIPE contract; the stream-relevant subset is
hashed into the job fingerprint (`stream_fingerprint`), so a checkpoint can tell whether it
belongs to a recipe.
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
    """How a row becomes tokens.

    kind: ``bytes`` (UTF-8 bytes are the token ids), ``tokenizer`` (a HuggingFace
    ``tokenizer.json`` at ``path``) or ``function`` (``module:function`` mapping one cell to a
    sequence of ints).
    bos, eos: a token put before (after) every document, before packing and splitting, so the
    Planner counts it: an id, or (``tokenizer``) the name of one of the tokenizer's tokens,
    e.g. ``"<|endoftext|>"``. A null or empty cell stays empty: no document.
    """

    kind: Literal["bytes", "tokenizer", "function"] = "bytes"
    path: str | None = None
    function: str | None = None
    bos: int | str | None = None
    eos: int | str | None = None


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
    (a ``tokenizer_config.json``, a ``.jinja`` file, or the Jinja text itself) and tokenized
    with the source's tokenizer. ``loss``: the tokens trained on: ``assistant`` (those inside
    the template's ``{% generation %}`` blocks: the assistant turns and their end-of-turn
    tokens), ``all``, or ``last`` (the last assistant turn only). ``system``: the system prompt
    put first in a conversation that has none."""

    template: str
    loss: Literal["assistant", "all", "last"] = "assistant"
    system: str | None = None


class Clip(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Cut each video into clips of ``length_s`` seconds, one starting every ``stride_s``
    seconds (None: ``length_s``, back to back), as many as fit whole; each clip is a sample of
    its own, with the video's text, sampled as a whole video would be. A video no longer than
    one clip is one sample. Samples holding more than one video are not cut."""

    length_s: float
    stride_s: float | None = None

    @property
    def stride(self) -> float:
        return self.length_s if self.stride_s is None else self.stride_s


class Cache(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Keep what sources on an object store read on local disk, so that a second epoch (or a
    restart, or another loader of the node) reads it from there (`msd.sources.cache`).

    dir: the folder (``~`` and ``$VARS`` are expanded where the loaders run: ``$TMPDIR`` is a
        SLURM node's own); the processes of a node may share it. max_bytes: the most it holds;
        least recently used blocks are deleted beyond it.
    """

    dir: str
    max_bytes: int


class Source(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One data source: files matched by ``path`` (a glob), in one format.

    format: ``parquet``; ``webdataset`` (a sample = the members of one key; ``text_column``
        names the text member's extension, default ``txt``; ``image_exts`` the image members');
        ``jsonl`` (one JSON object per line, ``.gz``/``.zst`` too; ``text_column`` or
        ``token_column`` is a key path, dots for nesting); ``arrow`` (Arrow IPC files, or the
        folder ``datasets.save_to_disk`` wrote); ``megatron`` (Megatron-LM ``.bin``/``.idx``
        pairs, by ``.idx`` glob or prefix; a sample is a document; no column). Unset: named by
        the path's ending (``.parquet``, ``.tar``, ``.jsonl[.gz|.zst]``, ``.arrow``,
        ``.idx``/``.bin``; a folder holding ``state.json`` is ``arrow``), else ``parquet``.
    image_column: a Parquet column of images (binary, the Hugging Face Image struct
        ``{bytes, path}``, or a list of either for interleaved documents); with it each sample
        is text + images, the text marking where each image goes (``vision.marker``).
    video_column, video_exts: a Parquet column of videos (binary, a ``{bytes, path}`` struct, or a
        list of either), or the WebDataset members holding videos (e.g. ``[mp4, webm, mkv, mov,
        gif]``; none by default); each marked in the text by ``video.marker``.
    clip: cut this source's videos into clips, each a sample (`Clip`); its index then reads
        each video's header once (cached beside the WebDataset indexes) to count its clips.
    chat: its rows are conversations, rendered with a chat template (`Chat`).
    loaders: the loader processes that read it: a number, ``auto`` (shared out by measured
        cost at launch: ``msd plan`` shows how), or unset: one of its own while the recipe's
        unset sources are few (at most the loader CPUs, and 4 at least), else as ``auto``, so
        that many sources do not mean as many processes.
    shadows: hot-standby loader processes with the source open; one takes over the work of a
        loader of it that dies or hangs (``loader.heartbeat_s``), and a new shadow is started.
    endpoint_url: the object store's endpoint for a URL path: an S3-compatible store's for
        ``s3://`` (default: the AWS environment's ``AWS_ENDPOINT_URL``, else AWS), an
        emulator's for ``gs://`` (default: ``STORAGE_EMULATOR_HOST``, else Google's) or for
        ``az://``/``abfs[s]://`` (``http://HOST:PORT``: Azurite); credentials come from each
        cloud's standard chain (docs/sources.md). anonymous: read a public bucket or
        container unsigned.
    cache: keep what it reads from an object store on local disk (`Cache`; default: the
        job's ``cache``); a local source ignores it.
    group_rows: rows per row group (the shuffle's unit) for formats that cut their own: JSONL
        (default: lines of about 1 MiB) and Megatron (default: about 2^20 tokens of documents).
        Set it to the row-group size of Parquet files holding the same rows for the same stream.
    files: written by ``msd launch``, not in recipes: the files ``path`` named when the job
        started, so that every role, and every restore, reads exactly those.
    """

    name: str
    path: str
    weight: float
    format: Format | None = None
    text_column: str | None = None
    token_column: str | None = None
    image_column: str | None = None
    image_exts: tuple[str, ...] = ("jpg", "jpeg", "png", "webp")
    video_column: str | None = None
    video_exts: tuple[str, ...] = ()
    clip: Clip | None = None
    chat: Chat | None = None
    transform: Transform = Transform()
    repeat: bool = True
    loaders: int | Literal["auto"] | None = None
    shadows: int = 0
    endpoint_url: str | None = None
    anonymous: bool = False
    cache: Cache | None = None
    group_rows: int | None = None
    files: tuple[PinnedFile, ...] = ()

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
    markers the images precede the text). ``mean``/``std``: what ``Client(pixels="float")``
    normalises with (per channel, of values in [0, 1]). ``decode``: ``exact`` decodes every JPEG
    at full size before resizing, as Hugging Face's Qwen2-VL processor does; ``fast`` decodes a
    JPEG at 1/2, 1/4 or 1/8 scale when that still covers the resized size (Pillow's draft mode:
    less CPU on large photos, slightly different pixels).
    """

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 1280
    temporal_patch_size: int = 1
    image_token_id: int = 151655
    marker: str = "<image>"
    mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    decode: Literal["exact", "fast"] = "exact"

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
    ``min_pixels`` .. ``max_pixels``, and the whole video within ``total_pixels`` (None: no cap).
    A video takes ``patches / merge_size²`` tokens ``video_token_id`` at its ``marker``.
    ``max_duration_s``: a longer video is left out (counted); so is one whose decode would pass
    through more than ``max_decode_pixels`` pixels (every frame up to its last sampled one, from
    its header: a bound on a decode's work that does not depend on the machine). ``threads``:
    FFmpeg threads per decode (0: FFmpeg's choice).
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    temporal_patch_size: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    total_pixels: int | None = None
    max_duration_s: float = 24 * 3600.0
    max_decode_pixels: int = 1 << 36
    threads: int = 1
    video_token_id: int = 151656
    marker: str = "<video>"

    @property
    def seconds_per_grid(self) -> float:
        """Seconds of video one temporal patch spans (Qwen2.5-VL's ``second_per_grid_ts``)."""
        return self.temporal_patch_size / self.fps


class Distribute(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The trainer topology (the paper's ClientPlaceTree): sizes of each parallel axis.

    ``order`` lists the axes fastest-varying first; the default is Megatron's. TP peers share one
    copy of a batch, CP ranks get their load-balanced slices of every sequence, and only the
    first and last pipeline stages get token tensors.
    """

    dp: int = 1
    pp: int = 1
    cp: int = 1
    tp: int = 1
    order: tuple[str, ...] = ("tp", "cp", "dp", "pp")
    # Pad every sample to a multiple of this many tokens; 0: 2 × cp (CP's load-balanced halves),
    # 1 without CP. Padding decides which samples fit a step, so a checkpoint restores under
    # another CP size when 2 × its cp divides this: set it to a multiple of each you may use.
    pad_to: int = 0


def pad_multiple(distribute: Distribute) -> int:
    """The multiple of tokens every sample is padded to."""
    if distribute.pad_to:
        return distribute.pad_to
    return 2 * distribute.cp if distribute.cp > 1 else 1


class Milestone(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """From ``step`` on (or, with linear interpolation, reached at ``step``), these weights."""

    step: int
    weights: dict[str, float]


class Mix(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A per-source weight schedule over steps; each source starts at its ``weight``.

    interpolate: ``linear`` ramps each source's weight between its milestones (curriculum);
    ``step`` holds it until the next milestone (piecewise constant).
    """

    interpolate: Literal["linear", "step"] = "linear"
    milestones: tuple[Milestone, ...] = ()


class Cost(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Per-sample cost from metadata: ``attn·len² + lin·len``, or ``function`` (``module:fn``)
    mapping an int64 array of lengths to a float array of costs. A sample with images adds
    the vision encoder's cost, ``enc_attn·p² + enc_lin·p`` per image of ``p`` patches."""

    attn: float = 1.0
    lin: float = 256.0
    function: str | None = None
    enc_attn: float = 1.0
    enc_lin: float = 256.0


class Balance(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How a global batch is split over DP ranks and micro-batches.

    long_samples: a sample longer than ``seq_len`` is ``split`` into pieces (each its own
    sequence; at most one step's rows of them, the rest is cut off), ``truncate``d, or
    ``drop``ped; the counts and the tokens cut off are reported, and warned about before a run.
    """

    method: Literal["greedy", "karmarkar_karp", "none"] = "greedy"
    long_samples: Literal["split", "truncate", "drop"] = "split"
    # What a rank's cost is: ``sum`` of the vision encoder's and the backbone's (both run on
    # every rank), or the ``backbone``'s alone (what balancing by tokens gives).
    objective: Literal["sum", "backbone"] = "sum"
    # The most image patches one micro-batch of a rank holds (what its vision encoder takes at
    # once), like the token budget of a row: never exceeded. None: no limit.
    max_patches: int | None = None


class Autoscale(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The Planner starts and retires loaders as each source's demand (its share of the mix,
    looked ``lead_s`` seconds ahead, times the trainers' pace) meets what its loaders were
    measured to supply; the stream does not change.

    max_loaders: loader processes in all (default: the Planner's node's CPUs).
    headroom: the share of a loader's measured capacity to plan on.
    every_s: seconds between decisions.
    """

    enabled: bool = False
    max_loaders: int | None = None
    lead_s: float = 10.0
    headroom: float = 0.7
    every_s: float = 2.0


class LoaderOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Knobs shared by every Source Loader.

    block_row_groups: row groups per shuffle block (a loader reads whole blocks).
    buffer_tokens: read-ahead of the whole data plane, shared out over the sources by their
        largest share of the mix (at least ``seq_len`` tokens each); default
        ``prefetch_steps + 4`` global batches (a few MB: tokens are small next to row groups).
    buffer_bytes: how many bytes of images the whole data plane's loaders hold unrouted (an
        image's bytes as stored until its sample is routed, or its patches where those are
        fewer), shared out like ``buffer_tokens`` (an image source stops reading ahead at
        whichever it reaches first); default: a global batch of image tokens' patches
        (``global_batch_tokens × merge_size² × 3·t·patch_size²``). The Planner asks for what it
        waits for whatever the budget, so a small one costs wait, never data.
    sources_per_process: how many sources with ``loaders: 1`` (or unset) one loader process
        serves (in recipe order), so many light sources do not mean as many processes; unset:
        one, and sources without ``loaders`` are shared out as ``auto`` when there are many.
    cpus: the loader processes that sources with ``loaders: auto`` share (default: this
        machine's CPUs); ``msd plan`` shows how they are shared out.
    groups: sources (by name) that share one loader process each; ``loaders: auto`` writes
        them into the job's recipe.
    heartbeat_s: a loader silent this long is taken for dead (loaders report every second);
        a shadow of its source takes its work over.
    read_retry_s: how long a loader retries a read an object store fails (throttling, a lost
        connection), backing off, before the job stops naming the source (``msd restore``
        continues it); every retry is counted in ``msd status`` and the metrics.
    """

    block_row_groups: int = 1
    buffer_tokens: int | None = None
    buffer_bytes: int | None = None
    sources_per_process: int | None = None
    cpus: int | None = None
    groups: tuple[tuple[str, ...], ...] = ()
    autoscale: Autoscale = Autoscale()
    heartbeat_s: float = 3.0
    read_retry_s: float = 60.0


class ConstructorOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """prefetch_steps: steps the Planner plans, and Constructors build, ahead of trainers.
    fanout: the most Constructors a loader sends payloads to; with more nodes than this, the
        Constructors relay payloads through a tree with this many children each
        (``msd.plan.fanout``); null: every loader sends straight to every Constructor.
    """

    prefetch_steps: int = 4
    fanout: int | None = 32


class MetricsOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """port: where the Planner serves Prometheus metrics (0: any free port, published in
        ``JOB/endpoints/metrics``; null: no endpoint).
    every_s: how often a line is added to ``JOB/metrics.jsonl`` (what ``msd report`` plots).
    """

    port: int | None = 0
    every_s: float = 5.0


class CheckpointOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """every_steps: a snapshot of the Planner's state every this many consumed steps (0: only
        on ``msd checkpoint``); each consumed step in between is a line of the log.
    keep: snapshots kept (older ones and their logs are deleted).
    enabled: false writes nothing (then ``recovery.restarts`` must be 0: a restart would have
        nothing to continue from).
    """

    every_steps: int = 100
    keep: int = 3
    enabled: bool = True


class RecoveryOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """restarts: how many times the launcher restarts a role killed by a signal (kill -9, the
    OOM killer) before it gives up and stops the job: a Planner, loader or Constructor
    restarts the data plane from its checkpoints at the step every rank has consumed; a
    trainer rank restarts every rank (they resume from their own checkpoints). A role that
    fails with an error is not restarted: it would fail again.
    """

    restarts: int = 3


class DemoTrainer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The built-in trainer: "computes" ``step_ms`` scaled by its batch's attention cost.

    save_batches: also write every batch it receives to the job folder (for inspection).
    """

    step_ms: float = 10.0
    save_batches: bool = False


class Trainer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``command: demo`` runs the built-in trainer; anything else is a command run per rank.

    On SLURM the ranks fill ``nodes`` nodes, ``tasks_per_node`` each (default: all ranks on
    ``nodes`` nodes, evenly), with ``gpus_per_node`` GPUs requested per node.
    """

    command: str = "demo"
    ranks: int | None = None
    demo: DemoTrainer = DemoTrainer()
    nodes: int = 1
    tasks_per_node: int | None = None
    gpus_per_node: int = 0


class SlurmRole(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one role's SLURM job asks for."""

    cpus: int = 1
    mem_gb: float | None = None
    partition: str | None = None


class Slurm(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where and how the roles are submitted with ``cluster: slurm`` (via submitit).

    ``additional`` is passed to sbatch as is (``{exclusive: ""}`` becomes ``--exclusive``).
    A role's ``partition`` overrides the job-wide one (e.g. loaders on a CPU partition).
    """

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int = 60
    constraint: str | None = None
    planner: SlurmRole = SlurmRole(mem_gb=2.0)
    loader: SlurmRole = SlurmRole(mem_gb=4.0)
    constructor: SlurmRole = SlurmRole(cpus=2)
    additional: dict[str, str | int] = {}


class Recipe(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A whole job. ``steps`` may be omitted only when every source has ``repeat: false``.

    Without a ``trainer`` section msd starts the data plane only; the user's own job starts
    the trainers and, on each node, a Constructor with ``msd sidecar``. ``cache``: the local
    cache of every source on an object store that sets none of its own (`Cache`).
    """

    sources: tuple[Source, ...]
    seq_len: int
    global_batch_tokens: int
    name: str = "msd-job"
    seed: int = 0
    steps: int | None = None
    micro_batch_size: int = 1
    distribute: Distribute = Distribute()
    mix: Mix = Mix()
    cost: Cost = Cost()
    balance: Balance = Balance()
    vision: Vision = Vision()
    video: Video = Video()
    loader: LoaderOptions = LoaderOptions()
    constructor: ConstructorOptions = ConstructorOptions()
    metrics: MetricsOptions = MetricsOptions()
    checkpoint: CheckpointOptions = CheckpointOptions()
    recovery: RecoveryOptions = RecoveryOptions()
    trainer: Trainer | None = None
    cluster: Literal["local", "slurm"] = "local"
    slurm: Slurm = Slurm()
    cache: Cache | None = None

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
