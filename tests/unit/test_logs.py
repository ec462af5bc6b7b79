"""Logging: a role's lines name the role, its step and the level; ``msd -v`` sets the level."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from cli.main import app
from msd import logs


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sets msd's logging up anew; the ones after it find it as it was."""
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)  # and restored afterwards
    root = logging.getLogger("msd")
    saved = (list(root.handlers), root.level, root.propagate, dict(logs._context))
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    root.propagate = saved[2]
    logs._context.update(saved[3])


def test_a_role_writes_one_line_naming_its_role_step_and_level(capsys):
    logs.setup("loader", "web/0")
    logs.set_step(42)
    logging.getLogger("msd.roles.loader").info("ready in %.2f s", 0.5)
    logging.getLogger("msd.roles.loader").debug("not shown at INFO")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "INFO loader[web/0] step=42 msd.roles.loader: ready in 0.50 s" in lines[0]


def test_a_role_logs_at_the_level_its_launcher_passed_on(monkeypatch, capsys):
    monkeypatch.setenv(logs.LEVEL_ENV, "debug")
    logs.setup("constructor", "node-1")
    logging.getLogger("msd.roles.constructor").debug("plan in")
    assert "DEBUG constructor[node-1] step=" in capsys.readouterr().err
    monkeypatch.setenv(logs.LEVEL_ENV, "nonsense")
    assert logs.role_level() == logging.INFO


def test_verbosity_counts():
    assert [logs.level_from_verbosity(n) for n in (0, 1, 2, 3)] == [
        logging.WARNING,
        logging.INFO,
        logging.DEBUG,
        logging.DEBUG,
    ]


def test_the_cli_is_quiet_by_default_and_passes_no_level_on():
    result = CliRunner().invoke(app, ["validate", "missing.yaml"])
    assert result.exit_code != 0
    assert logging.getLogger("msd").level == logging.WARNING
    assert logs.LEVEL_ENV not in __import__("os").environ


@pytest.mark.parametrize(("flags", "level"), [(["-v"], "INFO"), (["-vv"], "DEBUG")])
def test_verbose_flags_set_the_level_of_the_cli_and_of_the_roles_it_starts(flags, level):
    import os

    result = CliRunner().invoke(app, [*flags, "validate", "missing.yaml"])
    assert result.exit_code == 1 and "missing.yaml" in result.output, result.output
    assert logging.getLevelName(logging.getLogger("msd").level) == level
    assert os.environ[logs.LEVEL_ENV] == level


def test_verbose_is_listed_in_the_help():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "--verbose" in result.output
