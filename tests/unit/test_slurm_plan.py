"""What `msd launch --cluster slurm` would submit, pinned for a reference recipe."""

import msgspec
import pytest

from msd.errors import LaunchError
from msd.launch.slurm_plan import submissions
from msd.recipe.schema import Recipe

REFERENCE = {
    "name": "ref",
    "seq_len": 64,
    "global_batch_tokens": 256,
    "steps": 10,
    "distribute": {"dp": 4},
    "sources": [
        {"name": "web", "path": "x", "text_column": "t", "weight": 1, "loaders": 2},
        {"name": "code", "path": "y", "text_column": "t", "weight": 1},
    ],
    "trainer": {"command": "python train.py", "nodes": 2, "gpus_per_node": 8},
    "cluster": "slurm",
    "slurm": {
        "partition": "gpu",
        "account": "lab",
        "qos": "high",
        "time_min": 120,
        "constraint": "h100",
        "loader": {"partition": "cpu", "cpus": 4, "mem_gb": 8},
        "additional": {"exclusive": ""},
    },
}


def test_submissions_for_the_reference_recipe():
    subs = submissions(msgspec.convert(REFERENCE, Recipe))
    assert [(s.role, s.name, s.task) for s in subs] == [
        ("planner", "planner", ("planner",)),
        ("loader", "web/0", ("loader", "--name", "web/0")),
        ("loader", "web/1", ("loader", "--name", "web/1")),
        ("loader", "code/0", ("loader", "--name", "code/0")),
        ("trainer", "trainer", ("trainer", "2")),
    ]
    common = {
        "timeout_min": 120,
        "slurm_account": "lab",
        "slurm_qos": "high",
        "slurm_constraint": "h100",
        "slurm_additional_parameters": {"exclusive": ""},
    }
    assert subs[0].parameters == {
        **common,
        "name": "msd-ref-planner",
        "cpus_per_task": 1,
        "mem_gb": 2.0,
        "slurm_partition": "gpu",
        "nodes": 1,
        "tasks_per_node": 1,
    }
    assert subs[1].parameters == {
        **common,
        "name": "msd-ref-loader",
        "cpus_per_task": 4,
        "mem_gb": 8.0,
        "slurm_partition": "cpu",
        "nodes": 1,
        "tasks_per_node": 1,
    }
    assert subs[-1].parameters == {
        **common,
        "name": "msd-ref-trainer",
        "cpus_per_task": 2,
        "slurm_partition": "gpu",
        "nodes": 2,
        "tasks_per_node": 3,
        "gpus_per_node": 8,
    }


def test_ranks_that_do_not_fill_the_nodes_are_refused():
    recipe = msgspec.convert({**REFERENCE, "trainer": {"nodes": 3}}, Recipe)
    with pytest.raises(LaunchError, match="3 nodes × 2 tasks per node is not the 4 ranks"):
        submissions(recipe)
