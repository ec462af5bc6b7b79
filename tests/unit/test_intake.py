"""The Constructor's intake: a payload nobody planned is dropped, the first copy of a sample
wins, and what waits for a plan is bounded."""

from __future__ import annotations

import numpy as np

from msd.roles.constructor.intake import Intake
from msd.wire.rejects import Rejects


def tokens(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def test_a_step_completes_when_its_plan_and_every_needed_sample_are_in():
    intake = Intake(Rejects("t"), early_cap_bytes=1 << 20)
    intake.plan(5, {(0, 1), (1, 7)})
    intake.add(5, [(0, 1)], [tokens(1, 2)], 8)
    assert not intake.complete(5)
    intake.add(5, [(1, 7)], [tokens(3)], 4)
    assert intake.complete(5)
    got = intake.take(5)
    assert {k: v.tolist() for k, v in got.items()} == {(0, 1): [1, 2], (1, 7): [3]}
    assert not intake.planned(5) and not intake.held


def test_samples_nobody_planned_are_dropped_and_counted():
    rejects = Rejects("t")
    intake = Intake(rejects, early_cap_bytes=1 << 20)
    intake.plan(2, {(0, 1)})
    intake.add(2, [(0, 1), (0, 99)], [tokens(1), tokens(6, 6)], 12)
    assert rejects.counts == {"unplanned": 1}
    assert list(intake.take(2)) == [(0, 1)]


def test_early_samples_are_filtered_by_the_plan_when_it_comes():
    rejects = Rejects("t")
    intake = Intake(rejects, early_cap_bytes=1 << 20)
    intake.add(3, [(0, 1), (2, 5)], [tokens(1), tokens(9)], 8)  # the plan is not in yet
    assert intake.early_bytes == 8
    intake.plan(3, {(0, 1)})
    assert intake.complete(3) and rejects.counts == {"unplanned": 1}
    assert intake.early_bytes == 0


def test_the_first_copy_of_a_sample_wins():
    intake = Intake(Rejects("t"), early_cap_bytes=1 << 20)
    intake.plan(1, {(0, 4), (0, 5)})
    intake.add(1, [(0, 4)], [tokens(1, 2, 3)], 12)
    intake.add(1, [(0, 4)], [tokens(7, 7, 7)], 12)  # a second copy cannot replace the first
    intake.add(1, [(0, 5)], [tokens(4)], 4)
    assert intake.take(1)[(0, 4)].tolist() == [1, 2, 3]


def test_what_waits_for_a_plan_is_bounded_and_the_furthest_step_goes_first():
    rejects = Rejects("t")
    intake = Intake(rejects, early_cap_bytes=100)
    intake.add(1, [(0, 1)], [tokens(1)], 60)
    intake.add(9, [(0, 2)], [tokens(2)], 30)
    assert intake.early_bytes == 90 and not rejects.counts
    intake.add(4, [(0, 3)], [tokens(3)], 30)  # over the cap: step 9 goes
    assert intake.early_bytes == 90 and rejects.counts == {"over-capacity": 1}
    assert sorted(intake.held) == [1, 4]
    intake.add(12, [(0, 4)], [tokens(4)], 30)  # the furthest itself goes
    assert sorted(intake.held) == [1, 4] and rejects.counts == {"over-capacity": 2}


def test_forget_below_drops_built_and_stale_steps():
    intake = Intake(Rejects("t"), early_cap_bytes=1 << 20)
    intake.add(1, [(0, 1)], [tokens(1)], 4)
    intake.plan(2, {(0, 2)})
    intake.add(6, [(0, 3)], [tokens(1)], 4)
    intake.forget_below(5)
    assert sorted(intake.held) == [6] and not intake.planned(2) and intake.early_bytes == 4


def test_held_bytes_count_the_frames_of_steps_not_built_yet():
    intake = Intake(Rejects("t"), early_cap_bytes=1 << 20)
    intake.plan(1, {(0, 1), (0, 2)})
    intake.add(1, [(0, 1)], [tokens(1)], 40)
    intake.add(2, [(0, 3)], [tokens(2)], 30)  # early
    intake.add(1, [(0, 1)], [tokens(1)], 40)  # a second copy: its frame is not kept
    assert (intake.held_bytes, intake.early_bytes) == (70, 30)
    intake.add(1, [(0, 2)], [tokens(3)], 20)
    intake.take(1)
    intake.plan(2, {(0, 9)})  # nothing it holds is needed: its frame goes
    assert intake.held_bytes == 0
