"""docs/recipe.md and the starter recipe `msd init` writes hold every recipe key, and are what
their generator writes from the schema now, so neither can drift from it."""

import re
from pathlib import Path
from typing import Any

import msgspec.inspect as mi
import pytest
import yaml
from msd.cli.main import app
from typer.testing import CliRunner

from msd.recipe import reference, starter
from msd.recipe.load import WRITTEN_BY_MSD, load_recipe
from msd.recipe.schema import Recipe

ROOT = Path(__file__).resolve().parents[2]
# A commented-out key: `# ` before an indented `key:` (or `- key:` of a list item).
COMMENTED_KEY = re.compile(r"^(\s*)# (?=\s*(?:- )?[a-z_]+:(?: |$))", re.MULTILINE)


def _schema_paths(typ: Any = None, prefix: str = "") -> list[str]:
    """Every recipe key as a dotted path (``sources[].transform.kind``), walked here apart
    from the generator's own walk."""
    paths = []
    for field in (typ or mi.type_info(Recipe)).fields:
        if field.encode_name in WRITTEN_BY_MSD:
            continue
        path = prefix + field.encode_name
        paths.append(path)
        inner, suffix = field.type, ""
        if isinstance(inner, mi.UnionType):
            inner = next(t for t in inner.types if not isinstance(t, mi.NoneType))
        if isinstance(inner, mi.VarTupleType):
            inner, suffix = inner.item_type, "[]"
        if isinstance(inner, mi.StructType):
            paths += _schema_paths(inner, f"{path}{suffix}.")
    return paths


def _data_paths(data: Any, prefix: str = "") -> set[str]:
    """The key paths of parsed YAML, list items as ``[]``."""
    if isinstance(data, list):
        return set().union(*(_data_paths(item, f"{prefix}[]") for item in data))
    if not isinstance(data, dict):
        return set()
    found = set()
    for name, value in data.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        found |= {path} | _data_paths(value, path)
    return found


@pytest.fixture(scope="module")
def init_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    target = tmp_path_factory.mktemp("init") / "recipe.yaml"
    result = CliRunner().invoke(app, ["init", str(target)])
    assert result.exit_code == 0, result.output
    return target.read_text()


def test_the_walk_reaches_every_section():
    paths = _schema_paths()
    deep = ["sources[].cache.max_bytes", "mix.milestones[].weights", "slurm.planner.mem_gb"]
    assert len(paths) > 140 and all(p in paths for p in [*deep, "vision.decode", "cache.dir"])
    assert "sources[].files" not in paths  # written by msd launch, refused in a recipe


def test_docs_hold_every_key():
    docs = (ROOT / "docs" / "recipe.md").read_text()
    missing = [p for p in _schema_paths() if f"| `{p}` |" not in docs]
    assert not missing, f"docs/recipe.md lacks {missing}"


def test_msd_init_holds_every_key(init_text):
    """Set, or commented out: uncommenting every commented key makes each a key of the YAML."""
    everything = yaml.safe_load(COMMENTED_KEY.sub(r"\1", init_text))
    missing = sorted(set(_schema_paths()) - _data_paths(everything))
    assert not missing, f"msd init's recipe lacks {missing}"


def test_msd_init_recipe_is_valid_with_its_defaults_uncommented(tmp_path, init_text):
    """The commented keys hold the schema's defaults: setting every one of them (all but the
    examples of sections unset by default) leaves the same recipe."""
    live = starter.template(uncomment=True)
    pairs = list(zip(init_text.splitlines(), live.splitlines(), strict=True))
    assert all(b in (a, a.replace("# ", "", 1)) for a, b in pairs)
    uncommented = sum(a != b for a, b in pairs)
    assert uncommented > 80 and "\n  pp: 1 " in live and "\nvision:" in live
    (tmp_path / "as_written.yaml").write_text(init_text)
    (tmp_path / "uncommented.yaml").write_text(live)
    written = load_recipe(tmp_path / "as_written.yaml")
    assert written.distribute.dp == 8 and [s.name for s in written.sources] == ["web", "code"]
    assert load_recipe(tmp_path / "uncommented.yaml") == written


@pytest.mark.parametrize(
    ("path", "output"),
    [("docs/recipe.md", "markdown"), ("templates/recipe.yaml", "template")],
)
def test_generated_files_are_current(path, output, capsys):
    assert reference.main([output]) == 0
    fix = f"regenerate it: python -m msd.recipe.reference {output} > {path}"
    assert (ROOT / path).read_text() == capsys.readouterr().out, f"{path} is stale; {fix}"


def test_a_field_without_a_docstring_is_named():
    with pytest.raises(LookupError, match=r"schema\.py: Recipe\.nope has none"):
        reference.field_doc(Recipe, "nope")
    assert reference.main(["html"]) == 2
