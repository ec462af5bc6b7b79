"""Where a job stands for its Planner (``Phase``): starting until every peer has registered,
then running, until it is told to stop or a trainer goes back to an earlier step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Phase:
    """``running``: every peer registered, since ``started`` (the Planner's clock; before that,
    when the Planner started); ``stopped`` / ``rewind_to``: why the loop must end (a ``Stop``;
    a trainer restored the checkpoint of that step); ``failure``: a role's report, if any."""

    started: float
    running: bool = False
    stopped: bool = False
    rewind_to: int | None = None
    failure: str = ""
