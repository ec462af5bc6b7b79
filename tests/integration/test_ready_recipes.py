"""Every recipe in recipes/ passes `msd validate` against the demo sources, without a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from msd.synth.chat import write_chat_sources
from msd.synth.text import synth, train_tokenizer
from msd.synth.video import write_video_sources
from msd.synth.vlm import write_vlm_sources
from tests.conftest import SMALL_SOURCES, run_msd

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with `demo-data/`, `demo-vlm/`, `demo-video/` and `demo-chat/` as `msd synth
    demo-data`, `msd synth demo-vlm --kind vlm`, `msd synth demo-video --kind video` and `msd
    synth demo-chat --kind chat` lay them out (smaller sources)."""
    root = tmp_path_factory.mktemp("ready")
    synth(root / "demo-data", SMALL_SOURCES, seed=3, files_per_source=2, rows_per_row_group=32)
    train_tokenizer(root / "demo-data", SMALL_SOURCES, vocab_size=300, rows=50)
    synth(root / "demo-vlm", SMALL_SOURCES, seed=3, files_per_source=1, rows_per_row_group=32)
    write_vlm_sources(root / "demo-vlm", seed=3, samples=8, files_per_source=1)
    synth(root / "demo-video", SMALL_SOURCES, seed=3, files_per_source=1, rows_per_row_group=32)
    write_vlm_sources(root / "demo-video", seed=3, samples=4, files_per_source=1)
    write_video_sources(root / "demo-video", seed=3, videos=2, files_per_source=1)
    synth(root / "demo-chat", SMALL_SOURCES, seed=3, files_per_source=1, rows_per_row_group=32)
    write_chat_sources(root / "demo-chat", seed=3, conversations=8, files=1)
    return root


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_ready_recipe_validates_with_demo_data(path: Path, demo_dir: Path) -> None:
    result = run_msd("validate", str(path), cwd=demo_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid" in result.stdout
    assert "warning" not in result.stderr, result.stderr
