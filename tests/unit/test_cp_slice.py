import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.batch.cp_slice import cp_slice, unzigzag
from msd.batch.pack import Piece, pack_rows


@given(st.integers(1, 4), st.lists(st.integers(1, 30), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_cp_slices_reassemble_the_packed_batch(cp, lengths):
    m = 2 * cp
    seq_len = m * 32
    row, rows, used = [], [], 0
    for n, length in enumerate(lengths):
        padded = -(-length // m) * m
        if used + padded > seq_len:
            rows.append(row)
            row, used = [], 0
        row.append(Piece(0, n, np.arange(1, length + 1, dtype=np.int32) + 100 * n, padded))
        used += padded
    rows.append(row)
    full = pack_rows(rows, seq_len)
    parts = [cp_slice(full, cp, i) for i in range(cp)]
    for name in ("input_ids", "labels", "position_ids"):
        got = unzigzag([p[name].reshape(-1) for p in parts], full["cu_seqlens"], cp)
        assert np.array_equal(got, full[name].reshape(-1))
        assert all(p[name].shape == (len(rows), seq_len // cp) for p in parts)
    assert all(np.array_equal(p["cu_seqlens"] * cp, full["cu_seqlens"]) for p in parts)


def test_each_cp_rank_gets_chunks_i_and_mirror():
    full = pack_rows([[Piece(0, 0, np.arange(8, dtype=np.int32), 8)]], seq_len=8)
    left, right = cp_slice(full, 2, 0), cp_slice(full, 2, 1)
    assert left["input_ids"].tolist() == [[0, 1, 6, 7]]
    assert right["input_ids"].tolist() == [[2, 3, 4, 5]]
    assert left["position_ids"].tolist() == [[0, 1, 6, 7]]
    assert left["cu_seqlens"].tolist() == [0, 4]
