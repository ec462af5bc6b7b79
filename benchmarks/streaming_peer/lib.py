"""MosaicML Streaming, imported without the parts that need torchvision and transformers.

``import streaming`` runs ``streaming/__init__.py``, which imports ``streaming.vision``
(torchvision) and ``streaming.base.dataloader`` (transformers, for ``StreamingDataLoader``'s
batch types). This benchmark uses neither: only ``StreamingDataset``, ``Stream`` and
``MDSWriter`` with a plain ``torch.utils.data.DataLoader``. Where the whole package imports, it
is used as is; where it does not, the two package modules are registered empty (their paths
set, their ``__init__`` not run) and the three modules are imported directly. Nothing is
stubbed: every module that does run is Streaming's own.

torchvision is a binary built against one torch version and transformers pulls a dozen
packages; neither may replace the project's torch (see ``setup_peer.sh``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from importlib import metadata
from typing import Any

STREAMING_VERSION = "0.13.0"
_PACKAGES = ("streaming", "streaming.base")


def _register_shell(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"no {name!r}: run benchmarks/streaming_peer/setup_peer.sh")
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _load() -> tuple[Any, Any, Any, str]:
    """(StreamingDataset, Stream, MDSWriter, how they were imported)."""
    try:
        import streaming

        return streaming.StreamingDataset, streaming.Stream, streaming.MDSWriter, "package"
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] not in ("torchvision", "transformers"):
            raise
        for name in _PACKAGES:
            sys.modules.pop(name, None)
        for name in [m for m in sys.modules if m.startswith("streaming.")]:
            sys.modules.pop(name)
    for name in _PACKAGES:
        _register_shell(name)
    dataset = importlib.import_module("streaming.base.dataset")
    stream = importlib.import_module("streaming.base.stream")
    writer = importlib.import_module("streaming.base.format.mds.writer")
    how = "submodules (streaming.vision and StreamingDataLoader left out)"
    return dataset.StreamingDataset, stream.Stream, writer.MDSWriter, how


StreamingDataset, Stream, MDSWriter, IMPORTED_AS = _load()


def clean_stale_shared_memory() -> None:
    """Streaming's own clean-up of shared memory a killed run left behind."""
    util = importlib.import_module("streaming.base.util")
    util.clean_stale_shared_memory()


def describe() -> dict[str, str]:
    """What was imported, and the versions that matter to whether it works."""

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "missing"

    return {
        "mosaicml-streaming": version("mosaicml-streaming"),
        "imported_as": IMPORTED_AS,
        "numpy": version("numpy"),
        "torch": version("torch"),
        "xxhash": version("xxhash"),
        "zstd": version("zstd"),
        "python-snappy": version("python-snappy"),
        "Brotli": version("Brotli"),
        "catalogue": version("catalogue"),
    }
