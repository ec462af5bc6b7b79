from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.launch.auto_loaders import prepared
from msd.launch.check import check_sources
from msd.launch.peek import Batch, peek_job, peek_recipe
from msd.peek import (
    Detokenize,
    PeekRow,
    PeekSample,
    Placeholders,
    as_json,
    bytes_text,
    contact_sheet,
    image_tiles,
    rows_of,
    tokenizer_text,
)
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe, Source
from msd.sources.transforms import load_tokenizer

from .common import console, user_errors

ELLIPSIS = "…"


@user_errors
def peek(
    target: Annotated[Path, typer.Argument(help="A recipe YAML file, or a job folder.")],
    step: Annotated[int, typer.Option(help="The global step.")] = 0,
    rank: Annotated[int, typer.Option(help="The data-parallel rank.")] = 0,
    png: Annotated[
        Path | None,
        typer.Option(help="Where the images' contact sheet goes (peek-stepN-rankR.png)."),
    ] = None,
    chars: Annotated[
        int, typer.Option(min=0, help="Characters of text shown per sample (0: all).")
    ] = 240,
    json_out: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Show one step's batch of one data-parallel rank: each row, each sample in it (source,
    id, offset, length, text; tokens not trained dimmed) and a PNG of its images. A RECIPE's
    data plane runs here, without trainers, for steps 0 … N in a temporary folder and is then
    stopped (msd builds a step only with its roles); a running JOB is never asked for batches
    (that would take them from its trainers): what its demo trainer saved
    (trainer.demo.save_batches) is read instead."""
    if target.is_dir():
        recipe = JobDir(target).recipe()
        batch = peek_job(target, step, rank)
    else:
        recipe = prepared(load_recipe(target))
        check_sources(recipe, target)
        with tempfile.TemporaryDirectory(prefix="msd-peek-") as run_root:
            batch = peek_recipe(recipe, target.read_text(), step, rank, Path(run_root))
    rows = rows_of(batch, [s.name for s in recipe.sources], detokenizers(recipe), _ids(recipe))
    sheet = _write_sheet(batch, recipe, png or Path(f"peek-step{step}-rank{rank}.png"))
    if json_out:
        out = {"step": step, "rank": rank, "seq_len": recipe.seq_len, "rows": as_json(rows)}
        typer.echo(json.dumps(out | {"png": None if sheet is None else str(sheet)}))
        return
    _show(rows, step, rank, recipe.seq_len, chars)
    if sheet is not None:
        console.print(f"images: {sheet}", highlight=False, soft_wrap=True, markup=False)


def detokenizers(recipe: Recipe) -> list[Detokenize | None]:
    return [_detokenizer(s) for s in recipe.sources]


def _detokenizer(source: Source) -> Detokenize | None:
    """How a source's ids become text again; None where they never were text."""
    if source.token_column is not None or source.transform.kind == "function":
        return None
    if source.transform.kind == "tokenizer":
        return tokenizer_text(load_tokenizer(source.transform.path))
    return bytes_text


def _ids(recipe: Recipe) -> Placeholders:
    return Placeholders(
        recipe.vision.image_token_id if recipe.has_images else None,
        recipe.video.video_token_id if recipe.has_videos else None,
    )


def _write_sheet(batch: Batch, recipe: Recipe, path: Path) -> Path | None:
    names = [s.name for s in recipe.sources]
    tiles = image_tiles(batch, names, recipe.vision.patch_size, recipe.vision.merge_size)
    if not tiles:
        return None
    try:
        contact_sheet(tiles, path)
    except OSError as exc:
        raise LaunchError(f"cannot write the contact sheet {path} ({exc.strerror})") from None
    return path


def _show(rows: list[PeekRow], step: int, rank: int, seq_len: int, chars: int) -> None:
    console.print(
        f"step {step}, DP rank {rank}: {len(rows)} rows of {seq_len} tokens "
        "(dim: tokens not trained)",
        highlight=False,
    )
    for row in rows:
        pad = f", {row.padding} padding" if row.padding else ""
        n = len(row.samples)
        console.print(f"\n[bold]row {row.index}[/]: {n} sample{'' if n == 1 else 's'}{pad}")
        for sample in row.samples:
            console.print(_header(sample), highlight=False)
            console.print(_body(sample, chars), soft_wrap=False)


def _header(sample: PeekSample) -> Text:
    split = f" (offset {sample.offset}: a later piece)" if sample.offset else ""
    visuals = [
        f"{n} {kind}{'s' if n > 1 else ''}"
        for kind in ("image", "video")
        if (n := sample.placeholders(kind))
    ]
    extra = f", {', '.join(visuals)}" if visuals else ""
    return Text.assemble(
        ("  " + sample.source_name, "bold cyan"),
        f" #{sample.sample_id}{split}: at {sample.start}, {sample.length} tokens, "
        f"{int(sample.trained.sum())} trained{extra}",
    )


def _body(sample: PeekSample, chars: int) -> Text:
    text = Text("    ")
    left = chars or None
    for span in sample.spans:
        if left is not None and left <= 0:
            text.append(ELLIPSIS)
            break
        ids = sample.tokens[span.start : span.stop].tolist()
        piece, style = _span_text(span.kind, ids, span.text)
        if left is not None:
            piece, left = piece[:left], left - len(piece)
        text.append(piece, style=style if span.trained else f"{style} dim".strip())
    return text


def _span_text(kind: str, ids: list[int], decoded: str) -> tuple[str, str]:
    """A span as shown, and its style."""
    if kind != "text":
        return f"[{kind}: {len(ids)} tokens]", "magenta"
    if not decoded:  # ids that were never text
        return " ".join(map(str, ids)) + " ", ""
    return decoded.replace("\n", "↵"), ""
