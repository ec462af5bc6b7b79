"""What a trainer pays to import msd: the Client, and nothing of the data plane behind it.

``from msd.client import Client`` must load no role, planning or launch module, nor pyarrow (a
trainer reads batches, not Parquet); ``import msd`` alone must not load torch (the roles import it
too).
"""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN_UNDER_CLIENT = ("msd.roles", "msd.plan", "msd.launch", "pyarrow")


def _modules_after(code: str) -> list[str]:
    """The modules loaded once ``code`` ran in a fresh interpreter."""
    probe = f"{code}; import json, sys; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    modules: list[str] = json.loads(result.stdout.splitlines()[-1])
    return modules


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_client_loads_no_role_plan_or_launch_module_nor_pyarrow():
    modules = _modules_after("from msd.client import Client")
    assert "msd.client.torch" in modules  # the probe sees what the import loaded
    loaded = [m for m in modules if any(_under(m, p) for p in FORBIDDEN_UNDER_CLIENT)]
    assert loaded == []


def test_importing_msd_loads_no_torch():
    modules = _modules_after("import msd")
    assert not any(_under(m, "torch") for m in modules)


def test_the_probe_sees_a_forbidden_module_when_one_is_loaded():
    modules = _modules_after("from msd.client import Client; import msd.roles.constructor.intake")
    assert "msd.roles.constructor.intake" in modules and "torch" in modules
