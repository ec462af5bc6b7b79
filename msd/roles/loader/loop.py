"""The Source Loader process: its shards (``msd.roles.loader.shard``), one DEALER socket to the
Planner and PUSH sockets to the Constructors; it reports lengths and sends payloads as routed."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import zmq

from msd import logs
from msd.checkpoint.resume import first_positions, latest_state
from msd.errors import SourceError
from msd.jobdir import JobDir
from msd.jobdir.rescales import load_rescales
from msd.jobdir.shadows import load_takeovers, shadows_used
from msd.plan.partition import Generation, LoaderProcess, find_process, generations, span
from msd.recipe.schema import Recipe
from msd.roles.common import STATS_EVERY_S, connect_planner, hello, process_usage
from msd.roles.footprint import cache_image_blocks
from msd.roles.loader.outage import Outage
from msd.roles.loader.payload import image_fields, patches_of, token_buffer
from msd.roles.loader.pick import NextRead
from msd.roles.loader.shard import MAX_OPEN_FILES, SourceShard
from msd.roles.outlets import Outlets
from msd.sources import cache
from msd.sources.index import open_source
from msd.sources.read import RowGroupReader, Unavailable
from msd.wire import transport
from msd.wire.protocol import (
    DISCARD,
    Adopt,
    Cut,
    CutAt,
    GenerationStart,
    Meta,
    Payload,
    Retired,
    Route,
    Stats,
    Stop,
    Want,
    Welcome,
)

log = logging.getLogger(__name__)


class Loader:
    """A loader process: its shards, one Planner connection, a PUSH socket per Constructor it
    sends to (``msd.roles.outlets``)."""

    def __init__(
        self,
        job: JobDir,
        recipe: Recipe,
        process: LoaderProcess,
        rescales: tuple[Generation, ...] = (),
        planner: zmq.Socket[Any] | None = None,
        first: dict[int, int] | None = None,
    ) -> None:
        """``planner``: a socket to it already open (a shadow's); ``first``: the position each
        source's shard reads from (a shadow taking a lost loader's place), else the job's
        checkpoint says."""
        self.job, self.recipe, self.name = job, recipe, process.name
        self.patch_values = recipe.vision.patch_values  # the width of every payload's patches
        self.reader = RowGroupReader(max_open_files=min(MAX_OPEN_FILES, 4 * len(process.shards)))
        table = generations(recipe, rescales)
        self.shards = {
            shard.source: SourceShard(recipe, shard, self.reader, span(table, shard))
            for shard in process.shards
        }
        if first is None:
            state = latest_state(job)
            if state is not None:  # a job continuing from a checkpoint
                first = dict(enumerate(first_positions(state)))
        for shard in self.shards.values():
            if first is not None:
                shard.resume_at(first[shard.source])
        self.next_read = NextRead(self.shards.values())
        self.planner = planner or connect_planner(job, f"loader/{self.name}")
        self.out = Outlets(job.keys(), recipe.constructor.fanout)

    def run(self) -> None:
        sources = tuple(self.shards)
        gens = tuple(shard.generation for shard in self.shards.values())
        transport.send(self.planner, hello("loader", self.name, sources=sources, generations=gens))
        poller = zmq.Poller()
        poller.register(self.planner, zmq.POLLIN)
        next_stats = 0.0
        while True:
            if time.monotonic() >= next_stats:
                next_stats = time.monotonic() + STATS_EVERY_S
                transport.send(self.planner, self._stats())
                if all(shard.retired for shard in self.shards.values()):
                    self._retire()
                    return
            shard = self.next_read.pick(time.monotonic())
            for _ in dict(poller.poll(0 if shard else 100)):
                if not self._handle(*transport.recv(self.planner)[1:]):
                    return
            if shard is not None:
                started = time.perf_counter()
                meta = self._read(shard)
                shard.counts.busy_s += time.perf_counter() - started
                self.next_read.changed(shard.source)
                if meta is not None:
                    transport.send(self.planner, meta)
                    if shard.next_gpos() is None:
                        # Read to its end: its counts are final now, and a short job may end
                        # before the next report would go.
                        transport.send(self.planner, self._stats())

    def _read(self, shard: SourceShard) -> Meta | None:
        """The shard's next chunk; a read its object store failed is tried again later (the
        shard set aside meanwhile), until ``loader.read_retry_s`` is spent."""
        try:
            meta = shard.read_next()
        except Unavailable as exc:
            now = time.monotonic()
            if shard.outage is None:
                shard.outage = Outage(since=now, budget_s=self.recipe.loader.read_retry_s)
                log.warning("source %s: %s; trying again", self._source_name(shard), exc.reason)
            if not shard.outage.failed(now):
                raise SourceError(self._gave_up(shard, exc)) from exc
            shard.counts.retries += 1
            return None
        if shard.outage is not None:
            log.info(
                "source %s: read again after %d retries in %.1f s",
                self._source_name(shard),
                shard.outage.retries,
                time.monotonic() - shard.outage.since,
            )
            shard.outage = None
        return meta

    def _source_name(self, shard: SourceShard) -> str:
        return f"'{self.recipe.sources[shard.source].name}'"

    def _gave_up(self, shard: SourceShard, exc: Unavailable) -> str:
        outage = shard.outage
        assert outage is not None
        return (
            f"source {self._source_name(shard)} (sources[{shard.source}]): its object store "
            f"failed every read of '{exc.file}' for {time.monotonic() - outage.since:.0f} s "
            f"({outage.retries} retries, loader.read_retry_s {outage.budget_s:g}; last: "
            f"{exc.reason}); the job stops here: once the store answers, `msd restore "
            f"{self.job.root}` continues it from its last checkpoint"
        )

    def _retire(self) -> None:
        """Every shard was replaced by a newer generation and holds nothing: leave a note for
        the launcher (this exit is not a failure), tell the Planner, exit."""
        marker = self.job.retired(self.name)
        marker.parent.mkdir(exist_ok=True)
        marker.write_text(self.name)
        transport.send(self.planner, Retired(name=self.name))
        log.info("replaced by a newer generation; retired")

    def _stats(self) -> Stats:
        cpu_s, pss = process_usage()
        loads = tuple(shard.load() for shard in self.shards.values())
        host = socket.gethostname()
        blocks = cache.counts()
        return Stats(
            "loader",
            self.name,
            host,
            os.getpid(),
            cpu_s,
            pss,
            sources=loads,
            cache_hits=blocks.hits,
            cache_misses=blocks.misses,
            cache_fetched_bytes=blocks.fetched_bytes,
        )

    def _handle(self, msg: Any, buffers: list[memoryview]) -> bool:
        if isinstance(msg, Welcome):
            self.out.welcome(msg)
        elif isinstance(msg, Route):
            self._route(msg)
        elif isinstance(msg, Want):
            shard = self.shards[msg.source]
            shard.want = max(shard.want, msg.gpos)
            self.next_read.changed(msg.source)
        elif isinstance(msg, Cut):
            transport.send(self.planner, CutAt(msg.source, self.shards[msg.source].cursor.cut()))
            self.next_read.changed(msg.source)
        elif isinstance(msg, GenerationStart):
            shard = self.shards[msg.source]
            if shard.generation == msg.generation:
                shard.cursor.begin(msg.start)
            elif shard.generation < msg.generation and shard.cursor.stop is None:
                shard.cursor.end_at(msg.start)
            self.next_read.changed(msg.source)
        elif isinstance(msg, Stop):
            return False
        return True

    def _route(self, msg: Route) -> None:
        """One payload message per Constructor sent to: the routed samples' tokens back to
        back, and, when it relays them, the Constructor each is for."""
        logs.set_step(msg.step)
        routed = zip(msg.source, msg.gpos, msg.constructor, strict=True)
        kept = (e for e in routed if e[2] != DISCARD)  # a discarded sample is only forgotten
        for hop, entries in self.out.tree.by_entry(kept).items():
            payload, buffers = self._payload(msg.step, [e[:2] for e in entries])
            if any(e[2] != hop for e in entries):
                payload = msgspec.structs.replace(payload, to=tuple(e[2] for e in entries))
            self.out.send(hop, payload, buffers)
        for source, gpos in set(zip(msg.source, msg.gpos, strict=True)):
            self.shards[source].forget(gpos)
            self.next_read.changed(source)

    def _payload(self, step: int, keys: list[tuple[int, int]]) -> tuple[Payload, list[np.ndarray]]:
        """The tokens of these samples back to back, and their images' patches if any."""
        tokens = [self.shards[source].held[gpos] for source, gpos in keys]
        buffer = token_buffer(tokens)
        pixels = [self.shards[source].pixels.get(gpos) for source, gpos in keys]
        payload = Payload(
            step=step,
            source=tuple(source for source, _ in keys),
            gpos=tuple(gpos for _, gpos in keys),
            lengths=tuple(len(t) for t in tokens),
            token_dtype=str(buffer.dtype),
        )
        trained = [self.shards[source].trained.get(gpos) for source, gpos in keys]
        if any(t is not None for t in trained):  # a conversation: its spans; a document: whole
            spans = [
                np.array([[0, len(ids)]] if len(ids) else np.zeros((0, 2)), np.int64)
                if t is None
                else t
                for t, ids in zip(trained, tokens, strict=True)
            ]
            payload = msgspec.structs.replace(
                payload,
                trained=tuple(len(s) for s in spans),
                spans=tuple(np.concatenate(spans).reshape(-1).tolist()),
            )
        fields = image_fields(pixels, self.patch_values)
        if not fields:
            return payload, [buffer]
        held = [(key, p) for key, p in zip(keys, pixels, strict=True) if p is not None]

        def write(i: int, rows: np.ndarray) -> None:
            source, gpos = held[i][0]
            self.shards[source].write_images(gpos, rows)

        patches = patches_of([p for _, p in held], self.patch_values, write)
        return msgspec.structs.replace(payload, **fields), [buffer, patches]


def stand_by(
    job: JobDir, recipe: Recipe, process: LoaderProcess
) -> tuple[zmq.Socket[Any], Adopt] | None:
    """A shadow: keep the source open and report once a second until the Planner hands over a
    lost loader's place (``Adopt``); None if the job stops first."""
    assert process.standby is not None
    source = process.standby
    open_source(recipe.sources[source], f"sources[{source}]")  # its files' metadata, warm
    planner = connect_planner(job, f"loader/{process.name}")
    transport.send(planner, hello("loader", process.name, sources=(source,), standby=source))
    log.info("standing by for source %s", recipe.sources[source].name)
    next_stats = 0.0
    while True:
        if time.monotonic() >= next_stats:
            next_stats = time.monotonic() + STATS_EVERY_S
            cpu_s, pss = process_usage()
            host = socket.gethostname()
            transport.send(planner, Stats("loader", process.name, host, os.getpid(), cpu_s, pss))
        if planner.poll(100):
            msg = transport.recv(planner)[1]
            if isinstance(msg, Adopt):
                return planner, msg
            if isinstance(msg, Stop):
                return None


def main(job: JobDir, name: str) -> None:
    started = time.monotonic()
    # The C library's allocator, trimmed each time a visit lets go of a block (``Visit``),
    # gives freed blocks back; Arrow's default pool keeps them, tens of MB per process with many
    # sources.
    pa.set_memory_pool(pa.system_memory_pool())
    recipe = job.recipe()
    rescales = load_rescales(job.rescales, recipe)
    used = shadows_used(recipe, load_takeovers(job.shadows, recipe))
    process = find_process(recipe, name, rescales, used)
    planner, first = None, None
    if process.standby is not None:
        adopted = stand_by(job, recipe, process)
        if adopted is None:
            return
        planner, adopt = adopted
        rescales = load_rescales(job.rescales, recipe)
        process = find_process(recipe, adopt.name, rescales, used)
        first = dict(zip(process.sources, adopt.first, strict=True))
        log.info("now loader %s, from positions %s", adopt.name, adopt.first)
    if any(recipe.sources[s].has_videos for s in process.sources):
        cache_image_blocks()  # frame after frame of the same sizes (msd.roles.footprint)
    loader = Loader(job, recipe, process, rescales, planner, first)
    elapsed_s = time.monotonic() - started
    log.info("loader %s (%d sources) ready in %.2f s", loader.name, len(loader.shards), elapsed_s)
    loader.run()
