import numpy as np

from msd.batch.pack import IGNORE_INDEX, Piece, pack_rows


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


def test_images_come_in_row_order_and_placeholders_and_fillers_are_never_predicted() -> None:
    from msd.batch.sample import FILLER, SampleImages

    img = 9000
    a = SampleImages(np.full((8, 6), 1, np.uint8), ((1, 2, 4),))  # 8 patches: 2 tokens
    b = SampleImages(np.full((4, 6), 2, np.uint8), ((1, 2, 2),))  # 4 patches: 1 token
    first = np.array([5, img, img, 6, FILLER, FILLER], dtype=np.int32)
    second = np.array([7, img, 8], dtype=np.int32)
    rows = [
        [Piece(0, 10, second, images=b)],
        [Piece(1, 20, first, images=a), Piece(1, 21, np.array([3, 4], dtype=np.int32))],
    ]
    out = pack_rows(rows, 12, image_token_id=img, patch_values=6)
    assert out["image_sample_ids"].tolist() == [10, 20]  # row 0's image first
    assert out["image_source_ids"].tolist() == [0, 1]
    assert out["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]
    assert out["vision_cu_seqlens"].tolist() == [0, 4, 12]
    assert out["pixel_values"].dtype == np.uint8
    assert out["pixel_values"][:4].max() == 2 and out["pixel_values"][4:].min() == 1
    assert out["input_ids"][1, :6].tolist() == [5, img, img, 6, 0, 0]  # fillers are padding
    assert out["labels"][1, :6].tolist() == [-100, -100, 6, -100, -100, -100]
    assert out["labels"][0, :3].tolist() == [-100, 8, -100]
    assert not np.any(out["labels"] == img)


def test_a_batch_without_images_still_has_the_image_tensors() -> None:
    out = pack_rows([[Piece(0, 1, np.array([1, 2], dtype=np.int32))]], 4, 9, patch_values=588)
    assert out["pixel_values"].shape == (0, 588) and out["image_grid_thw"].shape == (0, 3)
    assert out["vision_cu_seqlens"].tolist() == [0]
