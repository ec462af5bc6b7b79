"""The data plane's incarnations on SLURM: ``JOB/restarts/N.json``.

On SLURM no single process sees every role, so each data role runs under a supervisor
(``msd.launch.supervise``). A supervisor whose role was killed, whose Planner went back to an
earlier step, or whose SLURM job was requeued starts incarnation N+1 by creating
``JOB/restarts/N+1.json``; every supervisor follows the highest N: it stops its role and starts it
again. The new roles continue from the job's checkpoints at the step every rank has consumed,
and meet only roles of the new incarnation (endpoints carry it, ``JobDir.publish``).

A file is created whole and exclusively (written aside, then hard-linked into place), so two
roles failing together start one incarnation, not two; ``key`` does the same for the several
tasks of one requeued SLURM job.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from msd.jobdir import JobDir


@dataclass(frozen=True)
class Restart:
    incarnation: int
    role: str
    name: str
    cause: str
    counted: bool  # against ``recovery.restarts`` (a rewind or a requeue is not a failure)
    key: str
    time: float


def restarts(job: JobDir) -> list[Restart]:
    """Every restart of the job's data plane, oldest first."""
    folder = job.root / "restarts"
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in folder.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, TypeError):
                found.append(Restart(**json.loads(path.read_text())))
    return sorted(found, key=lambda r: r.incarnation)


def current(job: JobDir) -> int:
    """The data plane's incarnation now (0 until it is first restarted)."""
    folder = job.root / "restarts"
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    return max((int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()), default=0)


def counted(job: JobDir) -> int:
    """How many restarts count against ``recovery.restarts``."""
    return sum(r.counted for r in restarts(job))


def start_next(
    job: JobDir, seen: int, role: str, name: str, cause: str, counted: bool, key: str = ""
) -> int:
    """Start the incarnation after ``seen`` (unless another role did, or one with the same
    non-empty ``key`` exists); return the incarnation now."""
    folder = job.root / "restarts"
    folder.mkdir(exist_ok=True)
    if key and any(r.key == key for r in restarts(job)):
        return current(job)
    record = Restart(seen + 1, role, name, cause, counted, key, time.time())
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".{seen + 1}.", suffix=".tmp")
    tmp = Path(name)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(asdict(record)))
    try:
        os.link(tmp, folder / f"{seen + 1}.json")
    except FileExistsError:
        pass  # another role's failure started it: follow that one
    finally:
        tmp.unlink(missing_ok=True)
    return current(job)
