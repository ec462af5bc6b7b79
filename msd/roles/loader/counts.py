"""What a shard has read and spent so far (``ReadCounts``), and the figures of it a loader
reports in its ``Stats`` (``source_load``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from msd.sources.chat_rows import ChatRows
from msd.sources.fuse import Fuser
from msd.wire.protocol import SourceLoad


@dataclass
class ReadCounts:
    """Since the shard opened: samples and tokens read, bytes of images read (as held),
    seconds spent reading and decoding, reads an object store failed that were tried again."""

    samples: int = 0
    tokens: int = 0
    image_bytes: int = 0
    busy_s: float = 0.0
    retries: int = 0


def source_load(
    source: int,
    counts: ReadCounts,
    held: tuple[int, int],
    fuser: Fuser | None,
    chat: ChatRows | None,
) -> SourceLoad:
    """A shard's figures for its loader's ``Stats``; ``held``: (samples, tokens) it holds."""
    return SourceLoad(
        source,
        counts.samples,
        counts.tokens,
        held[0],
        held[1],
        errors=counts.retries,
        busy_s=counts.busy_s,
        images_read=0 if fuser is None else fuser.images_read,
        skipped=tuple(sorted(skips(fuser, chat).items())),
        videos_read=0 if fuser is None else fuser.videos_read,
        video_s=0.0 if fuser is None else fuser.video_cost.seconds,
        video_cpu_s=0.0 if fuser is None else fuser.video_cost.cpu_s,
    )


def skips(fuser: Fuser | None, chat: ChatRows | None) -> Counter[str]:
    """What was left out as it was read, by reason: images, videos, conversations."""
    found: Counter[str] = Counter()
    for counts in (fuser.skips if fuser else None, chat and chat.skips):
        found.update(counts or {})
    return found
