"""Megatron indexed datasets: files written by megatron-core's own builder read back exactly.

Every document read through `FORMAT` is compared with what was written and with
megatron-core's `IndexedDataset`; damaged files each give one `SourceError` sentence naming
the file.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from msd.errors import SourceError
from msd.recipe.schema import Source
from msd.sources.formats import megatron
from msd.sources.formats.megatron import FORMAT
from msd.sources.transforms import token_lists

mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
torch = pytest.importorskip("torch")

KEY = "sources[0]"
Docs = list[list[list[int]]]  # documents of sequences of token ids


def _source(path: str | Path) -> Source:
    return Source(name="web", path=str(path), weight=1.0, token_column="tokens")


def _build(prefix: Path, docs: Docs, dtype: type = np.int32) -> Path:
    """Write ``docs`` with megatron-core's builder: one-sequence documents through
    ``add_document``, several-sequence ones through ``add_item`` + ``end_document``."""
    builder = mcore.IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype)
    for doc in docs:
        if len(doc) == 1:
            builder.add_document(np.asarray(doc[0], dtype=np.int64), [len(doc[0])])
        else:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
    builder.finalize(str(prefix) + ".idx")
    return Path(str(prefix) + ".idx")


def _random_docs(rng: np.random.Generator, count: int, high: int, max_len: int = 300) -> Docs:
    docs: Docs = []
    for _ in range(count):
        seqs = int(rng.integers(1, 4))
        docs.append(
            [rng.integers(0, high, int(rng.integers(0, max_len))).tolist() for _ in range(seqs)]
        )
    return docs


def _read_all(idx: Path) -> tuple[list[list[int]], tuple[int, ...], list[pa.Array]]:
    index = FORMAT.index(_source(idx), KEY, str(idx), "ignored", "tokens")
    reader = FORMAT.open(str(idx))
    try:
        arrays = [reader.read(g, "ignored") for g in range(len(index.group_rows))]
    finally:
        reader.close()
    rows = [row for a in arrays for row in a.to_pylist()]
    return rows, index.group_rows, arrays


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_every_document_reads_back_as_written_and_as_megatron_reads_it(tmp_path, dtype):
    rng = np.random.default_rng(7)
    docs = _random_docs(rng, 120, 65_000 if dtype is np.uint16 else 2**31 - 1)
    docs[3] = [[]]  # an empty document
    docs[4] = [[1, 2], [], [3]]  # an empty sequence inside one
    idx = _build(tmp_path / "data", docs, dtype)

    rows, group_rows, arrays = _read_all(idx)

    expected = [[t for seq in doc for t in seq] for doc in docs]
    assert rows == expected
    dataset = mcore.IndexedDataset(str(tmp_path / "data"))
    assert len(dataset.document_indices) - 1 == len(rows) == sum(group_rows)
    for d, row in enumerate(rows):
        lo, hi = dataset.document_indices[d], dataset.document_indices[d + 1]
        theirs = [int(t) for s in range(lo, hi) for t in dataset[s]]
        assert row == theirs
    assert {a.type for a in arrays} == {pa.large_list(pa.from_numpy_dtype(dtype))}
    ids = [x for a in arrays for x in token_lists(a)]  # what a loader makes of them
    assert [x.tolist() for x in ids] == expected


def test_a_contiguous_group_is_a_view_of_the_bin_map(tmp_path):
    idx = _build(tmp_path / "d", [[[1, 2, 3], [4]], [[5, 6]]], np.int32)
    reader = FORMAT.open(str(idx))
    array = reader.read(0, "tokens")
    values = array.values.buffers()[1]
    tokens = reader._tokens
    assert values.address == tokens.ctypes.data  # no copy: the map's own bytes
    reader.close()
    assert array.to_pylist() == [[1, 2, 3, 4], [5, 6]]  # still readable after close


def test_groups_respect_the_token_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(megatron, "GROUP_TOKENS", 100)
    monkeypatch.setattr(megatron, "CHUNK", 7)  # many chunks: the streaming paths
    rng = np.random.default_rng(3)
    docs = _random_docs(rng, 90, 1000, max_len=70)
    docs[10] = [list(range(250))]  # longer than the bound: a group alone
    idx = _build(tmp_path / "d", docs, np.uint16)

    rows, group_rows, arrays = _read_all(idx)

    assert rows == [[t for seq in doc for t in seq] for doc in docs]
    assert len(group_rows) > 5 and min(group_rows) >= 1
    sizes = [len(a.values) for a in arrays]
    for size, array in zip(sizes, arrays, strict=True):
        assert size <= 100 or len(array) == 1
    assert 250 in sizes
    # Greedy: a group and the next document would have overflowed the bound.
    lengths = [len(r) for r in rows]
    starts = np.cumsum((0, *group_rows))
    for g in range(len(group_rows) - 1):
        assert sizes[g] + lengths[starts[g + 1]] > 100


def test_groups_are_the_same_however_the_index_is_chunked(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    docs = _random_docs(rng, 200, 1000, max_len=40)
    docs[0] = [[]]
    docs[1] = [[]]
    idx = _build(tmp_path / "d", docs, np.int32)
    monkeypatch.setattr(megatron, "GROUP_TOKENS", 64)
    reference = FORMAT.index(_source(idx), KEY, str(idx), "t", "tokens").group_rows
    for chunk in (1, 2, 3, 50):
        monkeypatch.setattr(megatron, "CHUNK", chunk)
        assert FORMAT.index(_source(idx), KEY, str(idx), "t", "tokens").group_rows == reference


def test_scattered_pointers_are_gathered_in_document_order(tmp_path):
    # Megatron's builder writes sequences back to back; a valid index may point anywhere.
    data = np.arange(100, 120, dtype="<i4")
    (tmp_path / "s.bin").write_bytes(data.tobytes())
    sizes = np.array([3, 2, 4], dtype="<i4")
    pointers = np.array([40, 0, 20], dtype="<i8")  # tokens 110.., 100.., 105..
    doc_idx = np.array([0, 2, 3], dtype="<i8")
    header = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, 4, 3, 3)
    body = header + sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes()
    (tmp_path / "s.idx").write_bytes(body)

    rows, group_rows, _ = _read_all(tmp_path / "s.idx")

    assert rows == [[110, 111, 112, 100, 101], [105, 106, 107, 108]]
    assert group_rows == (2,)
    dataset = mcore.IndexedDataset(str(tmp_path / "s"))
    assert [int(t) for s in (0, 1) for t in dataset[s]] == rows[0]


def test_prefix_idx_glob_and_bin_glob_name_the_same_files(tmp_path):
    for name in ("b", "a"):
        _build(tmp_path / name, [[[1, 2]]], np.uint16)
    expected = (str(tmp_path / "a.idx"), str(tmp_path / "b.idx"))
    assert FORMAT.files(_source(tmp_path / "*.idx"), KEY) == expected
    assert FORMAT.files(_source(tmp_path / "*.bin"), KEY) == expected
    assert FORMAT.files(_source(tmp_path / "*"), KEY) == expected  # a glob of prefixes
    assert FORMAT.files(_source(tmp_path / "a"), KEY) == expected[:1]  # a data_path prefix


def test_a_path_that_matches_nothing_is_refused(tmp_path):
    with pytest.raises(SourceError, match=r"^source 'web' \(sources\[0\]\.path\): no Megatron"):
        FORMAT.files(_source(tmp_path / "nothing"), KEY)


def test_an_idx_without_its_bin_is_refused_naming_the_missing_file(tmp_path):
    idx = _build(tmp_path / "d", [[[1]]])
    os.remove(tmp_path / "d.bin")
    with pytest.raises(SourceError) as info:
        FORMAT.files(_source(idx), KEY)
    _one_sentence(info.value, str(tmp_path / "d.bin"))
    assert "sources[0].path" in str(info.value)


def test_a_bin_without_its_idx_is_refused_naming_the_missing_file(tmp_path):
    _build(tmp_path / "d", [[[1]]])
    os.remove(tmp_path / "d.idx")
    with pytest.raises(SourceError) as info:
        FORMAT.files(_source(tmp_path / "d.bin"), KEY)
    _one_sentence(info.value, str(tmp_path / "d.idx"))


def test_text_kind_is_refused(tmp_path):
    idx = _build(tmp_path / "d", [[[1]]])
    with pytest.raises(SourceError, match=r"sources\[0\]\.text_column.*already tokenized"):
        FORMAT.index(_source(idx), KEY, str(idx), "text", "text")


def test_a_dataset_of_empty_documents_holds_no_text(tmp_path):
    idx = _build(tmp_path / "d", [[[]], [[], []]])
    index = FORMAT.index(_source(idx), KEY, str(idx), "t", "tokens")
    assert index.group_rows == (2,) and index.holds_text is False
    full = _build(tmp_path / "f", [[[]], [[7]]])
    assert FORMAT.index(_source(full), KEY, str(full), "t", "tokens").holds_text is True
    reader = FORMAT.open(str(idx))
    assert reader.read(0, "t").to_pylist() == [[], []]
    reader.close()


def _damage(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _layout(idx: Path) -> tuple[int, int]:
    seqs, docs = struct.unpack_from("<QQ", idx.read_bytes(), 18)
    return seqs, docs


def _wrong_magic(idx: Path) -> None:
    _damage(idx, 0, b"NOTANIDX!")


def _truncated_idx(idx: Path) -> None:
    idx.write_bytes(idx.read_bytes()[:-5])


def _short_idx(idx: Path) -> None:
    idx.write_bytes(idx.read_bytes()[:20])


def _pointer_past_bin(idx: Path) -> None:
    seqs, _ = _layout(idx)
    _damage(idx, 34 + 4 * seqs + 8 * (seqs - 1), struct.pack("<q", 1 << 40))


def _misaligned_pointer(idx: Path) -> None:
    seqs, _ = _layout(idx)
    _damage(idx, 34 + 4 * seqs + 8, struct.pack("<q", 2))


def _negative_size(idx: Path) -> None:
    _damage(idx, 34, struct.pack("<i", -3))


def _non_monotonic_documents(idx: Path) -> None:
    seqs, _ = _layout(idx)
    _damage(idx, 34 + 12 * seqs + 8 * 2, struct.pack("<q", 0))


def _float_dtype(idx: Path) -> None:
    _damage(idx, 17, bytes([7]))


def _unknown_dtype(idx: Path) -> None:
    _damage(idx, 17, bytes([42]))


def _wrong_version(idx: Path) -> None:
    _damage(idx, 9, struct.pack("<Q", 2))


def _truncated_bin(idx: Path) -> None:
    bin_path = idx.with_suffix(".bin")
    bin_path.write_bytes(bin_path.read_bytes()[:-8])


def _odd_bin(idx: Path) -> None:
    bin_path = idx.with_suffix(".bin")
    bin_path.write_bytes(bin_path.read_bytes() + b"\x00")


def _huge_counts(idx: Path) -> None:
    _damage(idx, 18, struct.pack("<Q", 2**63))


def _multimodal(idx: Path) -> None:
    seqs, _ = _layout(idx)
    idx.write_bytes(idx.read_bytes() + bytes([1] * seqs))


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_wrong_magic, "magic"),
        (_truncated_idx, "truncated"),
        (_short_idx, "header"),
        (_pointer_past_bin, "sequence 5"),
        (_misaligned_pointer, "aligned"),
        (_negative_size, "negative size"),
        (_non_monotonic_documents, "must not decrease"),
        (_float_dtype, "float32"),
        (_unknown_dtype, "unknown dtype code 42"),
        (_wrong_version, "version 2"),
        (_truncated_bin, "aligned"),
        (_odd_bin, "not a multiple of 4"),
        (_huge_counts, "truncated"),
        (_multimodal, "multimodal"),
    ],
)
def test_a_damaged_dataset_is_one_sentence_naming_the_file(tmp_path, damage, says):
    idx = _build(tmp_path / "d", [[[1, 2, 3]], [[4, 5], [6]], [[7], [8, 9]], [[10]]])
    FORMAT.index(_source(idx), KEY, str(idx), "t", "tokens")  # sound before the damage
    damage(idx)
    with pytest.raises(SourceError) as info:
        FORMAT.index(_source(idx), KEY, str(idx), "t", "tokens")
    _one_sentence(info.value, str(idx))
    assert says in str(info.value)
    assert str(info.value).startswith("source 'web' (sources[0].path): ")
    with pytest.raises(SourceError) as opened:  # a loader opening it is refused too
        FORMAT.open(str(idx))
    _one_sentence(opened.value, str(idx))


def test_a_bin_that_changed_size_after_opening_is_refused(tmp_path):
    idx = _build(tmp_path / "d", [[[1, 2, 3]], [[4]]])
    reader = FORMAT.open(str(idx))
    assert reader.read(0, "t").to_pylist() == [[1, 2, 3], [4]]
    with open(tmp_path / "d.bin", "ab") as f:
        f.write(b"\x00" * 4)
    with pytest.raises(SourceError) as info:
        reader.read(0, "t")
    _one_sentence(info.value, str(tmp_path / "d.bin"))
    assert "changed" in str(info.value)
    reader.close()


def test_a_group_past_the_index_is_refused(tmp_path):
    idx = _build(tmp_path / "d", [[[1]]])
    reader = FORMAT.open(str(idx))
    with pytest.raises(SourceError, match="1 row groups, not a group 1"):
        reader.read(1, "t")
    reader.close()


def _one_sentence(exc: BaseException, path: str) -> None:
    text = str(exc)
    assert path in text
    assert "\n" not in text
    assert ". " not in text.replace(path, "PATH"), text
