import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.plan.mix import UNIFORM_CHUNK, SourceDraws, draw_source, step_rng


def one_draw(rng, weights, active):
    """The rule as first written: one uniform per draw, cumulative weights every time."""
    w = np.where(np.asarray(active), np.asarray(weights, dtype=np.float64), 0.0)
    cum = np.cumsum(w)
    u = rng.random() * cum[-1]
    return min(int(np.searchsorted(cum, u, side="right")), len(w) - 1)


weights_st = st.lists(st.floats(0.0, 10.0), min_size=1, max_size=6).filter(lambda w: sum(w) > 0)


@given(weights_st, st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 3000)), max_size=8))
@settings(max_examples=100, deadline=None)
def test_draws_in_chunks_are_the_draws_one_at_a_time(weights, plan):
    """Peek any number, take any part of them, switch sources off in between: every draw is
    what one ``draw_source`` call per draw gives."""
    seed = len(plan)
    draws, rng = SourceDraws(step_rng(seed, 7), weights), step_rng(seed, 7)
    active = [w > 0 for w in weights]
    for peek, take in plan:
        draws.set_active(active)
        sources = draws.peek(peek).tolist()
        taken = min(take, peek)
        assert sources[:taken] == [one_draw(rng, weights, active) for _ in range(taken)]
        draws.advance(taken)
        drawable = [s for s, on in enumerate(active) if on and weights[s] > 0]
        if len(drawable) > 1:
            active[drawable[0]] = False  # a source runs out
    assert len(draws.uniforms) < max([peek for peek, _ in plan], default=0) + UNIFORM_CHUNK


def test_draw_source_is_the_same_rule():
    weights, active = (0.5, 0.3, 0.2), [True, False, True]
    a, b = step_rng(3, 1), step_rng(3, 1)
    assert [draw_source(a, weights, active) for _ in range(500)] == [
        one_draw(b, weights, active) for _ in range(500)
    ]


def test_shares_follow_the_weights_and_skip_inactive_sources():
    draws = SourceDraws(step_rng(0, 0), (0.5, 0.3, 0.2, 0.0))
    draws.set_active([True, True, True, True])
    counts = np.bincount(draws.peek(100_000), minlength=4) / 100_000
    assert np.all(np.abs(counts - [0.5, 0.3, 0.2, 0.0]) < 0.01)
    draws.set_active([True, False, True, True])
    counts = np.bincount(draws.peek(100_000), minlength=4) / 100_000
    assert np.all(np.abs(counts - [0.5 / 0.7, 0.0, 0.2 / 0.7, 0.0]) < 0.01)


def test_each_step_has_its_own_generator():
    assert step_rng(1, 5).random() == step_rng(1, 5).random() != step_rng(1, 6).random()
