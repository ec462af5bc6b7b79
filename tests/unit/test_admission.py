"""What the Planner acts on, and from whom."""

from __future__ import annotations

from msd.roles.admission import refusal
from msd.wire.protocol import (
    CutAt,
    Failure,
    Hello,
    Meta,
    Progress,
    Rescale,
    Stats,
    StatusRequest,
    Want,
)

SOURCES, WORLD = 3, 4


def why(msg, sender=None):
    return refusal(msg, sender, SOURCES, WORLD)


def test_data_plane_messages_come_only_from_registered_peers_of_their_role():
    meta = Meta(source=1, gpos_start=0, lengths=(3,), sample_ids=(7,))
    progress = Progress(consumed=3)
    assert why(meta, "loader") is None and why(progress, "constructor") is None
    assert "registered loader" in why(meta)
    assert "registered loader" in why(meta, "constructor")
    assert "registered constructor" in why(progress, "loader")
    stats = Stats("loader", "web/0", "n", 1, 0.0, 0)
    failure = Failure(role="loader", name="web/0", error="x", traceback="")
    assert why(stats, "loader") is None and why(stats) is not None
    assert why(failure, "constructor") is None and why(failure) is not None


def test_control_requests_come_from_any_key_holder():
    assert why(StatusRequest()) is None
    assert why(Rescale(source="web", loaders=2)) is None


def test_kinds_no_peer_sends_the_planner_are_refused():
    assert "no peer sends" in why(Want(source=0, gpos=1), "loader")


def test_fields_out_of_range_are_refused():
    assert why(Meta(source=3, gpos_start=0, lengths=(1,), sample_ids=(1,)), "loader")
    assert why(Meta(source=0, gpos_start=-1, lengths=(1,), sample_ids=(1,)), "loader")
    assert why(Meta(source=0, gpos_start=0, lengths=(1, 2), sample_ids=(1,)), "loader")
    assert why(Meta(source=0, gpos_start=0, lengths=(-1,), sample_ids=(1,)), "loader")
    assert why(CutAt(source=-1, visit=0), "loader")
    assert why(Progress(consumed=-5), "constructor")


def test_hellos_of_unknown_roles_sources_or_ranks_are_refused():
    ok = Hello(role="constructor", name="n0", version=4, pid=1, ranks=(0, 1))
    assert why(ok) is None
    assert "no role" in why(Hello(role="trainer", name="x", version=4, pid=1))
    assert why(Hello(role="loader", name="x", version=4, pid=1, sources=(5,)))
    assert why(Hello(role="constructor", name="x", version=4, pid=1, ranks=(4,)))
