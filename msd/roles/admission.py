"""Which messages the Planner acts on, and from whom (pure: no sockets, no Planner state).

Only holders of the job's key reach the Planner at all (CURVE); behind that, every message is
still checked before it touches state: data-plane messages only from a registered peer of the
role that sends them (a loader's ``Meta``, a Constructor's ``Progress``), with fields in range;
control requests (``msd status``, ``mix``, ``rescale``, ``checkpoint``, a Client's rewind, the
launcher's ``LoaderLost``) from any key holder, each answered by its own handler. What fails is
dropped and counted by the caller, never raised: a malformed message cannot stop a job.
"""

from __future__ import annotations

from msd.wire.protocol import (
    CutAt,
    Failure,
    Hello,
    LoaderLost,
    Message,
    Meta,
    Progress,
    Rescale,
    Retired,
    Rewind,
    SetMix,
    Stats,
    StatusRequest,
    TakeCheckpoint,
)

ROLES = ("loader", "constructor")
_FROM_ROLE: dict[type, tuple[str, ...]] = {
    Meta: ("loader",),
    CutAt: ("loader",),
    Retired: ("loader",),
    Progress: ("constructor",),
    Stats: ROLES,
    Failure: ROLES,
}
_CONTROL = (Hello, StatusRequest, SetMix, Rescale, TakeCheckpoint, Rewind, LoaderLost)


def refusal(msg: Message, sender: str | None, sources: int, world_size: int) -> str | None:
    """Why the Planner must not act on ``msg`` from a peer registered as ``sender`` (None: not
    registered) in a job of ``sources`` sources and ``world_size`` ranks; None when it may."""
    roles = _FROM_ROLE.get(type(msg))
    if roles is not None and sender not in roles:
        return f"a {type(msg).__name__} from a peer that is not a registered {' or '.join(roles)}"
    if roles is None and not isinstance(msg, _CONTROL):
        return f"a {type(msg).__name__}, which no peer sends to the planner"
    if isinstance(msg, Meta):
        return _meta_refusal(msg, sources)
    if isinstance(msg, CutAt) and not 0 <= msg.source < sources:
        return f"a cut position for source {msg.source}"
    if isinstance(msg, Progress) and min(msg.consumed, msg.built, msg.step_bytes) < 0:
        return "a negative progress report"
    if isinstance(msg, Hello):
        return _hello_refusal(msg, sources, world_size)
    return None


def _meta_refusal(msg: Meta, sources: int) -> str | None:
    if not 0 <= msg.source < sources or msg.gpos_start < 0:
        return f"sample lengths for source {msg.source} from position {msg.gpos_start}"
    if len(msg.lengths) != len(msg.sample_ids) or any(n < 0 for n in msg.lengths):
        return "sample lengths that do not match their ids, or are negative"
    return None


def _hello_refusal(msg: Hello, sources: int, world_size: int) -> str | None:
    if msg.role not in ROLES:
        return f"a hello from a {msg.role!r}, which is no role of a job"
    if any(not 0 <= r < world_size for r in msg.ranks):
        return f"a hello from {msg.role} {msg.name} offering ranks the job does not have"
    if any(not 0 <= s < sources for s in msg.sources) or msg.standby >= sources:
        return f"a hello from {msg.role} {msg.name} naming sources the job does not have"
    return None
