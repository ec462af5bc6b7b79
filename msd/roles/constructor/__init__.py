"""Data Constructor: the sidecar that builds and serves batches for the ranks on its node.

It receives each step's plan from the Planner and the payloads from loaders (straight, or relayed by
other Constructors: ``msd.plan.fanout``; it relays in turn what is meant for those below it), packs
each data-parallel rank's rows once all payloads of the step are in (``msd.batch.pack``), cuts the
context-parallel slices (``msd.batch.cp_slice``), and answers each trainer rank's ``Get`` from its
buffer of ready batches: one copy per (DP rank, CP rank) and step, shared by every TP peer and
pipeline stage that reads it (a stage gets only the tensors it uses). It reports consumption (and
the trainers' data-wait) back to the Planner, which is what lets the Planner plan ahead without
running away. ``core`` decides without sockets; ``loop`` is the process around it
(docs/architecture.md).
"""

from msd.roles.constructor.loop import main

__all__ = ["main"]
