"""`msd plan` says where each source is read as `msd launch` starts it, in its table and in
``--json`` alike: the processes of a source with ``loaders: 2`` are its own, and a shared
process is named by the same number in both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import base_recipe


def _plan(tmp_path: Path, *args: str) -> str:
    """`msd plan recipe.yaml ARGS`'s standard output, on a terminal wide enough for one line a
    source."""
    result = subprocess.run(
        [sys.executable, "-m", "msd.cli", "plan", "recipe.yaml", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _table_rows(text: str) -> dict[str, list[str]]:
    """The table's cells by source name."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()]
    return {cells[0]: cells for cells in rows if cells}


@pytest.mark.parametrize("shared_by", ["loader.groups", "loaders: auto"])
def test_plan_table_and_json_agree_on_each_source_processes(
    shared_by: str, small_data: Path, tmp_path: Path
) -> None:
    """web has ``loaders: 2``: two processes of its own (0 and 1); code and books share the
    third, 2 (named in the recipe, or by ``auto`` on the one loader CPU web leaves)."""
    recipe = base_recipe(small_data, steps=5, loader={"cpus": 3})
    web, code, books = recipe["sources"]
    web["loaders"] = 2
    if shared_by == "loader.groups":
        code["loaders"] = books["loaders"] = 1
        recipe["loader"]["groups"] = [["code", "books"]]
    else:
        code["loaders"] = books["loaders"] = "auto"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    planned = json.loads(_plan(tmp_path, "--json"))
    table = _plan(tmp_path)
    assert planned["processes"] == 3 and ": 3 processes" in table
    rows = {row["source"]: row for row in planned["sources"]}
    cells = _table_rows(table)
    assert rows["web"]["loaders"] == 2 and rows["web"]["shared_process"] is None
    assert rows["web"]["why"] == "set in the recipe: 2 process(es) of its own"
    assert cells["web"][5:] == ["2", "set in the recipe: 2 process(es) of its own"]
    for name in ("code", "books"):
        assert rows[name]["loaders"] is None and rows[name]["shared_process"] == 2
        assert rows[name]["why"].endswith(": shares process 2 with 1 other source(s)")
        loaders, why = cells[name][5:]
        assert loaders == "shared"
        (number,) = re.findall(r"shares process (\d+) with", why)
        assert int(number) == rows[name]["shared_process"]
    cause = "set in the recipe" if shared_by == "loader.groups" else "of the loader time"
    assert cause in rows["code"]["why"] and cause in cells["books"][6]
