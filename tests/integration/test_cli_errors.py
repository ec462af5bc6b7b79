"""Bad input fails `msd validate` and `msd launch` before any process starts, in one clear line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from msd.plan.advice import process_limit
from tests.conftest import base_recipe, run_msd
from tests.videos import encode, write_tar

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


def test_validate_json_gives_the_sources_and_each_warning(small_data, tmp_path):
    recipe = base_recipe(small_data, steps=5)
    # one loader process past the count that draws a warning on this machine (4 are code's
    # and books')
    recipe["sources"][0]["loaders"] = process_limit(os.cpu_count() or 1, "local") - 3
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = msd("validate", "recipe.yaml", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["valid"] is True and found["errors"] == []
    assert [s["name"] for s in found["sources"]] == ["web", "code", "books"]
    assert found["sources"][1] == {
        "name": "code",
        "files": 2,
        "row_groups": 10,
        "rows": 300,
        "column": "text",
        "weight": 0.3,
        "loaders": 2,
    }
    (warning,) = found["warnings"]
    assert "loader processes" in warning
    assert warning in result.stderr  # still on stderr, as without --json


def test_validate_json_on_a_bad_recipe_says_why_and_exits_1(small_data, tmp_path):
    recipe = base_recipe(small_data, steps=5)
    _unknown_key(recipe)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = msd("validate", "recipe.yaml", "--json", cwd=tmp_path)
    assert result.returncode == 1
    found = json.loads(result.stdout)
    assert found["valid"] is False and found["warnings"] == []
    (error,) = found["errors"]
    assert "sources[1].wieght" in error
    assert result.stderr.count("error:") == 1 and "sources[1].wieght" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


CLEAN_MODULE = '''
def clean(text):
    """Refuses every cell, as a function written for other data does."""
    raise ValueError("bad cell")


def ids(text):
    return list(text.encode())
'''


@pytest.mark.parametrize("function", ["clean", "ids"])
def test_validate_tries_each_transform_function_on_its_source_first_samples(
    function: str, small_data: Path, tmp_path: Path
) -> None:
    """A transform function that raises on the data fails `msd validate` in one sentence naming
    the source, the function and what it raised (as `msd plan` and the loaders would fail);
    one that tokenizes the data passes."""
    (tmp_path / "cells.py").write_text(CLEAN_MODULE)  # `python -m` imports from its folder
    recipe = base_recipe(small_data, steps=5)
    recipe["sources"][1]["transform"] = {"kind": "function", "function": f"cells:{function}"}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = msd("validate", "recipe.yaml", cwd=tmp_path)
    if function == "ids":
        assert result.returncode == 0, result.stderr
        assert "valid" in result.stdout and "code" in result.stdout
        return
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "valid" not in result.stdout
    err = " ".join(result.stderr.split())  # rich may wrap the line
    line = yaml.safe_dump(recipe, sort_keys=False).splitlines().index("    function: cells:clean")
    assert err.startswith(f"error: recipe.yaml:{line + 1}: source 'code': transform "), err
    assert "'cells:clean' raised ValueError on one of its first 8 samples: bad cell;" in err


# -- video sources: the header of each file's first video --------------------------------------
def _video_files(root: Path) -> dict[str, Any]:
    """A WebDataset video source and a Parquet one, of real encoded clips: in each a good file, a
    file whose first video is damaged (after a null cell, in the Parquet file) and a file
    without videos; and a recipe of both."""
    good, header = encode("mp4", 12, 48, 64, 12), encode("webm", 4, 48, 64, 12)
    shards = root / "clips"
    shards.mkdir()
    write_tar(shards / "a.tar", [("one.mp4", good), ("one.txt", b"<video> a clip")])
    cut = [("cut.txt", b"<video> cut"), ("cut.mp4", good[: len(good) // 2])]
    write_tar(shards / "b.tar", [*cut, ("two.mp4", good), ("two.txt", b"<video> whole")])
    write_tar(shards / "c.tar", [("words.txt", b"no clip here")])
    table = root / "qa"
    table.mkdir()
    cells: dict[str, list[dict[str, Any] | None]] = {
        "a": [{"bytes": good, "path": "a.mp4"}],
        "b": [None, {"bytes": header[:100], "path": "cut.webm"}, {"bytes": good, "path": "x"}],
        "c": [None, None],
    }
    video = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for name, rows in cells.items():
        texts = ["<video> what is it?"] * len(rows)
        columns = {"video": pa.array(rows, video), "text": pa.array(texts)}
        pq.write_table(pa.table(columns), table / f"{name}.parquet", row_group_size=1)
    sources = [
        {"name": "clips", "path": str(shards / "*.tar"), "format": "webdataset"}
        | {"text_column": "txt", "video_exts": ["webm", "mp4"]},
        {"name": "qa", "path": str(table / "*.parquet"), "text_column": "text"}
        | {"video_column": "video"},
    ]
    return {
        "name": "videos",
        "seq_len": 256,
        "global_batch_tokens": 256,
        "steps": 2,
        "video": {"max_frames": 8, "min_pixels": 3136, "max_pixels": 12544},
        "sources": [s | {"weight": 1.0} for s in sources],
        "trainer": {"command": "demo"},
    }


def test_validate_warns_of_each_file_whose_first_video_is_unusable(tmp_path: Path) -> None:
    """Damage is data, as a job takes it (left out, counted): a warning naming the file, the
    sample or row, and the reason; a file without videos is named too."""
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_video_files(tmp_path)))
    result = msd("validate", "recipe.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid" in result.stdout and "Traceback" not in result.stderr
    warnings = " ".join(result.stderr.split()).split("warning: ")[1:]  # rich may wrap them
    expected = [
        f"source 'clips' (sources[0]): '{tmp_path}/clips/b.tar' sample 'cut', member 'cut.mp4': "
        "its first video is not a usable video (not a video)",
        f"source 'clips' (sources[0].video_exts): '{tmp_path}/clips/c.tar' holds no member named "
        "by video_exts (webm, mp4)",
        f"source 'qa' (sources[1]): '{tmp_path}/qa/b.parquet' row 1: its first video is not a "
        "usable video (cannot decode (OSError))",
        f"source 'qa' (sources[1].video_column): '{tmp_path}/qa/c.parquet' holds no video in "
        "column 'video'",
    ]
    assert len(warnings) == len(expected), warnings
    for warning, start in zip(warnings, expected, strict=True):
        assert warning.startswith(start), (warning, start)
        assert warning.rstrip().count(". ") == 0  # one sentence


@pytest.mark.parametrize("source", [0, 1], ids=["webdataset", "parquet"])
def test_validate_fails_a_video_source_whose_files_hold_no_video(
    tmp_path: Path, source: int
) -> None:
    """Not one video in any file is a recipe naming the wrong members or column: an error."""
    recipe = _video_files(tmp_path)
    if source == 0:
        recipe["sources"][0]["video_exts"] = ["mkv"]
        needles = ["sources[0].video_exts", "(mkv)", "only mp4, txt members"]
    else:
        recipe["sources"][1]["path"] = str(tmp_path / "qa" / "c.parquet")
        needles = ["sources[1].video_column", "column 'video' holds no video"]
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = msd("validate", "recipe.yaml", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    err = " ".join(result.stderr.split())
    assert err.startswith("error: recipe.yaml:"), err
    for needle in needles:
        assert needle in err, (needle, err)


def _chat_files(root: Path, first: list[Any]) -> dict[str, Any]:
    """A conversation source of one Parquet file whose first rows are ``first`` and then good
    conversations, with the demo's tokenizer and template."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from msd.synth.chat import TOKENIZER_DIR, write_chat_tokenizer

    write_chat_tokenizer(root / TOKENIZER_DIR, ["hello there", "how are you", "fine thanks"])
    good = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    (root / "chat").mkdir()
    table = pa.table({"messages": [json.dumps(c) for c in [*first, *[good] * 4]]})
    pq.write_table(table, root / "chat" / "a.parquet")
    transform = {"kind": "tokenizer", "path": str(root / TOKENIZER_DIR / "tokenizer.json")}
    return {
        "name": "c",
        "steps": 4,
        "seq_len": 64,
        "global_batch_tokens": 128,
        "sources": [
            {
                "name": "chat",
                "path": str(root / "chat" / "*.parquet"),
                "text_column": "messages",
                "transform": {**transform, "eos": "<|endoftext|>"},
                "chat": {"template": str(root / TOKENIZER_DIR / "tokenizer_config.json")},
                "weight": 1.0,
            }
        ],
    }


def test_validate_renders_each_conversation_files_first_rows(tmp_path: Path) -> None:
    """A malformed conversation is data (left out, counted): a warning naming the file, the
    row and the reason; no row that renders at all is a wrong column: an error."""
    odd = [[{"role": "user", "content": "hi"}, {"role": "narrator", "content": "x"}]]
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_chat_files(tmp_path, odd)))
    result = msd("validate", "recipe.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = " ".join(result.stderr.split()).split("warning: ")[1:]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        f"source 'chat' (sources[0]): '{tmp_path}/chat/a.parquet' row 0: its conversation is "
        "left out (unknown role)"
    ), warnings

    recipe = _chat_files(tmp_path / "all-bad", ["not a conversation"] * 8)
    (tmp_path / "all-bad" / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = msd("validate", "recipe.yaml", cwd=tmp_path / "all-bad")
    err = " ".join(result.stderr.split())
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "sources[0].text_column" in err and "none of the first 8 rows" in err, err


def test_validate_refuses_a_template_without_generation_blocks_for_assistant_loss(
    tmp_path: Path,
) -> None:
    recipe = _chat_files(tmp_path, [])
    recipe["sources"][0]["chat"]["template"] = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = msd("validate", "recipe.yaml", cwd=tmp_path)
    err = " ".join(result.stderr.split())
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert err.startswith("error: recipe.yaml:") and "{% generation %}" in err, err
    assert "loss: all" in err
    recipe["sources"][0]["chat"]["loss"] = "all"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert msd("validate", "recipe.yaml", cwd=tmp_path).returncode == 0
