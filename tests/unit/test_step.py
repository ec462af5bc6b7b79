import numpy as np

from msd.plan.step import EndOfStream, NeedData, PlannerState, StepPlan, StreamSpec, plan_step


def lengths_table(num_sources, n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 40, size=n) for _ in range(num_sources)]


def spec(**kw):
    base = dict(
        seed=3,
        weights=(0.5, 0.3, 0.2),
        num_rows=(300, 300, 300),
        repeat=(False, False, False),
        dp=2,
        rows_per_rank=2,
        seq_len=64,
        steps=None,
    )
    base.update(kw)
    return StreamSpec(**base)


def run(sp, table, state=None, limit=10_000):
    state = state or PlannerState.initial(len(sp.weights))
    plans = []

    def lookup(s, g):
        return int(table[s][g % len(table[s])])

    for _ in range(limit):
        result = plan_step(sp, state, lookup)
        if isinstance(result, EndOfStream):
            return plans, state
        assert not isinstance(result, NeedData)
        plan, state = result
        plans.append(plan)
    return plans, state


def test_finite_sources_deliver_every_sample_exactly_once():
    sp = spec()
    plans, _ = run(sp, lengths_table(3, 300))
    seen = [(s.source, s.gpos) for p in plans for s in p.slots]
    assert len(seen) == len(set(seen)) == 900


def test_rows_respect_capacity_and_budget():
    sp = spec()
    plans, _ = run(sp, lengths_table(3, 300))
    for p in plans:
        assert isinstance(p, StepPlan) and len(p.rows) == 2
        for rank in p.rows:
            for row in rank:
                assert sum(s.length for s in row) <= 64


def test_resume_from_a_midpoint_state_continues_the_same_stream():
    sp = spec(repeat=(True, True, True), steps=40)
    table = lengths_table(3, 300)
    full, _ = run(sp, table)
    first, mid = run(spec(repeat=(True, True, True), steps=17), table)
    rest, _ = run(sp, table, state=mid)
    assert first + rest == full


def test_missing_metadata_asks_for_it_and_changes_nothing():
    sp = spec()
    state = PlannerState.initial(3)
    result = plan_step(sp, state, lambda s, g: None)
    assert isinstance(result, NeedData)


def test_mix_shares_follow_weights():
    sp = spec(repeat=(True, True, True), steps=400)
    plans, _ = run(sp, lengths_table(3, 300))
    counts = np.bincount([s.source for p in plans for s in p.slots], minlength=3)
    shares = counts / counts.sum()
    assert np.all(np.abs(shares - np.array([0.5, 0.3, 0.2])) < 0.02)
