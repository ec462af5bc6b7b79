"""Videos to Qwen2-VL patches (`msd.sources.video`) on files PyAV encodes here: H.264 in MP4,
VP9 in WebM, GIF, odd sizes and frame rates, a variable frame rate, rotation metadata, and
damaged files; each decode checked against an independent decode, sample and patchify."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image

from msd.sources import vision
from msd.sources.video import (
    DecodedVideo,
    VideoHeader,
    VideoSpec,
    decode,
    decode_pixels,
    patchify_frames,
    plan_video,
    probe,
    put_frame,
    sample_count,
    sample_indices,
)
from msd.sources.vision import DecodeFailure, ImageGeometry
from tests.videos import decode_all, encode, no_frames

# Small frames keep the tests quick; the rule is the processor's whatever the bounds.
SPEC = VideoSpec(min_pixels=28 * 28, max_pixels=56 * 84)


def _hf_patchify(frames: np.ndarray, spec: VideoSpec) -> np.ndarray:
    """Hugging Face's Qwen2VLVideoProcessor.patchify, on [T, h, w, 3] frames: the last frame
    repeated to a multiple of the temporal patch, then its view and permutation."""
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)[None]  # [1, T, C, H, W]
    tps, p, m = spec.temporal_patch_size, spec.patch_size, spec.merge_size
    if pad := -video.shape[1] % tps:
        video = torch.cat((video, video[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
    b, t, c, h, w = video.shape
    patches = video.reshape(b, t // tps, tps, c, h // p // m, m, p, w // p // m, m, p)
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(t // tps * (h // p) * (w // p), c * tps * p * p).numpy()


def _reference(data: bytes, spec: VideoSpec) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Decode every frame, sample with torch as the processor does, resize each frame with
    Pillow's bicubic filter to Qwen2-VL's size, patchify as the processor does."""
    frames = decode_all(data)
    header = probe(data, spec)
    assert isinstance(header, VideoHeader)
    count = sample_count(len(frames), header.fps, spec)
    picked = torch.arange(0, len(frames), len(frames) / count).int().tolist()[:count]
    h, w = vision.fit(*frames[0].shape[:2], spec.frame_geometry(spec.max_pixels))
    resized = np.stack(
        [
            np.asarray(Image.fromarray(frames[i]).resize((w, h), Image.Resampling.BICUBIC))
            for i in picked
        ]
    )
    t = -(-count // spec.temporal_patch_size)
    return _hf_patchify(resized, spec), (t, h // spec.patch_size, w // spec.patch_size)


def test_sample_indices_are_torch_arange_of_the_processor() -> None:
    for total in range(1, 900, 11):
        for count in range(1, min(total, 300) + 1, 7):
            ref = torch.arange(0, total, total / count).int().tolist()[:count]
            assert list(sample_indices(total, count)) == ref, (total, count)


@pytest.mark.parametrize(
    ("frames", "fps", "spec", "expected"),
    [
        (300, 30.0, VideoSpec(), 20),  # 10 s at 2 fps
        (30, 30.0, VideoSpec(), 4),  # 1 s: min_frames
        (3, 30.0, VideoSpec(), 2),  # fewer than min_frames: what the stream has, even
        (1, 30.0, VideoSpec(), 1),  # one frame: repeated to fill the temporal patch
        (100_000, 25.0, VideoSpec(), 768),  # max_frames
        (250, 25.0, VideoSpec(fps=1.0, max_frames=7), 6),  # rounded down to the temporal patch
        (99, 7.0, VideoSpec(fps=3.0), 42),  # 14.1 s at 3 fps = 42.4
    ],
)
def test_frames_per_video_follow_the_processors_rule(
    frames: int, fps: float, spec: VideoSpec, expected: int
) -> None:
    assert sample_count(frames, fps, spec) == expected


def test_total_pixels_caps_each_frame_to_its_share() -> None:
    header = VideoHeader(
        frames=600, fps=30.0, duration_s=20.0, height=720, width=1280, codec="h264"
    )
    free = plan_video(header, VideoSpec(min_pixels=28 * 28))
    capped = plan_video(header, VideoSpec(min_pixels=28 * 28, total_pixels=40 * 28 * 28 * 20))
    assert free.grid[0] == capped.grid[0] == 20  # 40 frames
    assert capped.size[0] * capped.size[1] <= 40 * 28 * 28 * 20 * 2 // 40
    assert capped.patches < free.patches
    # Never under 1.05 × min_pixels a frame, whatever the share.
    spec = VideoSpec(min_pixels=100 * 28 * 28, total_pixels=28 * 28)
    floor = plan_video(header, spec)
    assert floor.size == vision.fit(720, 1280, spec.frame_geometry(int(100 * 28 * 28 * 1.05)))


def test_two_equal_frames_patch_as_a_still_image_with_temporal_patch_two() -> None:
    rng = np.random.default_rng(3)
    still = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
    spec = VideoSpec()
    video = patchify_frames(np.stack([still, still]), spec)
    image = vision.patchify(still, ImageGeometry(temporal_patch_size=2))
    np.testing.assert_array_equal(video, image)


def test_patch_order_is_the_processors() -> None:
    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (6, 56, 112, 3), dtype=np.uint8)
    np.testing.assert_array_equal(patchify_frames(frames, SPEC), _hf_patchify(frames, SPEC))


@pytest.mark.parametrize(
    ("kind", "frames", "height", "width", "fps"),
    [
        ("mp4", 50, 64, 96, 24),
        ("mp4", 31, 62, 98, Fraction(30000, 1001)),  # NTSC rate
        ("webm", 9, 61, 99, 12),  # odd sides (H.264 in 4:2:0 needs even ones)
        ("mp4", 12, 48, 64, 7),  # odd rate
        ("webm", 40, 72, 128, 25),
        ("gif", 17, 50, 70, 10),
    ],
)
def test_a_decoded_video_equals_an_independent_decode_sample_and_patchify(
    kind: str, frames: int, height: int, width: int, fps: Fraction | int
) -> None:
    data = encode(kind, frames, height, width, fps)
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader), header
    assert (header.frames, header.height, header.width) == (frames, height, width)
    plan = plan_video(header, SPEC)
    video = decode(data, SPEC)
    assert isinstance(video, DecodedVideo), video
    patches, grid = _reference(data, SPEC)
    assert video.grid == grid == plan.grid  # the plan, from the header alone, holds
    assert video.tokens == plan.patches // SPEC.merge_size**2
    assert video.patches.dtype == np.uint8
    assert video.patches.shape == (plan.patches, SPEC.patch_values)
    np.testing.assert_array_equal(video.patches, patches)
    again = decode(data, SPEC)
    assert isinstance(again, DecodedVideo)
    np.testing.assert_array_equal(again.patches, video.patches)


def test_a_variable_frame_rate_samples_decoded_frames_by_their_order() -> None:
    pts = [0, 1, 2, 5, 6, 10, 11, 12, 20, 21, 22, 23, 30, 31, 40, 41]
    data = encode("mp4", len(pts), 48, 64, 10, pts=pts)
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader)
    assert header.frames == len(pts)
    video = decode(data, SPEC)
    assert isinstance(video, DecodedVideo), video
    patches, grid = _reference(data, SPEC)
    assert video.grid == grid
    np.testing.assert_array_equal(video.patches, patches)


def test_rotation_metadata_is_not_applied_as_in_the_processors_reader() -> None:
    data = encode("mp4", 8, 48, 96, 24, rotation=90)
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader)
    assert (header.height, header.width) == (48, 96)
    video = decode(data, SPEC)
    assert isinstance(video, DecodedVideo), video
    patches, grid = _reference(data, SPEC)
    assert video.grid == grid and grid[1] < grid[2]  # still wider than high
    np.testing.assert_array_equal(video.patches, patches)


def test_a_short_video_repeats_its_last_frame_to_fill_the_temporal_patch() -> None:
    data = encode("mp4", 3, 48, 64, 24)
    video = decode(data, SPEC)
    assert isinstance(video, DecodedVideo), video
    assert video.frames == 2 and video.grid[0] == 1
    one = decode(encode("mp4", 1, 48, 64, 24), SPEC)
    assert isinstance(one, DecodedVideo), one
    assert one.frames == 1 and one.grid[0] == 1
    half = SPEC.patch_values // 2 // 3  # values of one frame in one channel of a patch
    values = one.patches.reshape(len(one.patches), 3, 2, half)
    np.testing.assert_array_equal(values[:, :, 0], values[:, :, 1])


def _damaged() -> dict[str, bytes]:
    good = encode("mp4", 40, 64, 96, 24)
    return {
        "empty": b"",
        "garbage": bytes(np.random.default_rng(5).integers(0, 256, 4096, dtype=np.uint8)),
        "cut in the header": good[: len(good) // 20],
        "cut mid-stream": good[: len(good) // 2],
        "no frames": no_frames(),
        "an image": _png(),
    }


def _png() -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("name", list(_damaged()))
def test_damage_is_a_reason_never_an_exception_and_the_same_each_time(name: str) -> None:
    data = _damaged()[name]
    first, second = decode(data, SPEC), decode(data, SPEC)
    if name == "an image":  # FFmpeg opens a PNG as a one-frame video: usable, not damage
        assert isinstance(first, DecodedVideo) and isinstance(second, DecodedVideo)
        return
    assert isinstance(first, DecodeFailure), (name, first)
    assert isinstance(second, DecodeFailure) and second.reason == first.reason
    assert first.reason


def test_absurd_declared_sizes_and_durations_are_refused_before_decoding() -> None:
    data = encode("mp4", 24, 64, 96, 24)
    assert probe(data, VideoSpec(max_frame_pixels=64 * 95)) == DecodeFailure("too many pixels")
    assert probe(data, VideoSpec(max_duration_s=0.5)) == DecodeFailure("too long")
    assert probe(data, VideoSpec(max_stream_frames=10)) == DecodeFailure("too many frames")


def test_a_decode_that_would_pass_through_too_many_pixels_is_refused_from_its_header() -> None:
    data = encode("mp4", 24, 64, 96, 24)  # 1 s: 4 frames sampled, the last is frame 18
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader)
    assert decode_pixels(header, SPEC) == 19 * 64 * 96
    tight = VideoSpec(min_pixels=28 * 28, max_pixels=56 * 84, max_decode_pixels=19 * 64 * 96 - 1)
    for _ in range(2):
        assert probe(data, tight) == DecodeFailure("too costly to decode")
        assert decode(data, tight) == DecodeFailure("too costly to decode")
    enough = VideoSpec(min_pixels=28 * 28, max_pixels=56 * 84, max_decode_pixels=19 * 64 * 96)
    assert isinstance(decode(data, enough), DecodedVideo)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fps": 0.0},
        {"min_frames": 0},
        {"min_frames": 9, "max_frames": 8},
        {"threads": -1},
        {"max_decode_pixels": 0},
        {"min_pixels": 10},
        {"min_pixels": 4000, "max_pixels": 3000},
    ],
)
def test_a_spec_out_of_bounds_is_refused_in_one_sentence(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"^\w+.*(must|needs)"):
        VideoSpec(**kwargs)  # type: ignore[arg-type]


def _hugging_face(data: bytes, spec: VideoSpec) -> tuple[np.ndarray, tuple[int, int, int]]:
    """What transformers' Qwen2VLVideoProcessor gives for the same decoded frames, before its
    rescale and normalise: its frame indices, its ``smart_resize`` size, its resize (torchvision's
    ``resize`` on uint8 tensors, which on CPU is torch's antialiased bicubic ``interpolate`` on
    the uint8 frames) and its patchify. torchvision itself is not importable beside this CPU
    torch, so its one call is made here directly."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    frames = np.stack(decode_all(data))
    header = probe(data, spec)
    assert isinstance(header, VideoHeader)
    count = sample_count(len(frames), header.fps, spec)
    picked = torch.arange(0, len(frames), len(frames) / count).int()[:count]
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)[picked].contiguous()
    factor = spec.patch_size * spec.merge_size
    h, w = smart_resize(
        *video.shape[-2:], factor=factor, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels
    )
    resized = torch.nn.functional.interpolate(
        video, size=[h, w], mode="bicubic", align_corners=False, antialias=True
    )
    assert resized.dtype == torch.uint8
    t = -(-count // spec.temporal_patch_size)
    patches = _hf_patchify(resized.permute(0, 2, 3, 1).numpy(), spec)
    return patches, (t, h // spec.patch_size, w // spec.patch_size)


# Pillow's bicubic resize (msd's) and torch's (the processor's) round a few values differently;
# the frames and grid are the same. Measured on these files: 0.1-2.2% of values differ, almost
# all by one level (mean |difference| at most 0.022 levels); where an odd-sized frame is scaled
# up, a few edge values differ by up to 6 levels (0.02% of values by more than one).
HF_MAX_MEAN, HF_MAX_DIFFERENT, HF_MAX_OVER_ONE = 0.05, 0.03, 0.001


@pytest.mark.parametrize(
    ("kind", "frames", "height", "width", "fps"),
    [
        ("mp4", 24, 360, 640, 24),  # a 360p clip, downscaled
        ("mp4", 12, 48, 64, 7),  # upscaled to min_pixels
        ("webm", 40, 72, 128, 25),
        ("webm", 9, 61, 99, 12),
        ("gif", 17, 50, 70, 10),
    ],
)
def test_pixels_match_hugging_faces_video_processor_within_the_stated_tolerance(
    kind: str, frames: int, height: int, width: int, fps: int
) -> None:
    spec = VideoSpec(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    data = encode(kind, frames, height, width, fps)
    video = decode(data, spec)
    assert isinstance(video, DecodedVideo), video
    reference, grid = _hugging_face(data, spec)
    assert video.grid == grid
    assert video.patches.shape == reference.shape
    difference = np.abs(video.patches.astype(np.int16) - reference.astype(np.int16))
    assert float(difference.mean()) < HF_MAX_MEAN
    assert np.count_nonzero(difference) / difference.size < HF_MAX_DIFFERENT
    assert np.count_nonzero(difference > 1) / difference.size < HF_MAX_OVER_ONE


def test_frames_put_one_by_one_make_the_patches_patchify_makes() -> None:
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (6, 56, 84, 3), dtype=np.uint8)
    grid = (3, 56 // SPEC.patch_size, 84 // SPEC.patch_size)
    patches = np.zeros((grid[0] * grid[1] * grid[2], SPEC.patch_values), dtype=np.uint8)
    for slot in rng.permutation(len(frames)).tolist():  # in any order
        put_frame(patches, grid, slot, frames[slot], SPEC)
    np.testing.assert_array_equal(patches, patchify_frames(frames, SPEC))
