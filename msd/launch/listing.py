"""A job reads the files its sources named when it started: listed once, recorded in the job's
recipe (``Source.files``), checked again on restore.

An object store's prefix gains objects while a job runs (a new shard lands in the bucket); were
each role, or a restore, to list it again, a loader could see files the Planner does not, or a
restored job a different epoch order. So ``msd launch`` lists every source once and writes the
files, with sizes and modification times, into the job's recipe; every role opens exactly those,
and ``msd restore`` carries the checkpoint's list over and refuses a file that has since
changed or vanished, naming it.
"""

from __future__ import annotations

import functools

import msgspec

from msd.errors import CheckpointError, SourceError
from msd.recipe.schema import PinnedFile, Recipe, Source
from msd.sources import storage
from msd.sources.formats import FORMATS
from msd.sources.formats.base import glob_files, store_of


def pin_files(recipe: Recipe, saved: Recipe | None = None) -> Recipe:
    """``recipe`` with each source's files recorded (a source that has them keeps them); a
    source that ``saved`` (the checkpoint's recipe) lists with the same path and store keeps
    that list, checked unchanged."""
    earlier = {s.name: s for s in saved.sources} if saved is not None else {}
    sources = []
    for i, source in enumerate(recipe.sources):
        if source.files and saved is None:
            sources.append(source)
            continue
        before = earlier.get(source.name)
        if before is not None and before.files and _same_place(before, source):
            check_unchanged(before, f"sources[{i}]")
            sources.append(msgspec.structs.replace(source, files=before.files))
        else:
            sources.append(msgspec.structs.replace(source, files=listed(source, f"sources[{i}]")))
    return msgspec.structs.replace(recipe, sources=tuple(sources))


def listed(source: Source, key: str) -> tuple[PinnedFile, ...]:
    """Every file ``source`` reads now (a Megatron ``.idx`` with its ``.bin``), with its size and
    modification time."""
    plain = msgspec.structs.replace(source, files=())
    paths = (
        glob_files(plain, key)
        if source.data_format == "webdataset"
        else (FORMATS[source.data_format].files(plain, key))
    )
    store = store_of(source)
    pinned = []
    for path in paths:
        for part in parts(source, path):
            try:
                found = storage.retrying(functools.partial(storage.stat, part, store), part, store)
            except OSError as exc:
                raise SourceError(
                    f"source '{source.name}' ({key}.path): cannot read '{part}' ({exc})"
                ) from exc
            pinned.append(PinnedFile(part, found.size, found.mtime_ns))
    return tuple(pinned)


def parts(source: Source, path: str) -> tuple[str, ...]:
    """The files behind one of a source's files: a Megatron index and its data."""
    if source.data_format == "megatron":
        return (path, storage.sibling(path, ".bin"))
    return (path,)


def check_unchanged(source: Source, key: str) -> None:
    """Each of ``source.files`` is still there with its recorded size and modification time;
    a `CheckpointError` naming the first that is not."""
    store = store_of(source)
    for pinned in source.files:
        try:
            now = storage.stat(pinned.path, store)
        except FileNotFoundError:
            raise CheckpointError(
                f"source '{source.name}' ({key}): '{pinned.path}', which the checkpoint's job "
                "read, is gone; put it back, or start a new job"
            ) from None
        except OSError as exc:
            raise CheckpointError(
                f"source '{source.name}' ({key}): cannot check '{pinned.path}' ({exc})"
            ) from exc
        if (now.size, now.mtime_ns) != (pinned.size, pinned.mtime_ns):
            raise CheckpointError(
                f"source '{source.name}' ({key}): '{pinned.path}' changed after the "
                f"checkpoint's job read it ({pinned.size:,} bytes then, {now.size:,} now, or a "
                "newer modification time); put the old file back, or start a new job"
            )


def _same_place(before: Source, now: Source) -> bool:
    return (before.path, before.endpoint_url, before.data_format) == (
        now.path,
        now.endpoint_url,
        now.data_format,
    )
