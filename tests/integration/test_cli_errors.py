"""Bad input fails `msd validate` and `msd launch` before any process starts, in one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import base_recipe, run_msd

msd = run_msd


def _unknown_key(r: dict) -> None:
    r["sources"][1]["wieght"] = 1


def _negative_weight(r: dict) -> None:
    r["sources"][2]["weight"] = -1


def _zero_weights(r: dict) -> None:
    for s in r["sources"]:
        s["weight"] = 0


def _missing_file(r: dict) -> None:
    r["sources"][0]["path"] = "nowhere/*.parquet"


def _missing_column(r: dict) -> None:
    r["sources"][1]["text_column"] = "body"


def _missing_cost_function(r: dict) -> None:
    r["cost"] = {"function": "nosuchmodule:cost"}


def _not_parquet(r: dict, tmp: Path) -> None:
    bad = tmp / "bad"
    bad.mkdir()
    (bad / "x.parquet").write_text("this is not parquet")
    r["sources"][0]["path"] = str(bad / "*.parquet")


CASES = {
    "unknown key": (_unknown_key, ["recipe.yaml:", "sources[1].wieght", "weight"]),
    "negative weight": (_negative_weight, ["recipe.yaml:", "sources[2].weight"]),
    "all-zero weights": (_zero_weights, ["recipe.yaml:", "weight"]),
    "missing file": (_missing_file, ["recipe.yaml:", "sources[0].path", "nowhere/*.parquet"]),
    "missing column": (_missing_column, ["recipe.yaml:", "body", "sources[1].text_column"]),
    "not parquet": (_not_parquet, ["recipe.yaml:", "web", "x.parquet"]),
    "missing cost function": (
        _missing_cost_function,
        ["recipe.yaml:", "cost.function", "nosuchmodule"],
    ),
}


@pytest.mark.parametrize("command", ["validate", "launch"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_recipes_fail_before_anything_starts(case, command, small_data, tmp_path):
    mutate, needles = CASES[case]
    recipe = base_recipe(small_data, steps=5)
    if mutate is _not_parquet:
        mutate(recipe, tmp_path)
    else:
        mutate(recipe)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = msd(command, "recipe.yaml", cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not (tmp_path / "runs").exists(), "no job folder, no process"


@pytest.mark.parametrize("command", ["validate", "launch"])
def test_yaml_syntax_error_names_the_line(command, tmp_path):
    (tmp_path / "recipe.yaml").write_text("name: x\nsources: [\n  {name: a\n")
    result = msd(command, "recipe.yaml", cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in out
    assert "recipe.yaml:4:" in out and "invalid YAML" in out


def test_validate_accepts_a_good_recipe(small_data, tmp_path):
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(base_recipe(small_data, steps=5)))
    result = msd("validate", "recipe.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "web" in result.stdout and "books" in result.stdout
