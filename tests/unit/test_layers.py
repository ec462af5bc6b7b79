"""Every module under msd/ imports only from its own layer or lower ones, as the table in
docs/architecture.md (*Layers*) orders them.

Imports are read with ``ast`` at any depth: inside functions and under ``if TYPE_CHECKING:``
too, since a type-only import still ties the lower layer's code to the higher one's names.
Imports by a string (``importlib.import_module``) are not read. No upward import is allowed, so
there is no list of exceptions to keep.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "msd"
DOC = ROOT / "docs" / "architecture.md"


def layer_table(text: str) -> list[list[str]]:
    """The modules of each layer, lowest first, from the *Layers* section's table."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]
    return [re.findall(r"`([\w.]+)`", row.split("|")[2]) for row in rows]


def layer_of(module: str, layers: list[list[str]]) -> int:
    """The layer of the longest table entry that names ``module`` or a package above it;
    ``msd`` names the package's ``__init__`` alone."""
    best: tuple[int, int] | None = None
    for index, entries in enumerate(layers):
        for entry in entries:
            names_it = module == entry or (entry != "msd" and module.startswith(entry + "."))
            if names_it and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    assert best is not None, f"{module} is in no layer of docs/architecture.md"
    return best[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported(path: Path) -> set[str]:
    """The msd modules ``path`` imports, anywhere in it."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base)
    return {name for name in found if name == "msd" or name.startswith("msd.")}


def upward_imports() -> set[tuple[str, str]]:
    layers = layer_table(DOC.read_text())
    upward: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        own = layer_of(importer, layers)
        upward.update(
            (importer, target) for target in imported(path) if layer_of(target, layers) > own
        )
    return upward


def test_the_table_has_the_layers() -> None:
    layers = layer_table(DOC.read_text())
    assert len(layers) >= 10
    assert layers[0][0] == "msd.errors"
    assert layer_of("msd.wire.protocol", layers) < layer_of("msd.control.views", layers)
    assert layer_of("msd.sources.stores.s3", layers) < layer_of("msd.recipe", layers)


def test_imports_point_down() -> None:
    upward = sorted(upward_imports())
    assert not upward, f"imports from a higher layer (docs/architecture.md, Layers): {upward}"
