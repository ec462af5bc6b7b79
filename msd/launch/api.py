"""``msd.launch``: start a job from Python, checked and prepared as ``msd launch`` does it.

The recipe is a YAML file's path, a `msd.recipe.schema.Recipe` or the same tree as a dict. The
job runs where ``cluster`` says, else where the recipe's ``cluster`` says (``local`` unless set),
like ``msd launch --cluster``. Warnings are logged (logger ``msd.launch.api``) and returned;
bad input raises the `MsdError` whose sentence ``msd launch`` prints.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import msgspec

from msd.errors import LaunchError, RecipeError
from msd.jobdir.history import load_history
from msd.launch.job import INTERRUPTED, STOPPED, Job, Outcome, summary
from msd.launch.prepare import auto_loaders_line, new_job, prepare_launch
from msd.plan.schedule import MixChange
from msd.recipe.load import load_recipe, recipe_from_data
from msd.recipe.schema import Recipe
from msd.wire.protocol import Status

logger = logging.getLogger(__name__)

RecipeInput = str | os.PathLike[str] | Recipe | Mapping[str, Any]
OnStatus = Callable[[Status], None]


@dataclass(frozen=True)
class Result:
    """How a job ended: ``done`` (``summary`` holds what ``msd launch --json`` prints) or
    ``stopped`` (by `RunningJob.stop`; the last figures seen, if any)."""

    job: Path
    state: Literal["done", "stopped"]
    summary: dict[str, Any] | None
    warnings: tuple[str, ...]


class RunningJob:
    """A started job (``wait=False``): its folder ``job``, ``wait()`` to supervise it to its
    end, ``stop()`` to end it. Its roles are restarted, rescaled and stopped by ``wait``, so
    call one of them; a job neither waited for nor stopped is shut down at interpreter exit."""

    def __init__(self, job: Job, warnings: tuple[str, ...]) -> None:
        self._job = job
        self.warnings = warnings
        self._watching = threading.Lock()
        self._outcome: Outcome | None = None
        atexit.register(self._at_exit)

    @property
    def job(self) -> Path:
        return self._job.job.root

    def wait(self, on_status: OnStatus | None = None) -> Result:
        """Supervise the job until its trainers finish (or it fails, or ``stop`` is called)."""
        with self._watching:
            if self._outcome is None:
                self._outcome = self._job.watch(on_status or _ignore)
                atexit.unregister(self._at_exit)
        return _result(self._outcome, self.warnings)

    def stop(self) -> Result:
        """Stop every process of the job (from any thread) and return once they are stopped."""
        self._job.request_stop()
        return self.wait()

    def __enter__(self) -> RunningJob:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._outcome is None:
            self._job.request_stop()
            self.wait()

    def _at_exit(self) -> None:
        if self._outcome is None:
            self._job.shut_down()


@overload
def launch(
    recipe: RecipeInput,
    *,
    cluster: str | None = None,
    runs: str | os.PathLike[str] = "runs",
    wait: Literal[True] = True,
    mix_history: str | os.PathLike[str] | None = None,
    on_status: OnStatus | None = None,
) -> Result: ...


@overload
def launch(
    recipe: RecipeInput,
    *,
    cluster: str | None = None,
    runs: str | os.PathLike[str] = "runs",
    wait: Literal[False],
    mix_history: str | os.PathLike[str] | None = None,
    on_status: OnStatus | None = None,
) -> RunningJob: ...


def launch(
    recipe: RecipeInput,
    *,
    cluster: str | None = None,
    runs: str | os.PathLike[str] = "runs",
    wait: bool = True,
    mix_history: str | os.PathLike[str] | None = None,
    on_status: OnStatus | None = None,
) -> Result | RunningJob:
    """Start the job ``msd launch`` would start for ``recipe``, in a new folder under ``runs``.

    ``wait``: run it to its end and return its `Result` (a failure raises `LaunchError`, a
    Ctrl-C `KeyboardInterrupt`, after every process of the job was stopped); else return a
    `RunningJob` once every role has started. ``on_status`` gets each Planner status while
    this call waits. ``mix_history``: replay a job's ``JOB/mix-history.json``."""
    parsed, text, where = _read(recipe)
    changes = _changes(mix_history, parsed)
    ready = prepare_launch(parsed, cluster, where)
    if ready.auto is not None:
        logger.info("%s", auto_loaders_line(ready.recipe, ready.auto))
    for warning in ready.warnings:
        logger.warning("%s", warning)
    job = new_job(ready.recipe, text, Path(runs), ready.cluster, changes)
    logger.info("job folder: %s", job.job.root)
    if wait:
        return _result(job.run(on_status or _ignore), ready.warnings)
    failed = job.try_start()
    if failed is not None:
        return _result(failed, ready.warnings)  # raises: a start-up that failed
    return RunningJob(job, ready.warnings)


def _read(recipe: RecipeInput) -> tuple[Recipe, str, str | os.PathLike[str] | None]:
    """The validated recipe, its text for ``JOB/recipe.yaml``, and the file it came from."""
    if isinstance(recipe, str | os.PathLike):
        return load_recipe(recipe), Path(recipe).read_text(), recipe
    if isinstance(recipe, Recipe | Mapping):
        data = msgspec.to_builtins(recipe) if isinstance(recipe, Recipe) else dict(recipe)
        parsed = recipe_from_data(data, "msd.launch")
        _no_files(parsed)
        # written as JSON (valid YAML), as `msd restore` writes a checkpoint's recipe
        return parsed, json.dumps(msgspec.to_builtins(data), indent=2) + "\n", None
    raise TypeError(f"msd.launch takes a recipe file, a Recipe or a dict, not {type(recipe)}")


def _no_files(recipe: Recipe) -> None:
    """A source's ``files`` is what a launch lists, as a recipe file may not set it either."""
    for i, source in enumerate(recipe.sources):
        if source.files:
            raise RecipeError(
                f"msd.launch: recipe.sources[{i}].files: is written by msd launch (the files "
                "path named then); remove it"
            )


def _changes(path: str | os.PathLike[str] | None, recipe: Recipe) -> tuple[MixChange, ...]:
    if path is None:
        return ()
    if not Path(path).is_file():
        raise LaunchError(f"--mix-history {path} is not a file")
    return load_history(Path(path), recipe)


def _result(outcome: Outcome, warnings: tuple[str, ...]) -> Result:
    """The outcome as a `Result`; a failure raised as ``msd launch`` reports it."""
    root, status = outcome.job.root, outcome.status
    if outcome.message == STOPPED:
        return Result(root, "stopped", summary(status) if status else None, warnings)
    if outcome.message == INTERRUPTED:
        raise KeyboardInterrupt
    if not outcome.ok:
        raise LaunchError(outcome.message)
    if status is None:
        logs = outcome.job.logs
        raise LaunchError(f"the job ended without a status from its planner; see {logs}")
    return Result(root, "done", summary(status), warnings)


def _ignore(status: Status) -> None:
    return None
