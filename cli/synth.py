from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from msd.synth.chat import DEFAULT_CONVERSATIONS, TOKENIZER_DIR, write_chat_sources
from msd.synth.text import synth as write_demo_sources
from msd.synth.text import train_tokenizer
from msd.synth.video import DEFAULT_VIDEOS, write_video_sources
from msd.synth.vlm import DEFAULT_SAMPLES, write_vlm_sources

from .common import console, err_console, user_errors


class Kind(str, Enum):
    """What ``msd synth`` writes: text sources, image-text sources beside them, or video-text
    sources beside both; or conversations beside the text sources."""

    text = "text"
    vlm = "vlm"
    video = "video"
    chat = "chat"


@user_errors
def synth(
    directory: Annotated[Path, typer.Argument(help="Folder to write the demo sources into.")],
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
    kind: Annotated[
        Kind,
        typer.Option(
            help="text: Parquet text sources; vlm: image-text sources too; video: video-text "
            "sources as well; chat: conversation sources (and their tokenizer and chat "
            "template) beside the text sources."
        ),
    ] = Kind.text,
    samples: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Samples per image-text source with --kind vlm or video; "
            f"{DEFAULT_SAMPLES} if unset (conversations per source with --kind chat; "
            f"{DEFAULT_CONVERSATIONS}).",
        ),
    ] = None,
    videos: Annotated[
        int | None,
        typer.Option(
            min=1, help=f"Clips per video source with --kind video; {DEFAULT_VIDEOS} if unset."
        ),
    ] = None,
) -> None:
    """Write demo Parquet sources with long-tail sample lengths (and images with --kind vlm,
    images and videos with --kind video)."""
    if samples is not None and kind is Kind.text:
        raise typer.BadParameter(
            "only --kind vlm, video or chat writes such samples", param_hint="--samples"
        )
    if videos is not None and kind is not Kind.video:
        raise typer.BadParameter("only --kind video writes videos", param_hint="--videos")
    files = write_demo_sources(directory, seed=seed)
    tokenizer = train_tokenizer(directory, seed=seed)
    sources = sorted({f.parent.name for f in files})
    console.print(f"wrote {len(files)} files for sources {', '.join(sources)} under {directory}")
    console.print(f"wrote a BPE tokenizer trained on them: {tokenizer}")
    if kind is Kind.chat:
        count = DEFAULT_CONVERSATIONS if samples is None else samples
        for c in write_chat_sources(directory, seed=seed, conversations=count):
            console.print(
                f"wrote {c.name}: {c.conversations} conversations, {c.bytes / 1e6:.1f} MB in "
                f"{len(c.files)} files"
            )
        console.print(f"wrote their tokenizer and chat template: {directory / TOKENIZER_DIR}")
    elif kind is not Kind.text:
        count = DEFAULT_SAMPLES if samples is None else samples
        for s in write_vlm_sources(directory, seed=seed, samples=count, on_file=_progress):
            console.print(
                f"wrote {s.name}: {s.samples} samples, {s.images} images, "
                f"{s.bytes / 1e6:.1f} MB in {len(s.files)} files"
            )
    if kind is Kind.video:
        clips = DEFAULT_VIDEOS if videos is None else videos
        for v in write_video_sources(directory, seed=seed, videos=clips, on_file=_progress):
            console.print(
                f"wrote {v.name}: {v.samples} samples, {v.videos} videos ({v.seconds:.0f} s), "
                f"{v.bytes / 1e6:.1f} MB in {len(v.files)} files"
            )


def _progress(path: Path, done: int, total: int) -> None:
    """A line on stderr for each file written (image and video sources take a while)."""
    line = f"wrote {path} ({done}/{total})"
    err_console.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)
