"""The starter recipe `msd init` writes (templates/recipe.yaml), generated from the schema.

It holds every key: those in `STARTER` set to working values, every other one commented out at
its default (in a section unset by default, at a value from `EXAMPLES`), each with the summary
of its meaning (`msd.recipe.reference`). Deleting the ``# `` of a key at its default sets it to
that default; `template(uncomment=True)` does so for all of them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple

import msgspec.inspect as mi

from msd.recipe.reference import RECIPE_TYPE, REQUIRED, Key, children, yaml_value

# What the starter sets: a two-source text job on 8 data-parallel demo ranks.
STARTER: dict[str, Any] = {
    "sources": [
        {
            "name": "web",
            "path": "data/web/*.parquet",
            "weight": 0.7,
            "text_column": "text",
            "transform": {"kind": "bytes"},
            "repeat": True,
            "loaders": 2,
        },
        {"name": "code", "path": "data/code/*.parquet", "weight": 0.3, "text_column": "text"},
    ],
    "seq_len": 4096,
    "global_batch_tokens": 65536,
    "name": "my-run",
    "seed": 0,
    "steps": 1000,
    "micro_batch_size": 1,
    "distribute": {"dp": 8},
    "balance": {"method": "greedy", "long_samples": "split"},
    "loader": {"block_row_groups": 1, "sources_per_process": 1},
    "constructor": {"prefetch_steps": 4},
    "trainer": {"command": "demo", "demo": {"step_ms": 20}},
    "cluster": "local",
}

# What the starter shows, commented out, for sections that are unset by default.
_CACHE = {"dir": "$TMPDIR/msd-cache", "max_bytes": 100 << 30}
EXAMPLES: dict[str, Any] = {
    "sources[].clip": {"length_s": 4.0},
    "sources[].chat": {"template": "tokenizer_config.json"},
    "sources[].cache": _CACHE,
    "mix.milestones": [
        {"step": 1000, "weights": {"code": 0.3}},
        {"step": 5000, "weights": {"code": 0.6, "web": 0.4}},
    ],
    "cache": _CACHE,
}

HEADER = """\
# An msd recipe: what data each training step gets, and who gets it.
# Check it with `msd validate recipe.yaml`, run it with `msd launch recipe.yaml`.
# Every key is here: a key commented out holds its default (delete its `# ` to set it), or an
# example value in a section that is unset by default, such as `cache`.
# docs/recipe.md explains every key in full.

"""
_UNSET: Any = object()  # a key the starter leaves out
COMMENT_AT = 29  # the column of a key's comment, where the key leaves room


class Shown(Enum):
    """Why a line is commented out."""

    DEFAULT = "default"  # a default: valid as it stands once uncommented
    EXAMPLE = "example"  # an example of a section unset by default


class Mark(NamedTuple):
    column: int
    shown: Shown


class Line(NamedTuple):
    indent: int
    body: str  # "key: value", or "" for a blank line
    comment: str = ""
    mark: Mark | None = None  # None: set
    dash: bool = False  # the first key of a list item


def template(uncomment: bool = False) -> str:
    """The starter recipe; ``uncomment``: with every commented default set instead."""
    lines = _section(RECIPE_TYPE, "", STARTER, None, 0, None, full=True)
    return HEADER + "".join(_render(line, uncomment) + "\n" for line in lines)


def _render(line: Line, uncomment: bool) -> str:
    if not line.body:
        return ""
    lead = " " * line.indent
    if line.dash:
        lead = lead[:-2] + "- "
    mark = line.mark
    if mark is not None:
        lead = f"{lead[: mark.column]}# {lead[mark.column :]}"
    text = lead + line.body
    if line.comment:
        text += " " * max(2, COMMENT_AT - len(text)) + "# " + line.comment
    if uncomment and mark is not None and mark.shown is Shown.DEFAULT:
        # After the padding: uncommenting deletes the two characters and nothing else.
        text = text[: mark.column] + text[mark.column + 2 :]
    return text


def _section(
    typ: mi.StructType,
    prefix: str,
    values: dict[str, Any] | None,
    defaults: Any,
    indent: int,
    mark: Mark | None,
    full: bool,
) -> list[Line]:
    """The lines of the keys under ``typ``: ``values`` set (or, under a ``mark``, shown as an
    example); with ``full``, every other key too, commented out, and each key's summary."""
    lines: list[Line] = []
    for key in children(typ, prefix, defaults):
        spaced = indent == 0 and key.section is not None  # a blank line around a top section
        if spaced and lines and lines[-1].body:
            lines.append(Line(0, ""))
        if values is not None and key.name in values:
            lines += _key(key, values[key.name], indent, mark, full)
        elif full:
            lines += _key(key, _UNSET, indent, _mark_for(key, indent, mark), full)
        if spaced:
            lines.append(Line(0, ""))
    return lines


def _mark_for(key: Key, indent: int, outer: Mark | None) -> Mark:
    """A key the starter leaves out: commented at the outermost commented key's column."""
    unset = key.section is not None and key.inner_defaults is None
    example = unset or (outer is not None and outer.shown is Shown.EXAMPLE)
    column = outer.column if outer is not None else indent
    return Mark(column, Shown.EXAMPLE if example else Shown.DEFAULT)


def _key(key: Key, value: Any, indent: int, mark: Mark | None, full: bool) -> list[Line]:
    """``key``'s lines: set to ``value``, or (``_UNSET``) at its example or default."""
    if value is _UNSET:
        value = EXAMPLES.get(key.path, _UNSET)
    comment = _summary(key) if full else ""
    inner = key.section
    if inner is None or (value is _UNSET and key.is_list):
        return [Line(indent, f"{key.name}: {_shown(key, value)}", comment, mark)]
    head = Line(indent, f"{key.name}:", comment, mark)
    if key.is_list:
        return [head, *_items(key, inner, value, indent + 4, mark, full)]
    given = None if value is _UNSET else value
    return [head, *_section(inner, key.path, given, key.inner_defaults, indent + 2, mark, full)]


def _shown(key: Key, value: Any) -> str:
    if value is not _UNSET:
        return yaml_value(value)
    if key.default is REQUIRED:
        raise LookupError(f"{key.path} has no default: give it a value in starter.EXAMPLES")
    return yaml_value(key.default)


def _items(
    key: Key,
    item: mi.StructType,
    values: list[dict[str, Any]],
    indent: int,
    mark: Mark | None,
    full: bool,
) -> list[Line]:
    """List items: the first with every key (if ``full``), the others with theirs only."""
    lines: list[Line] = []
    for i, item_values in enumerate(values):
        body = _section(item, key.inner_path, item_values, None, indent, mark, full and i == 0)
        lines += [body[0]._replace(dash=True), *body[1:]]
    return lines


def _summary(key: Key) -> str:
    """The key's summary as a comment, without its closing full stop."""
    text = key.summary
    return text[:-1] if text.endswith(".") and not text.endswith("...") else text
