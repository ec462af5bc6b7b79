"""The launcher's core, whatever places the roles: a job's life from start to its outcome.

A placement (``msd.launch.local``: subprocesses of this machine; ``msd.launch.slurm``: SLURM
jobs through submitit) says how roles are started, checked, recovered and stopped; ``Job``
runs the rest the same way for both: the job folder and its ``job.json``, the loop that asks the
Planner for its status, following rescales, and how the run ends (its ``Outcome``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import zmq

from msd.checkpoint.snapshot import Snapshot
from msd.errors import LaunchError, MsdError
from msd.jobdir import JobDir, full_message, is_full
from msd.launch.jobfolder import prepare_job, write_job_state
from msd.launch.listing import pin_files
from msd.plan.schedule import MixChange
from msd.recipe.schema import Recipe
from msd.wire import transport
from msd.wire.protocol import Status, StatusRequest, Stop

STATUS_EVERY_S = 0.5
INTERRUPTED = "interrupted (Ctrl-C); every process of the job was stopped"
STOPPED = "stopped on request; every process of the job was stopped"


@dataclass
class Outcome:
    ok: bool
    message: str
    status: Status | None
    job: JobDir


class Job:
    """One launch. A placement sets ``cluster`` and the timings, and implements the hooks
    below the ``-- placement`` line; ``run`` (or ``watch`` once started) does the rest."""

    cluster: ClassVar[str]
    poll_s: ClassVar[float]  # the longest wait for a status reply
    check_every_s: ClassVar[float]  # how often the roles are checked (0: every poll)
    finish_s: ClassVar[float]  # how long roles get to end by themselves after Stop

    def __init__(
        self,
        recipe: Recipe,
        recipe_text: str,
        run_root: Path,
        mix_history: tuple[MixChange, ...] = (),
        resume: Snapshot | None = None,
    ) -> None:
        self.recipe = recipe = pin_files(recipe)  # what every role reads: msd.launch.listing
        self.job = prepare_job(recipe, recipe_text, run_root, mix_history, resume)
        self.rescales_seen = (0.0, 0.0)  # mtimes of JOB/loaders.json, JOB/shadows.json
        self.sock: zmq.Socket[Any] | None = None
        self.stop_requested = threading.Event()  # set by `request_stop`, from any thread
        self._setup()
        self._write_job_json("starting")

    def _write_job_json(self, state: str) -> None:
        write_job_state(self.job, self.recipe, self.cluster, state, **self._job_fields())

    # -- the run ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every role of the job."""
        self._start_roles()
        self._write_job_json("running")

    def run(
        self,
        on_status: Callable[[Status], None],
        on_started: Callable[[dict[str, str]], None] | None = None,
    ) -> Outcome:
        """Start every role (``on_started`` gets each one's pid or SLURM job id), then
        ``watch``; a Ctrl-C or an error during start-up stops what started."""
        failed = self.try_start()
        if failed is not None:
            return failed
        if on_started is not None:
            on_started(self.started())
        return self.watch(on_status)

    def try_start(self) -> Outcome | None:
        """``start``, or the outcome of a start-up that failed or was interrupted (what
        started is stopped again)."""
        try:
            with self._starting():
                self.start()
        except KeyboardInterrupt:
            return self._start_failed(INTERRUPTED)
        except (MsdError, OSError) as exc:
            if isinstance(exc, OSError) and not is_full(exc):
                raise
            return self._start_failed(_message(exc, self.job))
        return None

    def request_stop(self) -> None:
        """Ask ``watch`` (in whatever thread it runs) to stop every role and end ``STOPPED``."""
        self.stop_requested.set()

    def _start_failed(self, message: str) -> Outcome:
        self.shut_down()
        with contextlib.suppress(MsdError):
            self._write_job_json(final_state(message))
        return Outcome(False, message, None, self.job)

    def watch(self, on_status: Callable[[Status], None]) -> Outcome:
        """Run until the trainers finish or something fails; always stop every role."""
        status: Status | None = None
        failure: str | None = None
        try:
            self._connect()
            status, failure = self._watch_loop(on_status)
            if failure is None:
                status = self._finish(status)
        except KeyboardInterrupt:
            failure = INTERRUPTED
        except (MsdError, OSError) as exc:  # OSError: the launcher's own writes
            if isinstance(exc, OSError) and not is_full(exc):
                raise
            failure = _message(exc, self.job)
        finally:
            self.shut_down()
        return self._end(failure, status)

    def _end(self, failure: str | None, status: Status | None) -> Outcome:
        try:
            self._write_job_json(final_state(failure))
        except LaunchError as exc:
            failure = failure or str(exc)
        return Outcome(failure is None, failure or "done", status, self.job)

    def _watch_loop(self, on_status: Callable[[Status], None]) -> tuple[Status | None, str | None]:
        """Check the roles and ask the Planner for its status until the run ends: the last
        status, and why it failed (None: the trainers finished)."""
        status: Status | None = None
        next_check = next_ask = 0.0
        while True:
            if self.stop_requested.is_set():
                return status, STOPPED
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.check_every_s
                ended, failure = self._check_roles(status)
                if ended:
                    return status, failure
            if time.monotonic() >= next_ask:
                transport.send(self._planner(), StatusRequest())
                next_ask = time.monotonic() + STATUS_EVERY_S
            reply = receive_status(self._planner(), self.poll_s)
            if reply is not None:
                status = reply
                on_status(reply)

    def _check_roles(self, status: Status | None) -> tuple[bool, str | None]:
        """(ended, failure): the trainers finished, a role failed for good, or go on."""
        try:
            ended, failure = self._check(status)
            if not ended:
                self._follow_rescales()
        except MsdError as exc:
            return True, str(exc)
        return ended, failure

    def _finish(self, status: Status | None) -> Status | None:
        """The trainers are done: the Planner's last status, then Stop and let roles end."""
        sock = self._planner()
        status = final_status(sock) or status
        transport.send(sock, Stop(reason="trainers finished"))
        self._wait_ended(self.finish_s)
        return status

    def _follow_rescales(self) -> None:
        """Start the loaders a rescale (``JOB/loaders.json``) or a shadow's take-over
        (``JOB/shadows.json``) added."""
        mtimes = tuple(
            path.stat().st_mtime if path.exists() else 0.0
            for path in (self.job.rescales, self.job.shadows)
        )
        if mtimes != self.rescales_seen:
            self.rescales_seen = (mtimes[0], mtimes[1])
            self._start_loaders()

    def _planner(self) -> zmq.Socket[Any]:
        if self.sock is None:
            raise LaunchError("the launcher lost its connection to the planner")
        return self.sock

    # -- placement ----------------------------------------------------------------------------
    def _setup(self) -> None:
        """The placement's own state, set before ``job.json`` is first written."""
        raise NotImplementedError

    def _job_fields(self) -> dict[str, Any]:
        """What this placement adds to ``job.json`` (after the common fields)."""
        raise NotImplementedError

    def _starting(self) -> contextlib.AbstractContextManager[None]:
        """Around ``start``: locally, Ctrl-C is held back while children are forked."""
        return contextlib.nullcontext()

    def _start_roles(self) -> None:
        """Start (or submit) every role of the job."""
        raise NotImplementedError

    def started(self) -> dict[str, str]:
        """Each role started, with its pid or SLURM job id."""
        raise NotImplementedError

    def _connect(self) -> None:
        """Wait for the Planner and connect ``self.sock`` (or let ``_planner`` do so)."""
        raise NotImplementedError

    def _check(self, status: Status | None) -> tuple[bool, str | None]:
        """(ended, failure): recover a role that ended if it can; ended once the trainers
        are done (failure None) or a role failed for good (why)."""
        raise NotImplementedError

    def _start_loaders(self) -> None:
        """Start every loader process of the recipe and its rescales not started yet."""
        raise NotImplementedError

    def _wait_ended(self, timeout_s: float) -> None:
        """After Stop, wait up to ``timeout_s`` for every role to end by itself."""
        raise NotImplementedError

    def shut_down(self) -> None:
        """Stop every role that still runs, and close the Planner's socket."""
        raise NotImplementedError


def _message(exc: MsdError | OSError, job: JobDir) -> str:
    """A user error's sentence; a full disk (the launcher's own writes) named as such."""
    return full_message(job.root) if isinstance(exc, OSError) else str(exc)


def receive_status(sock: zmq.Socket[Any], timeout_s: float) -> Status | None:
    """The Planner's next ``Status`` reply if one arrives within ``timeout_s``."""
    if not sock.poll(int(timeout_s * 1000)):
        return None
    msg = transport.recv(sock)[1]
    return msg if isinstance(msg, Status) else None


def final_status(sock: zmq.Socket[Any], timeout_s: float = 2.0) -> Status | None:
    """Ask the Planner for its status once more and wait for the answer."""
    transport.send(sock, StatusRequest())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sock.poll(100):
        msg = transport.recv(sock)[1]
        if isinstance(msg, Status):
            return msg
    return None


def final_state(failure: str | None) -> str:
    """``job.json``'s state once the launcher is done: ``done``, ``stopped`` (``msd stop``,
    Ctrl-C, ``request_stop``) or ``failed``."""
    if failure is None:
        return "done"
    return "stopped" if failure in (INTERRUPTED, STOPPED) else "failed"


_LOGGED_ERROR = re.compile(r"^msd\.errors\.\w+: (?P<message>.+)$")


def logged_error(log: Path, tail_bytes: int = 64 * 1024) -> str:
    """The last user error (an ``MsdError``'s sentence) a role's log ends with, or ""."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    found = [m["message"] for line in lines if (m := _LOGGED_ERROR.match(line))]
    return found[-1] if found else ""


def summary(status: Status) -> dict[str, Any]:
    """The run's figures as plain data (the CLI renders them; ``--json`` prints them)."""
    total = max(1, sum(status.source_samples))
    sources = status.view.sources if status.view is not None else ()
    return {
        "steps": status.consumed,
        "tokens": status.tokens_consumed,
        "elapsed_s": round(status.elapsed_s, 3),
        "tokens_per_s": round(status.tokens_consumed / max(status.elapsed_s, 1e-9), 1),
        "wait_p50_ms": round(status.wait_p50_ms, 3),
        "wait_p99_ms": round(status.wait_p99_ms, 3),
        "split_samples": status.split,
        "truncated_samples": status.truncated,
        "dropped_samples": status.dropped,
        "empty_samples": status.empty,
        "images": status.images,
        "skipped_images": sum(status.skipped_images),
        "skipped_images_by_source": {
            n: k for n, k in zip(status.source_names, status.skipped_images, strict=False) if k
        },
        "trained_tokens_by_source": {
            n: k for n, k in zip(status.source_names, status.trained_tokens, strict=False)
        },
        "left_out_by_source": {
            v.name: dict(sorted(v.left_out.items())) for v in sources if v.left_out
        },
        "videos_by_source": {
            v.name: {"read": v.videos_read, "seconds": v.video_s, "cpu_s": v.video_cpu_s}
            for v in sources
            if v.videos_read
        },
        "truncated_tokens": sum(status.truncated_tokens),
        "truncated_tokens_by_source": {
            n: t for n, t in zip(status.source_names, status.truncated_tokens, strict=True) if t
        },
        "constructor_step_bytes": status.constructor_step_bytes,
        "lifecycle": dict(status.lifecycle),
        "sources": {
            n: c / total for n, c in zip(status.source_names, status.source_samples, strict=True)
        },
    }
