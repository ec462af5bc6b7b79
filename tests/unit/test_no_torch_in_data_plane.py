"""The Planner, the loaders, the Constructor and the launcher must not import torch.

Only `msd.Client` needs it (the demo trainer reads with `msd.NumpyClient`); every data-plane
process would otherwise pay seconds of start-up and hundreds of MB for nothing.
"""

from __future__ import annotations

import subprocess
import sys

DATA_PLANE = (
    "msd",
    "msd.roles.planner",
    "msd.roles.loader",
    "msd.roles.constructor",
    "msd.recipe",
    "msd.launch.local",
    # The role entry point every role starts through, and the launcher's own imports.
    "msd.roles.__main__",
    "msd.launch.check",
    "msd.cli.main",
    # The demo trainer reads numpy arrays (msd.NumpyClient): its ranks start without torch.
    "msd.trainer.demo",
    "msd.client.numpy",
)


def _torch_imported_after(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", f"{code}; import sys; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_data_plane_modules_do_not_import_torch():
    assert _torch_imported_after(f"import {', '.join(DATA_PLANE)}") == "False"


def test_the_check_is_able_to_see_torch():
    # The same probe reports True once the trainer side is imported: it can fail.
    assert _torch_imported_after("import msd; msd.Client") == "True"
