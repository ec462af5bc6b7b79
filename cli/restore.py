from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from msd.checkpoint.compat import differences, keeping_padding
from msd.checkpoint.signing import job_key_file
from msd.checkpoint.store import open_checkpoint
from msd.checkpoint.validate import snapshot_recipe
from msd.errors import CheckpointError
from msd.jobdir.history import load_history, make_change
from msd.launch.check import check_sources
from msd.launch.listing import pin_files
from msd.launch.prepare import cluster_of, decide_loaders, new_job
from msd.plan.schedule import MixChange
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe, stream_fingerprint, to_json
from msd.sources.formats.base import as_launched
from msd.sources.index import open_source

from .common import RunsOption, err_console, user_errors
from .launch import run_job, show_auto_loaders


@user_errors
def restore(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="A snapshot (JOB/checkpoints/step-N.json), or a job folder: its latest step."
        ),
    ],
    recipe: Annotated[
        Path | None,
        typer.Option(
            help="Continue under this recipe (e.g. other DP/TP/PP sizes), not the saved one; "
            "needed for a checkpoint without its job's key: its trainer command runs."
        ),
    ] = None,
    step: Annotated[
        int | None, typer.Option(help="With a job folder: continue from this step, not the latest.")
    ] = None,
    allow_batch_change: Annotated[
        bool,
        typer.Option(help="Allow other tokens per step: the sources' cursors carry over."),
    ] = False,
    cluster: Annotated[str | None, typer.Option(help="local (default) or slurm.")] = None,
    run_dir: RunsOption = Path("runs"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Continue a job's stream from a checkpoint in a new job: the same batches from its step."""
    found = open_checkpoint(checkpoint, step)
    for problem in found.passed_over:
        err_console.print(f"[yellow]passed over:[/] {problem}", highlight=False, soft_wrap=True)
    snap = found.snapshot
    saved = snapshot_recipe(snap, found.path)
    if recipe is None and not found.verified:
        raise CheckpointError(_unverified(found.path))
    if recipe is not None:
        parsed, text, where = load_recipe(recipe), recipe.read_text(), recipe
    else:
        parsed, text, where = saved, json.dumps(snap.recipe, indent=2) + "\n", found.path
    parsed = pin_files(parsed, saved)
    check_sources(parsed, where)
    kept = keeping_padding(saved, parsed)
    if kept is not parsed:
        parsed = kept
        err_console.print(
            f"padding samples to multiples of {kept.distribute.pad_to}, as the checkpoint's run "
            "did (distribute.pad_to), so the same global batches continue",
            highlight=False,
        )
    rows = tuple(
        open_source(as_launched(s, parsed.cluster), f"sources[{i}]").num_rows
        for i, s in enumerate(parsed.sources)
    )
    problems = differences(saved, snap.num_rows, parsed, rows, allow_batch_change)
    if problems:
        raise CheckpointError(
            f"the checkpoint {found.path} cannot continue under {where}: " + "; ".join(problems)
        )
    changes = _mix_history(checkpoint, snap.mix_history, parsed)
    chosen = cluster_of(parsed, cluster)
    parsed, auto = decide_loaders(parsed)
    show_auto_loaders(parsed, auto, json_out)
    resume = dataclasses.replace(
        snap,
        recipe=json.loads(to_json(parsed)),
        fingerprint=stream_fingerprint(parsed),
        num_rows=rows,
    )
    if not json_out:
        err_console.print(f"continuing from step {snap.step} ({found.path})", highlight=False)
    job = new_job(parsed, text, run_dir, chosen, changes, resume)
    run_job(job, parsed, chosen, json_out)


def _unverified(path: Path) -> str:
    """Why the command in an unverifiable snapshot is not run, and what to do instead."""
    key = job_key_file(path)
    why = "it is not signed" if key.is_file() else f"its job's key {key} is not beside it"
    return (
        f"{path} cannot be verified ({why}), so the trainer command it holds is not run; "
        "pass --recipe RECIPE to continue under that recipe and its trainer command"
    )


def _mix_history(
    checkpoint: Path, saved: tuple[dict[str, object], ...], recipe: Recipe
) -> tuple[MixChange, ...]:
    """A job folder's whole mix history (changes made after its last snapshot included), else
    the snapshot's."""
    history = checkpoint / "mix-history.json"
    if checkpoint.is_dir() and history.is_file():
        return load_history(history, recipe)
    try:
        return tuple(make_change(recipe, c["weights"], int(c["step"])) for c in saved)  # type: ignore[arg-type, call-overload]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint's mix history is malformed ({exc})") from None
