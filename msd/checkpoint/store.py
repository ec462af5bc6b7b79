"""A job's checkpoints on disk: snapshots written atomically, a log of per-step deltas after
each, and finding the state at a step from them (the newest good snapshot at or before it, plus
the log). A damaged snapshot or log line is passed over for the good ones before it."""

from __future__ import annotations

import dataclasses
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from msd.checkpoint.format import (
    Delta,
    decode_delta,
    decode_snapshot,
    encode_delta,
    encode_snapshot,
    verified,
)
from msd.checkpoint.signing import key_for
from msd.checkpoint.snapshot import Snapshot, Totals
from msd.checkpoint.validate import delta_problem
from msd.errors import CheckpointError
from msd.jobdir import atomic_write
from msd.plan.step import PlannerState

_SNAPSHOT = re.compile(r"^step-(\d+)\.json$")
_LOG = re.compile(r"^log-(\d+)\.jsonl$")


def snapshot_name(step: int) -> str:
    return f"step-{step:08d}.json"


def log_name(step: int) -> str:
    return f"log-{step:08d}.jsonl"


@dataclass(frozen=True)
class Found:
    """The state at a step, rebuilt from ``path`` (a snapshot) and the log after it;
    ``passed_over``: damaged files or lines met on the way (newest first); ``verified``: the
    snapshot is signed with its job's key (``msd.checkpoint.signing``)."""

    snapshot: Snapshot
    path: Path
    passed_over: tuple[str, ...] = ()
    verified: bool = False

    @property
    def step(self) -> int:
        return self.snapshot.step


class CheckpointStore:
    """``JOB/checkpoints``: snapshots every so often, a delta a step in between. With the
    job's signing ``key``, snapshots are signed when written and checked when read."""

    def __init__(self, root: Path, keep: int = 3, key: bytes | None = None) -> None:
        self.root = root
        self.keep = max(1, keep)
        self.key = key
        self._log: BinaryIO | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    # -- writing ------------------------------------------------------------------------------
    def write_snapshot(self, snap: Snapshot, wait: bool = True) -> Path:
        """Write ``snap`` (temp file, fsync, rename); later deltas go to a new log after it; only
        the newest ``keep`` snapshots and their logs are kept. ``wait=False``: the file is
        written by a background thread (the caller's loop does not wait for the disk); a crash
        before it lands leaves the previous snapshot and the logs, which reach this step."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / snapshot_name(snap.step)
        data = encode_snapshot(snap, self.key)
        self.wait()
        self.close_log()
        # A new, empty log: lines a log of this step held from an earlier life are stale.
        self._log = open(self.root / log_name(snap.step), "wb")  # noqa: SIM115 - kept open
        if wait:
            self._write(path, data)
        else:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="msd-checkpoint")
            self._pending = self._writer.submit(self._write, path, data)
        return path

    def _write(self, path: Path, data: bytes) -> None:
        atomic_write(path, data)
        for step, old in self.snapshots()[: -self.keep]:
            old.unlink(missing_ok=True)
            (self.root / log_name(step)).unlink(missing_ok=True)

    def wait(self) -> None:
        """Until a snapshot being written in the background has landed (its error, if any)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def rewind(self, snap: Snapshot) -> Path:
        """Make ``snap`` the latest: the snapshots and logs of later steps are deleted (the
        stream from it is the same pure function; they would be written again)."""
        for step, path in self.snapshots():
            if step > snap.step:
                path.unlink(missing_ok=True)
        for step, path in self._logs():
            if step > snap.step:
                path.unlink(missing_ok=True)
        return self.write_snapshot(snap)

    def append(self, delta: Delta) -> None:
        """Add one consumed step to the log (after at least one snapshot)."""
        if self._log is None:
            raise CheckpointError(f"no snapshot written in {self.root} yet; cannot log a step")
        self._log.write(encode_delta(delta))
        self._log.flush()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        """Finish what is being written; close the log."""
        try:
            self.wait()
        finally:
            self.close_log()
            if self._writer is not None:
                self._writer.shutdown()
                self._writer = None

    # -- reading ------------------------------------------------------------------------------
    def snapshots(self) -> list[tuple[int, Path]]:
        """(step, path) of every snapshot file, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            m = _SNAPSHOT.match(path.name)
            if m:
                found.append((int(m.group(1)), path))
        return sorted(found)

    def _logs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := _LOG.match(p.name))]
        return sorted(found)

    def find(self, step: int | None = None) -> Found:
        """The state at ``step`` (default: the latest the log reaches)."""
        passed: list[str] = []
        candidates = [(s, p) for s, p in self.snapshots() if step is None or s <= step]
        for _, path in reversed(candidates):
            try:
                data = path.read_bytes()
                snap = decode_snapshot(data, path, self.key)
            except (CheckpointError, OSError) as exc:
                passed.append(str(exc))
                continue
            state, deltas, problem = self._replay(snap, step)
            if problem:
                passed.append(problem)
            if step is not None and state.step != step:
                passed.append(f"{path} and the log after it reach step {state.step}, not {step}")
                continue
            found = dataclasses.replace(snap, state=state, **_delivered(snap, deltas))
            return Found(found, path, tuple(passed), verified(data, self.key))
        where = f"at or before step {step} " if step is not None else ""
        detail = "; ".join(passed) if passed else "there is none"
        raise CheckpointError(f"no usable checkpoint {where}in {self.root}: {detail}")

    def _replay(self, snap: Snapshot, until: int | None) -> tuple[PlannerState, list[Delta], str]:
        """The snapshot's state with the logs after it applied, up to ``until``; the deltas
        applied, and the first damage met (the replay stops there)."""
        state, deltas = snap.state, list[Delta]()
        for start, path in self._logs():
            if start < snap.step:
                continue
            with open(path, "rb") as f:
                for number, line in enumerate(f, 1):
                    if until is not None and state.step >= until:
                        return state, deltas, ""
                    delta = decode_delta(line)
                    if delta is None:
                        return state, deltas, f"{path} line {number} is damaged; stopped there"
                    wrong = delta_problem(
                        delta.moved, delta.carry, delta.tokens, len(state.cursors)
                    )
                    if wrong:
                        return state, deltas, f"{path} line {number} {wrong}; stopped there"
                    if delta.step <= state.step:
                        continue
                    if delta.step != state.step + 1:
                        return state, deltas, f"{path} line {number} skips a step; stopped there"
                    state = delta.apply(state)
                    deltas.append(delta)
        return state, deltas, ""


def _delivered(snap: Snapshot, deltas: list[Delta]) -> dict[str, Any]:
    """The snapshot's totals and counters with what the logged steps delivered added."""
    samples, tokens = list(snap.totals.source_samples), list(snap.totals.source_tokens)
    counters = snap.counters
    for delta in deltas:
        counters += delta.counters
        for source, n, t in delta.sources:
            if source < len(samples) and source < len(tokens):  # a snapshot without them: none
                samples[source] += n
                tokens[source] += t
    total = snap.totals.tokens + sum(d.tokens for d in deltas)
    return {"totals": Totals(total, tuple(samples), tuple(tokens)), "counters": counters}


def open_checkpoint(path: Path, step: int | None = None) -> Found:
    """What ``msd restore PATH`` continues from: a snapshot file (exactly its step), a job
    folder or its ``checkpoints`` folder (the latest step, or ``step``). Verified when its
    job's key is beside it (``JOB/job.key``) and its signature matches; refused when signed
    and the signature does not match."""
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    key = key_for(path)
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"cannot read {path} ({exc.strerror or exc})") from None
        snap = decode_snapshot(data, path, key)
        if step is not None and step != snap.step:
            raise CheckpointError(f"{path} holds step {snap.step}, not {step}")
        return Found(snap, path, verified=verified(data, key))
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not CheckpointStore(root).snapshots():
        raise CheckpointError(f"{path} holds no checkpoint (no {root}/step-*.json)")
    return CheckpointStore(root, key=key).find(step)
