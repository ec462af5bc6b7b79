"""Every command that takes a run folder takes it as `--runs` or `--run-dir`, the same option
with one help text, whichever spelling a user learnt first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from msd.cli.main import app
from typer.core import TyperOption
from typer.testing import CliRunner

# the commands that take a run folder, and the arguments each needs besides it
TAKE_A_RUN_FOLDER = {
    "launch": ["recipe.yaml"],
    "restore": ["runs/t-20240501-120000"],
    "ls": [],
    "status": [],
}
SPELLINGS = ("--runs", "--run-dir")


def run_folder_options() -> dict[str, TyperOption]:
    """Per command of `msd`, its option that names a run folder: by either spelling, or by
    the default `runs` (a command that spelt it some third way would show here)."""
    commands = typer.main.get_group(app).commands
    return {
        name: param
        for name, command in commands.items()
        for param in command.params
        if isinstance(param, TyperOption)
        and (set(SPELLINGS) & set(param.opts) or param.default == Path("runs"))
    }


def test_every_command_with_a_run_folder_takes_both_spellings_with_one_help() -> None:
    options = run_folder_options()
    assert set(options) == set(TAKE_A_RUN_FOLDER)
    assert all(option.opts == list(SPELLINGS) for option in options.values())
    assert len({option.help for option in options.values()}) == 1


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("command", sorted(TAKE_A_RUN_FOLDER))
def test_either_spelling_names_the_run_folder(command: str, spelling: str) -> None:
    parser = typer.main.get_group(app).commands[command]
    context = parser.make_context(command, [*TAKE_A_RUN_FOLDER[command], spelling, "elsewhere"])
    option = run_folder_options()[command]
    assert context.params[str(option.name)] == Path("elsewhere")


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_ls_and_status_look_in_the_folder_either_spelling_names(
    tmp_path: Path, spelling: str
) -> None:
    job = tmp_path / "t-20240501-120000"
    job.mkdir()
    (job / "job.json").write_text(json.dumps({"name": "t", "cluster": "local", "state": "done"}))
    listed = CliRunner().invoke(app, ["ls", spelling, str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    assert [r["name"] for r in json.loads(listed.stdout)] == [job.name]
    # the newest job there is found, and has no Planner to ask
    status = CliRunner().invoke(app, ["status", spelling, str(tmp_path)])
    assert status.exit_code == 1
    assert f"{job.name} is not running (state: done)" in status.stderr
