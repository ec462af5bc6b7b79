"""Read a YAML recipe once and validate it, naming file, line and key path in every error.

The YAML is composed into nodes (which keep line marks) and then constructed with the safe
constructor, so one parse gives both the data and a key-path -> line map. Unknown keys are
found by walking the nodes alongside the schema's msgspec types, so all of them are reported at
once; msgspec then checks types and required keys, and `checks` the cross-field rules.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgspec
import msgspec.inspect as mi
import yaml

from msd.errors import RecipeError
from msd.recipe.checks import check_recipe
from msd.recipe.schema import Recipe

_RECIPE_TYPE = mi.type_info(Recipe)
# msgspec: "Expected `int`, got `str` - at `$.sources[0].loaders`" (no " - at" at the top).
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_YAML_WORDS = {"object": "mapping", "array": "list"}


class _Key(NamedTuple):
    """One mapping key or list item met while walking the YAML alongside the schema."""

    path: str
    line: int
    known: bool
    valid: tuple[str, ...]


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read, parse and validate the recipe at ``path``; raise `RecipeError` on any problem."""
    name = os.fspath(path)
    text = _read_text(name)
    node, data = _parse(name, text)
    lines = _line_index(name, node)
    try:
        recipe = msgspec.convert(data, Recipe)
    except msgspec.ValidationError as e:
        raise RecipeError(_validation_message(name, lines, str(e), data)) from None
    found = check_recipe(recipe) + [
        (f"sources[{i}].files", "is written by msd launch (the files path named then); remove it")
        for i, source in enumerate(recipe.sources)
        if source.files
    ]
    problems = [f"{_where(name, lines, key)}: {msg}" for key, msg in found]
    if problems:
        raise RecipeError("\n".join(problems))
    return with_job_cache(recipe)


def recipe_from_data(data: Any, where: str) -> Recipe:
    """A recipe held as JSON data (the one a checkpoint embeds), checked like a recipe file;
    a `RecipeError` naming ``where`` and the key path of the first problem."""
    try:
        recipe = msgspec.convert(data, Recipe)
    except msgspec.ValidationError as e:
        match = _AT.match(str(e))
        what, path = (match["what"], (match["path"] or "").lstrip(".")) if match else (str(e), "")
        what = re.sub(r"`([^`]*)`", r"\1", what)
        raise RecipeError(f"{where}: {_in_recipe(path)}: {what[:1].lower()}{what[1:]}") from None
    problems = check_recipe(recipe)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        key, message = problems[0]
        raise RecipeError(f"{where}: {_in_recipe(key)}: {message}{more}")
    return with_job_cache(recipe)


def with_job_cache(recipe: Recipe) -> Recipe:
    """``recipe`` with the job's ``cache`` given to every source that sets none (the roles
    read a source's own)."""
    if recipe.cache is None or all(s.cache is not None for s in recipe.sources):
        return recipe
    sources = tuple(
        s if s.cache is not None else msgspec.structs.replace(s, cache=recipe.cache)
        for s in recipe.sources
    )
    return msgspec.structs.replace(recipe, sources=sources)


def _in_recipe(path: str) -> str:
    return f"recipe.{path}" if path else "recipe"


def _read_text(name: str) -> str:
    try:
        with open(name, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise RecipeError(
            f"{name}: cannot read the recipe ({e.strerror or e}); check the path"
        ) from None
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as e:
        line = blob[: e.start].count(b"\n") + 1
        raise RecipeError(f"{name}:{line}: the file is not UTF-8 text; save it as UTF-8") from None


def _parse(name: str, text: str) -> tuple[yaml.MappingNode, dict[str, Any]]:
    """The root node and the data built from it, with safe_load's constructor."""
    try:
        node, data = _compose_and_construct(name, text)
    except yaml.YAMLError as e:
        raise RecipeError(_yaml_message(name, text, e)) from None
    if node is None or data is None:  # a bare `---` or `~` holds no recipe either
        fix = "write at least sources, seq_len and global_batch_tokens"
        raise RecipeError(f"{name}:1: the recipe is empty; {fix}")
    if not isinstance(node, yaml.MappingNode) or not isinstance(data, dict):
        got = _yaml_kind(node)
        fix = "write recipe keys such as seq_len: 64 at the top level"
        raise RecipeError(f"{name}:{_line(node)}: the top level is {got}, not a mapping; {fix}")
    return node, data


def _compose_and_construct(name: str, text: str) -> tuple[yaml.Node | None, Any]:
    """With libyaml where it is installed (a recipe of 10,000 sources parses in a second, not
    five); a file it refuses is read again by the pure-Python loader, whose error messages
    ``_yaml_message`` words."""
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        yaml.reader.Reader(text)  # refuses unprintable characters as the Python loader does
        try:
            return _with_loader(fast(text), name)
        except yaml.YAMLError:
            pass
    return _with_loader(yaml.SafeLoader(text), name)


def _with_loader(loader: Any, name: str) -> tuple[yaml.Node | None, Any]:
    try:
        node = loader.get_single_node()
        _reject_duplicates(name, node)
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


def _yaml_message(name: str, text: str, error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if mark is not None:
        where = f"{name}:{mark.line + 1}"
        column = f" (column {mark.column + 1})"
    else:
        # The reader (bad characters) reports a character offset instead of a mark.
        offset = getattr(error, "position", 0)
        where, column = f"{name}:{text.count(chr(10), 0, offset) + 1}", ""
    parts = (getattr(error, "context", None), getattr(error, "problem", None))
    problem = ", ".join(p for p in parts if p) or str(error).splitlines()[0]
    return f"{where}: invalid YAML: {problem}{column}; fix the YAML there"


def _yaml_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"a single value {node.value!r}" if isinstance(node, yaml.ScalarNode) else "a mapping"


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _key_text(node: yaml.Node) -> str:
    # The source text, not the constructed value: `on:` must read "on", not True.
    return str(node.value) if isinstance(node, yaml.ScalarNode) else "<non-scalar key>"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _walk(node: yaml.Node, typ: mi.Type, prefix: str) -> Iterator[_Key]:
    """Every key and list item under ``node`` where the schema expects ``typ``.

    Follows only the schema, so a node of the wrong shape (left to msgspec to report) or a
    recursive alias cannot lead the walk astray.
    """
    typ = _unwrap(typ)
    if isinstance(node, yaml.MappingNode) and isinstance(typ, mi.StructType):
        yield from _walk_mapping(node, typ, prefix)
    elif isinstance(node, yaml.SequenceNode) and isinstance(typ, mi.VarTupleType):
        for i, item in enumerate(node.value):
            path = f"{prefix}[{i}]"
            yield _Key(path, _line(item), True, ())
            yield from _walk(item, typ.item_type, path)


def _walk_mapping(node: yaml.MappingNode, typ: mi.StructType, prefix: str) -> Iterator[_Key]:
    fields = _fields(typ)
    valid = tuple(f for f in fields if f not in WRITTEN_BY_MSD)
    for key_node, value_node in node.value:
        name = _key_text(key_node)
        path = _join(prefix, name)
        yield _Key(path, _line(key_node), name in fields, valid)
        if name in fields:
            yield from _walk(value_node, fields[name], path)


# Keys msd writes into a job's recipe, not offered to recipe authors.
WRITTEN_BY_MSD = frozenset({"files"})


def _fields(typ: mi.StructType) -> dict[str, mi.Type]:
    return {f.encode_name: f.type for f in typ.fields}


def _unwrap(typ: mi.Type) -> mi.Type:
    """The container member of an optional container (``Sub | None``), else ``typ`` itself."""
    if isinstance(typ, mi.UnionType):
        nested = [t for t in typ.types if isinstance(t, mi.StructType | mi.VarTupleType)]
        return nested[0] if nested else typ
    return typ


def _reject_duplicates(name: str, root: yaml.Node | None) -> None:
    # safe_load keeps the last of two equal keys silently; a recipe should say what it means.
    # Runs before construction, which splices `<<` merges into the mapping nodes.
    seen: set[str] = set()
    for key in _walk(root, _RECIPE_TYPE, "") if root is not None else ():
        if key.path in seen:
            raise RecipeError(f"{name}:{key.line}: {key.path}: is set twice; keep one of them")
        seen.add(key.path)


def _line_index(name: str, root: yaml.MappingNode) -> dict[str, int]:
    """Key path -> 1-based line, for every key that exists; raise on unknown keys."""
    keys = list(_walk(root, _RECIPE_TYPE, ""))
    unknown = [_unknown_message(name, key) for key in keys if not key.known]
    if unknown:
        raise RecipeError("\n".join(unknown))
    # Later wins: after a `<<` merge the explicit keys follow the merged ones.
    return {"": _line(root)} | {key.path: key.line for key in keys}


def _unknown_message(name: str, key: _Key) -> str:
    leaf = key.path.rpartition(".")[2]
    close = difflib.get_close_matches(leaf, key.valid, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    valid = ", ".join(key.valid)
    return f"{name}:{key.line}: {key.path}: unknown key{hint}; use one of {valid}, or remove it"


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def _where(name: str, lines: dict[str, int], path: str) -> str:
    """``file:line: key`` for ``path``, at the nearest existing parent if the key is absent."""
    probe = path
    while probe not in lines:
        probe = _parent(probe)
    return f"{name}:{lines[probe]}: {path}" if path else f"{name}:{lines[probe]}"


def _validation_message(name: str, lines: dict[str, int], error: str, data: Any = None) -> str:
    match = _AT.match(error)
    what, path = (match["what"], (match["path"] or "").lstrip(".")) if match else (error, "")
    missing = _MISSING.match(what)
    if missing:
        key = _join(path, missing["field"])
        place = f"to {path}" if path else "at the top level"
        fix = f"add {missing['field']} ({_describe(_type_at(key))}) {place}"
        return f"{_where(name, lines, key)}: missing required key; {fix}"
    # msgspec speaks JSON; a recipe author reads YAML.
    what = re.sub(r"`([^`]*)`", lambda m: _YAML_WORDS.get(m[1], m[1]), what)
    fix = _exponent_fix(_value_at(data, path)) or f"set it to {_describe(_type_at(path))}"
    return f"{_where(name, lines, path)}: {what[:1].lower()}{what[1:]}; {fix}"


# YAML 1.1 (PyYAML) reads a number in exponent form only with a dot and a signed exponent.
_EXPONENT = re.compile(
    r"^(?P<sign>[-+]?)(?P<int>[0-9]+)(?:\.(?P<frac>[0-9]*))?[eE](?P<exp>[-+]?[0-9]+)$"
)


def _exponent_fix(value: Any) -> str:
    """What to write for a number YAML took for text (``1e308``), or "" if it is not one."""
    if not isinstance(value, str) or not (m := _EXPONENT.match(value.strip())):
        return ""
    exp = int(m["exp"])
    written = f"{m['sign']}{m['int']}.{m['frac'] or '0'}e{'-' if exp < 0 else '+'}{abs(exp)}"
    why = "YAML reads an exponent number as text unless it has a dot and a signed exponent"
    return f"write {written} instead of {value} ({why})"


def _value_at(data: Any, path: str) -> Any:
    """The value at a key path such as ``sources[0].weight`` in the parsed YAML, or None."""
    for part in re.findall(r"\[\d+\]|[^.\[]+", path):
        if part.startswith("[") and isinstance(data, list) and int(part[1:-1]) < len(data):
            data = data[int(part[1:-1])]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            return None
    return data


def _type_at(path: str) -> mi.Type:
    """The schema type at a key path such as ``sources[0].transform.kind``."""
    typ: mi.Type = _RECIPE_TYPE
    for part in re.findall(r"\[\d+\]|[^.\[]+", path):
        typ = _unwrap(typ)
        if isinstance(typ, mi.VarTupleType) and part.startswith("["):
            typ = typ.item_type
        elif isinstance(typ, mi.StructType) and part in _fields(typ):
            typ = _fields(typ)[part]
        else:
            return mi.AnyType()
    return typ


_SIMPLE = {
    mi.IntType: "an integer",
    mi.FloatType: "a number",
    mi.StrType: "a quoted string",
    mi.BoolType: "true or false",
    mi.NoneType: "null",
    mi.VarTupleType: "a list",
    mi.StructType: "a mapping",
}


def _describe(typ: mi.Type) -> str:
    """Plain words for what a value of ``typ`` looks like in YAML."""
    if isinstance(typ, mi.UnionType):
        return " or ".join(_describe(t) for t in typ.types)
    if isinstance(typ, mi.LiteralType):
        return "one of " + ", ".join(str(v) for v in typ.values)
    return _SIMPLE.get(type(typ), "a value of the right type")


def line_of(path: str | os.PathLike[str], key: str) -> str:
    """``file:line`` of ``key`` (or of its nearest parent) in an already valid recipe file."""
    name = os.fspath(path)
    node, _ = _parse(name, _read_text(name))
    return _where(name, _line_index(name, node), key).removesuffix(f": {key}")
