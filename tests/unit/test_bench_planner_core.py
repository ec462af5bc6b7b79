"""benchmarks.planner_core drives a real PlannerCore: every step it times sends the step's plans
and routes, and plan_step is a part of the core's time, not more."""

from __future__ import annotations

from benchmarks.planner_core import RANKS_PER_NODE, point


def test_each_timed_step_plans_one_step_for_every_constructor():
    result = point(16, steps=3)
    assert result["constructors"] == 16 // RANKS_PER_NODE
    # a Plan for each Constructor and at least one Route, every step
    assert result["messages"] >= result["constructors"] + 1
    assert 0 < result["plan_step_ms"] <= result["core_ms"]
    assert result["bytes"] > 0 and result["meta_ms_per_1k_samples"] > 0
