"""The relay tree of hierarchical fan-out, and cutting a relayed payload by next hop: every
Constructor is reached, each talks to at most ``fanout`` others, and a payload's parts hold
exactly its samples."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.plan.fanout import Tree
from msd.wire.protocol import Payload, decode, encode
from msd.wire.relay import split_payload


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40))
def test_every_constructor_is_reached_through_at_most_fanout_children_each(n: int, f: int) -> None:
    tree = Tree(n, f)
    depth = tree.depth()
    entries = {tree.entry(d) for d in range(n)}
    assert len(entries) <= f and entries <= set(range(min(n, f)))
    for c in range(n):
        assert len(tree.children(c)) <= f
    for dest in range(n):
        at, hops = tree.entry(dest), 0
        while at != dest:
            nxt = tree.next_hop(at, dest)
            assert nxt is not None and nxt in tree.children(at)
            at, hops = nxt, hops + 1
        assert hops + 1 <= depth
        assert tree.next_hop(dest, dest) == dest
    assert tree.relays == (n > f)


def test_the_tree_is_about_log_fanout_deep() -> None:
    assert Tree(512, 8).depth() == 3  # 8 roots, 64 below them, the rest below those
    assert Tree(512, 32).depth() == 2
    assert Tree(4, 1).depth() == 4  # a chain
    assert Tree(32, 32).depth() == 1 and not Tree(32, 32).relays


def test_without_a_fanout_every_loader_sends_straight_to_every_constructor() -> None:
    tree = Tree(600, None)
    assert [tree.entry(d) for d in range(600)] == list(range(600))
    assert not tree.relays and tree.depth() == 1


def test_a_sample_off_the_path_has_no_next_hop() -> None:
    tree = Tree(20, 2)  # roots 0, 1; 2, 3 below 0; 4, 5 below 1; 6, 7 below 2 ...
    assert tree.path(7) == [0, 2, 7]
    assert tree.next_hop(1, 7) is None and tree.next_hop(3, 7) is None
    assert tree.next_hop(0, 7) == 2


def test_samples_are_grouped_by_where_the_loader_sends_them() -> None:
    tree = Tree(10, 3)  # 3 and 4 hang under 0
    grouped = tree.by_entry([(0, 1, 4), (0, 2, 1), (1, 5, 0), (2, 9, 3)])
    assert grouped == {0: [(0, 1, 4), (1, 5, 0), (2, 9, 3)], 1: [(0, 2, 1)]}


def _payload(rng: np.random.Generator, n: int, images: bool) -> tuple[Payload, list[np.ndarray]]:
    lengths = rng.integers(0, 9, n).tolist()
    tokens = rng.integers(0, 60_000, sum(lengths)).astype(np.uint16)
    msg = Payload(
        step=3,
        source=tuple(rng.integers(0, 4, n).tolist()),
        gpos=tuple(range(100, 100 + n)),
        lengths=tuple(lengths),
        token_dtype="uint16",
        to=tuple(rng.integers(0, 5, n).tolist()),
    )
    if not images:
        return msg, [tokens]
    counts = rng.integers(0, 3, n).tolist()
    grids = [(1, int(h), int(w)) for h, w in rng.integers(1, 4, (sum(counts), 2))]
    pixels = rng.integers(0, 256, (sum(h * w for _, h, w in grids), 6), dtype=np.uint8)
    flat = tuple(x for g in grids for x in g)
    msg = Payload(**{**_fields(msg), "images": tuple(counts), "grids": flat, "patch_values": 6})
    return msg, [tokens, pixels.reshape(-1)]


def _fields(msg: Payload) -> dict[str, object]:
    return {f: getattr(msg, f) for f in msg.__struct_fields__}


def _samples(msg: Payload, buffers: list[np.ndarray]) -> dict[tuple[int, int, int], bytes]:
    """Each sample (source, gpos, destination) → its tokens' and its images' bytes."""
    tokens = np.frombuffer(buffers[0], dtype=msg.token_dtype)
    bounds = np.cumsum((0, *msg.lengths))
    images = np.cumsum((0, *msg.images)) if msg.images else np.zeros(len(msg.gpos) + 1, int)
    grids = np.asarray(msg.grids, dtype=np.int64).reshape(-1, 3)
    rows = np.cumsum(np.concatenate(([0], grids[:, 1] * grids[:, 2])))
    pixels = np.frombuffer(buffers[1], np.uint8) if len(buffers) > 1 else np.zeros(0, np.uint8)
    out = {}
    for i, key in enumerate(zip(msg.source, msg.gpos, msg.to, strict=True)):
        grid = grids[images[i] : images[i + 1]].tobytes()
        span = pixels[rows[images[i]] * 6 : rows[images[i + 1]] * 6].tobytes()
        out[key] = tokens[bounds[i] : bounds[i + 1]].tobytes() + grid + span
    return out


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 30), st.booleans())
def test_a_payload_splits_into_parts_that_hold_exactly_its_samples(
    seed: int, n: int, images: bool
) -> None:
    msg, buffers = _payload(np.random.default_rng(seed), n, images)
    parts = split_payload(msg, buffers, lambda d: d % 3)
    got: dict[tuple[int, int, int], bytes] = {}
    for hop, (part, part_buffers) in parts.items():
        part, part_buffers = decode(encode(part, part_buffers))  # a well-formed message
        assert {d % 3 for d in part.to} == {hop}
        got.update(_samples(part, [np.asarray(b) for b in part_buffers]))
    assert got == _samples(msg, buffers)


def test_a_payload_going_one_way_is_passed_on_as_it_is() -> None:
    msg, buffers = _payload(np.random.default_rng(1), 6, images=True)
    assert split_payload(msg, buffers, lambda d: 7) == {7: (msg, buffers)}
