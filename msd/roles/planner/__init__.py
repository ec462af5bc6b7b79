"""Planner: the one process that decides the stream and holds the job's state.

It sees metadata only (sample lengths reported by loaders), plans each global step with the pure
``msd.plan.step.plan_step``, tells each Constructor what its ranks get and each loader where to
send which payload, and stays at most ``prefetch_steps`` ahead of the slowest trainer rank.
``core`` decides without sockets; ``loop`` is the process around it (docs/architecture.md).
"""

from msd.roles.planner.loop import main

__all__ = ["main"]
