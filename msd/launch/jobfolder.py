"""A launch's job folder: created with what every role reads, and its ``job.json`` kept current."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from msd.checkpoint.signing import signing_key
from msd.checkpoint.snapshot import Snapshot
from msd.checkpoint.store import CheckpointStore
from msd.errors import LaunchError
from msd.jobdir import JobDir, full_message, is_full
from msd.jobdir.history import write_history
from msd.plan.schedule import MixChange
from msd.recipe.schema import Recipe, stream_fingerprint, to_json
from msd.wire.keys import create_keys


def new_job_dir(recipe: Recipe, run_root: Path) -> JobDir:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = run_root / f"{recipe.name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return JobDir(path)


def prepare_job(
    recipe: Recipe,
    recipe_text: str,
    run_root: Path,
    mix_history: tuple[MixChange, ...] = (),
    resume: Snapshot | None = None,
) -> JobDir:
    """A new job folder holding the recipe as written and as validated (what roles read), the
    job's key, the mix history to replay (``msd launch --mix-history``) and, for ``msd
    restore``, the checkpoint it continues from (its first snapshot)."""
    job = new_job_dir(recipe, run_root.resolve())
    try:
        _fill(job, recipe, recipe_text, mix_history, resume)
    except OSError as exc:
        if not is_full(exc):
            raise
        raise LaunchError(full_message(job.root, exc.filename or "")) from None
    return job


def _fill(
    job: JobDir,
    recipe: Recipe,
    recipe_text: str,
    mix_history: tuple[MixChange, ...],
    resume: Snapshot | None,
) -> None:
    job.create()
    keys = create_keys(job.key_file)
    (job.root / "recipe.yaml").write_text(recipe_text)
    job.recipe_json.write_bytes(to_json(recipe))
    if mix_history:
        write_history(job.mix_history, recipe, mix_history)
    if resume is not None:
        CheckpointStore(job.checkpoints, key=signing_key(keys)).write_snapshot(resume)
    job.write_json(job.job_json, {"start_step": resume.step if resume is not None else 0})


def write_job_state(job: JobDir, recipe: Recipe, cluster: str, state: str, **extra: Any) -> None:
    """``job.json``: what ``msd stop`` and ``msd status`` read about a run. On a full disk it
    is overwritten in place (a new file cannot be written); a ``LaunchError`` if even that
    fails."""
    data = {
        "name": recipe.name,
        "fingerprint": stream_fingerprint(recipe),
        "cluster": cluster,
        "state": state,
        "launcher_pid": os.getpid(),
        "launcher_host": socket.gethostname(),  # where launcher_pid can be checked
        "start_step": job.start_step(),
        **extra,
    }
    try:
        job.write_json(job.job_json, data)
    except OSError as exc:
        if not is_full(exc):
            raise
        try:
            job.write_json_in_place(job.job_json, data)
        except OSError:
            raise LaunchError(full_message(job.root, str(job.job_json))) from None
