"""The image-text demo data generator: determinism, layout, HF schema, sizes, the CLI."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from msd.cli import synth as cli_synth
from msd.cli.main import app
from PIL import Image
from typer.testing import CliRunner

from msd.synth.text import SynthSource, synth, train_tokenizer
from msd.synth.video import PARQUET_SOURCE as VIDEO_PARQUET
from msd.synth.video import WDS_SOURCE as VIDEO_WDS
from msd.synth.video import write_video_sources
from msd.synth.vlm import (
    DEFAULT_SAMPLES,
    IMAGE_MARKER,
    INTERLEAVED_SOURCE,
    MAX_IMAGES_PER_DOCUMENT,
    PARQUET_SOURCE,
    TAR_MTIME,
    WDS_SOURCE,
    VlmSourceSummary,
    image_specs,
    write_vlm_sources,
)

SAMPLES = 16  # the fewest for which every source holds a < 64 px and a > 1024 px image
FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _write(root: Path, seed: int = 0) -> list[VlmSourceSummary]:
    return write_vlm_sources(
        root, seed=seed, samples=SAMPLES, files_per_source=2, rows_per_row_group=4
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[VlmSourceSummary]]:
    root = tmp_path_factory.mktemp("vlm")
    return root, _write(root)


def _hashes(root: Path) -> dict[str, str]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _tar_samples(path: Path) -> dict[str, dict[str, tarfile.TarInfo | bytes]]:
    samples: dict[str, dict[str, tarfile.TarInfo | bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            key, ext = member.name.split(".", 1)
            assert not samples or key in samples or key > max(samples)  # samples are contiguous
            reader = tar.extractfile(member)
            assert reader is not None
            samples.setdefault(key, {})[ext] = reader.read()
            samples[key][f"{ext}.info"] = member
    return samples


def _images(root: Path) -> dict[str, list[Image.Image]]:
    found: dict[str, list[Image.Image]] = {}
    for path in sorted((root / WDS_SOURCE).glob("*.tar")):
        for sample in _tar_samples(path).values():
            data = next(v for k, v in sample.items() if k in FORMATS)
            assert isinstance(data, bytes)
            found.setdefault(WDS_SOURCE, []).append(Image.open(io.BytesIO(data)))
    for name, column in [(PARQUET_SOURCE, "image"), (INTERLEAVED_SOURCE, "images")]:
        for path in sorted((root / name).glob("*.parquet")):
            for cell in pq.read_table(path).column(column).to_pylist():
                for image in cell if isinstance(cell, list) else [cell]:
                    found.setdefault(name, []).append(Image.open(io.BytesIO(image["bytes"])))
    return found


def test_same_seed_gives_byte_identical_files(
    tmp_path: Path, written: tuple[Path, list[VlmSourceSummary]]
) -> None:
    root, summaries = written
    again = _write(tmp_path)
    assert _hashes(tmp_path) == _hashes(root)
    assert len(_hashes(root)) == 6 and [s.bytes for s in summaries] == [s.bytes for s in again]


def test_summary_counts_what_was_written(written: tuple[Path, list[VlmSourceSummary]]) -> None:
    root, summaries = written
    assert [s.name for s in summaries] == [WDS_SOURCE, PARQUET_SOURCE, INTERLEAVED_SOURCE]
    images = _images(root)
    for s in summaries:
        assert s.samples == SAMPLES and s.images == len(images[s.name])
        assert s.files == tuple(sorted((root / s.name).iterdir()))
        assert s.bytes == sum(p.stat().st_size for p in s.files) > 0


def test_every_tar_sample_has_an_image_a_caption_and_matching_json(
    written: tuple[Path, list[VlmSourceSummary]],
) -> None:
    root, _ = written
    shards = sorted((root / WDS_SOURCE).glob("*.tar"))
    assert [p.name for p in shards] == ["shard-00000.tar", "shard-00001.tar"]
    keys = []
    for shard in shards:
        for key, sample in _tar_samples(shard).items():
            (ext,) = (k for k in sample if k in FORMATS)
            assert set(sample) == {ext, "txt", "json", f"{ext}.info", "txt.info", "json.info"}
            meta = json.loads(sample["json"])  # type: ignore[arg-type]
            image = Image.open(io.BytesIO(sample[ext]))  # type: ignore[arg-type]
            assert image.format == FORMATS[ext]
            assert image.size == (meta["width"], meta["height"]) and meta["id"] == int(key)
            assert sample["txt"].decode().startswith("a ")  # type: ignore[union-attr]
            for info in (v for k, v in sample.items() if k.endswith(".info")):
                assert isinstance(info, tarfile.TarInfo)
                assert (info.mtime, info.uid, info.gid, info.mode) == (TAR_MTIME, 0, 0, 0o644)
            keys.append(key)
    assert keys == [f"{i:06d}" for i in range(SAMPLES)]


def test_parquet_image_column_is_the_hf_image_feature(
    written: tuple[Path, list[VlmSourceSummary]],
) -> None:
    root, _ = written
    for path in sorted((root / PARQUET_SOURCE).glob("*.parquet")):
        schema = pq.read_schema(path)
        assert schema.field("image").type == IMAGE_TYPE
        assert schema.field("text").type == pa.string()
        features = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
        assert features["image"] == {"_type": "Image"}
        assert pq.ParquetFile(path).metadata.num_row_groups == 2
    table = pq.read_table(root / PARQUET_SOURCE)
    assert table.column("id").to_pylist() == list(range(SAMPLES))
    for row in table.to_pylist():
        decoded = Image.open(io.BytesIO(row["image"]["bytes"]))
        assert FORMATS[row["image"]["path"].rsplit(".", 1)[1]] == decoded.format and row["text"]


def test_every_document_has_one_marker_per_image_between_paragraphs(
    written: tuple[Path, list[VlmSourceSummary]],
) -> None:
    root, _ = written
    table = pq.read_table(root / INTERLEAVED_SOURCE)
    assert table.schema.field("images").type == pa.list_(IMAGE_TYPE)
    first = pq.ParquetFile(root / INTERLEAVED_SOURCE / "part-00000.parquet")
    assert first.metadata.num_row_groups == 2
    counts = []
    for row in table.to_pylist():
        images, text = row["images"], row["text"]
        blocks = text.split("\n\n")
        assert 1 <= len(images) <= MAX_IMAGES_PER_DOCUMENT
        assert text.count(IMAGE_MARKER) == blocks.count(IMAGE_MARKER) == len(images)
        assert IMAGE_MARKER not in (blocks[0], blocks[-1])
        counts.append(len(images))
    assert len(set(counts)) > 1


def test_sizes_span_thumbnails_to_large_images(
    written: tuple[Path, list[VlmSourceSummary]],
) -> None:
    root, _ = written
    found = _images(root)
    for images in found.values():
        sides = [max(image.size) for image in images]
        assert min(sides) <= 64 and max(sides) >= 1024
    assert {image.format for images in found.values() for image in images} == set(FORMATS.values())


def test_default_size_distribution_is_long_tailed_with_wide_and_tall_images() -> None:
    specs = image_specs(np.random.default_rng(0), DEFAULT_SAMPLES)
    sides = np.array([max(s.width, s.height) for s in specs])
    ratios = np.array([s.width / s.height for s in specs])
    assert min(min(s.width, s.height) for s in specs) >= 32 and sides.max() <= 2048
    assert sides.min() <= 64 and sides.max() >= 1024
    assert 200 <= np.median(sides) <= 320 and sides.mean() > 1.3 * np.median(sides)
    assert ratios.max() >= 3.5 and ratios.min() <= 1 / 3.5


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_vlm_sources(tmp_path, samples=0)
    with pytest.raises(ValueError):
        write_vlm_sources(tmp_path, files_per_source=0)


SMALL_TEXT = (SynthSource("web", median_tokens=64, sigma=1.0, max_tokens=512, num_samples=300),)


@pytest.fixture
def small_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # The default text sources take seconds; the CLI passes the same arguments either way.
    monkeypatch.setattr(
        cli_synth, "write_demo_sources", functools.partial(synth, sources=SMALL_TEXT)
    )
    tokenizer = functools.partial(train_tokenizer, sources=SMALL_TEXT, vocab_size=300, rows=20)
    monkeypatch.setattr(cli_synth, "train_tokenizer", tokenizer)


@pytest.mark.usefixtures("small_text")
def test_cli_kind_text_is_the_default_and_vlm_adds_image_sources(tmp_path: Path) -> None:
    runner = CliRunner()
    args = [["synth", str(tmp_path / "default")], ["synth", str(tmp_path / "text")]]
    args[1] += ["--kind", "text"]
    args.append(["synth", str(tmp_path / "vlm"), "--kind", "vlm", "--samples", "2"])
    for arg in args:
        result = runner.invoke(app, arg)
        assert result.exit_code == 0, result.output
    default = _hashes(tmp_path / "default")
    assert set(default) == {"tokenizer.json", "web/part-00000.parquet", "web/part-00001.parquet"}
    assert _hashes(tmp_path / "text") == default
    vlm = _hashes(tmp_path / "vlm")
    assert {k: v for k, v in vlm.items() if k in default} == default
    assert {k.split("/")[0] for k in vlm.keys() - default.keys()} == {
        WDS_SOURCE,
        PARQUET_SOURCE,
        INTERLEAVED_SOURCE,
    }
    assert f"wrote {WDS_SOURCE}: 2 samples, 2 images" in result.output


@pytest.mark.usefixtures("small_text")
def test_cli_kind_vlm_tells_of_each_file_on_stderr_as_it_is_written(tmp_path: Path) -> None:
    """Image sources take a while: a line on stderr for each file written, and the files are
    those the library writes alone."""
    args = ["synth", str(tmp_path / "cli"), "--kind", "vlm", "--samples", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    files = [f"{WDS_SOURCE}/shard-00000.tar", f"{PARQUET_SOURCE}/part-00000.parquet"]
    files.append(f"{INTERLEAVED_SOURCE}/part-00000.parquet")
    expected = [f"wrote {tmp_path / 'cli' / f} ({n}/3)" for n, f in enumerate(files, 1)]
    assert result.stderr.splitlines() == expected
    assert "(1/3)" not in result.stdout and f"wrote {WDS_SOURCE}: 1 samples" in result.stdout
    write_vlm_sources(tmp_path / "alone", samples=1)
    written = _hashes(tmp_path / "cli")
    assert {f: written[f] for f in files} == _hashes(tmp_path / "alone")


@pytest.mark.usefixtures("small_text")
def test_cli_refuses_samples_without_kind_vlm(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["synth", str(tmp_path), "--samples", "4"])
    assert result.exit_code == 2 and "--kind vlm" in result.output
    assert not tmp_path.joinpath("web").exists()


@pytest.mark.usefixtures("small_text")
def test_cli_kind_video_adds_video_sources_beside_the_image_ones(tmp_path: Path) -> None:
    args = ["synth", str(tmp_path), "--kind", "video", "--samples", "2", "--videos", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = {k.split("/")[0] for k in _hashes(tmp_path)}
    assert {VIDEO_WDS, VIDEO_PARQUET, WDS_SOURCE} <= written
    assert f"wrote {VIDEO_WDS}: 3 samples, 3 videos" in result.output
    told = [line.rsplit(" ", 1)[1] for line in result.stderr.splitlines()[-4:]]
    assert told == [f"({n}/4)" for n in (1, 2, 3, 4)]  # each video file, as it is written
    rows = pq.read_table(tmp_path / VIDEO_PARQUET / "part-00000.parquet").to_pylist()
    assert all(r["text"].startswith("<video>") and r["video"]["bytes"] for r in rows)
    with tarfile.open(tmp_path / VIDEO_WDS / "shard-00000.tar") as tar:
        names = tar.getnames()
    assert any(n.endswith(".webm") for n in names) and any(n.endswith(".txt") for n in names)


@pytest.mark.usefixtures("small_text")
def test_cli_refuses_videos_without_kind_video(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["synth", str(tmp_path), "--kind", "vlm", "--videos", "2"])
    assert result.exit_code == 2 and "--kind video" in result.output
    assert not tmp_path.joinpath("web").exists()


def test_video_sources_are_byte_identical_for_the_same_arguments(tmp_path: Path) -> None:
    a = write_video_sources(tmp_path / "a", seed=5, videos=3, files_per_source=1)
    b = write_video_sources(tmp_path / "b", seed=5, videos=3, files_per_source=1)
    assert _hashes(tmp_path / "a") == _hashes(tmp_path / "b")
    assert [s.seconds for s in a] == [s.seconds for s in b] and all(s.seconds >= 3 for s in a)
    c = write_video_sources(tmp_path / "c", seed=6, videos=3, files_per_source=1)
    assert _hashes(tmp_path / "c") != _hashes(tmp_path / "a")
    assert [s.videos for s in c] == [3, 3]
