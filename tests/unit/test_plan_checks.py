import msgspec
import numpy as np
import pytest

from msd.errors import RecipeError
from msd.plan.cost import CostModel
from msd.recipe.checks import check_recipe
from msd.recipe.schema import Recipe

BASE = {
    "seq_len": 64,
    "global_batch_tokens": 512,
    "steps": 10,
    "distribute": {"dp": 2},
    "sources": [
        {"name": "web", "path": "x", "text_column": "t", "weight": 0.5},
        {"name": "code", "path": "y", "text_column": "t", "weight": 0.5},
    ],
}


def problems(**changes):
    data = {**BASE, **changes}
    return [f"{p.key}: {p.message}" for p in check_recipe(msgspec.convert(data, Recipe))]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"distribute": {"dp": 2, "tp": 0}}, "distribute.tp: must be >= 1, got 0; use at least 1"),
        (
            {"distribute": {"dp": 2, "order": ["tp", "dp", "pp"]}},
            "distribute.order: must list each",
        ),
        (
            {"distribute": {"dp": 2, "cp": 3}},
            "seq_len: must be a multiple of 2 * distribute.cp = 6",
        ),
        ({"micro_batch_size": 3}, "micro_batch_size: must divide the 4 rows each DP rank gets"),
        ({"micro_batch_size": 0}, "micro_batch_size: must be >= 1, got 0"),
        (
            {
                "mix": {
                    "milestones": [
                        {"step": 5, "weights": {"web": 1}},
                        {"step": 5, "weights": {"web": 2}},
                    ]
                }
            },
            "mix.milestones[1].step: must be greater than the previous milestone's step 5",
        ),
        (
            {"mix": {"milestones": [{"step": 5, "weights": {"wbe": 1}}]}},
            "mix.milestones[0].weights.wbe: is not a source; use one of web, code",
        ),
        (
            {"mix": {"milestones": [{"step": 5, "weights": {"web": -1}}]}},
            "mix.milestones[0].weights.web: must be a finite number >= 0",
        ),
        (
            {"mix": {"milestones": [{"step": 5, "weights": {"web": 0, "code": 0}}]}},
            "mix.milestones[0].weights: leaves every source at weight 0",
        ),
        ({"cost": {"attn": -1}}, "cost.attn: must be a finite number >= 0, got -1.0"),
        ({"cost": {"function": "nocolon"}}, "cost.function: must be module:function"),
        ({"trainer": {"ranks": 4}, "distribute": {"dp": 2, "tp": 2}}, None),
    ],
)
def test_each_plan_check(changes, expected):
    got = problems(**changes)
    if expected is None:
        assert got == []
    else:
        assert len(got) == 1 and got[0].startswith(expected), got


def test_a_user_cost_function_is_used_and_checked(tmp_path, monkeypatch):
    (tmp_path / "mycosts.py").write_text(
        "import numpy as np\n"
        "def flops(lengths):\n    return lengths.astype(float) * 3\n"
        "def bad(lengths):\n    return -lengths\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    lengths = np.array([1, 2, 10])
    assert CostModel(function="mycosts:flops")(lengths).tolist() == [3.0, 6.0, 30.0]
    assert CostModel(attn=2.0, lin=1.0)(lengths).tolist() == [3.0, 10.0, 210.0]
    with pytest.raises(RecipeError, match="finite cost >= 0"):
        CostModel(function="mycosts:bad")(lengths)
    with pytest.raises(RecipeError, match="cannot be imported"):
        CostModel(function="mycosts:missing")(lengths)
