"""Recipe loading: every error names file, line and key path; semantic checks one by one."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from msd.errors import RecipeError
from msd.recipe import Recipe, load_recipe
from msd.recipe.checks import Problem, check_recipe
from msd.recipe.schema import (
    ConstructorOptions,
    DemoTrainer,
    Distribute,
    LoaderOptions,
    Source,
    Trainer,
    Transform,
)

GOOD = """\
name: demo
seed: 1
steps: 10
seq_len: 64
global_batch_tokens: 256
distribute: {dp: 2}
sources:
  - name: web
    path: data/web/*.parquet
    text_column: text
    weight: 0.7
  - name: code
    path: data/code/*.parquet
    text_column: text
    weight: 0.3
    loaders: 2
"""
SOURCE_KEYS = (
    "name, path, weight, format, text_column, token_column, image_column, image_exts, "
    "video_column, video_exts, clip, chat, transform, repeat, loaders, shadows, endpoint_url, "
    "anonymous, cache, group_rows"
)
TOP_KEYS = (
    "sources, seq_len, global_batch_tokens, name, seed, steps, micro_batch_size, distribute, "
    "mix, cost, balance, vision, video, loader, "
    "constructor, metrics, checkpoint, recovery, trainer, cluster, slurm, cache"
)


def edit(old: str, new: str) -> str:
    assert old in GOOD, old  # guards the test itself, not user input
    return GOOD.replace(old, new, 1)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "q.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return path, str(info.value)


def test_good_recipe_loads_and_defaults_fill_in(tmp_path: Path) -> None:
    recipe = load_recipe(str(write(tmp_path, GOOD)))
    assert (recipe.name, recipe.seed, recipe.steps, recipe.rows_per_rank) == ("demo", 1, 10, 2)
    web, code = recipe.sources
    assert (web.weight, web.loaders, web.repeat, code.weight, code.loaders) == (
        0.7,
        None,  # unset: msd launch decides (one of its own while the sources are few)
        True,
        0.3,
        2,
    )
    assert web.transform == Transform(kind="bytes", path=None, function=None)
    assert recipe.trainer is None, "no trainer section: the data plane only"
    assert recipe.loader == LoaderOptions(block_row_groups=1, buffer_tokens=None)
    assert (recipe.constructor.prefetch_steps, recipe.cluster) == (4, "local")


def test_merge_keys_work_and_explicit_keys_win(tmp_path: Path) -> None:
    text = edit("  - name: code\n", "  - <<: {name: x, path: p, loaders: 3}\n    name: code\n")
    code = load_recipe(write(tmp_path, text)).sources[1]
    assert (code.name, code.path, code.loaders) == ("code", "data/code/*.parquet", 2)


def test_unreadable_file(tmp_path: Path) -> None:
    absent = tmp_path / "absent.yaml"
    with pytest.raises(RecipeError) as info:
        load_recipe(absent)
    assert str(info.value) == (
        f"{absent}: cannot read the recipe (No such file or directory); check the path"
    )
    with pytest.raises(RecipeError, match=r"cannot read the recipe \(Is a directory\)"):
        load_recipe(tmp_path)


EMPTY = "1: the recipe is empty; write at least sources, seq_len and global_batch_tokens"
TOP_FIX = "write recipe keys such as seq_len: 64 at the top level"

# fmt: off
FILE_ERRORS = [
    (b"seed: 1\nname: \xff\n", "2: the file is not UTF-8 text; save it as UTF-8"),
    (b"", EMPTY), (b"\n", EMPTY), (b"# only a comment\n", EMPTY), (b"---\n", EMPTY),
    (b"- a\n- b\n", f"1: the top level is a list, not a mapping; {TOP_FIX}"),
    (b"# c\nhi\n", f"2: the top level is a single value 'hi', not a mapping; {TOP_FIX}"),
    (edit("seq_len: 64\n", "seq_len: 64\n  bad: x\n").encode(),
     "5: invalid YAML: mapping values are not allowed here (column 6); fix the YAML there"),
    (edit("steps: 10", "steps: !!python/object/apply:os.getpid []").encode(),
     "3: invalid YAML: could not determine a constructor for the tag "
     "'tag:yaml.org,2002:python/object/apply:os.getpid' (column 8); fix the YAML there"),
    (edit("    loaders: 2\n", "    loaders: 2\n    loaders: 3\n").encode(),
     "17: sources[1].loaders: is set twice; keep one of them"),
]
# fmt: on


@pytest.mark.parametrize(("content", "expected"), FILE_ERRORS)
def test_file_and_yaml_errors(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "q.yaml"
    path.write_bytes(content)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value) == f"{path}:{expected}"


def test_unknown_keys_at_every_level_are_reported_together(tmp_path: Path) -> None:
    text = edit("seed: 1", "sed: 1").replace("weight: 0.3", "wieght: 0.3")
    text = text.replace("{dp: 2}", "{dp: 2, ep: 2}").replace(
        "0.7\n", "0.7\n    transform: {pth: t}\n"
    )
    path, message = error(tmp_path, text)
    assert message.splitlines() == [
        f"{path}:2: sed: unknown key (did you mean seed?); use one of {TOP_KEYS}, or remove it",
        f"{path}:6: distribute.ep: unknown key; "
        "use one of dp, pp, cp, tp, order, pad_to, or remove it",
        f"{path}:12: sources[0].transform.pth: unknown key (did you mean path?); "
        "use one of kind, path, function, bos, eos, or remove it",
        f"{path}:16: sources[1].wieght: unknown key (did you mean weight?); "
        f"use one of {SOURCE_KEYS}, or remove it",
    ]


# fmt: off
TYPE_ERRORS = [
    (edit("weight: 0.3", "weight: x"),
     "15: sources[1].weight: expected float, got str; set it to a number"),
    (edit("seed: 1", "seed: on"), "2: seed: expected int, got bool; set it to an integer"),
    (edit("seq_len: 64", "seq_len: 6.5"),
     "4: seq_len: expected int, got float; set it to an integer"),
    (edit("name: demo", "name: 2024-01-01"),
     "1: name: expected str, got date; set it to a quoted string"),
    (edit("{dp: 2}", "2"), "6: distribute: expected mapping, got int; set it to a mapping"),
    (GOOD[: GOOD.index("sources:")] + "sources: {web: 1}\n",
     "7: sources: expected list, got mapping; set it to a list"),
    (edit("    loaders: 2\n", "    loaders: 2\n    transform: {kind: spm}\n"),
     "17: sources[1].transform.kind: invalid enum value 'spm'; "
     "set it to one of bytes, function, tokenizer"),
    (edit("steps: 10", "steps: ten"),
     "3: steps: expected int | null, got str; set it to an integer or null"),
    (edit("    weight: 0.3\n", ""),  # a missing key: its parent's line
     "12: sources[1].weight: missing required key; add weight (a number) to sources[1]"),
    ("# header\n" + edit("seq_len: 64\n", ""),
     "2: seq_len: missing required key; add seq_len (an integer) at the top level"),
]
# fmt: on


@pytest.mark.parametrize(("text", "expected"), TYPE_ERRORS)
def test_type_errors_and_missing_keys(tmp_path: Path, text: str, expected: str) -> None:
    path, message = error(tmp_path, text)
    assert message == f"{path}:{expected}"


def test_the_example_message(tmp_path: Path) -> None:
    path, message = error(tmp_path, edit("weight: 0.3", "weight: -1.0"))
    expected = "sources[1].weight: must be >= 0, got -1.0; set a non-negative weight"
    assert message == f"{path}:15: {expected}"


# fmt: off
SEMANTIC = [
    ("weight: 0.3", "weight: .nan", 15, "sources[1].weight"),
    ("name: code", "name: web", 12, "sources[1].name"),
    ("steps: 10\n", "", 1, "steps"),  # absent: the top level's line
    ("global_batch_tokens: 256", "global_batch_tokens: 300", 5, "global_batch_tokens"),
    ("{dp: 2}", "{dp: 2}\ntrainer: {ranks: 4}", 7, "trainer.ranks"),
    ("    text_column: text\n    weight: 0.3", "    weight: 0.3", 12, "sources[1].text_column"),
    ("    loaders: 2", "    transform: {kind: tokenizer}", 16, "sources[1].transform.path"),
]
# fmt: on


@pytest.mark.parametrize(("old", "new", "line", "key"), SEMANTIC)
def test_semantic_errors_name_key_and_line(
    tmp_path: Path, old: str, new: str, line: int, key: str
) -> None:
    text = edit(old, new)
    path, message = error(tmp_path, text)
    # The wording is pinned by the checks tests below; here the line and key are the point.
    [problem] = check_recipe(msgspec.convert(yaml.safe_load(text), Recipe))
    assert problem.key == key
    assert message == f"{path}:{line}: {key}: {problem.message}"


def test_all_semantic_problems_are_reported(tmp_path: Path) -> None:
    path, message = error(tmp_path, edit("seq_len: 64", "seq_len: 1").replace("ed: 1", "ed: -1"))
    assert message.splitlines() == [
        f"{path}:4: seq_len: must be >= 2, got 1; a sample needs at least 2 tokens",
        f"{path}:2: seed: must be >= 0, got -1; use a non-negative seed",
    ]


# --- checks.py, directly -------------------------------------------------------------------

WEB = Source(name="web", path="w/*.parquet", weight=1.0, text_column="text")
BASE = Recipe(sources=(WEB,), seq_len=8, global_batch_tokens=32, steps=5)


def problems(**changes: object) -> list[Problem]:
    return check_recipe(msgspec.structs.replace(BASE, **changes))


def src(**changes: object) -> tuple[Source, ...]:
    return (msgspec.structs.replace(WEB, **changes),)


FUNCTION_FIX = "set function to module:attr, e.g. mypkg.tok:encode"


def transform(**fields: str) -> tuple[Source, ...]:
    return src(transform=Transform(**fields))  # type: ignore[arg-type]


# fmt: off
CHECKS = [
    ({"sources": ()}, "sources: must list at least one source; add a source"),
    ({"sources": src(name="a/b")}, "sources[0].name: must match [A-Za-z0-9_.-]+, got 'a/b'; "
     "use only letters, digits, '_', '.' and '-'"),
    ({"sources": (WEB, WEB)},
     "sources[1].name: repeats the name 'web' of sources[0]; give every source a unique name"),
    ({"sources": src(weight=0.0)}, "sources: all weights are 0; give one source a weight > 0"),
    ({"sources": src(weight=-0.5)},
     "sources[0].weight: must be >= 0, got -0.5; set a non-negative weight"),
    ({"sources": src(weight=float("inf"))},
     "sources[0].weight: must be a finite number, got inf; set a non-negative weight"),
    ({"sources": src(path="")}, "sources[0].path: is empty; set a glob of Parquet files"),
    ({"sources": src(text_column=None)},
     "sources[0].text_column: is missing and so is token_column; "
     "set text_column (raw text) or token_column (token ids)"),
    ({"sources": src(token_column="ids")},
     "sources[0].token_column: is set together with text_column; keep only one"),
    ({"sources": src(text_column="")},
     "sources[0].text_column: is empty; name a column of the Parquet files"),
    ({"sources": src(loaders=0)},
     "sources[0].loaders: must be >= 1, got 0; use at least 1 loader or auto"),
    ({"sources": transform(kind="tokenizer")},
     "sources[0].transform.path: is required for kind tokenizer; "
     "set path to a HuggingFace tokenizer.json"),
    ({"sources": transform(kind="function", function="nocolon")},
     "sources[0].transform.function: kind function needs module:attr, got 'nocolon'; "
     f"{FUNCTION_FIX}"),
    ({"sources": transform(kind="function")},
     "sources[0].transform.function: kind function needs module:attr, it is missing; "
     f"{FUNCTION_FIX}"),
    ({"sources": transform(path="t.json")},
     "sources[0].transform.path: is not used by kind bytes; remove it, or change kind from bytes"),
    ({"sources": transform(kind="tokenizer", path="t", function="m:f")},
     "sources[0].transform.function: is not used by kind tokenizer; "
     "remove it, or change kind from tokenizer"),
    ({"sources": transform(kind="function", path="t", function="m:f")},
     "sources[0].transform.path: is not used by kind function; "
     "remove it, or change kind from function"),
    ({"seq_len": 1, "global_batch_tokens": 4},
     "seq_len: must be >= 2, got 1; a sample needs at least 2 tokens"),
    ({"global_batch_tokens": 0},
     "global_batch_tokens: must be >= 1, got 0; use a positive batch size"),
    ({"global_batch_tokens": 5}, "global_batch_tokens: must be a multiple of "
     "distribute.dp * seq_len = 1 * 8 = 8, got 5; use 8"),
    ({"global_batch_tokens": 60, "distribute": Distribute(dp=2)}, "global_batch_tokens: "
     "must be a multiple of distribute.dp * seq_len = 2 * 8 = 16, got 60; use 48 or 64"),
    ({"distribute": Distribute(dp=0)},
     "distribute.dp: must be >= 1, got 0; use at least 1 data-parallel rank"),
    ({"seed": -3}, "seed: must be >= 0, got -3; use a non-negative seed"),
    ({"steps": 0}, "steps: must be >= 1, got 0; run at least 1 step"),
    ({"steps": None}, "steps: is omitted but sources web repeat forever; "
     "set steps, or make every source finite with repeat: false"),
    ({"trainer": Trainer(command=" ")},
     "trainer.command: is empty; use demo for the built-in trainer, or a shell command"),
    ({"trainer": Trainer(ranks=2)},
     "trainer.ranks: must equal dp * pp * cp * tp = 1, got 2; set ranks to 1 or omit it"),
    ({"trainer": Trainer(demo=DemoTrainer(step_ms=-1.0))},
     "trainer.demo.step_ms: must be >= 0, got -1.0; use a non-negative time in milliseconds"),
    ({"trainer": Trainer(demo=DemoTrainer(step_ms=float("nan")))}, "trainer.demo.step_ms: "
     "must be a finite number, got nan; use a non-negative time in milliseconds"),
    ({"loader": LoaderOptions(block_row_groups=0)},
     "loader.block_row_groups: must be >= 1, got 0; read at least 1 row group per block"),
    ({"loader": LoaderOptions(buffer_tokens=7)}, "loader.buffer_tokens: must be >= 8, got 7; "
     "buffer at least one row, or omit it for two global batches"),
    ({"constructor": ConstructorOptions(prefetch_steps=0)},
     "constructor.prefetch_steps: must be >= 1, got 0; prefetch at least 1 step"),
    ({"constructor": ConstructorOptions(fanout=0)}, "constructor.fanout: must be >= 1, got 0; "
     "send to at least 1 Constructor, or null for direct transfer"),
    ({"trainer": Trainer(nodes=0)},
     "trainer.nodes: must be >= 1, got 0; run on at least 1 node"),
    ({"trainer": Trainer(nodes=3), "distribute": Distribute(dp=4), "global_batch_tokens": 32},
     "trainer.nodes: 3 nodes × 2 tasks per node is not the 4 ranks; "
     "set trainer.nodes and tasks_per_node to match dp * pp * cp * tp"),
    ({"distribute": Distribute(pad_to=9)}, "distribute.pad_to: is 9; "
     "use 0 (the default: 2 × cp) or a multiple of 2 × cp up to seq_len"),
    ({"distribute": Distribute(cp=2, pad_to=6), "trainer": Trainer(ranks=2)},
     "distribute.pad_to: is 6, not a multiple of 2 × cp; "
     "use a multiple of 4 (each CP rank gets two equal chunks of a sample)"),
]
# fmt: on


@pytest.mark.parametrize(("changes", "expected"), CHECKS)
def test_each_check(changes: dict[str, object], expected: str) -> None:
    assert [f"{p.key}: {p.message}" for p in problems(**changes)] == [expected]


def test_consistent_recipes_pass() -> None:
    function = Transform(kind="function", function="my_pkg.tok:Enc.encode")
    tokenizer = Transform(kind="tokenizer", path="tok.json")
    token_source = msgspec.structs.replace(WEB, name="t", text_column=None, token_column="ids")
    sources = (*src(transform=function), token_source, *src(name="k", transform=tokenizer))
    assert check_recipe(BASE) == []
    assert problems(sources=sources) == []
    assert problems(steps=None, sources=src(repeat=False)) == []


def test_several_problems_come_in_recipe_order() -> None:
    keys = [p.key for p in problems(seed=-1, seq_len=0, sources=src(weight=-1.0, loaders=0))]
    assert keys == ["sources[0].weight", "sources[0].loaders", "seq_len", "seed"]


def test_the_jobs_cache_is_every_sources_that_sets_none(tmp_path: Path) -> None:
    text = edit("seed: 1\n", "seed: 1\ncache: {dir: $TMPDIR/msd, max_bytes: 1000000000}\n")
    text = text.replace(
        "    loaders: 2\n", "    loaders: 2\n    cache: {dir: ~/c, max_bytes: 20000000}\n"
    )
    recipe = load_recipe(write(tmp_path, text))
    web, code = recipe.sources
    assert web.cache == recipe.cache and web.cache is not None
    assert (web.cache.dir, web.cache.max_bytes) == ("$TMPDIR/msd", 10**9)  # expanded where read
    assert code.cache is not None and (code.cache.dir, code.cache.max_bytes) == ("~/c", 2 * 10**7)
    assert load_recipe(write(tmp_path, GOOD)).sources[0].cache is None


@pytest.mark.parametrize(
    ("cache", "expected"),
    [
        ("{dir: '', max_bytes: 1000000000}", "7: cache.dir: is empty; name a local folder"),
        (
            "{dir: 's3://b/c', max_bytes: 1000000000}",
            "7: cache.dir: is 's3://b/c', a URL; name a folder on the loaders' own disks",
        ),
        (
            "{dir: /tmp/c, max_bytes: 1000}",
            "7: cache.max_bytes: is 1000, too small; hold at least 16777216 bytes",
        ),
        ("{dir: /tmp/c, max_bytes: 10GB}", "7: cache.max_bytes: expected int, got str"),
        ("{dir: /tmp/c}", "7: cache.max_bytes: missing required key; add max_bytes"),
    ],
)
def test_a_bad_cache_is_one_sentence_naming_its_key(
    tmp_path: Path, cache: str, expected: str
) -> None:
    text = edit("distribute: {dp: 2}\n", f"distribute: {{dp: 2}}\ncache: {cache}\n")
    path, message = error(tmp_path, text)
    assert message.startswith(f"{path}:{expected}"), message
    assert len(message.splitlines()) == 1


def test_a_sources_bad_cache_names_the_source(tmp_path: Path) -> None:
    text = edit("    loaders: 2\n", "    loaders: 2\n    cache: {dir: /c, max_bytes: 0}\n")
    path, message = error(tmp_path, text)
    assert message.startswith(f"{path}:17: sources[1].cache.max_bytes: is 0, too small"), message
