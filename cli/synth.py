from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from msd.synth import synth as write_demo_sources
from msd.synth import train_tokenizer

from .common import console, user_errors


@user_errors
def synth(
    directory: Annotated[Path, typer.Argument(help="Folder to write the demo sources into.")],
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
) -> None:
    """Write demo Parquet sources with long-tail sample lengths."""
    files = write_demo_sources(directory, seed=seed)
    tokenizer = train_tokenizer(directory, seed=seed)
    sources = sorted({f.parent.name for f in files})
    console.print(f"wrote {len(files)} files for sources {', '.join(sources)} under {directory}")
    console.print(f"wrote a BPE tokenizer trained on them: {tokenizer}")
