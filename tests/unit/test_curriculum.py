"""The curriculum recipe's realised shares track its schedule (the Planner's pure function)."""

from pathlib import Path

import numpy as np

from msd.plan.schedule import schedule_of
from msd.plan.spec import stream_spec
from msd.plan.step import EndOfStream, PlannerState, plan_step
from msd.recipe.load import load_recipe
from msd.synth.text import DEFAULT_SOURCES, sample_lengths

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_curriculum_shares_track_the_schedule_over_500_step_windows():
    recipe = load_recipe(RECIPES / "curriculum.yaml")
    lengths = {s.name: sample_lengths(s) for s in DEFAULT_SOURCES}
    table = [lengths[s.name] for s in recipe.sources]
    spec = stream_spec(recipe, tuple(len(t) for t in table))
    state = PlannerState.initial(len(table))
    counts = np.zeros((recipe.steps // 500, len(table)))
    while not isinstance(
        result := plan_step(spec, state, lambda s, g: int(table[s][g % len(table[s])])), EndOfStream
    ):
        plan, state = result
        for slot in plan.slots:
            counts[plan.step // 500, slot.source] += slot.offset == 0
    schedule = schedule_of(recipe)
    for window, row in enumerate(counts):
        want = schedule.window_mean(window * 500, (window + 1) * 500)
        assert np.allclose(row / row.sum(), want, atol=0.02), (window, row / row.sum(), want)
    code = counts[:, 1] / counts.sum(axis=1)
    assert code[0] < 0.07 and code[-1] > 0.38, "the ramp happened"
