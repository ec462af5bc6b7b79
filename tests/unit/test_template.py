"""The starter recipe `msd init` writes, and every ready recipe, pass recipe validation."""

from pathlib import Path

import pytest
from msd.cli.main import app
from typer.testing import CliRunner

from msd.recipe.load import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


def test_msd_init_writes_a_valid_recipe(tmp_path):
    target = tmp_path / "recipe.yaml"
    result = CliRunner().invoke(app, ["init", str(target)])
    assert result.exit_code == 0, result.output
    recipe = load_recipe(target)
    assert recipe.distribute.dp == 8 and recipe.balance.method == "greedy"
    again = CliRunner().invoke(app, ["init", str(target)])
    assert again.exit_code == 1 and "already exists" in again.output


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_ready_recipes_load(path):
    assert load_recipe(path).name == path.stem
