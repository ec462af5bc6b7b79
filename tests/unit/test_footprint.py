"""A role process's footprint: pyarrow does not pull pandas in, the allocator keeps
payload-sized buffers in mappings of their own, and a video loader's Pillow reuses its image
blocks. Each check runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from msd.roles.footprint import threshold_from_environment


def run(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_pyarrow_converts_python_objects_without_importing_pandas() -> None:
    pytest.importorskip("pandas")  # where it is not installed there is nothing to keep out
    code = """
import sys
import pyarrow as pa
from msd.roles.footprint import keep_pandas_out
keep_pandas_out()
pa.array([1, None]); pa.array(["text", None]); pa.array([b"x"]).take(pa.array([0]))
print("pandas" in sys.modules)
import pandas
print(pandas.DataFrame({"a": [1]}).shape)
"""
    assert run(code).splitlines() == ["False", "(1, 1)"]
    # without it, pyarrow's first conversion imports pandas
    assert run("import sys, pyarrow as pa; pa.array([1]); print('pandas' in sys.modules)") == "True"


MAPPED_AFTER_A_FREE = """
import ctypes, sys
from msd.roles.footprint import fix_mmap_threshold

class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    fix_mmap_threshold()
libc.free(libc.malloc(8 << 20))  # a payload freed: glibc's threshold would rise to 8 MiB
before = libc.mallinfo2().hblks  # blocks in mappings of their own
block = libc.malloc(2 << 20)
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_fixed_threshold_keeps_a_2_mib_buffer_in_its_own_mapping_after_a_large_free() -> None:
    def mapped(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", MAPPED_AFTER_A_FREE, mode],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return int(done.stdout.split()[-1])

    assert mapped("fixed") == 1
    assert mapped("default") == 0  # the risen threshold puts it in the heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize(
    "variables",
    [
        {"MALLOC_MMAP_THRESHOLD_": "33554432"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1:glibc.malloc.mmap_threshold=33554432"},
    ],
)
def test_a_threshold_the_environment_sets_stands(variables: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MAPPED_AFTER_A_FREE, "fixed"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, **variables},
    )
    assert int(done.stdout.split()[-1]) == 0  # 2 MiB under its 32 MiB: from the heap


def test_only_the_mmap_threshold_counts_as_set_by_the_environment() -> None:
    assert threshold_from_environment({"MALLOC_MMAP_THRESHOLD_": "0"})
    assert threshold_from_environment({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4096"})
    assert not threshold_from_environment({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"})
    assert not threshold_from_environment({"MALLOC_TRIM_THRESHOLD_": "1", "PATH": "/bin"})


def test_a_loader_puts_arrow_on_the_c_allocator_unless_told_otherwise() -> None:
    code = """
from msd.roles.footprint import arrow_on_malloc
print(arrow_on_malloc())
import pyarrow as pa
print(pa.default_memory_pool().backend_name)
print(arrow_on_malloc())
"""
    assert run(code).splitlines() == ["True", "system", "False"]  # too late once loaded


def test_the_environment_still_chooses_arrows_pool() -> None:
    code = """
import os
os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
from msd.roles.footprint import arrow_on_malloc
arrow_on_malloc()
print(os.environ["ARROW_DEFAULT_MEMORY_POOL"])
"""
    assert run(code) == "jemalloc"


FRAME_FAULTS = """
import resource, sys
from PIL import Image
from msd.roles.footprint import cache_image_blocks, fix_mmap_threshold
fix_mmap_threshold()
if sys.argv[1] == "cached":
    cache_image_blocks()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def frame():  # a 720p frame as a video loader makes it: converted, then resized
    Image.new("RGB", (1280, 720), (9, 8, 7)).resize((1008, 560), Image.Resampling.BICUBIC)
frame()
before = faults()
for _ in range(20):
    frame()
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_image_blocks_spare_a_video_loader_the_page_faults_of_each_frame() -> None:
    def faults(mode: str) -> int:
        return int(run(FRAME_FAULTS, mode))

    uncached, cached = faults("default"), faults("cached")
    assert uncached > 20 * 500  # each frame's images (3.7 + 2.9 + 2.3 MB) mapped afresh
    assert cached * 4 < uncached
