"""Source Loader: reads its shards of one or more sources, reports lengths, sends payloads.

A loader process serves the shards ``msd.plan.partition`` gives it. Shard ``i`` of a source read
by ``L`` shards owns every L-th block that an epoch visits (k ≡ i mod L); it reads those blocks
in visiting order, tokenizes them and reports each sample's length to the Planner. It keeps the
tokens until the Planner routes them to a Constructor, then forgets them. ``shard`` is the
socket-free core (one shard, read a chunk at a time); ``loop`` the process around it.
"""

from msd.roles.loader.loop import main

__all__ = ["main"]
