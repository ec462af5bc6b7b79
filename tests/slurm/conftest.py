"""The `slurm_cluster` fixture: the two-node test cluster of tests/slurm/cluster/up.sh, or a skip.

With MSD_REQUIRE_SLURM=1 (CI sets it) a missing cluster fails the tests instead of skipping them,
so a broken set-up cannot pass as green.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

NODES = ("n1", "n2")
PARTITION = "debug"
_HEALTHY_STATES = {"idle", "mix", "alloc", "comp"}
_COMMAND_TIMEOUT_S = 30
_START_HINT = "run tests/slurm/cluster/up.sh"
_UP = Path(__file__).resolve().parent / "cluster" / "up.sh"
_CLUSTER_DIR = Path(os.environ.get("MSD_SLURM_DIR", "/tmp/msd-slurm"))
_UP_TIMEOUT_S = 300
log = logging.getLogger(__name__)


def _run(*command: str) -> str | None:
    """The command's output, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _why_not_up() -> str | None:
    # `scontrol ping` answers at once; `sinfo` retries for ~9 s when slurmctld is down.
    if "UP" not in (_run("scontrol", "ping") or ""):
        return "slurmctld does not answer `scontrol ping`"
    listing = _run("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t")
    if listing is None:
        return "sinfo does not answer"
    states = dict(line.split(maxsplit=1) for line in listing.splitlines() if line.strip())
    unready = [
        f"{node}={states.get(node, 'missing')}"
        for node in NODES
        if states.get(node) not in _HEALTHY_STATES
    ]
    return f"nodes not ready: {', '.join(unready)}" if unready else None


@pytest.fixture(scope="session")
def slurm_cluster() -> tuple[str, ...]:
    """The names of the cluster's nodes, once `sinfo` shows every one of them ready."""
    why = _why_not_up()
    if why is None:
        return NODES
    if os.environ.get("MSD_REQUIRE_SLURM") == "1":
        pytest.fail(
            "SLURM is required (MSD_REQUIRE_SLURM=1) but the test cluster is not up: "
            f"{_START_HINT} ({why})",
            pytrace=False,
        )
    pytest.skip(f"the SLURM test cluster is not up ({why}): {_START_HINT}")


def _dead_daemons() -> list[str]:
    """The daemons up.sh started (its pid files) that no longer run."""
    run = _CLUSTER_DIR / "run"
    dead = []
    for name in ("slurmctld", *(f"slurmd-{node}" for node in NODES)):
        try:
            pid = int((run / f"{name}.pid").read_text())
            alive = Path(f"/proc/{pid}/comm").read_text().strip() == name.split("-")[0]
        except (OSError, ValueError):
            alive = False
        if not alive:
            dead.append(name)
    return dead


@pytest.fixture(autouse=True)
def slurm_daemons_alive() -> Iterator[None]:
    """Before each test, a daemon of the test cluster that died (Debian's slurmd has aborted
    on heap corruption after a job step ended) is brought back by up.sh, so one crash of the
    test cluster does not fail every test after it. A cluster up.sh never started is left to
    the ``slurm_cluster`` fixture."""
    if (_CLUSTER_DIR / "run").is_dir():
        dead = _dead_daemons()
        if dead:
            log.warning("the SLURM test cluster lost %s; restarting it", ", ".join(dead))
            done = subprocess.run(
                ["bash", str(_UP)], capture_output=True, text=True, timeout=_UP_TIMEOUT_S
            )
            if done.returncode != 0:
                pytest.fail(f"up.sh could not restart the test cluster: {done.stderr[-500:]}")
    yield
