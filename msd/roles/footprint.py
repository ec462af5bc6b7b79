"""What a role process costs beyond its work: how its C allocator hands memory back, and which
libraries it loads.

``fix_mmap_threshold`` (glibc only; elsewhere a no-op): glibc serves a request of at least its
mmap threshold with its own mapping, returned to the system when freed, and everything smaller
from its heaps, which give back only whole free pages at their top. The threshold starts at
128 KiB and rises to the largest block freed so far, up to 32 MiB: after a role frees one
payload of decoded patches (a few MB), every later buffer below that size is carved from the
heaps, and the holes between live ones stay resident. Fixing the threshold keeps payload-sized
buffers in mappings of their own. Measured on an image job (``python -m benchmarks.dataloader
--vlm``, S = 64): the data plane's peak memory 606 -> 441 MiB, its CPU per image higher (a
mapping's pages are zeroed and faulted in each time: docs/multimodal.md, *Decode throughput*,
measures 21 % of a loader's CPU on images of up to 2,048 px). Where the environment sets glibc's
own threshold (``MALLOC_MMAP_THRESHOLD_``, or ``glibc.malloc.mmap_threshold`` in
``GLIBC_TUNABLES``) that choice stands and the threshold is left as glibc has it: e.g.
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864`` trades a larger, less flat
footprint for that CPU.

``arrow_on_malloc`` (a Source Loader): Arrow's C++ side allocates from its own default pool
(mimalloc), not from the pool ``pyarrow.set_memory_pool`` names: the Parquet reader decodes each
row group there, and mimalloc keeps what it freed, per thread. A loader reads a row group again
for each window it cuts, so that grew by about 3 MB per row group read until a loader serving 64
sources held 60 MiB of freed pages. Naming the system allocator before pyarrow loads puts every
Arrow allocation on glibc, which returns them (see ``fix_mmap_threshold``).

``cache_image_blocks`` (a loader of video sources): Pillow allocates each image from blocks of
its own and, by default, frees a block as soon as its image goes. A video loader converts and
resizes sampled frames of the same few sizes one after the other, each image a few MB: with the
mmap threshold fixed, every one was a new mapping whose pages were faulted in again. Keeping the
last few freed blocks serves the next frames from them. Measured decoding H.264 clips
(``msd.sources.video.decode``, one process): 20-22 % more CPU with the fixed threshold than
without it; with the blocks kept, 3 % more at 720p and 16 % at 1080p (where FFmpeg's frames
are mapped afresh too). What it holds is at most ``IMAGE_BLOCKS`` blocks, one frame's images
(for a 1080p frame: 8 MiB as decoded, 6 MiB resized).

``keep_pandas_out``: see there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD_VARIABLE = "MALLOC_MMAP_THRESHOLD_"  # glibc reads these when the process starts
TUNABLES_VARIABLE, THRESHOLD_TUNABLE = "GLIBC_TUNABLES", "glibc.malloc.mmap_threshold"
MMAP_THRESHOLD = 1 << 20
ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"  # read once, when pyarrow loads
IMAGE_BLOCKS = 3  # a frame's three images: as decoded, resized halfway, resized


def threshold_from_environment(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment sets glibc's mmap threshold itself."""
    tunables = environ.get(TUNABLES_VARIABLE, "").split(":")
    return THRESHOLD_VARIABLE in environ or any(
        t.partition("=")[0] == THRESHOLD_TUNABLE for t in tunables
    )


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve blocks of at least ``threshold`` bytes from mappings of their own, whatever the
    process frees later; True if the allocator took it (glibc on Linux). Not where the
    environment sets glibc's threshold: that stands."""
    if not sys.platform.startswith("linux"):
        return False
    if threshold_from_environment():
        log.debug("the environment sets glibc's mmap threshold: it stays as set")
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    taken = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not taken:
        log.debug("the C allocator refused an mmap threshold of %d bytes", threshold)
    return taken


def arrow_on_malloc() -> bool:
    """Have Arrow allocate with the C library's allocator, unless the environment names another
    pool; True if that holds once pyarrow loads (False: pyarrow was loaded before)."""
    if "pyarrow" in sys.modules:
        log.debug("pyarrow is loaded already: its memory pool stays as it is")
        return False
    os.environ.setdefault(ARROW_POOL_VARIABLE, "system")
    return True


def cache_image_blocks(blocks: int = IMAGE_BLOCKS) -> None:
    """Have Pillow keep up to ``blocks`` freed image blocks for its next images."""
    from PIL import Image

    Image.core.set_blocks_max(blocks)  # type: ignore[attr-defined]  # as PILLOW_BLOCKS_MAX sets it


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError("pandas is kept out of msd's role processes")
        return None


def keep_pandas_out() -> None:
    """Tell pyarrow that pandas is not here, without keeping anyone from importing it later.

    Where pandas is installed, pyarrow imports it the first time it converts Python objects or
    checks a value for pandas types (0.5 CPU-s and about 48 MiB a process); a role never hands
    it pandas objects. Both checks run once, here, while a finder refuses pandas; pyarrow then
    remembers that it has none. A transform function may still import pandas for itself.
    """
    if "pandas" in sys.modules:
        return  # already loaded: nothing to save
    import pyarrow as pa

    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.lib._pandas_api.have_pandas  # noqa: B018  (the Python side's one import attempt)
        pa.array([None])  # the C++ side's one attempt, on its first Python object
    finally:
        sys.meta_path.remove(blocker)
