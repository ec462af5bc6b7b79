"""Which visit a shard opens next (``Cursor``): its visits in an epoch's order, from where its
generation begins or the job resumed, up to where a newer generation takes over.

Shard ``index`` of a generation read by ``stride`` shards opens visits ``start + index``, every
``stride``-th after, before ``stop``. Visit ``v`` is visit ``v % len(blocks)`` of epoch
``v // len(blocks)``; a source that does not repeat ends after its first epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from msd.plan.order import Block, EpochOrder
from msd.plan.partition import Shard
from msd.recipe.schema import Recipe
from msd.sources.index import source_key


@dataclass
class Cursor:
    """``next_v``: the next visit to open (None: its generation waits for the Planner to say
    where it begins); ``stop``: the first visit of the next generation (None: read until the
    source ends); ``frozen``: the Planner is cutting a new generation in, open nothing new;
    ``skip_below``: positions before it were placed before the step the job resumed at."""

    blocks: tuple[Block, ...]
    seed: int
    key: int  # the source's (``source_key``), which its epoch orders are drawn with
    repeat: bool
    index: int
    stride: int
    stop: int | None
    next_v: int | None
    frozen: bool = False
    skip_below: int = 0
    order: EpochOrder | None = field(default=None, repr=False)  # of the last epoch looked at

    @staticmethod
    def of(
        recipe: Recipe,
        shard: Shard,
        blocks: tuple[Block, ...],
        span: tuple[int | None, int | None, int],
    ) -> Cursor:
        """The cursor of ``shard`` over its source's ``blocks``; ``span``: (start, stop,
        stride) of its generation (``msd.plan.partition.span``)."""
        spec = recipe.sources[shard.source]
        start, stop, stride = span
        next_v = None if start is None else start + shard.index
        key = source_key(spec.name)
        return Cursor(blocks, recipe.seed, key, spec.repeat, shard.index, stride, stop, next_v)

    def upcoming(self) -> tuple[EpochOrder, int] | None:
        """The next visit to open: (its epoch's order, its index in the epoch)."""
        v = self.next_v
        if v is None or self.frozen or (self.stop is not None and v >= self.stop):
            return None
        epoch, k = divmod(v, len(self.blocks))
        if epoch > 0 and not self.repeat:
            return None
        if self.order is None or self.order.epoch != epoch:
            self.order = EpochOrder(self.blocks, self.seed, self.key, epoch)
        return self.order, k

    def resume_at(self, gpos: int, num_rows: int) -> None:
        """Open nothing before position ``gpos`` (of a source of ``num_rows`` rows an epoch):
        skip the visits that end before it; the one holding it skips the rows before it."""
        self.skip_below = gpos
        epoch, pos = divmod(gpos, num_rows)
        k = EpochOrder(self.blocks, self.seed, self.key, epoch).visit_of(pos)
        first = epoch * len(self.blocks) + k
        if self.next_v is not None:
            while self.next_v < first:
                self.next_v += self.stride

    def begin(self, start: int) -> None:
        """The Planner decided where this shard's generation begins."""
        self.next_v = start + self.index

    def cut(self) -> int:
        """Open no new visit until ``end_at``; the first visit not opened yet."""
        self.frozen = True
        assert self.next_v is not None
        return self.next_v

    def end_at(self, stop: int) -> None:
        """A new generation reads from visit ``stop`` on; this one finishes what lies before."""
        self.stop, self.frozen = stop, False
