"""bos/eos around every document (`msd.recipe.schema.Transform`): text, token and image
sources, ids and tokenizer token names, empty rows left empty, the Planner's lengths counting
them, and recipes without them keeping their fingerprint."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from msd.errors import SourceError
from msd.recipe.hints import missing_eos
from msd.recipe.schema import Recipe, Source, Transform, stream_fingerprint
from msd.sources.fuse import Fuser, FuseSpec
from msd.sources.image_rows import rows_of
from msd.sources.transforms import boundaries, make_transform
from msd.sources.vision import ImageGeometry
from msd.synth.text import END_OF_TEXT, SynthSource, train_tokenizer

BOS, EOS = 300, 301


def test_each_document_gets_one_bos_and_one_eos_and_empty_rows_stay_empty() -> None:
    tokenize = make_transform(Transform(bos=BOS, eos=EOS), "text")
    got = tokenize(pa.array(["ab", None, "", "c"]))
    assert [t.tolist() for t in got] == [[BOS, 97, 98, EOS], [], [], [BOS, 99, EOS]]
    only_eos = make_transform(Transform(eos=0), "text")(pa.array(["xy"]))
    assert only_eos[0].tolist() == [120, 121, 0]
    tokens = make_transform(Transform(eos=EOS), "tokens")(
        pa.array([[5, 6], None], pa.list_(pa.int64()))
    )
    assert [t.tolist() for t in tokens] == [[5, 6, EOS], []]


def test_pieces_of_a_document_are_tokenized_without_them() -> None:
    pieces = make_transform(Transform(bos=BOS, eos=EOS), "text", documents=False)
    assert pieces(pa.array(["ab"]))[0].tolist() == [97, 98]


def test_a_tokenizer_names_its_token_and_an_unknown_name_is_one_sentence(tmp_path: Path) -> None:
    path = train_tokenizer(tmp_path, [SynthSource("s", 40, 0.5, 80, 50)], vocab_size=300, rows=50)
    transform = Transform(kind="tokenizer", path=str(path), eos=END_OF_TEXT)
    bos, eos = boundaries(transform)
    assert bos is None and eos is not None
    ids = make_transform(transform, "text")(pa.array(["hello world"]))[0]
    assert ids[-1] == eos and eos not in ids[:-1].tolist()
    with pytest.raises(SourceError, match=r"has no token '</s>'"):
        boundaries(Transform(kind="tokenizer", path=str(path), eos="</s>"))
    with pytest.raises(SourceError, match="only a tokenizer transform has"):
        boundaries(Transform(eos="</s>"))
    with pytest.raises(SourceError, match="is not a token id"):
        boundaries(Transform(bos=-1))


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (56, 56), (1, 2, 3)).save(out, format="PNG")
    return out.getvalue()


def test_an_image_sample_is_framed_whole_and_its_images_keep_their_place() -> None:
    spec = FuseSpec(ImageGeometry(), 9999, "<image>", 1 << 20)
    framed = Fuser.of_source(_source(Transform(bos=BOS, eos=EOS)), "text", spec, False)
    plain = Fuser.of_source(_source(Transform()), "text", spec, False)
    rows = rows_of(
        pa.array([b"a <image> b", b"", None], pa.large_binary()),
        pa.array([[_png()], [], [_png()]], pa.list_(pa.large_binary())),
    )
    (one, empty, image_only), _ = framed(rows)
    (one_plain, _, image_plain), _ = plain(rows)
    assert one.tolist() == [BOS, *one_plain.tolist(), EOS]
    assert empty.tolist() == []  # no text, no image: no document
    assert image_only.tolist() == [BOS, *image_plain.tolist(), EOS]
    assert np.count_nonzero(one == 9999) == np.count_nonzero(one_plain == 9999) > 0


def _source(transform: Transform) -> Source:
    return Source(name="s", path="p", weight=1.0, text_column="t", transform=transform)


def _recipe(transform: dict[str, object]) -> Recipe:
    doc = {
        "name": "b",
        "seq_len": 64,
        "global_batch_tokens": 128,
        "sources": [
            {
                "name": "s",
                "path": "x/*.parquet",
                "text_column": "t",
                "weight": 1.0,
                "transform": transform,
            }
        ],
    }
    return msgspec.convert(doc, type=Recipe)


def test_recipes_without_bos_or_eos_keep_their_fingerprint_and_tokenizers_are_told() -> None:
    plain = stream_fingerprint(_recipe({"kind": "bytes"}))
    assert stream_fingerprint(_recipe({"kind": "bytes", "eos": None})) == plain
    assert stream_fingerprint(_recipe({"kind": "bytes", "eos": 0})) != plain
    told = missing_eos(_recipe({"kind": "tokenizer", "path": "t.json"}))
    assert len(told) == 1 and "sources[0] (s)" in told[0] and "transform.eos" in told[0]
    assert missing_eos(_recipe({"kind": "tokenizer", "path": "t.json", "eos": "</s>"})) == []
    assert missing_eos(_recipe({"kind": "bytes"})) == []
