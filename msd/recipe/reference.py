"""Every recipe key, its type, default and meaning, walked from the schema: docs/recipe.md.

A key's meaning is the docstring written under its field in `msd.recipe.schema`, the one
place it is kept: its first paragraph a summary (what `msd init` writes beside the key,
`msd.recipe.starter`), the rest detail (in docs/recipe.md only). After changing the schema:

    python -m msd.recipe.reference markdown > docs/recipe.md
    python -m msd.recipe.reference template > templates/recipe.yaml
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import re
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgspec
import msgspec.inspect as mi
import yaml

from msd.recipe import schema
from msd.recipe.load import WRITTEN_BY_MSD


def _struct_type(cls: type) -> mi.StructType:
    typ = mi.type_info(cls)
    assert isinstance(typ, mi.StructType)
    return typ


RECIPE_TYPE = _struct_type(schema.Recipe)
REQUIRED: Any = msgspec.NODEFAULT


class Key(NamedTuple):
    """One key of the recipe, as a dotted path: ``sources[].transform.kind``."""

    path: str
    field: mi.Field
    owner: type
    default: Any  # REQUIRED where the recipe must set it

    @property
    def doc(self) -> str:
        return field_doc(self.owner, self.field.name)

    @property
    def summary(self) -> str:
        return _one_line(self.doc.split("\n\n")[0])

    @property
    def section(self) -> mi.StructType | None:
        """The struct under this key (a mapping, an optional one, or a list of them)."""
        return section_type(self.field.type)

    @property
    def is_list(self) -> bool:
        return isinstance(_without_none(self.field.type), mi.VarTupleType)

    @property
    def inner_path(self) -> str:
        """The prefix of the keys under this one: ``sources[]``, ``distribute``."""
        return self.path + ("[]" if self.is_list else "")

    @property
    def inner_defaults(self) -> Any:
        """The struct holding the defaults of the keys under this one, if its default is one."""
        return self.default if isinstance(self.default, msgspec.Struct) else None

    @property
    def name(self) -> str:
        return self.field.encode_name


def keys(typ: mi.StructType = RECIPE_TYPE, prefix: str = "", defaults: Any = None) -> Iterator[Key]:
    """Every key under ``typ``, depth first in the schema's order."""
    for key in children(typ, prefix, defaults):
        yield key
        inner = key.section
        if inner is not None:
            yield from keys(inner, key.inner_path, key.inner_defaults)


def children(typ: mi.StructType, prefix: str = "", defaults: Any = None) -> Iterator[Key]:
    """The keys right under ``typ``; ``defaults``: the struct whose values are the defaults
    there (a field's default can differ from its type's: ``slurm.planner.mem_gb``)."""
    for field in typ.fields:
        if field.encode_name not in WRITTEN_BY_MSD:
            yield Key(_join(prefix, field.encode_name), field, typ.cls, _default(field, defaults))


def section_type(typ: mi.Type) -> mi.StructType | None:
    typ = _without_none(typ)
    if isinstance(typ, mi.VarTupleType):
        typ = typ.item_type
    return typ if isinstance(typ, mi.StructType) else None


def _without_none(typ: mi.Type) -> mi.Type:
    if isinstance(typ, mi.UnionType):
        rest = [t for t in typ.types if not isinstance(t, mi.NoneType)]
        return rest[0] if len(rest) == 1 else typ
    return typ


def _default(field: mi.Field, defaults: Any) -> Any:
    if defaults is not None:
        return getattr(defaults, field.name)
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return field.default


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def field_doc(cls: type, name: str) -> str:
    """The docstring under field ``name`` of ``cls`` in the schema."""
    try:
        return _field_docs()[cls.__name__][name]
    except KeyError:
        fix = "write its meaning as a docstring on the line under it"
        raise LookupError(f"msd/recipe/schema.py: {cls.__name__}.{name} has none; {fix}") from None


@functools.cache
def _field_docs() -> dict[str, dict[str, str]]:
    """Class name -> field name -> the string literal written under the field."""
    tree = ast.parse(inspect.getsource(schema))
    return {
        node.name: dict(_attribute_docs(node.body))
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def _attribute_docs(body: list[ast.stmt]) -> Iterator[tuple[str, str]]:
    for field, after in itertools.pairwise(body):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            yield field.target.id, inspect.cleandoc(after.value.value)


def _one_line(text: str) -> str:
    """Docstring text as one line, its ``code`` in Markdown's single backticks."""
    return re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split()))


def type_words(typ: mi.Type) -> str:
    """What a value of ``typ`` is, in words: ``integer, `auto` or null``."""
    if isinstance(typ, mi.UnionType | mi.LiteralType):
        return _either(list(_alternatives(typ)))
    if isinstance(typ, mi.VarTupleType):
        return f"list of {_plural(typ.item_type)}"
    if isinstance(typ, mi.TupleType):
        return f"list of {len(typ.item_types)} {_plural(typ.item_types[0])}"
    if isinstance(typ, mi.DictType):
        return f"mapping of {type_words(typ.key_type)} to {type_words(typ.value_type)}"
    return _WORDS.get(type(typ), "value")


def _alternatives(typ: mi.Type) -> Iterator[str]:
    """The values a union or ``Literal`` allows, in words, literals one by one."""
    if isinstance(typ, mi.UnionType):
        for member in typ.types:
            yield from _alternatives(member)
    elif isinstance(typ, mi.LiteralType):
        yield from (f"`{v}`" for v in typ.values)
    else:
        yield type_words(typ)


def _either(parts: list[str]) -> str:
    return f"{', '.join(parts[:-1])} or {parts[-1]}" if len(parts) > 1 else parts[0]


_WORDS = {
    mi.IntType: "integer",
    mi.FloatType: "number",
    mi.StrType: "string",
    mi.BoolType: "boolean",
    mi.NoneType: "null",
    mi.StructType: "mapping",
}


def _plural(typ: mi.Type) -> str:
    if isinstance(typ, mi.VarTupleType):
        return f"lists of {_plural(typ.item_type)}"
    return {mi.StructType: "mappings", mi.StrType: "strings"}.get(type(typ), f"{type_words(typ)}s")


def yaml_value(value: Any) -> str:
    """``value`` as written in a recipe (flow style: ``[tp, cp, dp, pp]``)."""
    text = yaml.safe_dump(
        msgspec.to_builtins(value), default_flow_style=True, width=1 << 30, sort_keys=False
    )
    return text.removesuffix("\n").removesuffix("\n...")


INTRO = """\
# Recipe reference

Every key a recipe may hold: its type, its default (*required* where it has none) and what it
means. A recipe is YAML; `msd init` writes a starter that holds every key, the ones it does not
set commented out at their defaults, and `msd validate RECIPE` checks one, naming the file, line
and key of each problem. A key inside a list is written with `[]`: `sources[].weight` is the
`weight` of each item of `sources`. The ready recipes in `recipes/` show the keys at work.
`msd launch` also writes `sources[].files` into a job's own copy of the recipe (the files each
source's `path` named when the job started); a recipe that sets it is refused.

This page is generated from the docstrings of `msd/recipe/schema.py`, where each key's meaning
is kept; after changing the schema, `python -m msd.recipe.reference markdown > docs/recipe.md`
writes it again (a unit test fails while it is stale).
"""


def markdown() -> str:
    """docs/recipe.md: the intro, a contents line, then one table a section."""
    all_keys = list(keys())
    sections = [("top level", "", schema.Recipe)] + [
        (_title(k), k.path, k.section.cls) for k in all_keys if k.section is not None
    ]
    toc = " · ".join(f"[{title}](#{_anchor(title)})" for title, _, _ in sections)
    parts = [INTRO, f"Sections: {toc}.\n"]
    for title, path, cls in sections:
        rows = [k for k in all_keys if _parent(k.path) == path]
        parts.append(_table(title, cls.__doc__ or "", rows))
    return "\n".join(parts)


def _title(key: Key) -> str:
    return f"`{key.inner_path}`"


def _parent(path: str) -> str:
    return path.rpartition(".")[0].removesuffix("[]")


def _linked(text: str) -> str:
    """Mentions of the other pages and the ready recipes as links from docs/."""
    text = re.sub(r"\bdocs/([\w-]+\.md)", r"[\1](\1)", text)
    return re.sub(r"\b(recipes/[\w-]+\.yaml)", r"[\1](../\1)", text)


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9_ -]", "", title.lower()).replace(" ", "-")


def _table(title: str, doc: str, rows: list[Key]) -> str:
    intro = _linked(_one_line(inspect.cleandoc(doc)))
    lines = [f"## {title[:1].upper()}{title[1:]}\n", intro + "\n"]
    lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [_row(k) for k in rows]
    return "\n".join(lines) + "\n"


def _row(key: Key) -> str:
    if key.default is REQUIRED:
        default = "*required*"
    elif isinstance(key.default, msgspec.Struct):
        default = "per key"
    else:
        default = f"`{yaml_value(key.default)}`"
    meaning = _linked(_one_line(key.doc))
    if key.section is not None:
        meaning += f" Keys: [{_title(key)}](#{_anchor(_title(key))})."
    cells = [f"`{key.path}`", type_words(key.field.type), default, meaning]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def main(argv: list[str]) -> int:
    from msd.recipe import starter

    outputs = {"markdown": markdown, "template": starter.template}
    if len(argv) != 1 or argv[0] not in outputs:
        sys.stderr.write("usage: python -m msd.recipe.reference {markdown|template}\n")
        return 2
    sys.stdout.write(outputs[argv[0]]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
