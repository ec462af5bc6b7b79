"""Image-text sources on real demo data: indexes, rows by position, errors, and the wire."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msd.errors import ProtocolError, SourceError
from msd.recipe.schema import Source
from msd.sources.first_video import ROWS_PER_READ, FirstVideo, first_videos
from msd.sources.fuse import PAST_ROW, Fuser, FuseSpec
from msd.sources.image_rows import (
    ROW_TYPE,
    ImageRowReader,
    as_image_lists,
    read_block,
    row_sizes,
    rows_of,
)
from msd.sources.index import RowGroup, SourceIndex, open_source
from msd.sources.read import RowGroupReader
from msd.sources.transforms import text_bytes
from msd.sources.vision import ImageGeometry
from msd.synth.vlm import (
    IMAGE_MARKER,
    IMAGE_TYPE,
    INTERLEAVED_SOURCE,
    PARQUET_SOURCE,
    WDS_SOURCE,
    write_vlm_sources,
)
from msd.wire.protocol import Meta, Payload, decode, encode

SAMPLES = 24
FILES = 2
ROWS_PER_GROUP = 4
IMAGE_EXTS = ("jpg", "png", "webp")
PATCH_VALUES = 3 * 14 * 14
IMG = 151655


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vlm")
    write_vlm_sources(root, samples=SAMPLES, files_per_source=FILES, rows_per_row_group=4)
    return root


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path))
    return tmp_path


def _wds(root: Path, path: str | None = None, name: str = WDS_SOURCE) -> Source:
    return Source(
        name=name, path=path or str(root / WDS_SOURCE / "*.tar"), weight=1.0, format="webdataset"
    )


def _parquet(root: Path, folder: str = PARQUET_SOURCE, column: str = "image") -> Source:
    return Source(
        name=folder,
        path=str(root / folder / "*.parquet"),
        weight=1.0,
        text_column="text",
        image_column=column,
    )


def _opened(source: Source) -> tuple[SourceIndex, ImageRowReader]:
    src = open_source(source, "sources[0]")
    return src, ImageRowReader(source, src, RowGroupReader())


def _tar_rows(path: Path | str) -> list[tuple[str, bytes, list[bytes], int]]:
    """(key, text, images, bytes of all members) of each sample, read with tarfile."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for info in tar.getmembers():
            key, _, ext = info.name.partition(".")
            data = tar.extractfile(info)
            assert data is not None
            samples.setdefault(key, {})[ext] = data.read()
    return [
        (
            key,
            m["txt"],
            [m[e] for e in IMAGE_EXTS if e in m],
            sum(len(v) for v in m.values()),
        )
        for key, m in samples.items()
    ]


def _parquet_rows(rg: RowGroup, column: str) -> list[tuple[bytes, list[bytes]]]:
    """(text, images) of each row of a row group, read with pyarrow."""
    table = pq.ParquetFile(rg.file).read_row_group(rg.index, columns=["text", column])
    out = []
    for text, images in zip(
        table.column("text").to_pylist(), table.column(column).to_pylist(), strict=True
    ):
        cells = images if isinstance(images, list) else [images]
        out.append((text.encode(), [c["bytes"] for c in cells]))
    return out


def _as_pairs(rows: pa.StructArray) -> list[tuple[bytes | None, list[bytes | None]]]:
    assert rows.type == ROW_TYPE
    return [(r["text"], r["images"]) for r in rows.to_pylist()]


# Indexes --------------------------------------------------------------------------------------


def test_webdataset_source_is_one_row_group_per_tar(root: Path, cache_dir: Path) -> None:
    src = open_source(_wds(root), "sources[0]")
    tars = sorted(str(p) for p in (root / WDS_SOURCE).glob("*.tar"))
    assert src.num_rows == SAMPLES and src.format == "webdataset" and src.has_images
    assert src.files == tuple(tars)
    assert src.row_groups == tuple(RowGroup(t, 0, len(_tar_rows(t))) for t in tars)
    assert src.row_starts == (0, src.row_groups[0].num_rows)
    assert src.problems == ()
    assert list((cache_dir / "webdataset").glob("*.index.json"))  # the scans were cached


@pytest.mark.parametrize(
    ("folder", "column"), [(PARQUET_SOURCE, "image"), (INTERLEAVED_SOURCE, "images")]
)
def test_parquet_image_source_keeps_the_files_row_groups(
    root: Path, folder: str, column: str
) -> None:
    src = open_source(_parquet(root, folder, column), "sources[0]")
    assert src.num_rows == SAMPLES and src.image_column == column and src.has_images
    expected = []
    for path in sorted((root / folder).glob("*.parquet")):
        meta = pq.ParquetFile(path).metadata
        expected += [
            RowGroup(str(path), i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)
        ]
    assert src.row_groups == tuple(expected)
    assert len(expected) == SAMPLES // ROWS_PER_GROUP
    assert src.row_starts == tuple(range(0, SAMPLES, ROWS_PER_GROUP))


# Rows -----------------------------------------------------------------------------------------


def test_webdataset_rows_come_back_as_asked(root: Path) -> None:
    src, reader = _opened(_wds(root))
    for rg in src.row_groups:
        truth = _tar_rows(rg.file)
        everything = _as_pairs(reader.read(rg))
        assert everything == [(text, images) for _, text, images, _ in truth]
        rows = np.array([rg.num_rows - 1, 0, 3, 3, 1])
        picked = _as_pairs(reader.read(rg, rows))
        assert picked == [everything[r] for r in rows.tolist()]
        assert all(len(images) == 1 for _, images in picked)


@pytest.mark.parametrize(
    ("folder", "column"), [(PARQUET_SOURCE, "image"), (INTERLEAVED_SOURCE, "images")]
)
def test_parquet_rows_come_back_as_asked(root: Path, folder: str, column: str) -> None:
    src, reader = _opened(_parquet(root, folder, column))
    for rg in src.row_groups:
        truth = _parquet_rows(rg, column)
        assert _as_pairs(reader.read(rg)) == truth
        rows = np.array([2, 0, 3])
        assert _as_pairs(reader.read(rg, rows)) == [truth[r] for r in rows.tolist()]


def test_interleaved_rows_hold_several_images_one_per_marker(root: Path) -> None:
    src, reader = _opened(_parquet(root, INTERLEAVED_SOURCE, "images"))
    counts = []
    for rg in src.row_groups:
        for text, images in _as_pairs(reader.read(rg)):
            assert text is not None and all(images)
            assert text.count(IMAGE_MARKER.encode()) == len(images)
            counts.append(len(images))
    assert len(counts) == SAMPLES
    assert max(counts) > 1 and sum(counts) > SAMPLES


@pytest.mark.parametrize("which", ["wds", "captions", "interleaved"])
def test_read_block_returns_block_local_rows_in_the_asked_order(root: Path, which: str) -> None:
    source = {
        "wds": _wds(root),
        "captions": _parquet(root),
        "interleaved": _parquet(root, INTERLEAVED_SOURCE, "images"),
    }[which]
    src, reader = _opened(source)
    groups = src.row_groups[:3]
    everything = [row for g in groups for row in _as_pairs(reader.read(g))]
    total = len(everything)
    rows = np.array([total - 1, 0, groups[0].num_rows, 2, total - 2, groups[0].num_rows - 1, 0])
    block = read_block(reader, groups, rows)
    assert _as_pairs(block) == [everything[r] for r in rows.tolist()]
    assert len(read_block(reader, groups, np.array([], dtype=np.int64))) == 0


def test_row_sizes_are_text_bytes_plus_image_bytes(root: Path) -> None:
    for source in (_wds(root), _parquet(root), _parquet(root, INTERLEAVED_SOURCE, "images")):
        src, reader = _opened(source)
        for rg in src.row_groups:
            rows = reader.read(rg)
            expected = [
                len(t or b"") + sum(len(i or b"") for i in ims) for t, ims in _as_pairs(rows)
            ]
            sizes = row_sizes(rows)
            assert sizes.dtype == np.int64 and sizes.tolist() == expected
            assert min(expected) > 0


def test_row_sizes_count_missing_text_images_and_videos_as_nothing() -> None:
    rows = rows_of(
        pa.array([b"abc", None, b"", b"z"], pa.large_binary()),
        pa.array([[b"12345", None], None, [], [b"1", b"22"]], ROW_TYPE[1].type),
        pa.array([[b"123"], [None], None, []], ROW_TYPE[2].type),
    )
    assert row_sizes(rows).tolist() == [11, 0, 0, 4]


def test_webdataset_index_sizes_are_every_members_bytes(root: Path) -> None:
    src, reader = _opened(_wds(root))
    for rg in src.row_groups:
        sizes = reader.sizes(rg)
        assert sizes is not None
        assert sizes.tolist() == [total for *_, total in _tar_rows(rg.file)]
    parquet_src, parquet_reader = _opened(_parquet(root))
    assert parquet_reader.sizes(parquet_src.row_groups[0]) is None


def test_image_columns_become_lists_of_binary() -> None:
    typ = pa.list_(pa.large_binary())
    binary = pa.array([b"a", None, b"bc"], pa.binary())
    assert as_image_lists(binary).to_pylist() == [[b"a"], [None], [b"bc"]]
    structs = pa.array(
        [{"bytes": b"x", "path": "x.png"}, {"bytes": None, "path": "y.png"}, None], IMAGE_TYPE
    )
    got = as_image_lists(structs)
    assert got.type.value_type == typ.value_type
    assert got.to_pylist() == [[b"x"], [None], [None]]
    lists = pa.array(
        [[{"bytes": b"p", "path": "p"}, {"bytes": b"q", "path": "q"}], None, [], [None]],
        pa.list_(IMAGE_TYPE),
    )
    assert as_image_lists(lists).to_pylist() == [[b"p", b"q"], [], [], [None]]
    assert as_image_lists(lists.slice(1)).to_pylist() == [[], [], [None]]
    assert as_image_lists(structs.slice(1, 1)).to_pylist() == [[None]]


def test_the_first_video_of_a_parquet_file_is_the_first_cell_with_bytes(tmp_path: Path) -> None:
    """Past empty lists, null lists and videos without bytes, and past the first read's rows;
    a file without one has none (``msd validate`` probes what this finds)."""
    rows: list[list[dict[str, object] | None] | None] = [[]] * (ROWS_PER_READ + 1)
    rows += [None, [None, {"bytes": None, "path": "a"}, {"bytes": b"clip", "path": "b"}]]
    texts = pa.array(["<video>"] * len(rows))
    pq.write_table(
        pa.table({"v": pa.array(rows, pa.list_(IMAGE_TYPE)), "t": texts}), tmp_path / "a.parquet"
    )
    pq.write_table(
        pa.table({"v": pa.array([[], None], pa.list_(IMAGE_TYPE)), "t": texts[:2]}),
        tmp_path / "b.parquet",
    )
    source = Source(
        name="qa", path=str(tmp_path / "*.parquet"), weight=1, text_column="t", video_column="v"
    )
    found = list(first_videos(source, open_source(source, "sources[0]")))
    assert found == [
        FirstVideo(str(tmp_path / "a.parquet"), f"row {ROWS_PER_READ + 2}", b"clip"),
        FirstVideo(str(tmp_path / "b.parquet")),
    ]


# Errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("column", ["no_such_column", "id"])
def test_a_bad_image_column_is_one_sentence_naming_source_and_key(root: Path, column: str) -> None:
    source = Source(
        name="captions-bad",
        path=str(root / PARQUET_SOURCE / "*.parquet"),
        weight=1.0,
        text_column="text",
        image_column=column,
    )
    with pytest.raises(SourceError) as caught:
        open_source(source, "sources[2]")
    message = str(caught.value)
    assert "'captions-bad'" in message and "sources[2].image_column" in message
    assert f"'{column}'" in message
    assert "\n" not in message
    if column == "id":
        assert "int64" in message


def test_a_webdataset_glob_that_matches_nothing_is_a_source_error(root: Path) -> None:
    source = _wds(root, path=str(root / "nowhere" / "*.tar"), name="lost")
    with pytest.raises(SourceError, match=r"source 'lost' \(sources\[0\]\.path\): no file matches"):
        open_source(source, "sources[0]")


def test_a_truncated_tar_keeps_its_complete_samples_and_says_why(
    root: Path, tmp_path: Path
) -> None:
    whole = sorted((root / WDS_SOURCE).glob("*.tar"))[0]
    data = whole.read_bytes()
    cut = tmp_path / "cut" / "shard-00000.tar"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) // 2])
    truth = _tar_rows(whole)
    src, reader = _opened(_wds(root, path=str(cut), name="cut"))
    assert 0 < src.num_rows < len(truth)
    assert src.problems and all(p.startswith(str(cut)) for p in src.problems)
    rows = _as_pairs(reader.read(src.row_groups[0]))
    assert rows == [(text, images) for _, text, images, _ in truth[: src.num_rows]]
    assert all(len(images) == 1 for _, images in rows)


# The wire -------------------------------------------------------------------------------------


def _image_payload(**changes: object) -> tuple[Payload, list[bytes]]:
    fields: dict[str, object] = {
        "step": 4,
        "source": (1, 1, 2),
        "gpos": (7, 8, 9),
        "lengths": (3, 2, 4),
        "images": (2, 0, 1),
        "grids": (1, 4, 4, 1, 2, 6, 1, 8, 4),
        "patch_values": PATCH_VALUES,
    }
    fields.update(changes)
    payload = Payload(**fields)  # type: ignore[arg-type]
    tokens = np.arange(9, dtype=np.int32).tobytes()
    pixels = (np.arange((16 + 12 + 32) * PATCH_VALUES) % 251).astype(np.uint8).tobytes()
    return payload, [tokens, pixels]


def test_a_payload_with_images_round_trips() -> None:
    payload, buffers = _image_payload()
    msg, views = decode(encode(payload, buffers))
    assert msg == payload
    assert [bytes(v) for v in views] == buffers


def test_a_payload_with_a_wrong_size_image_buffer_is_refused() -> None:
    payload, (tokens, pixels) = _image_payload()
    with pytest.raises(ProtocolError, match="images take"):
        decode(encode(payload, [tokens, pixels[:-1]]))
    with pytest.raises(ProtocolError, match="buffers, expected 2"):
        decode(encode(payload, [tokens]))


@pytest.mark.parametrize(
    "changes",
    [
        {"images": (2, 0, 2)},  # one grid short
        {"images": (2, 1)},  # one count short
        {"grids": (1, 4, 4, 1, 2, 6)},
        {"images": (), "grids": (1, 4, 4)},  # grids without images
        {"grids": (1, 4, 4, 1, 0, 6, 1, 8, 4)},
        {"patch_values": 0},
    ],
)
def test_a_payload_whose_grids_do_not_match_its_images_is_refused(
    changes: dict[str, object],
) -> None:
    payload, buffers = _image_payload(**changes)
    if not payload.images:
        buffers = buffers[:1]
    with pytest.raises(ProtocolError):
        decode(encode(payload, buffers))


def test_a_meta_with_images_round_trips_and_a_mismatch_is_refused() -> None:
    meta = Meta(
        source=2,
        gpos_start=10,
        lengths=(40, 9),
        sample_ids=(3, 4),
        images=(2, 1),
        patches=(16, 8, 4),
    )
    msg, _ = decode(encode(meta))
    assert msg == meta
    for images, patches in [
        ((2, 1), (16, 8)),
        ((2,), (16, 8, 4)),
        ((2, 1), (16, 0, 4)),
        ((), (16,)),
    ]:
        bad = Meta(
            source=2,
            gpos_start=10,
            lengths=(40, 9),
            sample_ids=(3, 4),
            images=images,
            patches=patches,
        )
        with pytest.raises(ProtocolError):
            decode(encode(bad))


def _write_tar(path: Path, members: list[tuple[str, bytes]]) -> list[int]:
    """Write the members; the byte offset at which each member's header starts."""
    starts = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            starts.append(tar.offset)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return starts


def test_a_tar_cut_between_the_members_of_one_sample_drops_that_sample(tmp_path: Path) -> None:
    members = []
    for k in range(3):
        members += [(f"{k:06d}.txt", f"caption {k}".encode()), (f"{k:06d}.png", b"png" * 300)]
    whole = tmp_path / "whole.tar"
    starts = _write_tar(whole, members)
    cut = tmp_path / "cut" / "shard.tar"
    cut.parent.mkdir()
    cut.write_bytes(whole.read_bytes()[: starts[5]])  # after sample 2's text, before its image
    src, reader = _opened(_wds(tmp_path, path=str(cut), name="cut"))
    assert src.problems  # the cut is seen ...
    rows = _as_pairs(reader.read(src.row_groups[0]))
    assert all(images for _, images in rows)  # ... but is every sample kept whole?
    assert src.num_rows == 2


def test_fusing_the_interleaved_source_keeps_or_counts_every_image(root: Path) -> None:
    src, reader = _opened(_parquet(root, INTERLEAVED_SOURCE, "images"))
    geometry = ImageGeometry(max_pixels=64 * 28 * 28)
    spec = FuseSpec(geometry, image_token_id=IMG, marker=IMAGE_MARKER, seq_len=256)
    fuser = Fuser(text_bytes, spec, require_text=True)
    kept = 0
    for rg in src.row_groups:
        rows = reader.read(rg)
        ids, pixels = fuser(rows)
        for sample, images in zip(ids, pixels, strict=True):
            if images is None:
                assert not np.any(sample == IMG)
                continue
            kept += len(images.grids)
            assert len(sample) <= spec.seq_len
            assert int(np.sum(sample == IMG)) == sum(images.counts) // geometry.merge_size**2
    assert fuser.images_read == sum(
        len(i) for g in src.row_groups for _, i in _as_pairs(reader.read(g))
    )
    assert kept > 0 and fuser.skips[PAST_ROW] > 0
    assert kept + fuser.skips[PAST_ROW] == fuser.images_read
