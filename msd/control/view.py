"""What the Planner makes of what it observes: the ``StatusView`` behind ``msd status``, the
Prometheus endpoint and ``JOB/metrics.jsonl``.

The Planner feeds a ``JobObserver`` events it already has (a step planned, waits reported,
a role's ``Stats``, a tick with the consumed totals) and asks it for a view once a second.
Rates are over the last ``WINDOW_S`` seconds; wait and plan-time percentiles over the last
steps. Nothing here touches a socket.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from msd.wire.protocol import Hello, Stats
from msd.wire.views import (
    ConstructorView,
    JobView,
    LoaderView,
    PlannerView,
    RankView,
    SourceView,
    StatusView,
)

VIEW_VERSION = 1
WINDOW_S = 10.0
SILENT_AFTER_S = 5.0  # a role that sent no Stats for this long is shown "silent"
WARM_STEPS = 20  # the trainers' pace is measured from this step on (start-up is not their pace)


@dataclass
class _Role:
    hello: Hello
    last: Stats | None = None
    last_at: float = 0.0
    cpu_percent: float = 0.0
    samples_per_s: float = 0.0
    retiring: bool = False


@dataclass
class _Totals:
    at: float
    consumed: int
    tokens: int
    samples: np.ndarray
    source_tokens: np.ndarray


def _pct(values: deque[float] | list[float], q: float) -> float:
    return float(np.percentile(np.fromiter(values, float), q)) if values else 0.0


@dataclass
class JobObserver:
    source_names: tuple[str, ...]
    roles: dict[str, _Role] = field(default_factory=dict)
    plan_s: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    balance: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    waits_s: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    totals: deque[_Totals] = field(default_factory=deque)
    paces: deque[tuple[float, float]] = field(default_factory=deque)

    # -- events -------------------------------------------------------------------------------
    def on_hello(self, key: str, hello: Hello) -> None:
        self.roles[key] = _Role(hello)

    def source_totals(self, sources: int) -> np.ndarray:
        """Per source, summed over its live loaders: samples read, tokens read, busy seconds."""
        totals = np.zeros((sources, 3))
        for role in self.roles.values():
            for load in role.last.sources if role.last else ():
                totals[load.source] += (load.samples_read, load.tokens_read, load.busy_s)
        return totals

    def trainer_pace(self, window_s: float = 3.0, memory_s: float = 30.0) -> float:
        """Steps per second the trainers would take if no step waited for data: the rate
        over the last ``window_s`` corrected for the waits in it, and the best such estimate
        of the last ``memory_s`` (a stall or start-up is not the trainers' pace; planning for
        less than it is what makes them wait)."""
        if len(self.totals) < 2:
            return 0.0
        last = self.totals[-1]
        first = next((t for t in self.totals if last.at - t.at <= window_s), last)
        if last.at - first.at >= 1.0 and first.consumed >= WARM_STEPS:
            rate = (last.consumed - first.consumed) / (last.at - first.at)
            recent = list(self.waits_s)[-200:]
            wait = sum(recent) / len(recent) if recent else 0.0
            self.paces.append((last.at, rate / max(0.05, 1.0 - rate * wait)))
        while self.paces and last.at - self.paces[0][0] > memory_s:
            self.paces.popleft()
        return max((p for _, p in self.paces), default=0.0)

    def on_retiring(self, key: str) -> None:
        """A newer generation took over this loader's only source: it finishes and exits."""
        if key in self.roles:
            self.roles[key].retiring = True

    def on_retired(self, key: str) -> None:
        self.roles.pop(key, None)

    def on_stats(self, key: str, msg: Stats, now: float) -> None:
        role = self.roles.get(key)
        if role is None:
            return
        if role.last is not None and now > role.last_at:
            dt = now - role.last_at
            role.cpu_percent = 100 * max(0.0, msg.cpu_s - role.last.cpu_s) / dt
            read = sum(s.samples_read for s in msg.sources)
            before = sum(s.samples_read for s in role.last.sources)
            role.samples_per_s = max(0, read - before) / dt
        role.last, role.last_at = msg, now

    def on_plan(self, seconds: float, rank_costs: np.ndarray) -> None:
        self.plan_s.append(seconds)
        mean = float(rank_costs.mean()) if rank_costs.size else 0.0
        if mean > 0:
            self.balance.append(float(rank_costs.max()) / mean)

    def on_waits(self, waits_s: tuple[float, ...]) -> None:
        self.waits_s.extend(waits_s)

    def on_tick(
        self,
        now: float,
        consumed: int,
        tokens: int,
        samples: np.ndarray,
        source_tokens: np.ndarray,
    ) -> None:
        self.totals.append(_Totals(now, consumed, tokens, samples.copy(), source_tokens.copy()))
        while len(self.totals) > 2 and now - self.totals[1].at >= WINDOW_S:
            self.totals.popleft()

    # -- the view -----------------------------------------------------------------------------
    def view(
        self,
        *,
        state: str,
        planned: int,
        steps: int | None,
        uptime_s: float,
        failure: str,
        weights: tuple[float, ...],
        lifecycle: dict[str, int],
        counts: dict[str, int],
        planner_pid: int,
        skipped_images: tuple[int, ...] = (),
        trained_tokens: tuple[int, ...] = (),
        now: float | None = None,
        rejected: dict[str, int] | None = None,
    ) -> StatusView:
        now = time.monotonic() if now is None else now
        first, last = self._window()
        dt = max(1e-9, last.at - first.at) if last is not None and first is not None else 0.0

        def rate(a: float, b: float) -> float:
            return float(b - a) / dt if dt > 0 else 0.0

        last_totals = last or _Totals(now, 0, 0, np.zeros(len(weights)), np.zeros(len(weights)))
        first_totals = first or last_totals
        roles = list(self.roles.values())
        loader_roles = [r for r in roles if r.hello.role == "loader"]
        constructor_roles = [r for r in roles if r.hello.role == "constructor"]
        per_source = _per_source(loader_roles, len(weights))
        loaders = [_loader_view(r, self._state(r, now)) for r in loader_roles]
        constructors = [_constructor_view(r, self._state(r, now)) for r in constructor_roles]
        ranks = [view for r in constructor_roles for view in _rank_views(r)]
        sources = _source_views(
            self.source_names,
            weights,
            first_totals,
            last_totals,
            dt,
            per_source,
            skipped_images or (0,) * len(self.source_names),
            trained_tokens or (0,) * len(self.source_names),
        )
        media = _media(loader_roles)
        sources = tuple(
            msgspec.structs.replace(v, **media[i]) if i in media else v
            for i, v in enumerate(sources)
        )
        job = JobView(
            state=state,
            step=int(last_totals.consumed),
            planned=planned,
            steps=steps,
            steps_per_s=round(rate(first_totals.consumed, last_totals.consumed), 3),
            tokens_per_s=round(rate(first_totals.tokens, last_totals.tokens), 1),
            tokens=int(last_totals.tokens),
            uptime_s=round(uptime_s, 3),
            failure=failure,
        )
        planner = PlannerView(
            pid=planner_pid,
            plan_ms_p50=round(1000 * _pct(self.plan_s, 50), 3),
            plan_ms_p99=round(1000 * _pct(self.plan_s, 99), 3),
            balance_max_over_mean=round(_pct(list(self.balance), 50) if self.balance else 0.0, 4),
            planned_ahead=int(planned - last_totals.consumed),
            lifecycle=dict(lifecycle),
            split=counts.get("split", 0),
            truncated=counts.get("truncated", 0),
            dropped=counts.get("dropped", 0),
            rejected=dict(rejected or {}),
            empty=counts.get("empty", 0),
            images=counts.get("images", 0),
            skipped_images=counts.get("skipped_images", 0),
        )
        return StatusView(
            version=VIEW_VERSION,
            job=job,
            sources=sources,
            loaders=tuple(sorted(loaders, key=lambda v: v.name)),
            constructors=tuple(sorted(constructors, key=lambda v: v.name)),
            ranks=tuple(sorted(ranks, key=lambda v: v.rank)),
            planner=planner,
            wait_p50_ms=round(1000 * _pct(self.waits_s, 50), 3),
            wait_p99_ms=round(1000 * _pct(self.waits_s, 99), 3),
        )

    def _window(self) -> tuple[_Totals | None, _Totals | None]:
        if not self.totals:
            return None, None
        return self.totals[0], self.totals[-1]

    @staticmethod
    def _state(role: _Role, now: float) -> str:
        if role.retiring:
            return "retiring"
        if role.last is None:
            return "starting"
        return "running" if now - role.last_at < SILENT_AFTER_S else "silent"


def _media(loaders: list[_Role]) -> dict[int, dict[str, Any]]:
    """Per image or video source the running loaders report on: what they left out as they
    read, by reason, and the videos they decoded (``SourceView``'s fields)."""
    found: dict[int, dict[str, Any]] = {}
    for role in loaders:
        for load in role.last.sources if role.last else ():
            if not (load.skipped or load.videos_read):
                continue
            own = found.setdefault(
                load.source, {"left_out": {}, "videos_read": 0, "video_s": 0.0, "video_cpu_s": 0.0}
            )
            for reason, n in load.skipped:
                own["left_out"][reason] = own["left_out"].get(reason, 0) + n
            own["videos_read"] += load.videos_read
            own["video_s"] = round(own["video_s"] + load.video_s, 3)
            own["video_cpu_s"] = round(own["video_cpu_s"] + load.video_cpu_s, 3)
    return found


def _per_source(loaders: list[_Role], sources: int) -> tuple[list[int], ...]:
    """Per source: loaders serving it, samples and tokens held unrouted, errors."""
    serving, held, held_tokens, errors = ([0] * sources for _ in range(4))
    for role in loaders:
        if not role.retiring:
            for s in role.hello.sources:
                serving[s] += 1
        for load in role.last.sources if role.last else ():
            held[load.source] += load.held_samples
            held_tokens[load.source] += load.held_tokens
            errors[load.source] += load.errors
    return serving, held, held_tokens, errors


def _source_views(
    names: tuple[str, ...],
    weights: tuple[float, ...],
    first: _Totals,
    last: _Totals,
    dt: float,
    per_source: tuple[list[int], ...],
    skipped_images: tuple[int, ...],
    trained_tokens: tuple[int, ...],
) -> tuple[SourceView, ...]:
    """A row per source; the arithmetic done a column at a time (a job may have thousands)."""
    norm = sum(weights) or 1.0
    shares = np.round(np.asarray(weights, dtype=np.float64) / norm, 6).tolist()
    if dt > 0:
        samples_per_s = np.round((last.samples - first.samples) / dt, 2).tolist()
        tokens_per_s = np.round((last.source_tokens - first.source_tokens) / dt, 1).tolist()
    else:
        samples_per_s = tokens_per_s = [0.0] * len(names)
    samples = last.samples.astype(np.int64).tolist()
    tokens = last.source_tokens.astype(np.int64).tolist()
    serving, held, held_tokens, errors = per_source
    columns = zip(
        names,
        shares,
        samples_per_s,
        tokens_per_s,
        samples,
        tokens,
        serving,
        held,
        held_tokens,
        errors,
        skipped_images,
        trained_tokens,
        strict=True,
    )
    return tuple(
        SourceView(
            name=name,
            weight=share,
            samples_per_s=sps,
            tokens_per_s=tps,
            samples=n,
            tokens=t,
            loaders=loaders,
            queue_samples=queued,
            queue_tokens=queued_tokens,
            errors=e,
            skipped_images=skipped,
            trained_tokens=trained,
        )
        for (
            name,
            share,
            sps,
            tps,
            n,
            t,
            loaders,
            queued,
            queued_tokens,
            e,
            skipped,
            trained,
        ) in columns
    )


def _loader_view(role: _Role, state: str) -> LoaderView:
    stats = role.last
    return LoaderView(
        name=role.hello.name,
        node=stats.node if stats else role.hello.node,
        pid=role.hello.pid,
        state=state,
        cpu_percent=round(role.cpu_percent, 1),
        cpu_seconds=round(stats.cpu_s, 3) if stats else 0.0,
        pss_bytes=stats.pss_bytes if stats else 0,
        samples_per_s=round(role.samples_per_s, 1),
        sources=len(role.hello.sources),
        tokens_read=sum(s.tokens_read for s in stats.sources) if stats else 0,
        busy_s=round(sum(s.busy_s for s in stats.sources), 3) if stats else 0.0,
        cache_hits=stats.cache_hits if stats else 0,
        cache_misses=stats.cache_misses if stats else 0,
        cache_fetched_bytes=stats.cache_fetched_bytes if stats else 0,
    )


def _constructor_view(role: _Role, state: str) -> ConstructorView:
    stats = role.last
    return ConstructorView(
        name=role.hello.name,
        node=role.hello.node,
        pid=role.hello.pid,
        state=state,
        cpu_percent=round(role.cpu_percent, 1),
        cpu_seconds=round(stats.cpu_s, 3) if stats else 0.0,
        pss_bytes=stats.pss_bytes if stats else 0,
        ready_bytes=stats.ready_bytes if stats else 0,
        rejected=stats.rejected if stats else {},
        relayed=stats.relayed if stats else 0,
        relayed_bytes=stats.relayed_bytes if stats else 0,
        payload_bytes=stats.payload_bytes if stats else 0,
    )


def _rank_views(role: _Role) -> list[RankView]:
    return [
        RankView(
            rank=r.rank,
            constructor=role.hello.name,
            step=r.consumed,
            ahead=r.ahead,
            wait_p50_ms=round(r.wait_p50_ms, 3),
            wait_p99_ms=round(r.wait_p99_ms, 3),
        )
        for r in (role.last.ranks if role.last else ())
    ]


def metrics_line(view: StatusView, unix_time: float) -> dict[str, object]:
    """One line of ``JOB/metrics.jsonl`` (version 1; ``msd report`` reads it)."""
    return {
        "time": round(unix_time, 3),
        "uptime_s": view.job.uptime_s,
        "state": view.job.state,
        "step": view.job.step,
        "planned": view.job.planned,
        "steps_per_s": view.job.steps_per_s,
        "tokens_per_s": view.job.tokens_per_s,
        "tokens": view.job.tokens,
        "wait_p50_ms": view.wait_p50_ms,
        "wait_p99_ms": view.wait_p99_ms,
        "balance_max_over_mean": view.planner.balance_max_over_mean,
        "plan_ms_p99": view.planner.plan_ms_p99,
        "loaders": len(view.loaders),
        # The loaders' local caches (msd.sources.cache), summed: blocks read from them, blocks
        # fetched from the store, bytes fetched.
        "cache": {
            "hits": sum(x.cache_hits for x in view.loaders),
            "misses": sum(x.cache_misses for x in view.loaders),
            "fetched_bytes": sum(x.cache_fetched_bytes for x in view.loaders),
        },
        "sources": {
            s.name: {
                "weight": s.weight,
                "tokens_per_s": s.tokens_per_s,
                "queue_samples": s.queue_samples,
                "read_retries": s.errors,
            }
            for s in view.sources
        },
    }
