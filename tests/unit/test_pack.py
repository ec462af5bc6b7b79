import numpy as np

from msd.pack import IGNORE_INDEX, Piece, pack_rows


def test_packed_rows_keep_samples_apart():
    a = Piece(0, 10, np.array([1, 2, 3], dtype=np.int32))
    b = Piece(1, 11, np.array([4, 5], dtype=np.int32))
    c = Piece(0, 12, np.array([6, 7, 8, 9], dtype=np.int32))
    out = pack_rows([[a, b], [c]], seq_len=6)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert out["labels"].tolist() == [[2, 3, -100, 5, -100, -100], [7, 8, 9, -100, -100, -100]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert out["cu_seqlens"].tolist() == [0, 3, 5, 6, 10, 12]
    assert out["sample_ids"].tolist() == [10, 11, 12]
    assert out["source_ids"].tolist() == [0, 1, 0]
    assert IGNORE_INDEX == -100


def test_a_full_row_has_no_padding_segment():
    out = pack_rows([[Piece(0, 1, np.arange(4, dtype=np.int32))]], seq_len=4)
    assert out["cu_seqlens"].tolist() == [0, 4]
