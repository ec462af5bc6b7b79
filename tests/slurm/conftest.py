"""The `slurm_cluster` fixture: the two-node test cluster of tests/slurm/cluster/up.sh, or a skip.

With MSD_REQUIRE_SLURM=1 (CI sets it) a missing cluster fails the tests instead of skipping them,
so a broken set-up cannot pass as green.
"""

from __future__ import annotations

import os
import subprocess

import pytest

NODES = ("n1", "n2")
PARTITION = "debug"
_HEALTHY_STATES = {"idle", "mix", "alloc", "comp"}
_COMMAND_TIMEOUT_S = 30
_START_HINT = "run tests/slurm/cluster/up.sh"


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
