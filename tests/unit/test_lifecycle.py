import numpy as np

from msd.plan.lifecycle import SampleGraph


def test_a_sample_moves_through_its_states_and_leaves_the_window():
    graph = SampleGraph(window=2)
    graph.on_assigned(0, [(0, 0), (1, 0)], carried=[(0, 1)])
    assert graph.state_of((0, 0)) == "assigned" and graph.state_of((0, 1)) == "planned"
    assert graph.counts(reported=5) == {
        "loaded": 4,
        "planned": 1,
        "assigned": 2,
        "delivered": 0,
        "consumed": 0,
    }
    graph.on_assigned(1, np.array([(0, 2), (0, 1), (0, 2)]), carried=[])  # a split sample
    graph.on_delivered(1)
    assert graph.state_of((0, 0)) == "delivered" and graph.state_of((0, 1)) == "assigned"
    assert graph.in_flight() == [0, 1]
    graph.on_consumed(1)
    assert graph.state_of((1, 0)) == "consumed" and graph.in_flight() == [1]
    for step in range(2, 6):
        graph.on_assigned(step, [(2, step)], carried=[])
        graph.on_delivered(step + 1)
        graph.on_consumed(step + 1)
    assert graph.state_of((0, 0)) is None, "old steps leave the window"
    assert len(graph.steps) <= 2 + 1 and sum(len(s.keys) for s in graph.steps.values()) <= 3
