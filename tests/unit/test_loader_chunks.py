import itertools

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from msd.roles.loader.visit import cell_sizes, chunk_end


@given(st.lists(st.integers(0, 100), min_size=1, max_size=50), st.integers(1, 300))
def test_chunks_cover_every_cell_once_and_respect_the_budget(sizes, budget):
    arr = np.array(sizes, dtype=np.int64)
    at, chunks = 0, []
    while at < len(arr):
        end = chunk_end(arr, at, budget)
        assert end > at
        assert end - at == 1 or arr[at:end].sum() <= budget
        chunks.append((at, end))
        at = end
    assert chunks[0][0] == 0 and chunks[-1][1] == len(arr)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))


def test_cell_sizes_of_text_and_token_columns():
    assert cell_sizes(pa.array(["ab", None, "héllo"])).tolist() == [2, 0, 6]
    assert cell_sizes(pa.array([[1, 2, 3], [], None], pa.list_(pa.int32()))).tolist() == [3, 0, 0]
