"""Planner: the one process that decides the stream and holds the job's state.

It sees metadata only (sample lengths reported by loaders), plans each global step with the pure
``msd.plan.step.plan_step``, tells each Constructor what its ranks get and each loader where to
send which payload, and stays at most ``prefetch_steps`` ahead of the slowest trainer rank.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from msd.checkpoint.format import Counters, Delta, Snapshot, Totals
from msd.checkpoint.resume import needed
from msd.checkpoint.signing import signing_key
from msd.checkpoint.store import CheckpointStore
from msd.control.history import change_json, load_history, make_change, write_history
from msd.control.metrics import Histogram, MetricsServer
from msd.control.rescales import load_rescales, write_rescales
from msd.control.shadows import Takeover, load_takeovers, write_takeovers
from msd.control.view import JobObserver, metrics_line
from msd.errors import CheckpointError, MsdError, ProtocolError, SourceError
from msd.jobdir import REWIND_EXIT, JobDir
from msd.plan import autoscale
from msd.plan.lifecycle import SampleGraph
from msd.plan.partition import Generation, generations, loader_processes
from msd.plan.spec import stream_spec, topology_of
from msd.plan.step import EndOfStream, NeedData, PlannerState, StepPlan, plan_step
from msd.recipe.schema import Recipe, stream_fingerprint, to_json
from msd.roles.admission import refusal
from msd.roles.common import FAILURE_PREFIX
from msd.sources.index import open_source
from msd.wire import transport
from msd.wire.protocol import (
    DISCARD,
    PROTOCOL_VERSION,
    Adopt,
    CheckpointTaken,
    ConstructorInfo,
    Cut,
    CutAt,
    End,
    Failure,
    GenerationStart,
    Hello,
    LoaderLost,
    Meta,
    MixSet,
    Plan,
    Progress,
    Refused,
    Rescale,
    Rescaling,
    Retired,
    Rewind,
    Rewinding,
    Route,
    SetMix,
    Stats,
    Status,
    StatusRequest,
    StatusView,
    Stop,
    TakeCheckpoint,
    Want,
    Welcome,
)
from msd.wire.rejects import Rejects

log = logging.getLogger(__name__)
TICK_S = 1.0  # how often the Planner refreshes its view (status, metrics)

# Metadata only: a row group's sample lengths are a few MB at most.
MAX_MESSAGE_BYTES = 256 << 20


class Peer:
    def __init__(self, identity: bytes, hello: Hello) -> None:
        self.identity = identity
        self.hello = hello


class Planner:
    def __init__(self, job: JobDir, recipe: Recipe) -> None:
        self.job = job
        self.recipe = recipe
        num_rows = tuple(
            open_source(s, f"sources[{i}]").num_rows for i, s in enumerate(recipe.sources)
        )
        self.changes = load_history(job.mix_history, recipe)
        self.spec = stream_spec(recipe, num_rows, self.changes)
        self.store = CheckpointStore(
            job.checkpoints, recipe.checkpoint.keep, signing_key(job.keys())
        )
        resumed = self.store.find() if self.store.snapshots() else None
        self.state = (
            resumed.snapshot.state if resumed else PlannerState.initial(len(recipe.sources))
        )
        self.start = self.state  # positions below its cursors were placed before it
        self.states = {self.state.step: self.state}  # at each step planned, not yet logged
        self.logged = self.state.step
        keys = job.keys()
        ctx = transport.context()
        self.auth = transport.admit_only(ctx, keys)  # only holders of the job's key get in
        self.sock, endpoint = transport.bind(ctx, zmq.ROUTER, keys, MAX_MESSAGE_BYTES)
        self.rescales = list(load_rescales(job.rescales, recipe))
        self.takeovers = list(load_takeovers(job.shadows, recipe))
        self.expected_loaders = {
            p.name for p in loader_processes(recipe, self.rescales) if p.standby is None
        }
        self.seen_loaders: set[str] = set()
        self.standby: dict[int, list[Peer]] = {}  # source → its shadows, waiting
        self.last_seen: dict[bytes, float] = {}  # a loader's (or shadow's) last message
        # Per step not yet built everywhere: what each loader was told to send (identity →
        # (source, gpos) → destinations), so a shadow can send it if that loader is lost.
        self.inflight: dict[int, dict[bytes, dict[tuple[int, int], set[int]]]] = {}
        self.reroute: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}
        self.lost: set[bytes] = set()
        self.cut_at: dict[int, dict[bytes, int | None]] = {}  # source → its current shards' replies
        auto = recipe.loader.autoscale
        self.autoscale = (
            autoscale.Settings(
                max_loaders=auto.max_loaders or os.cpu_count() or 1,
                lead_s=auto.lead_s,
                headroom=auto.headroom,
            )
            if auto.enabled
            else None
        )
        self.low_for = [0] * len(recipe.sources)
        self.next_scale = 0.0
        self.loaders: dict[str, Peer] = {}
        self.constructors: list[Peer] = []
        self.topology = topology_of(recipe)
        self.ranks: set[int] = set()
        self.dp_constructors: dict[int, set[int]] = {}
        self.known: dict[int, dict[int, tuple[int, int, bytes]]] = {
            i: {} for i in range(len(recipe.sources))
        }
        self.constructor_consumed: dict[int, int] = {}
        self.step_tokens: dict[int, int] = {}
        self.step_sources: dict[int, np.ndarray] = {}
        totals = resumed.snapshot.totals if resumed else Totals()
        self.tokens_consumed = totals.tokens
        self.source_samples = np.zeros(len(recipe.sources), dtype=np.int64)
        self.source_tokens = np.zeros(len(recipe.sources), dtype=np.int64)
        if totals.source_samples:
            self.source_samples += np.array(totals.source_samples, dtype=np.int64)
            self.source_tokens += np.array(totals.source_tokens, dtype=np.int64)
        self.step_source_tokens: dict[int, np.ndarray] = {}
        # The long-sample counters of the steps consumed (checkpointed), and of each step
        # planned but not consumed yet (counted once consumed: a restart plans them again).
        self.counters = resumed.snapshot.counters if resumed else Counters()
        self.step_counters: dict[int, Counters] = {}
        self.warned_truncated: set[int] = set()  # sources whose truncation was logged
        self.counted = self.state.step
        self.observer = JobObserver(tuple(s.name for s in recipe.sources))
        self.next_tick = 0.0
        self.next_line = 0.0
        self.wait_hist, self.plan_hist = Histogram(), Histogram()
        self.metrics: MetricsServer | None = None
        if recipe.metrics.port is not None:
            host, advertised = transport.bind_host()
            self.metrics = MetricsServer(host, recipe.metrics.port, advertised)
            job.publish("metrics", self.metrics.endpoint)
        self.num_steps: int | None = None
        self.wanted: dict[int, int] = {}
        self.blocked: tuple[int, int] | None = None  # the (source, gpos) planning waits for
        self.step_bytes: dict[int, int] = {}
        self.built: dict[int, int] = {}
        self.graph = SampleGraph(window=max(64, 4 * recipe.constructor.prefetch_steps))
        self.started = time.monotonic()
        self.failure = ""
        self.rejects = Rejects("planner")
        self.peer_roles: dict[bytes, str] = {}  # a registered peer's role
        self.running = False
        self.rewind_to: int | None = None
        if resumed is not None:
            print(f"planner: continuing from step {self.state.step} ({resumed.path})", flush=True)
            for problem in resumed.passed_over:
                print(f"planner: passed over: {problem}", flush=True)
        self.checkpoints = recipe.checkpoint.enabled
        if self.checkpoints:
            self.snapshot()  # the log goes on after it
        job.publish("planner", endpoint)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while True:
            if dict(poller.poll(50)) and not self._drain():
                return
            if self.rewind_to is not None:
                return
            if self.running:
                self._plan_ahead()
                if self.logged < self.consumed:
                    due = self._log_consumed()
                    self._count_consumed()  # the snapshot's totals are those of its step
                    if due:
                        self.snapshot(wait=False)
            if time.monotonic() >= self.next_tick:
                self._tick()
            if self.autoscale is not None and self.running and time.monotonic() >= self.next_scale:
                self.next_scale = time.monotonic() + self.recipe.loader.autoscale.every_s
                self._autoscale()

    def _drain(self) -> bool:
        """Handle every queued message; False once the job is told to stop."""
        while self.sock.poll(0):
            received = transport.recv_or_drop(self.sock, self.rejects)
            if received is None:
                continue
            identity, msg, _ = received
            assert identity is not None  # a ROUTER socket always names the sender
            if isinstance(msg, Stop):
                self._broadcast(msg)
                if self.running:
                    self._metrics_line()  # the last step reached, for `msd ls`
                return False
            self._handle(identity, msg)
        return True

    def _handle(self, identity: bytes, msg: Any) -> None:
        if identity in self.lost:
            return  # a loader taken for lost (hung) that woke up: a shadow has its place
        sender = self.peer_roles.get(identity)
        if sender is None and isinstance(msg, Failure) and identity.startswith(FAILURE_PREFIX):
            # a role reports its crash on a socket of its own: ``failure/`` + its identity
            sender = self.peer_roles.get(identity[len(FAILURE_PREFIX) :])
        why = refusal(msg, sender, len(self.recipe.sources), self.topology.world_size)
        if why is not None:
            self.rejects.count("unexpected" if sender is None else "invalid", why)
            return
        self.last_seen[identity] = time.monotonic()
        if isinstance(msg, Meta):
            self._on_meta(identity, msg)
        elif isinstance(msg, Progress):
            self._on_progress(identity, msg)
        elif isinstance(msg, Hello):
            self._on_hello(identity, msg)
        elif isinstance(msg, Stats):
            self.observer.on_stats(identity.hex(), msg, time.monotonic())
        elif isinstance(msg, StatusRequest):
            transport.send(self.sock, self.status(), to=identity)
        elif isinstance(msg, SetMix):
            transport.send(self.sock, self._on_set_mix(msg), to=identity)
        elif isinstance(msg, Rescale):
            transport.send(self.sock, self._on_rescale(msg), to=identity)
        elif isinstance(msg, TakeCheckpoint):
            transport.send(self.sock, self._on_take_checkpoint(), to=identity)
        elif isinstance(msg, Rewind):
            transport.send(self.sock, self._on_rewind(msg), to=identity)
        elif isinstance(msg, LoaderLost):
            self._lost(msg.name, "its process died")
        elif isinstance(msg, CutAt):
            self._on_cut_at(identity, msg)
        elif isinstance(msg, Retired):
            self.loaders.pop(msg.name, None)
            self.observer.on_retired(identity.hex())
        elif isinstance(msg, Failure):
            self.failure = f"{msg.role} {msg.name}: {msg.error}"
            print(f"failure reported by {msg.role} {msg.name}:\n{msg.traceback}", flush=True)
        else:
            raise ProtocolError(f"the planner got an unexpected {type(msg).__name__}")

    # -- registration -------------------------------------------------------------------------
    def _on_hello(self, identity: bytes, msg: Hello) -> None:
        if msg.version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"{msg.role} {msg.name} speaks protocol {msg.version}, "
                f"the planner {PROTOCOL_VERSION}"
            )
        self.observer.on_hello(identity.hex(), msg)
        self.peer_roles[identity] = msg.role
        if msg.role == "loader" and msg.standby >= 0:
            self.standby.setdefault(msg.standby, []).append(Peer(identity, msg))
        elif msg.role == "loader":
            self.loaders[msg.name] = Peer(identity, msg)
            self.seen_loaders.add(msg.name)
            if self.running:  # a rescale's new loader, or a shadow taking a lost one's place
                transport.send(self.sock, self._welcome(), to=identity)
                for source in msg.sources:
                    self._maybe_cut(source)
                    if source in self.wanted:
                        want = Want(source=source, gpos=self.wanted[source])
                        transport.send(self.sock, want, to=identity)
        elif msg.role == "constructor":
            taken = self.ranks & set(msg.ranks)
            if taken:
                raise ProtocolError(
                    f"constructor {msg.name} offers ranks {sorted(taken)} that another "
                    "constructor serves; start one constructor per node"
                )
            index = len(self.constructors)
            for rank in msg.ranks:
                dp = self.topology.coords(rank).dp
                self.dp_constructors.setdefault(dp, set()).add(index)
            self.ranks.update(msg.ranks)
            self.constructor_consumed[index] = self.start.step
            self.constructors.append(Peer(identity, msg))
        if not self.running and self._all_registered():
            self._start()

    def _all_registered(self) -> bool:
        everyone = set(range(self.topology.world_size))
        return self.expected_loaders <= self.seen_loaders and self.ranks == everyone

    def _welcome(self) -> Welcome:
        infos = tuple(
            ConstructorInfo(c.hello.name, c.hello.endpoints["payload"]) for c in self.constructors
        )
        return Welcome(constructors=infos)

    def _start(self) -> None:
        for peer in self.loaders.values():
            transport.send(self.sock, self._welcome(), to=peer.identity)
        self.running = True
        self.started = time.monotonic()
        print(
            f"planner: {len(self.loaders)} loaders, {len(self.constructors)} constructors",
            flush=True,
        )
        for source in range(len(self.recipe.sources)):
            self._maybe_cut(source)  # a rescale still starting when the data plane restarted

    # -- metadata and progress ----------------------------------------------------------------
    def _on_meta(self, identity: bytes, msg: Meta) -> None:
        known = self.known[msg.source]
        unneeded = []
        rerouted: dict[int, list[tuple[int, int, int]]] = {}
        for offset, (length, sample_id) in enumerate(zip(msg.lengths, msg.sample_ids, strict=True)):
            gpos = msg.gpos_start + offset
            if (msg.source, gpos) in self.reroute:  # a lost loader's: to the step it was for
                step, dests = self.reroute.pop((msg.source, gpos))
                rerouted.setdefault(step, []).extend((msg.source, gpos, d) for d in dests)
            elif not needed(self.state, msg.source, gpos):
                unneeded.append(gpos)  # placed already (before a restart, or by a lost loader)
            else:
                known[gpos] = (length, sample_id, identity)
        for step, entries in rerouted.items():
            route = Route(
                step=step,
                source=tuple(e[0] for e in entries),
                gpos=tuple(e[1] for e in entries),
                constructor=tuple(e[2] for e in entries),
            )
            transport.send(self.sock, route, to=identity)
        if unneeded:
            route = Route(
                step=self.start.step,
                source=(msg.source,) * len(unneeded),
                gpos=tuple(unneeded),
                constructor=(DISCARD,) * len(unneeded),
            )
            transport.send(self.sock, route, to=identity)

    def _on_progress(self, identity: bytes, msg: Progress) -> None:
        index = next(i for i, c in enumerate(self.constructors) if c.identity == identity)
        self.constructor_consumed[index] = max(self.constructor_consumed[index], msg.consumed)
        self.step_bytes[index] = max(self.step_bytes.get(index, 0), msg.step_bytes)
        self.built[index] = max(self.built.get(index, 0), msg.built)
        self.graph.on_delivered(min(self.built.values()))
        if len(self.built) == len(self.constructors):
            for step in [s for s in self.inflight if s < min(self.built.values())]:
                del self.inflight[step]
        self.observer.on_waits(msg.waits_s)
        self.wait_hist.observe_many(msg.waits_s)
        due = self._log_consumed()
        self._count_consumed()
        if due:
            self.snapshot(wait=False)

    @property
    def consumed(self) -> int:
        """Steps that every rank has consumed."""
        return min(self.constructor_consumed.values(), default=0)

    def _log_consumed(self) -> bool:
        """A log line per step newly consumed by every rank; whether a snapshot is due."""
        due = False
        every = self.recipe.checkpoint.every_steps
        if not self.checkpoints:  # nothing written; the states are not kept either
            for step in [s for s in self.states if s < self.consumed]:
                del self.states[step]
            self.logged = max(self.states)
            return False
        # Ranks may be ahead of what this Planner has planned (it restarted behind them):
        # the log follows the steps as they are planned.
        while self.logged < self.consumed and self.logged + 1 in self.states:
            step = self.logged + 1
            before = self.states.pop(self.logged)
            tokens = self.step_tokens.get(self.logged, 0)
            counters = self.step_counters.get(self.logged)
            sources = self._step_sources(self.logged)
            self.store.append(Delta.between(before, self.states[step], tokens, sources, counters))
            self.logged = step
            due = due or (every > 0 and step % every == 0)
        return due

    def snapshot(self, wait: bool = True) -> tuple[Path, int, float]:
        """Write the state at the step every rank has consumed; (path, bytes, seconds).
        ``wait=False``: the file is written in the background (bytes then reads 0)."""
        started = time.perf_counter()
        snap = Snapshot(
            state=self.states[self.logged],
            fingerprint=stream_fingerprint(self.recipe),
            recipe=json.loads(to_json(self.recipe)),
            num_rows=self.spec.num_rows,
            mix_history=tuple(change_json(self.recipe, c) for c in self.changes),
            totals=Totals(
                self.tokens_consumed,
                tuple(int(x) for x in self.source_samples),
                tuple(int(x) for x in self.source_tokens),
            ),
            created=time.time(),
            counters=self.counters,
        )
        path = self.store.write_snapshot(snap, wait=wait)
        size = path.stat().st_size if wait else 0
        return path, size, time.perf_counter() - started

    def _on_take_checkpoint(self) -> CheckpointTaken | Refused:
        if not self.checkpoints:
            return Refused(reason="this job's recipe has checkpoint.enabled: false")
        try:
            path, size, seconds = self.snapshot()
        except OSError as exc:
            return Refused(reason=f"cannot write a checkpoint in {self.store.root}: {exc}")
        print(f"planner: checkpoint of step {self.logged} at {path}", flush=True)
        return CheckpointTaken(step=self.logged, path=str(path), bytes=size, seconds=seconds)

    def _on_rewind(self, msg: Rewind) -> Rewinding | Refused:
        """A trainer restored an earlier checkpoint: make the state at ``msg.step`` the latest
        and exit, for the launcher to restart the data plane there."""
        if self.rewind_to is not None:
            return Rewinding(step=self.rewind_to)
        if msg.step > self.logged:
            return Refused(reason=f"step {msg.step} was not reached yet; nothing to go back to")
        try:
            found = self.store.find(msg.step)
            self.store.rewind(found.snapshot)
        except (CheckpointError, OSError) as exc:
            return Refused(reason=f"cannot go back to step {msg.step}: {exc}")
        print(f"planner: a trainer went back to step {msg.step}; restarting there", flush=True)
        self.rewind_to = msg.step
        return Rewinding(step=msg.step)

    def _lost(self, name: str, why: str) -> None:
        """Loader ``name`` died or hung: a shadow of its source takes its place: it reads the
        lost loader's shards from the first position still needed, and what the lost one
        was told to send to steps not built yet goes to those steps again."""
        peer = self.loaders.pop(name, None)
        if peer is None:  # a shadow, or gone already
            for source, peers in self.standby.items():
                self.standby[source] = [p for p in peers if p.hello.name != name]
            return
        self.observer.on_retired(peer.identity.hex())
        self.lost.add(peer.identity)
        sources = peer.hello.sources
        shadows = self.standby.get(sources[0], []) if len(sources) == 1 else []
        if not shadows:
            print(f"planner: loader {name} lost ({why}); no shadow stands by", flush=True)
            return
        shadow = shadows.pop(0)
        for step, routes in self.inflight.items():
            for (source, gpos), dests in routes.get(peer.identity, {}).items():
                self.reroute[(source, gpos)] = (step, tuple(dests))
        for source in sources:  # what it reported and held is gone with it
            known = self.known[source]
            for gpos in [g for g, entry in known.items() if entry[2] == peer.identity]:
                del known[gpos]
        self.blocked = None
        first = tuple(
            min(
                [
                    self.state.cursors[s],
                    *(g for src, g in self.state.carry if src == s),
                    *(g for src, g in self.reroute if src == s),
                ]
            )
            for s in sources
        )
        transport.send(self.sock, Adopt(name=name, first=first), to=shadow.identity)
        self.takeovers.append(
            Takeover(name, shadow.hello.name, sources[0], self.consumed, time.time())
        )
        write_takeovers(self.job.shadows, self.recipe, self.takeovers)
        print(f"planner: loader {name} lost ({why}); {shadow.hello.name} takes over", flush=True)

    def _check_heartbeats(self) -> None:
        """A loader or shadow silent for ``loader.heartbeat_s`` is taken for lost."""
        limit = time.monotonic() - self.recipe.loader.heartbeat_s
        for name, peer in list(self.loaders.items()):
            if self.last_seen.get(peer.identity, limit + 1) < limit:
                self._lost(name, f"silent for {self.recipe.loader.heartbeat_s:g} s")
        for source, peers in self.standby.items():
            self.standby[source] = [p for p in peers if self.last_seen.get(p.identity, 0) >= limit]

    def _count_consumed(self) -> None:
        self.graph.on_consumed(self.consumed)
        while self.counted < self.consumed and self.counted in self.step_tokens:
            self.tokens_consumed += self.step_tokens.pop(self.counted)
            self.source_samples += self.step_sources.pop(self.counted)
            self.source_tokens += self.step_source_tokens.pop(self.counted)
            self.counters += self.step_counters.pop(self.counted, Counters())
            self.counted += 1

    def _step_sources(self, step: int) -> tuple[tuple[int, int, int], ...]:
        """(source, samples, tokens) a planned step delivers, sources with none left out."""
        samples, tokens = self.step_sources.get(step), self.step_source_tokens.get(step)
        if samples is None or tokens is None:
            return ()
        pairs = zip(samples.tolist(), tokens.tolist(), strict=True)
        return tuple((s, n, t) for s, (n, t) in enumerate(pairs) if n or t)

    # -- planning -----------------------------------------------------------------------------
    def _lookup(self, source: int, gpos: int) -> int | None:
        entry = self.known[source].get(gpos)
        return None if entry is None else entry[0]

    def _plan_ahead(self) -> None:
        if self.blocked is not None:  # planning would stop at the same sample again
            source, gpos = self.blocked
            if gpos not in self.known[source]:
                return
            self.blocked = None
        limit = self.consumed + self.recipe.constructor.prefetch_steps
        while self.num_steps is None and self.state.step < limit:
            started = time.perf_counter()
            result = plan_step(self.spec, self.state, self._lookup)
            if isinstance(result, NeedData):
                self.blocked = (result.source, result.gpos)
                self._want(result)
                return
            if isinstance(result, EndOfStream):
                self.num_steps = result.step
                for c in self.constructors:
                    transport.send(self.sock, End(num_steps=result.step), to=c.identity)
                return
            plan, self.state = result
            if not plan.pieces.columns[2].any():
                raise SourceError(self._no_tokens(plan))
            self.states[self.state.step] = self.state
            self._dispatch(plan)
            seconds = time.perf_counter() - started
            self.observer.on_plan(seconds, self._rank_costs(plan))
            self.plan_hist.observe(seconds)

    def _no_tokens(self, plan: StepPlan) -> str:
        """Why a step that holds nothing but empty samples stops the job (it would be padding)."""
        drawn = sorted({self.recipe.sources[s].name for s in plan.pieces.columns[0].tolist()})
        return (
            f"step {plan.step} holds no tokens: all {plan.counts.empty} samples drawn for it from "
            f"{', '.join(drawn)} are empty (null or empty text, or 0 tokens after the transform); "
            "check those sources' text_column and transform"
        )

    def _want(self, need: NeedData) -> None:
        """Tell the loaders of every source planning waits for (or soon will) which position it
        needs, once per position: all at once, not one round trip each."""
        furthest: dict[int, int] = {}
        for source, gpos in ((need.source, need.gpos), *need.soon):
            furthest[source] = max(gpos, furthest.get(source, -1))
        for source, gpos in furthest.items():
            if self.wanted.get(source, -1) >= gpos:
                continue
            self.wanted[source] = gpos
            for peer in self.loaders.values():
                if source in peer.hello.sources:
                    transport.send(self.sock, Want(source=source, gpos=gpos), to=peer.identity)

    def _dispatch(self, plan: StepPlan) -> None:
        """Each Constructor its DP ranks' rows; each loader where to send what it holds."""
        per_constructor: dict[int, list[tuple[int, int, int, int, int, int, int, int]]] = {}
        routes: dict[bytes, dict[tuple[int, int], set[int]]] = {}
        counts = np.zeros(len(self.recipe.sources), dtype=np.int64)
        tokens = np.zeros(len(self.recipe.sources), dtype=np.int64)
        for dp, rank_rows in enumerate(plan.rows):
            dests = self.dp_constructors[dp]
            for row, slots in enumerate(rank_rows):
                for slot in slots:
                    _, sample_id, loader = self.known[slot.source][slot.gpos]
                    entry = (
                        dp,
                        row,
                        slot.source,
                        slot.gpos,
                        sample_id,
                        slot.length,
                        slot.offset,
                        slot.padded,
                    )
                    for dest in dests:
                        per_constructor.setdefault(dest, []).append(entry)
                    key = (slot.source, slot.gpos)
                    routes.setdefault(loader, {}).setdefault(key, set()).update(dests)
                    counts[slot.source] += slot.offset == 0
                    tokens[slot.source] += slot.length
        for source, gpos in plan.dropped:
            loader = self.known[source][gpos][2]
            routes.setdefault(loader, {})[(source, gpos)] = {DISCARD}
        self.inflight[plan.step] = routes  # kept as is: a lost loader's are sent again
        for loader, by_key in routes.items():  # one Route per loader process
            for source, gpos in by_key:
                self.known[source].pop(gpos)
            entries = [(*key, d) for key, ds in sorted(by_key.items()) for d in sorted(ds)]
            route = Route(
                step=plan.step,
                source=tuple(e[0] for e in entries),
                gpos=tuple(e[1] for e in entries),
                constructor=tuple(e[2] for e in entries),
            )
            transport.send(self.sock, route, to=loader)
        for index, c in enumerate(self.constructors):
            plan_msg = Plan(step=plan.step, slots=tuple(per_constructor.get(index, [])))
            transport.send(self.sock, plan_msg, to=c.identity)
        keys = {(s.source, s.gpos) for s in plan.slots}
        self.graph.on_assigned(plan.step, keys, carried=self.state.carry)
        self.step_tokens[plan.step] = sum(s.length for s in plan.slots)
        self.step_sources[plan.step] = counts
        self.step_source_tokens[plan.step] = tokens
        done = plan.counts
        self._warn_truncated(done.truncated_tokens)
        self.step_counters[plan.step] = Counters(
            done.split, done.truncated, done.dropped, done.truncated_tokens, done.empty
        )

    def _warn_truncated(self, truncated_tokens: tuple[tuple[int, int], ...]) -> None:
        """Once per source: its samples lose tokens to ``long_samples`` (the summary counts)."""
        for source, tokens in truncated_tokens:
            if source not in self.warned_truncated:
                self.warned_truncated.add(source)
                log.warning(
                    "source %s: a sample lost %d tokens to long_samples: %s (seq_len %d, "
                    "%d rows a step); the run summary counts every one (truncated_tokens)",
                    self.recipe.sources[source].name,
                    tokens,
                    self.recipe.balance.long_samples,
                    self.recipe.seq_len,
                    self.spec.global_rows,
                )

    # -- status and shutdown ------------------------------------------------------------------
    def _broadcast(self, msg: Stop) -> None:
        shadows = [p for peers in self.standby.values() for p in peers]
        for peer in [*self.loaders.values(), *shadows, *self.constructors]:
            transport.send(self.sock, msg, to=peer.identity)

    def _rank_costs(self, plan: StepPlan) -> np.ndarray:
        """Each DP rank's cost in this step (what balance is judged by)."""
        pieces = plan.pieces
        running = np.concatenate(([0.0], np.cumsum(self.spec.cost(pieces.columns[2]))))
        row_costs = running[pieces.bounds[1:]] - running[pieces.bounds[:-1]]
        return np.asarray(row_costs.reshape(-1, plan.rows_per_rank).sum(axis=1))

    # -- control ------------------------------------------------------------------------------
    def _on_set_mix(self, msg: SetMix) -> MixSet | Refused:
        """Record a mix change in the job's history, then plan with it from its step on."""
        first_free = self.state.step  # steps before it are planned (and may be delivered)
        at = first_free if msg.at_step < 0 else msg.at_step
        if at < first_free:
            return Refused(
                reason=f"step {at} is already planned (steps 0-{first_free - 1}); "
                f"choose --at-step {first_free} or later"
            )
        if self.num_steps is not None and at >= self.num_steps:
            return Refused(reason=f"the stream ends after step {self.num_steps - 1}")
        try:
            change = make_change(self.recipe, msg.weights, at)
            schedule = self.spec.schedule.with_change(change)
            if sum(schedule.weights_at(at)) <= 0:
                return Refused(reason=f"every source would have weight 0 from step {at}")
            write_history(self.job.mix_history, self.recipe, (*self.changes, change))
        except (MsdError, OSError) as exc:
            return Refused(reason=str(exc))
        self.changes = (*self.changes, change)
        self.spec = stream_spec(self.recipe, self.spec.num_rows, self.changes)
        print(f"planner: mix {dict(msg.weights)} from step {at}", flush=True)
        return MixSet(at_step=at, weights=dict(msg.weights))

    def _on_rescale(self, msg: Rescale) -> Rescaling | Refused:
        """Start a new generation of a source's loaders: record it (the launcher starts its
        processes); once they are all up, cut it in (``_maybe_cut``)."""
        names = [s.name for s in self.recipe.sources]
        if msg.source not in names:
            return Refused(reason=f"no source named {msg.source!r} (sources: {', '.join(names)})")
        if not 1 <= msg.loaders <= 256:
            return Refused(reason=f"--loaders must be from 1 to 256, got {msg.loaders}")
        new = self._new_generation(names.index(msg.source), msg.loaders, "msd rescale")
        if isinstance(new, str):
            return Refused(reason=new)
        return Rescaling(source=msg.source, generation=new.number, loaders=msg.loaders)

    def _new_generation(self, source: int, loaders: int, reason: str) -> Generation | str:
        """Record a new generation of a source's loaders (the launcher starts them); a reason
        it cannot be, otherwise."""
        name = self.recipe.sources[source].name
        gens = generations(self.recipe, self.rescales)[source]
        if gens[-1].start is None:
            return f"{name} is being rescaled already (generation {gens[-1].number}); wait"
        new = Generation(source, len(gens), loaders, None, self.consumed, reason)
        try:
            write_rescales(self.job.rescales, self.recipe, [*self.rescales, new])
        except OSError as exc:
            return f"cannot record the rescale in {self.job.rescales}: {exc}"
        self.rescales.append(new)
        print(
            f"planner: {name} → {loaders} loaders (generation {new.number}, {reason})", flush=True
        )
        return new

    def _autoscale(self) -> None:
        """Give each source the loaders its demand over the next seconds needs."""
        assert self.autoscale is not None
        pace = self.observer.trainer_pace()
        if pace <= 0:
            return
        table = generations(self.recipe, self.rescales)
        totals = self.observer.source_totals(len(self.recipe.sources))
        loads = []
        for s, (samples, tokens, busy) in enumerate(totals):
            current = next(g for g in reversed(table[s]) if g.start is not None)
            loads.append(
                autoscale.SourceLoad(
                    current.loaders,
                    tokens / samples if samples else None,
                    tokens / busy if busy > 0.5 else None,  # half a second busy: measured
                )
            )
        needs = autoscale.needed_loaders(
            self.spec.schedule,
            loads,
            self.consumed,
            pace,
            self.recipe.global_batch_tokens,
            self.autoscale,
        )
        counts = [None if n is None else n.loaders for n in needs]
        self.low_for = [
            low + 1 if need is not None and need < load.loaders else 0
            for low, need, load in zip(self.low_for, counts, loads, strict=True)
        ]
        targets = autoscale.decide(loads, counts, self.low_for, self.autoscale)
        for s, (target, load, need) in enumerate(zip(targets, loads, needs, strict=True)):
            if target != load.loaders and table[s][-1].start is not None and need is not None:
                why = (
                    f"autoscale: {need.demand:,.0f} tokens/s needed within "
                    f"{self.autoscale.lead_s:g} s (pace {pace:.1f} steps/s), "
                    f"{need.per_loader:,.0f} per loader"
                )
                if not isinstance(self._new_generation(s, target, why), str):
                    self.low_for[s] = 0

    def _generation_peers(self, source: int, number: int) -> list[Peer]:
        return [
            p
            for p in self.loaders.values()
            if source in p.hello.sources
            and p.hello.generations[p.hello.sources.index(source)] == number
        ]

    def _maybe_cut(self, source: int) -> None:
        """Once every loader of a source's pending generation is up, ask the current ones
        where they are (``Cut``)."""
        gens = generations(self.recipe, self.rescales)[source]
        pending = gens[-1]
        if pending.start is not None or source in self.cut_at:
            return
        if len(self._generation_peers(source, pending.number)) < pending.loaders:
            return
        current = next(g for g in reversed(gens) if g.start is not None)
        peers = self._generation_peers(source, current.number)
        self.cut_at[source] = {p.identity: None for p in peers}
        for p in peers:
            transport.send(self.sock, Cut(source=source), to=p.identity)

    def _on_cut_at(self, identity: bytes, msg: CutAt) -> None:
        """When every current shard has said where it stands, the new generation starts after
        the furthest: each visit is read by exactly one shard."""
        replies = self.cut_at.get(msg.source)
        if replies is None or identity not in replies:
            self.rejects.count("invalid", f"a cut position for source {msg.source}, not asked")
            return
        replies[identity] = msg.visit
        if any(v is None for v in replies.values()):
            return
        start = max(v for v in replies.values() if v is not None)
        del self.cut_at[msg.source]
        index = next(
            i for i, g in enumerate(self.rescales) if g.source == msg.source and g.start is None
        )
        g = self.rescales[index]
        self.rescales[index] = dataclasses.replace(g, start=start)
        write_rescales(self.job.rescales, self.recipe, self.rescales)
        for p in self.loaders.values():
            if msg.source in p.hello.sources:
                start_msg = GenerationStart(source=msg.source, generation=g.number, start=start)
                transport.send(self.sock, start_msg, to=p.identity)
                older = p.hello.generations[p.hello.sources.index(msg.source)] < g.number
                if older and len(p.hello.sources) == 1:
                    self.observer.on_retiring(p.identity.hex())
        name = self.recipe.sources[msg.source].name
        print(f"planner: {name} generation {g.number} reads from visit {start}", flush=True)

    def _tick(self) -> None:
        """Refresh the view: rates, the metrics endpoint, a line of ``metrics.jsonl``."""
        now = time.monotonic()
        self.next_tick = now + TICK_S
        if self.running:
            self._check_heartbeats()
        view = self.view()
        if self.metrics is not None:
            self.metrics.update(view, self.wait_hist.snapshot(), self.plan_hist.snapshot())
        if now >= self.next_line and self.running:
            self.next_line = now + self.recipe.metrics.every_s
            self._metrics_line(view)

    def _metrics_line(self, view: StatusView | None = None) -> None:
        line = metrics_line(view or self.view(), time.time())
        with open(self.job.metrics, "a") as f:
            f.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self.store.close()
        self.sock.close(linger=1000)  # replies sent last (a rewind's) still go out
        if self.metrics is not None:
            self.metrics.close()
        self.auth.stop()

    def _state_name(self) -> str:
        done = self.num_steps is not None and self.consumed >= self.num_steps
        return "done" if done else "running" if self.running else "starting"

    def view(self) -> StatusView:
        """The job as ``msd status`` shows it, as of now."""
        now = time.monotonic()
        self.observer.on_tick(
            now, self.consumed, self.tokens_consumed, self.source_samples, self.source_tokens
        )
        step = min(self.consumed, self.num_steps or self.consumed)
        return self.observer.view(
            state=self._state_name(),
            planned=self.state.step,
            steps=self.num_steps if self.num_steps is not None else self.recipe.steps,
            uptime_s=time.monotonic() - self.started,
            failure=self.failure,
            weights=self.spec.schedule.weights_at(step),
            lifecycle=self.graph.counts(reported=sum(len(k) for k in self.known.values())),
            counts=self._counts(),
            planner_pid=os.getpid(),
            now=now,
            rejected=self.rejects.snapshot(),
        )

    def _counts(self) -> dict[str, int]:
        c = self.counters
        return {"split": c.split, "truncated": c.truncated, "dropped": c.dropped, "empty": c.empty}

    def status(self) -> Status:
        view = self.view()
        state = view.job.state
        roles = tuple(
            (p.hello.role, p.hello.name, p.hello.pid)
            for p in [*self.constructors, *self.loaders.values()]
        )
        return Status(
            state=state,
            planned=self.state.step,
            consumed=self.consumed,
            steps=self.num_steps if self.num_steps is not None else self.recipe.steps,
            elapsed_s=time.monotonic() - self.started,
            tokens_consumed=self.tokens_consumed,
            source_names=tuple(s.name for s in self.recipe.sources),
            source_samples=tuple(int(x) for x in self.source_samples),
            wait_p50_ms=view.wait_p50_ms,
            wait_p99_ms=view.wait_p99_ms,
            truncated=self.counters.truncated,
            split=self.counters.split,
            dropped=self.counters.dropped,
            truncated_tokens=self.counters.per_source(len(self.recipe.sources)),
            empty=self.counters.empty,
            constructor_step_bytes=sum(self.step_bytes.values()),
            lifecycle=view.planner.lifecycle,
            roles=(("planner", "planner", os.getpid()), *roles),
            failure=self.failure,
            view=view,
        )


def main(job: JobDir) -> None:
    planner = Planner(job, job.recipe())
    try:
        planner.run()
    finally:
        planner.close()
    if planner.rewind_to is not None:
        raise SystemExit(REWIND_EXIT)
