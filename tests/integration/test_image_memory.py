"""A loader of an image source holds what it reads ahead as the images' bytes, decoding a sample
only when it is routed: asked for ten times its read-ahead, its RSS stays under a bound that
the same read-ahead held as patches would pass several times over."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image

from msd.recipe.load import load_recipe
from tests.conftest import assert_launch_ok, start_launch
from tests.integration.test_recovery import peak_rss_until_exit

SIDE = 1400  # a 1400 × 1400 photo: 2,500 placeholders, 5.9 MB of patches; 250 KB as this JPEG
MAX_PIXELS = 14 * 14 * 4 * 2500
ROWS, DISTINCT = 320, 8
SEQ_LEN = 8192
# A loader process's own memory (Python, numpy, pyarrow, Pillow, PyAV) ...
LOADER_FLOOR = 90 << 20
# ... and the images it holds as bytes (up to 65 MB here), with room for one step's patches
# being decoded and sent (about 18 MB). Held as patches, the read-ahead asked for is 183 MiB:
# such a loader peaks near 300 MiB.
LOADER_RSS_BOUND = 250 << 20


def _photo(seed: int) -> bytes:
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    pixels = np.stack(
        [
            127 + 120 * np.sin(x / (17 + seed)),
            127 + 120 * np.cos(y / 29),
            127 + 120 * np.sin((x + y) / 53),
        ],
        axis=-1,
    ).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


def test_a_loader_asked_for_ten_times_its_read_ahead_holds_bytes_not_patches(
    tmp_path: Path,
) -> None:
    photos = [_photo(k) for k in range(DISTINCT)]
    (tmp_path / "photos").mkdir()
    table = pa.table(
        {
            "text": [f"photo {k}" for k in range(ROWS)],
            "image": [photos[k % DISTINCT] for k in range(ROWS)],
        }
    )
    pq.write_table(table, tmp_path / "photos" / "part-0.parquet", row_group_size=80)
    doc = {
        "name": "photos",
        "seed": 1,
        "steps": 12,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": SEQ_LEN,
        "distribute": {"dp": 1},
        "vision": {"max_pixels": MAX_PIXELS},
        "sources": [
            {
                "name": "photos",
                "path": str(tmp_path / "photos" / "*.parquet"),
                "text_column": "text",
                "image_column": "image",
                "transform": {"kind": "bytes"},
                "weight": 1.0,
            }
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 300}},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    recipe = load_recipe(tmp_path / "r.yaml")
    doc["loader"] = {
        "buffer_tokens": 10 * recipe.loader_buffer_tokens,
        "buffer_bytes": 10 * recipe.loader_buffer_bytes,
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    # Held as patches, what the loader may read ahead would be this much over its own memory.
    read_ahead = min(ROWS, 10 * recipe.loader_buffer_tokens // 2500)  # images
    # Held as patches, that read-ahead alone would take the loader past the bound.
    held_as_patches = min(10 * recipe.loader_buffer_bytes, read_ahead * SIDE * SIDE * 3)
    assert LOADER_FLOOR + held_as_patches > LOADER_RSS_BOUND

    proc = start_launch(tmp_path, "r.yaml", "--json")
    out, err, peak = peak_rss_until_exit(proc, "loader")
    assert_launch_ok(proc, out, err)
    summary = json.loads(out[out.index("{") :])
    assert summary["steps"] == 12
    assert 0 < peak < LOADER_RSS_BOUND, f"a loader peaked at {peak / 2**20:.0f} MiB"
