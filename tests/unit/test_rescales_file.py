"""The job's loader-generation file: written and read back; a file of another version, or not
of this shape, is a clear error."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from msd.errors import LaunchError
from msd.jobdir.rescales import RESCALES_VERSION, load_rescales, write_rescales
from msd.plan.partition import Generation

RECIPE: Any = SimpleNamespace(sources=[SimpleNamespace(name="web"), SimpleNamespace(name="code")])


def test_generations_written_are_read_back(tmp_path: Path) -> None:
    path = tmp_path / "loaders.json"
    generations = (Generation(1, 1, 3, None, None, "slow"),)
    write_rescales(path, RECIPE, generations)
    assert load_rescales(path, RECIPE) == generations
    assert load_rescales(tmp_path / "none.json", RECIPE) == ()


def test_a_file_of_another_version_names_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "loaders.json"
    path.write_text(json.dumps({"version": RESCALES_VERSION + 1, "generations": []}))
    with pytest.raises(LaunchError) as raised:
        load_rescales(path, RECIPE)
    message = str(raised.value)
    assert str(path) in message
    assert f"version {RESCALES_VERSION + 1}" in message
    assert f"reads version {RESCALES_VERSION}" in message


@pytest.mark.parametrize("text", ["[1]", "{}", "not json", '{"version": 1}'])
def test_a_file_not_of_this_shape_is_a_launch_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "loaders.json"
    path.write_text(text)
    with pytest.raises(LaunchError, match="not a valid loader-generation file"):
        load_rescales(path, RECIPE)
