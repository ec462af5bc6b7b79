"""Mix-driven autoscaling: a source whose transform is 20× slower than the others' ramps from
5 % to 60 % of the samples. With autoscaling the Planner adds its loaders before the ramp and
the trainers keep getting data; without, they wait for it.

The scenario lives in ``benchmarks/autoscale.py``; the absolute target (p99 < 20 ms) is
measured there, since this machine is shared: here the two runs are compared side by side."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.autoscale import RAMP, STEPS, WARMUP, generations, make_data, run, summary, waits

HEADROOM = 0.5


@pytest.fixture(scope="module")
def ramp_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("ramp"))


def test_loaders_are_added_before_the_ramp_and_trainers_do_not_wait(
    tmp_path: Path, ramp_data: Path
) -> None:
    # A loader's measured capacity falls as more loaders, the 4 ranks and whatever else runs
    # share this machine's 2 cores: planned on half of it (msd's default is 0.7), the slow
    # source's loaders keep up with its 60 % share even on a busy machine.
    auto = run(tmp_path, ramp_data, autoscale=True, headroom=HEADROOM)
    fixed = run(tmp_path, ramp_data, autoscale=False)
    print(json.dumps({"autoscale": summary(auto, WARMUP), "fixed": summary(fixed, RAMP[1])}))
    decided = generations(auto)
    slow = [g for g in decided if g["source"] == "slow"]
    assert slow and slow[0]["loaders"] > 1 and slow[0]["decided_at"] < RAMP[0], decided
    assert all(g["reason"].startswith("autoscale") for g in decided)
    assert generations(fixed) == []
    auto_after, fixed_after = waits(auto, RAMP[1], STEPS), waits(fixed, RAMP[1], STEPS)
    # Without autoscaling the trainers wait once slow dominates; with it they do not, on 9
    # steps of 10 (a few steps at slow's epoch boundaries still wait 0.1-0.6 s with enough
    # loaders, which would decide a mean: docs/operating.md, autoscaling).
    assert np.percentile(fixed_after, 99) > 20.0
    assert np.percentile(fixed_after, 90) > 4 * np.percentile(auto_after, 90)
    # The whole run once warm: single waits on this shared machine are noise (p99 is the fifth
    # longest of 430 steps), so the bulk of the steps is judged (p95).
    auto_p95 = np.percentile(waits(auto, WARMUP, STEPS), 95)
    assert auto_p95 < np.percentile(fixed_after, 99) / 4
