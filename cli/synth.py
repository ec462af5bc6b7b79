from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from msd.synth import synth as write_demo_sources
from msd.synth import train_tokenizer
from msd.synth_vlm import DEFAULT_SAMPLES, write_vlm_sources

from .common import console, user_errors


class Kind(str, Enum):
    """What ``msd synth`` writes: text sources, or image-text sources beside them."""

    text = "text"
    vlm = "vlm"


@user_errors
def synth(
    directory: Annotated[Path, typer.Argument(help="Folder to write the demo sources into.")],
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
    kind: Annotated[
        Kind, typer.Option(help="text: Parquet text sources; vlm: image-text sources too.")
    ] = Kind.text,
    samples: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Samples per image-text source with --kind vlm; {DEFAULT_SAMPLES} if unset.",
        ),
    ] = None,
) -> None:
    """Write demo Parquet sources with long-tail sample lengths (and images with --kind vlm)."""
    if samples is not None and kind is not Kind.vlm:
        raise typer.BadParameter("only --kind vlm writes image samples", param_hint="--samples")
    files = write_demo_sources(directory, seed=seed)
    tokenizer = train_tokenizer(directory, seed=seed)
    sources = sorted({f.parent.name for f in files})
    console.print(f"wrote {len(files)} files for sources {', '.join(sources)} under {directory}")
    console.print(f"wrote a BPE tokenizer trained on them: {tokenizer}")
    if kind is Kind.vlm:
        count = DEFAULT_SAMPLES if samples is None else samples
        for s in write_vlm_sources(directory, seed=seed, samples=count):
            console.print(
                f"wrote {s.name}: {s.samples} samples, {s.images} images, "
                f"{s.bytes / 1e6:.1f} MB in {len(s.files)} files"
            )
