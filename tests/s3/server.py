"""A real S3-compatible server for the tests: moto's standalone server on loopback, auth on.

``start()`` runs ``python -m moto.server`` as a child in its own session on a free loopback port,
with ``INITIAL_NO_AUTH_ACTION_COUNT`` set so that moto lets exactly the first few requests through
unsigned: those create an IAM user with an allow-all inline policy and an access key. From then
on moto checks every request's signature like S3 does: a wrong key or secret is refused
(403 ``InvalidAccessKeyId`` / ``SignatureDoesNotMatch``), and so is an unsigned request (moto
answers those with an HTTP 500, not the 403 of real S3).

moto keeps its objects in memory, so the server is paused (SIGSTOP) and resumed (SIGCONT), never
restarted, when a test needs "the store stopped answering for a while".

A running server can be shared between commands through a JSON state file (``save``/``load``);
``python -m tests.s3.server up|down STATE_FILE`` (what ``tests/s3/up.sh`` and ``down.sh`` run)
starts one that outlives the command, and stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pyarrow.fs as pafs

HOST = "127.0.0.1"
REGION = "us-east-1"
USER = "msd"
STATE_ENV = "MSD_S3_STATE"
DEFAULT_STATE_FILE = Path("/tmp/msd-s3/state.json")
LOG_NAME = "moto.log"
# What `python -m moto.server` needs beyond moto itself (the `server` extra's flask and
# flask-cors; tests/s3 does not need the rest of that extra).
REQUIRED_MODULES = ("moto", "flask", "flask_cors", "boto3")
# Unsigned requests moto lets through: create_user, put_user_policy, create_access_key.
_NO_AUTH_ACTIONS = 3
_READY_TIMEOUT_S = 60.0
_ANSWER_TIMEOUT_S = 2.0
_STOP_TIMEOUT_S = 10.0
_POLL_S = 0.1
_LOG_TAIL_LINES = 25
_ALLOW_ALL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}
# Variables of the caller's environment that would override or spoil the server's credentials
# and endpoint (msd.sources.storage reads AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL).
CONFLICTING_ENV = (
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL_S3",
)
_BUCKET_MAX = 63
_BUCKET_SUFFIX_LEN = 8
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


@dataclass
class S3Server:
    """A running moto server: where it listens, the access key it accepts, its process."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str
    pid: int
    log: str = ""
    # Set when this process started the server (its child): stop() reaps it.
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def env(self) -> dict[str, str]:
        """The environment variables that point an AWS client (pyarrow, boto3, msd) here."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def filesystem(self, **options: object) -> pafs.S3FileSystem:
        """A pyarrow filesystem signed with the server's key; ``options`` go to S3FileSystem."""
        settings: dict[str, object] = {
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "endpoint_override": self.endpoint,
            "region": self.region,
            "allow_bucket_creation": True,
        }
        settings.update(options)
        return pafs.S3FileSystem(**settings)

    def make_bucket(self, name: str) -> None:
        """Create the bucket ``name``."""
        self.filesystem().create_dir(name)

    def upload(self, local_dir: Path, url: str) -> None:
        """Copy every file under ``local_dir`` to ``url`` (``s3://bucket/prefix``), keeping their
        paths relative to ``local_dir``."""
        dest = s3_path(url)
        fs = self.filesystem()
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                key = f"{dest}/{path.relative_to(local_dir).as_posix()}"
                with fs.open_output_stream(key, compression=None) as out:
                    out.write(path.read_bytes())

    def answers(self, timeout_s: float = _ANSWER_TIMEOUT_S) -> bool:
        """Whether the server answers an HTTP request within ``timeout_s``."""
        return _answers(self.endpoint, timeout_s)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted, nothing is answered."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT), with every object it held."""
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a while); its objects are gone."""
        if _is_moto(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
                os.kill(self.pid, signal.SIGCONT)  # a paused process acts on SIGTERM once resumed
            if not _wait_gone(self.pid, _STOP_TIMEOUT_S):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                _wait_gone(self.pid, _STOP_TIMEOUT_S)
        if self._process is not None:
            self._process.wait(timeout=_STOP_TIMEOUT_S)


@dataclass
class S3Bucket:
    """One test's bucket on a server (what the ``s3`` fixture gives)."""

    server: S3Server
    bucket: str

    def url(self, prefix: str = "") -> str:
        """``s3://BUCKET/PREFIX`` (``s3://BUCKET`` for no prefix)."""
        prefix = prefix.strip("/")
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def upload(self, local_dir: Path, prefix: str = "") -> str:
        """Copy every file under ``local_dir`` to ``url(prefix)``; returns that URL."""
        url = self.url(prefix)
        self.server.upload(local_dir, url)
        return url


def s3_path(url: str) -> str:
    """``bucket/prefix`` of ``s3://bucket/prefix`` (the form pyarrow's S3FileSystem takes)."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    path = url[len("s3://") :].strip("/")
    if not path:
        raise ValueError(f"no bucket in {url!r}")
    return path


def bucket_name(hint: str) -> str:
    """A fresh, valid S3 bucket name (3-63 characters of ``a-z0-9-``) made from ``hint`` (a test's
    name) and a random suffix, so that no two calls give the same name."""
    suffix = uuid.uuid4().hex[:_BUCKET_SUFFIX_LEN]
    slug = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-")
    slug = slug[: _BUCKET_MAX - _BUCKET_SUFFIX_LEN - 1].strip("-") or "t"
    if slug.startswith(("xn--", "sthree")):  # prefixes S3 reserves
        slug = f"t-{slug}"[: _BUCKET_MAX - _BUCKET_SUFFIX_LEN - 1].strip("-")
    name = f"{slug}-{suffix}"
    if not _BUCKET_NAME.match(name):
        raise AssertionError(f"made an invalid bucket name {name!r} from {hint!r}")
    return name


def missing_modules() -> list[str]:
    """The modules the server needs that cannot be imported here (empty when all are there)."""
    return [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]


def default_state_file() -> Path:
    """The state file of the shared server: ``$MSD_S3_STATE``, else /tmp/msd-s3/state.json."""
    return Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_FILE)


def start(port: int | None = None, log_dir: Path | None = None) -> S3Server:
    """Start a moto server on ``port`` (a free one if None) of loopback, with auth on, and
    create its user and key. Its output goes to ``log_dir``/moto.log (a new temp dir if None).
    Raises RuntimeError if it does not come up."""
    port = port or _free_port()
    endpoint = f"http://{HOST}:{port}"
    log = Path(log_dir or tempfile.mkdtemp(prefix="msd-s3-")) / LOG_NAME
    log.parent.mkdir(parents=True, exist_ok=True)
    process = _spawn(port, log)
    try:
        _wait_ready(process, endpoint, log)
        access_key, secret_key = _create_key(endpoint)
        _check_auth_on(endpoint, access_key)
    except BaseException:
        _kill(process)
        raise
    return S3Server(endpoint, access_key, secret_key, REGION, process.pid, str(log), process)


def save(server: S3Server, path: Path) -> None:
    """Write the server's address, key and pid to the JSON state file ``path``."""
    state = {
        "endpoint": server.endpoint,
        "access_key": server.access_key,
        "secret_key": server.secret_key,
        "region": server.region,
        "pid": server.pid,
        "log": server.log,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)


def load(path: Path) -> S3Server | None:
    """The server named by the state file ``path``; None if the file is missing or unreadable,
    or its process no longer runs."""
    try:
        state = json.loads(path.read_text())
        server = S3Server(
            endpoint=str(state["endpoint"]),
            access_key=str(state["access_key"]),
            secret_key=str(state["secret_key"]),
            region=str(state["region"]),
            pid=int(state["pid"]),
            log=str(state.get("log", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return server if _is_moto(server.pid) else None


def _free_port() -> int:
    """A TCP port of loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(port: int, log: Path) -> subprocess.Popen[bytes]:
    """``python -m moto.server`` in its own session, its output appended to ``log``."""
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_NO_AUTH_ACTIONS)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _answers(endpoint: str, timeout_s: float) -> bool:
    """Whether moto's own API (which does not count as one of the unsigned actions) answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{endpoint}/moto-api/", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def _wait_ready(process: subprocess.Popen[bytes], endpoint: str, log: Path) -> None:
    """Return once the server answers; RuntimeError if it exits or stays silent too long."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not _answers(endpoint, _ANSWER_TIMEOUT_S):
        code = process.poll()
        if code is not None:
            raise RuntimeError(
                f"the moto server exited with code {code} before answering on {endpoint}"
                f"{_log_tail(log)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the moto server did not answer on {endpoint} within {_READY_TIMEOUT_S:.0f} s"
                f"{_log_tail(log)}"
            )
        time.sleep(_POLL_S)


def _client(service: str, endpoint: str, access_key: str, secret_key: str) -> Any:
    """A boto3 client of ``service`` at ``endpoint`` that does not retry."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


def _create_key(endpoint: str) -> tuple[str, str]:
    """Through the unsigned first actions: an IAM user allowed everything, and its access key."""
    iam = _client("iam", endpoint, "bootstrap", "bootstrap")
    iam.create_user(UserName=USER)
    iam.put_user_policy(UserName=USER, PolicyName="all", PolicyDocument=json.dumps(_ALLOW_ALL))
    key = iam.create_access_key(UserName=USER)["AccessKey"]
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def _check_auth_on(endpoint: str, access_key: str) -> None:
    """RuntimeError unless the server now refuses a request signed with a wrong secret."""
    from botocore.exceptions import ClientError

    s3 = _client("s3", endpoint, access_key, "not-the-secret")
    try:
        s3.list_buckets()
    except ClientError:
        return
    raise RuntimeError(f"the moto server on {endpoint} accepts a wrong secret: auth is off")


def _is_moto(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) ``moto.server`` process."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "moto.server" in proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether the process ``pid`` ended (or became a zombie) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while _is_moto(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _kill(process: subprocess.Popen[bytes]) -> None:
    """End a server this process started, and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait(timeout=_STOP_TIMEOUT_S)


def _log_tail(log: Path) -> str:
    """The last lines of the server's log, for an error message."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return ""
    return f"; last lines of {log}:\n" + "\n".join(lines) if lines else f" ({log} is empty)"


def _up(state_file: Path) -> str:
    """Start a server that outlives this command (unless one answers already); what happened."""
    server = load(state_file)
    if server is not None and server.answers():
        return f"S3 server already up at {server.endpoint} (pid {server.pid})"
    if server is not None:  # alive but silent: paused or hung
        server.stop()
    server = start(log_dir=state_file.parent)
    save(server, state_file)
    return f"S3 server up at {server.endpoint} (pid {server.pid}); state in {state_file}"


def _down(state_file: Path) -> str:
    """Stop the server of the state file, if it runs; what happened."""
    server = load(state_file)
    state_file.unlink(missing_ok=True)
    if server is None:
        return "no S3 server was running"
    server.stop()
    return f"S3 server at {server.endpoint} (pid {server.pid}) stopped"


def main(argv: list[str] | None = None) -> int:
    """``up STATE_FILE`` / ``down STATE_FILE``: start or stop the shared server."""
    parser = argparse.ArgumentParser(prog="python -m tests.s3.server", description=__doc__)
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("state_file", type=Path, nargs="?", default=default_state_file())
    args = parser.parse_args(argv)
    try:
        said = _up(args.state_file) if args.command == "up" else _down(args.state_file)
    except RuntimeError as error:
        print(f"{args.command}: FAILED: {error}", file=sys.stderr)
        return 1
    print(f"{args.command}: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
