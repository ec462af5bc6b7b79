"""Shared fixtures: tiny Parquet sources made in tmp_path and recipes that point at them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from msd.synth.text import SynthSource, synth
from tests.s3 import server as s3server
from tests.stores import Bucket, registry
from tests.stores import process as emulators

SMALL_SOURCES = (
    SynthSource("web", median_tokens=40, sigma=0.8, max_tokens=700, num_samples=500),
    SynthSource("code", median_tokens=120, sigma=0.8, max_tokens=700, num_samples=300),
    SynthSource("books", median_tokens=300, sigma=0.6, max_tokens=700, num_samples=150),
)


@pytest.fixture(scope="session")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    synth(root, SMALL_SOURCES, seed=5, files_per_source=2, rows_per_row_group=32)
    return root


def base_recipe(data: Path, **overrides: Any) -> dict[str, Any]:
    recipe: dict[str, Any] = {
        "name": "t",
        "seed": 11,
        "seq_len": 512,
        "global_batch_tokens": 4096,
        "distribute": {"dp": 4},
        "sources": [
            {
                "name": s.name,
                "path": str(data / s.name / "*.parquet"),
                "text_column": "text",
                "weight": w,
                "repeat": False,
                "loaders": 2,
            }
            for s, w in zip(SMALL_SOURCES, (0.5, 0.3, 0.2), strict=True)
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }
    recipe.update(overrides)
    return recipe


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(recipe: dict[str, Any], name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    return write


def read_rank_logs(job_root: Path) -> dict[int, list[dict[str, Any]]]:
    logs = {}
    for path in sorted((job_root / "trainer").glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        # a rank still writing may have its last line half written: read whole lines only
        whole = path.read_text().split("\n")[:-1]
        logs[rank] = [json.loads(line) for line in whole if line]
    return logs


def processes_of_launcher(launcher_pid: int) -> list[psutil.Process]:
    """Every live process started by the launcher with that pid (they carry it in their env)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("MSD_LAUNCHER_PID") == str(
                launcher_pid
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def run_msd(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`msd ARGS` as a user runs it, output captured."""
    result = subprocess.run(
        [sys.executable, "-m", "msd.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    _LAUNCHED.append((result, cwd))
    return result


def restore_sigint() -> None:
    """For ``preexec_fn``: a shell without job control starts background commands with SIGINT
    ignored, and Python keeps it ignored; a user's terminal delivers Ctrl-C with the default
    action. Tests that send SIGINT start their commands this way."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Launcher(subprocess.Popen[str]):
    """A launcher started by a test; keeps what ``communicate`` read (``said``), so a failed
    test can still show it."""

    said: tuple[str, str] | None = None

    def communicate(self, *args: Any, **kwargs: Any) -> tuple[str, str]:
        out, err = super().communicate(*args, **kwargs)
        self.said = (out or "", err or "")
        return self.said


# What the running test launched: (launcher or finished command, its working folder). A failed
# test shows each one's output and the tails of its jobs' logs (``pytest_runtest_makereport``).
_LAUNCHED: list[tuple[Launcher | subprocess.CompletedProcess[str], Path]] = []


def start_launch(cwd: Path, recipe_file: str, *options: str) -> Launcher:
    """`msd launch RECIPE [OPTIONS]` in the background, its output captured."""
    launcher = Launcher(
        [sys.executable, "-m", "msd.cli", "launch", recipe_file, *options],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=restore_sigint,  # `msd stop` and Ctrl-C reach it as they reach a user's
    )
    _LAUNCHED.append((launcher, cwd))
    return launcher


def wait_for_file(
    cwd: Path, pattern: str, launcher: subprocess.Popen[str], lines: int = 0, timeout_s: float = 120
) -> Path:
    """The first file matching ``pattern`` under ``cwd`` once it has ``lines`` lines, while the
    launcher still runs; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        found = sorted(cwd.glob(pattern))
        if found and len(found[0].read_text().splitlines()) >= lines:
            return found[0]
        time.sleep(0.2)
    raise LaunchFailed(f"{pattern} did not appear", launcher)


LOG_TAIL_LINES = 30
_LOGS = ("runs/*/logs/*", "runs/*/slurm/*.out", "runs/*/slurm/*.err")


def role_log_tails(cwd: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of every role log (and SLURM job log) of the jobs under ``cwd``."""
    parts = []
    for log in sorted({path for pattern in _LOGS for path in cwd.glob(pattern)}):
        if log.is_file() and log.stat().st_size:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.relative_to(cwd)} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts) or f"(no role logs under {cwd})"


def launcher_output(launcher: Launcher | subprocess.Popen[str]) -> tuple[str, str]:
    """What the launcher wrote; one still running is killed first (its pipes can only be read
    to their end once it has ended)."""
    if isinstance(launcher, Launcher) and launcher.said is not None:
        return launcher.said
    if launcher.poll() is None:
        launcher.kill()
    try:
        return launcher.communicate(timeout=30)
    except (ValueError, OSError, subprocess.TimeoutExpired):  # read already, or stuck
        return "", ""


def launch_report(run: Launcher | subprocess.CompletedProcess[str], cwd: Path) -> str:
    """A launcher's (or a finished command's) exit code and output, and its jobs' log tails."""
    if isinstance(run, subprocess.CompletedProcess):
        code, (out, err) = run.returncode, (run.stdout or "", run.stderr or "")
    else:
        out, err = launcher_output(run)
        code = run.returncode
    command = " ".join(str(a) for a in run.args[3:])  # after `python -m msd.cli`
    return (
        f"=== msd {command} (in {cwd}): exit code {code}\n--- stdout\n{out}\n"
        f"--- stderr\n{err}\n{role_log_tails(cwd)}"
    )


class LaunchFailed(AssertionError):
    """A launch-driving test's failure; the launcher is ended so that its output can be read
    (the failed test's report shows it, with the role logs' tails)."""

    def __init__(self, what: str, launcher: subprocess.Popen[str]) -> None:
        launcher_output(launcher)
        super().__init__(f"{what} (launcher exit code {launcher.returncode}; its output below)")


def assert_launch_ok(launcher: subprocess.Popen[str], out: str, err: str) -> None:
    """The launcher (its output read already) exited 0; else fail (its output below)."""
    if launcher.returncode != 0:
        raise LaunchFailed(f"the launcher failed: {err.strip()[-500:]}", launcher)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report shows what each launcher and ``msd`` command it ran wrote, and the
    tails of its jobs' role logs."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and _LAUNCHED:
        for run, cwd in _LAUNCHED:
            report.sections.append(("msd launched by this test", launch_report(run, cwd)))
    if report.when == "teardown" or report.failed:
        _LAUNCHED.clear()


@pytest.fixture(autouse=True)
def record_digests(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ``MSD_RECORD_DIGESTS=FILE``: after each test, append every batch digest its jobs'
    ranks logged (one JSON line a test), to compare two versions' streams test by test."""
    out = os.environ.get("MSD_RECORD_DIGESTS")
    if not out or "tmp_path" not in request.fixturenames:
        yield
        return
    root: Path = request.getfixturevalue("tmp_path")
    yield
    jobs = sorted({p.parent.parent for p in root.rglob("trainer/rank-*.jsonl")}, key=str)
    found: dict[str, dict[int, list[tuple[int, str]]]] = {}
    for index, job in enumerate(sorted(jobs, key=lambda j: j.stat().st_mtime)):
        ranks = read_rank_logs(job)
        found[f"{job.relative_to(root).parent}#{index}"] = {
            rank: sorted({(int(e["step"]), str(e["digest"])) for e in lines if "digest" in e})
            for rank, lines in ranks.items()
        }
    with open(out, "a") as f:
        f.write(json.dumps({"test": request.node.nodeid, "jobs": found}) + "\n")


_S3_START_HINT = "run tests/s3/up.sh"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.S3Server]:
    """A real S3-compatible server (moto, auth on): the one tests/s3/up.sh started (its state
    file: ``$MSD_S3_STATE``, else /tmp/msd-s3/state.json) if it answers, else one started for
    this session and stopped at its end. Without moto it skips; with MSD_REQUIRE_S3=1 it fails."""
    shared = s3server.load(s3server.default_state_file())
    if shared is not None and shared.answers():
        yield shared
        return
    missing = s3server.missing_modules()
    if missing:
        why = f"{', '.join(missing)} not importable: pip install -e '.[dev]'"
        if os.environ.get("MSD_REQUIRE_S3") == "1":
            pytest.fail(
                f"S3 is required (MSD_REQUIRE_S3=1) but no S3 test server is up and {why}; "
                f"or {_S3_START_HINT}",
                pytrace=False,
            )
        pytest.skip(f"no S3 test server ({why}), or {_S3_START_HINT}")
    server = s3server.start(log_dir=tmp_path_factory.mktemp("s3-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(
    s3_server: s3server.S3Server, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[s3server.S3Bucket]:
    """A fresh bucket for this test on the S3 test server, and the server's credentials and
    endpoint in ``os.environ`` (so commands the test starts inherit them)."""
    for name in s3server.CONFLICTING_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = s3server.bucket_name(request.node.name)
    s3_server.make_bucket(bucket)
    yield s3server.S3Bucket(s3_server, bucket)
    s3_server.resume()  # a test that failed while it had paused the server


_STORES_START_HINT = "run tests/stores/up.sh"


def _emulator(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[emulators.Emulator]:
    """The emulator of ``kind`` that tests/stores/up.sh started, if it answers; else one started
    for this session and stopped at its end. Where it cannot start it skips, or with
    MSD_REQUIRE_GCS=1 / MSD_REQUIRE_AZURE=1 fails."""
    shared = emulators.load(registry.state_file(kind))
    if shared is not None and shared.answers():
        yield shared
        return
    why = registry.KINDS[kind].missing()
    if why is not None:
        flag = f"MSD_REQUIRE_{kind.upper()}"
        if os.environ.get(flag) == "1":
            pytest.fail(
                f"the {kind} emulator is required ({flag}=1) but none is up and {why}; "
                f"or {_STORES_START_HINT}",
                pytrace=False,
            )
        pytest.skip(f"no {kind} emulator ({why}), or {_STORES_START_HINT}")
    emulator = registry.KINDS[kind].start(log_dir=tmp_path_factory.mktemp(f"{kind}-emulator"))
    try:
        yield emulator
    finally:
        emulator.stop()


def set_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str | None]) -> None:
    """Set each of ``values`` in ``os.environ`` for the test (None: unset it)."""
    for name, value in values.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[emulators.Emulator]:
    """A real GCS emulator (gcp-storage-emulator) on loopback (`_emulator`)."""
    yield from _emulator("gcs", tmp_path_factory)


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[emulators.Emulator]:
    """A real Azure Blob Storage emulator (Azurite, its development account) (`_emulator`)."""
    yield from _emulator("azure", tmp_path_factory)


def _bucket(
    kind: str,
    emulator: emulators.Emulator,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    home: Path,
) -> Bucket:
    """A fresh bucket (container) for this test, and the emulator's environment in
    ``os.environ`` (so commands the test starts inherit it)."""
    module = registry.KINDS[kind]
    set_env(monkeypatch, module.env(emulator, home))
    fs = module.filesystem(emulator)
    bucket = Bucket(kind, module.SCHEME, emulator, s3server.bucket_name(request.node.name), fs)
    fs.create_dir(bucket.name)
    return bucket


@pytest.fixture
def gcs(
    gcs_server: emulators.Emulator,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> Bucket:
    """A fresh bucket on the GCS emulator; no Google credentials in the environment."""
    home = tmp_path_factory.mktemp("home")
    return _bucket("gcs", gcs_server, request, monkeypatch, home)


@pytest.fixture
def azure(
    azure_server: emulators.Emulator,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> Bucket:
    """A fresh container on Azurite; its development account and key in the environment."""
    home = tmp_path_factory.mktemp("home")
    return _bucket("azure", azure_server, request, monkeypatch, home)


@pytest.fixture(params=["gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Bucket:
    """A fresh bucket on each emulator in turn (GCS, then Azure)."""
    bucket: Bucket = request.getfixturevalue(request.param)
    return bucket
