"""The job folder: the one place a job's roles, launcher, clients and CLI meet.

    JOB/recipe.yaml            the recipe as the user wrote it
    JOB/recipe.json            the validated recipe with absolute paths (what roles read)
    JOB/job.json               name, fingerprint, launcher pid, state
    JOB/job.key                the job's CURVE keys (0600): who may talk to its Planner
    JOB/mix-history.json       every mix change made while the job ran (``msd mix``)
    JOB/loaders.json           the loader generations added while it ran (``msd rescale``)
    JOB/shadows.json           the shadow loaders that took a lost loader's place
    JOB/retired/NAME           a loader process that finished its share and exited
    JOB/metrics.jsonl          the job's figures, one line a second (``msd report``)
    JOB/checkpoints/           snapshots of the Planner's state and the log of steps after
                               each (``msd.checkpoint``; ``msd restore``)
    JOB/endpoints/NAME         the address a role serves and its incarnation (written
                               atomically once bound)
    JOB/restarts/N.json        on SLURM, why the data plane started for the N-th time
    JOB/logs/ROLE-NAME.log     each role's output
    JOB/trainer/rank-R.jsonl   what the demo trainer received, step by step

Endpoints are published as files so nothing needs a fixed port, and the same rendezvous works
on a shared filesystem under SLURM.

The records a job keeps in its folder are read and written by the modules beside this one, so a
role reads its own job folder without the operator's commands: ``history`` (mix-history.json),
``rescales`` (loaders.json), ``shadows`` (shadows.json) and ``runs`` (what ``msd ls`` reads of a
run folder's jobs).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from msd.errors import LaunchError
from msd.recipe.schema import Recipe, from_json
from msd.wire.keys import KEY_FILE, JobKeys, load_keys

# The Planner's exit code when the data plane must restart at an earlier step (a trainer rewound).
REWIND_EXIT = 75


def constructor_endpoint_name(node: str) -> str:
    """The name a node's Data Constructor publishes its trainer endpoint under."""
    return f"constructor-{node}"


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file; a failed
    write leaves no temporary file behind (on a full disk it would hold the space).
    ``durable``: on disk before the rename (fsync), so that it survives a crash of the machine."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the filesystem is full (or the user's quota is)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def full_message(root: Path, what: str = "") -> str:
    """One sentence: the job folder's filesystem is full (``what`` could not be written)."""
    try:
        free = f"{shutil.disk_usage(root).free:,} bytes free"
    except OSError:
        free = "no space left"
    wrote = f" writing {what}" if what else ""
    return (
        f"the job folder {root} is full ({free} on its filesystem{wrote}); "
        "free space there or use another --run-dir"
    )


def nearly_full(root: Path, margin_bytes: int = 1 << 20) -> bool:
    """Whether the job folder's filesystem has less than ``margin_bytes`` left."""
    try:
        return shutil.disk_usage(root).free < margin_bytes
    except OSError:
        return False


class Published(NamedTuple):
    address: str
    incarnation: int


def incarnation() -> int:
    """Which start of the data plane this process belongs to (``msd.launch.incarnations``;
    0 outside SLURM supervision)."""
    return int(os.environ.get("MSD_INCARNATION", "0"))


class JobDir:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    @property
    def recipe_json(self) -> Path:
        return self.root / "recipe.json"

    @property
    def job_json(self) -> Path:
        return self.root / "job.json"

    @property
    def key_file(self) -> Path:
        return self.root / KEY_FILE

    @property
    def mix_history(self) -> Path:
        return self.root / "mix-history.json"

    @property
    def rescales(self) -> Path:
        return self.root / "loaders.json"

    @property
    def shadows(self) -> Path:
        return self.root / "shadows.json"

    def retired(self, loader: str) -> Path:
        return self.root / "retired" / loader.replace("/", "-")

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def start_step(self) -> int:
        """The first step this job serves: 0, or the step it was restored at."""
        try:
            return int(self.read_json(self.job_json).get("start_step", 0))
        except (OSError, ValueError):
            return 0

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    def keys(self) -> JobKeys:
        return load_keys(self.key_file)

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def trainer(self) -> Path:
        return self.root / "trainer"

    def create(self) -> None:
        """The folder, owner only (0700) from its first moment: it holds the job's key."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)  # the umask may have taken bits; exist_ok kept an old mode
        for sub in (self.root / "endpoints", self.logs, self.trainer):
            sub.mkdir(mode=0o700, exist_ok=True)

    def recipe(self) -> Recipe:
        try:
            return from_json(self.recipe_json.read_bytes())
        except FileNotFoundError:
            raise LaunchError(f"{self.root} is not an msd job folder (no recipe.json)") from None
        except msgspec.MsgspecError as exc:
            raise LaunchError(f"{self.recipe_json} is not a valid recipe ({exc})") from None

    def write_json(self, path: Path, data: dict[str, Any]) -> None:
        atomic_write(path, json.dumps(data, indent=2, sort_keys=True).encode())

    def write_json_in_place(self, path: Path, data: dict[str, Any]) -> None:
        """Overwrite ``path`` itself, not via a new file: on a full disk its own blocks are
        freed and reused (a reader may see it half written, which a torn JSON read tells)."""
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.truncate(0)
            f.write(json.dumps(data, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())

    def read_json(self, path: Path) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(path.read_text())
        return result

    def endpoint_file(self, name: str) -> Path:
        return self.root / "endpoints" / name

    def publish(self, name: str, endpoint: str) -> None:
        """Publish a role's address, stamped with the data plane's incarnation. Not synced to
        disk: an address lives no longer than its process, and the fsync (~10 ms) would be paid
        by each of hundreds of Constructors at start-up."""
        address = f"{endpoint}\n{incarnation()}\n".encode()
        atomic_write(self.endpoint_file(name), address, durable=False)

    def read_endpoint(self, name: str) -> Published | None:
        """What is published as ``name`` now (None: nothing yet)."""
        try:
            lines = self.endpoint_file(name).read_text().split()
        except FileNotFoundError:
            return None
        return Published(lines[0], int(lines[1]) if len(lines) > 1 else 0) if lines else None

    def wait_published(self, name: str, timeout_s: float = 60.0) -> Published:
        """``name``'s endpoint once its role has published it: on SLURM, by a role of this
        process's incarnation or a later one (an older one's address is of a stopped role)."""
        deadline = time.monotonic() + timeout_s
        least = incarnation()
        while (found := self.read_endpoint(name)) is None or found.incarnation < least:
            if time.monotonic() > deadline:
                raise LaunchError(f"no {name} endpoint in {self.root} after {timeout_s:.0f} s")
            time.sleep(0.02)
        return found

    def wait_endpoint(self, name: str, timeout_s: float = 60.0) -> str:
        """The address ``name`` serves, once published (``wait_published``)."""
        return self.wait_published(name, timeout_s).address

    def log_path(self, role: str, name: str) -> Path:
        return self.logs / f"{role}-{name.replace('/', '-')}.log"

    def rank_log(self, rank: int) -> Path:
        return self.trainer / f"rank-{rank}.jsonl"
