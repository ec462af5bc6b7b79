"""The hybrid cost: encoder per image (quadratic in its patches) plus backbone over the fused
length; ``backbone`` leaves the encoder out."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msd.plan.cost import CostModel
from msd.plan.hybrid_cost import HybridCost


def test_an_image_costs_its_patches_squared_and_a_text_sample_nothing_in_the_encoder():
    model = HybridCost(CostModel(attn=1.0, lin=0.0), enc_attn=2.0, enc_lin=3.0)
    costs = model.costs(np.array([10, 4]), np.array([5, 1]), np.array([0, 0]))
    # sample 0: backbone 100, images 2·25+3·5 and 2·1+3·1; sample 1: text only
    assert costs.tolist() == [100 + 65 + 5, 16]
    assert model.costs(
        np.array([10, 4]), np.array([5, 1]), np.array([0, 0]), "backbone"
    ).tolist() == [
        100,
        16,
    ]


def test_attention_is_per_image_so_one_large_image_costs_more_than_two_halves():
    model = HybridCost(enc_attn=1.0, enc_lin=0.0)
    one = model.encoder(np.array([100]), np.array([0]), 1)
    two = model.encoder(np.array([50, 50]), np.array([0, 0]), 1)
    assert one[0] == 2 * two[0]


def test_a_videos_patches_attend_within_each_temporal_patch():
    model = HybridCost(enc_attn=1.0, enc_lin=2.0)
    # 4 temporal patches of 10 × 10: 4 · 100² pair costs, not 400², and 2 · 400 linear
    video = model.encoder(np.array([400]), np.array([0]), 1, frames=np.array([4]))
    assert video.tolist() == [4 * 100**2 + 2 * 400]
    image = model.encoder(np.array([400]), np.array([0]), 1)
    assert image.tolist() == [400**2 + 2 * 400]
    assert model.images(np.array([400, 100]), np.array([4, 1])) == video[0] + 100**2 + 200


@given(
    st.lists(st.integers(0, 4096), min_size=1, max_size=30),
    st.lists(st.tuples(st.integers(1, 2000), st.integers(0, 29)), max_size=40),
)
def test_the_sum_is_the_backbone_plus_a_nonnegative_encoder_term(lengths, images):
    model = HybridCost()
    n = len(lengths)
    patches = np.array([p for p, _ in images], dtype=np.int64)
    owner = np.array([o % n for _, o in images], dtype=np.int64)
    total = model.costs(np.array(lengths), patches, owner, "sum")
    backbone = model.costs(np.array(lengths), patches, owner, "backbone")
    assert np.all(total >= backbone)
    assert np.isclose(total.sum() - backbone.sum(), model.encoder(patches, owner, n).sum())
    with_images = set(owner.tolist())
    assert all(total[i] == backbone[i] for i in range(n) if i not in with_images)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="objective"):
        HybridCost().costs(np.array([1]), np.array([]), np.array([]), "encoder")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="patch count"):
        HybridCost().encoder(np.array([1, 2]), np.array([0]), 1)
