"""`msd --version`: the version is written once, in msd/__init__.py."""

from __future__ import annotations

import re
from importlib.metadata import version

from msd.cli.main import app
from typer.testing import CliRunner

import msd


def test_msd_version_prints_the_package_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"msd {msd.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", msd.__version__)


def test_the_installed_metadata_carries_the_same_version():
    assert version("msd") == msd.__version__
