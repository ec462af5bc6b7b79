"""Source Loader: reads its share of one source, reports lengths, sends payloads where told.

Loader ``i`` of ``L`` owns every L-th block that an epoch visits (k ≡ i mod L), reads those
blocks in visiting order, tokenizes them and reports each sample's length to the Planner. It
keeps the tokens until the Planner routes them to a Constructor, then forgets them. It reads
ahead only while it holds fewer than ``buffer_tokens`` unrouted tokens, so its memory is bounded
and does not depend on the number of ranks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import zmq

from msd.jobdir import JobDir
from msd.plan.order import EpochOrder, make_blocks
from msd.recipe.schema import Recipe
from msd.roles.common import connect_planner, hello
from msd.sources.index import SourceIndex, open_source, source_key
from msd.sources.read import RowGroupReader
from msd.sources.transforms import make_transform
from msd.wire import transport
from msd.wire.protocol import DISCARD, Meta, Payload, Route, Stop, Want, Welcome

# Text bytes tokenized per loop turn: small enough that Routes are answered within
# milliseconds even with a slow tokenizer, large enough that per-message costs stay small.
CHUNK_BYTES = 64 * 1024


def loader_name(source: str, index: int) -> str:
    return f"{source}/{index}"


def cell_sizes(column: pa.Array) -> np.ndarray:
    """Bytes (text) or ids (token lists) of each cell: what tokenizing it will cost."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        sizes = pc.list_value_length(column)
    else:
        sizes = pc.binary_length(column)
    return np.asarray(sizes.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def chunk_end(sizes: np.ndarray, start: int, budget: int) -> int:
    """End of the chunk that starts at ``start``: at least one cell, at most ``budget`` in all."""
    if start >= len(sizes):
        return start
    fits = int(np.searchsorted(np.cumsum(sizes[start:]), budget, side="right"))
    return start + max(1, fits)


@dataclass
class _Visit:
    """A block being tokenized chunk by chunk; ``at`` is the next position within it."""

    gpos_start: int
    first_row: int
    local_rows: np.ndarray
    column: pa.Array
    sizes: np.ndarray
    at: int = 0


class Loader:
    def __init__(self, job: JobDir, recipe: Recipe, source: int, index: int) -> None:
        self.recipe = recipe
        self.source = source
        self.index = index
        spec = recipe.sources[source]
        self.name = loader_name(spec.name, index)
        self.num_loaders = spec.loaders
        self.src: SourceIndex = open_source(spec, f"sources[{source}]")
        self.blocks = make_blocks(
            [rg.num_rows for rg in self.src.row_groups], recipe.loader.block_row_groups
        )
        self.key = source_key(spec.name)
        self.tokenize = make_transform(spec.transform, self.src.column_kind)
        self.reader = RowGroupReader()
        self.visits = self._visits()
        self.upcoming = next(self.visits, None)
        self.visit: _Visit | None = None
        self.want = -1
        self.held: dict[int, np.ndarray] = {}
        self.held_tokens = 0
        self.planner = connect_planner(job, f"loader/{self.name}")
        self.constructors: list[zmq.Socket[Any]] = []

    def _visits(self) -> Iterator[tuple[EpochOrder, int]]:
        """This loader's (epoch order, visit index) pairs, in stream order."""
        epoch = 0
        while True:
            order = EpochOrder(self.blocks, self.recipe.seed, self.key, epoch)
            yield from ((order, k) for k in range(self.index, len(self.blocks), self.num_loaders))
            if not self.recipe.sources[self.source].repeat:
                return
            epoch += 1

    def run(self) -> None:
        transport.send(self.planner, hello("loader", self.name, sources=(self.source,)))
        poller = zmq.Poller()
        poller.register(self.planner, zmq.POLLIN)
        while True:
            can_read = self._can_read()
            for _ in dict(poller.poll(0 if can_read else 100)):
                if not self._handle(*transport.recv(self.planner)[1:]):
                    return
            if can_read:
                self._read_next()

    def _can_read(self) -> bool:
        """Read ahead within the buffer, and past it up to a position the Planner waits for
        (the buffer may be full of samples the Planner took but has not placed yet)."""
        position = self._next_gpos()
        if position is None:
            return False
        return self.held_tokens < self.recipe.loader_buffer_tokens or position <= self.want

    def _next_gpos(self) -> int | None:
        if self.visit is not None:
            return self.visit.gpos_start + self.visit.at
        if self.upcoming is None:
            return None
        order, k = self.upcoming
        return order.epoch * order.num_rows + int(order.block_starts[k])

    def _handle(self, msg: Any, buffers: list[memoryview]) -> bool:
        if isinstance(msg, Welcome):
            ctx = transport.context()
            self.constructors = [
                transport.connect(ctx, zmq.PUSH, c.payload_endpoint) for c in msg.constructors
            ]
        elif isinstance(msg, Route):
            self._route(msg)
        elif isinstance(msg, Want):
            self.want = max(self.want, msg.gpos)
        elif isinstance(msg, Stop):
            return False
        return True

    def _route(self, msg: Route) -> None:
        """One payload message per destination: the routed samples' tokens back to back."""
        by_dest: dict[int, list[int]] = {}
        for gpos, dest in zip(msg.gpos, msg.constructor, strict=True):
            by_dest.setdefault(dest, []).append(gpos)
        by_dest.pop(DISCARD, None)  # dropped by the plan: only forgotten
        for dest, gposes in by_dest.items():
            tokens = [self.held[g] for g in gposes]
            lengths = tuple(len(t) for t in tokens)
            payload = Payload(
                step=msg.step, source=self.source, gpos=tuple(gposes), lengths=lengths
            )
            buffer = np.concatenate(tokens) if tokens else np.empty(0, np.int32)
            transport.send(self.constructors[dest], payload, [buffer])
        for gpos in set(msg.gpos):
            self.held_tokens -= len(self.held.pop(gpos))

    def _read_next(self) -> None:
        """Tokenize the next chunk of the current block, opening the next block when needed."""
        if self.visit is None:
            self.visit = self._open_visit()
            if self.visit is None:
                return
        visit = self.visit
        end = chunk_end(visit.sizes, visit.at, CHUNK_BYTES)
        local = visit.local_rows[visit.at : end]
        tokens = self.tokenize(visit.column.take(pa.array(local)))
        self._report(visit.gpos_start + visit.at, visit.first_row + local, tokens)
        visit.at = end
        if end == len(visit.local_rows):
            self.visit = None

    def _open_visit(self) -> _Visit | None:
        """Read (not yet tokenize) the column of this loader's next block."""
        if self.upcoming is None:
            return None
        order, k = self.upcoming
        self.upcoming = next(self.visits, None)
        block = self.blocks[int(order.block_perm[k])]
        groups = self.src.row_groups[block.first_rg : block.first_rg + block.num_rg]
        column = pa.concat_arrays([self.reader.read(rg, self.src.column) for rg in groups])
        local_rows = order.rows_of_visit(k) - block.first_row
        sizes = cell_sizes(column)[local_rows]
        gpos_start = order.epoch * order.num_rows + int(order.block_starts[k])
        return _Visit(gpos_start, block.first_row, local_rows, column, sizes)

    def _report(self, gpos_start: int, rows: np.ndarray, tokens: list[np.ndarray]) -> None:
        """Keep the tokens; tell the Planner their lengths (it decides on long samples)."""
        for offset, t in enumerate(tokens):
            self.held[gpos_start + offset] = t
            self.held_tokens += len(t)
        meta = Meta(
            source=self.source,
            gpos_start=gpos_start,
            lengths=tuple(len(t) for t in tokens),
            sample_ids=tuple(int(r) for r in rows),
        )
        transport.send(self.planner, meta)


def main(job: JobDir, source: int, index: int) -> None:
    started = time.monotonic()
    loader = Loader(job, job.recipe(), source, index)
    print(f"loader {loader.name} ready in {time.monotonic() - started:.2f} s", flush=True)
    loader.run()
