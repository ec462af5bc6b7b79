"""A loader's payload for a routed step (`msd.roles.loader.payload`): images held as bytes and
decoded images and videos side by side make one payload the wire accepts, every item flagged."""

from __future__ import annotations

import numpy as np

from msd.batch.sample import EncodedImages, SampleImages
from msd.roles.loader.payload import image_fields, patches_of
from msd.wire.protocol import Payload, decode, encode

WIDTH = 3 * 14 * 14  # an image patch's values
VIDEO_ROWS = 2  # a video patch holds two frames: two rows of WIDTH


def _video(frames: int, h: int, w: int, fill: int) -> SampleImages:
    patches = np.full((frames * h * w * VIDEO_ROWS, WIDTH), fill, dtype=np.uint8)
    return SampleImages(patches, ((frames, h, w),), (True,), VIDEO_ROWS)


def _image(h: int, w: int, fill: int) -> SampleImages:
    return SampleImages(np.full((h * w, WIDTH), fill, dtype=np.uint8), ((1, h, w),))


def test_images_held_as_bytes_beside_videos_make_a_payload_the_wire_accepts() -> None:
    encoded = EncodedImages((b"jpeg-a", b"jpeg-b"), ((1, 2, 4), (1, 4, 4)))
    held = [encoded, None, _video(2, 2, 2, 7), _image(2, 2, 9)]
    fields = image_fields(held, WIDTH)
    assert fields["images"] == (2, 0, 1, 1)
    assert fields["videos"] == (0, 0, 1, 0)  # one flag an item, images held as bytes too
    assert fields["video_rows"] == VIDEO_ROWS

    written: list[int] = []

    def write(i: int, rows: np.ndarray) -> None:  # as a shard decodes into its rows
        written.append(i)
        rows[:] = i + 1

    items = [p for p in held if p is not None]
    patches = patches_of(items, WIDTH, write)
    assert written == [0, 1, 2]
    rows = [8 + 16, 2 * 2 * 2 * VIDEO_ROWS, 4]
    assert patches.shape == (sum(rows), WIDTH)
    bounds = np.cumsum([0, *rows])
    for i in range(3):
        assert np.all(patches[bounds[i] : bounds[i + 1]] == i + 1)

    tokens = np.zeros(40, dtype=np.uint8)
    payload = Payload(
        step=3,
        source=(0, 0, 1, 2),
        gpos=(0, 1, 0, 0),
        lengths=(10, 10, 10, 10),
        token_dtype="uint8",
        **fields,
    )
    back, buffers = decode(encode(payload, [tokens, patches]))  # checked as a Constructor does
    assert isinstance(back, Payload) and back.videos == fields["videos"]
    assert buffers[1].nbytes == patches.nbytes


def test_samples_without_images_add_no_fields_and_one_decoded_sample_is_not_copied() -> None:
    assert image_fields([None, None], WIDTH) == {}
    video = _video(2, 2, 2, 5)
    out = patches_of([video], WIDTH, lambda i, rows: None)
    assert np.shares_memory(out, video.patches)
