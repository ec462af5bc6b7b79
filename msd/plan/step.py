"""The stream as a pure function: plan one global step from the Planner's state.

``plan_step(spec, state, lookup)`` draws, with the step's own generator, which source each next
sample comes from (weights from the mix schedule at this step), takes that source's next
position in its epoch order, and packs it into the step's rows; it stops once a few drawn
samples no longer fit. Which samples form a step therefore depends on (spec, state, sample
lengths) only — never on timing, on how many loaders there are, or on how many ranks share it.
The step's samples are then balanced over data-parallel ranks and micro-batches.

``lookup(source, gpos)`` returns the length of a sample once its loader has reported it, or
None; then planning answers ``NeedData`` and is retried later with the same state. A lookup that
also has ``many(sources, gpos)`` (the lengths of many draws, -1 for those not reported) is asked
a chunk of draws at once. ``NeedData.resume`` holds the step's selection as far as it got: passed
back (``plan_step(..., resume=...)``), the retry continues from there instead of drawing and
packing the step again from its first sample, with the same result.

For speed, draws are made, looked up and packed a chunk at a time (``SourceDraws``,
``RowPacker.place_each``), with the same result as one at a time; the plan keeps its pieces as
columns (``Pieces``) and builds the ``Slot`` objects of ``StepPlan.rows`` only when read (the
Planner itself reads the columns).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from msd.plan.balance import Method, hybrid_placement, placement
from msd.plan.cost import CostModel
from msd.plan.mix import SourceDraws, step_rng
from msd.plan.patch_rows import PatchRowPacker, deal_micro_batches, micro_batch_patches
from msd.plan.rows import RowPacker, best_fit_rows, deal_rows
from msd.plan.schedule import Schedule

Lookup = Callable[[int, int], "int | None"]
# The vision encoder's cost of each piece (source, gpos, length; 0 without images): what a rank
# pays beyond the backbone's cost of its tokens under the ``sum`` objective.
EncoderCost = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# The image patches of each piece (source, gpos, offset; 0 without images), for
# ``max_patches``: a piece is never cut inside an image, so its patches are its own.
PatchCount = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
LongSamples = str  # "split" | "truncate" | "drop"


@dataclass(frozen=True)
class StreamSpec:
    """What decides the stream, reduced to numbers (see ``msd.plan.spec.stream_spec``)."""

    seed: int
    schedule: Schedule
    num_rows: tuple[int, ...]
    repeat: tuple[bool, ...]
    dp: int
    micro_batches: int
    micro_batch_size: int
    seq_len: int
    steps: int | None
    pad_multiple: int = 1
    long_samples: LongSamples = "split"
    method: Method = "greedy"
    cost: CostModel = field(default_factory=CostModel)
    max_patches: int | None = None  # a micro-batch's image patches, at most

    @cached_property
    def sizes(self) -> np.ndarray:
        """``num_rows`` as an array (read-only), for looking up many sources at once."""
        return _frozen(np.array(self.num_rows, dtype=np.int64).reshape(-1))

    @cached_property
    def repeats(self) -> np.ndarray:
        """``repeat`` as a boolean array (read-only)."""
        return _frozen(np.array(self.repeat, dtype=bool).reshape(-1))

    @property
    def rows_per_rank(self) -> int:
        return self.micro_batches * self.micro_batch_size

    @property
    def global_rows(self) -> int:
        return self.dp * self.rows_per_rank

    @property
    def carry_limit(self) -> int:
        """Drawn samples that did not fit before a step is closed (they open the next one)."""
        return max(1, min(self.global_rows, 8))

    @property
    def empty_limit(self) -> int:
        """Samples holding no tokens (null or empty text) a step takes at most; then it closes.
        They fit any row, so a stream of nothing else would never close a step."""
        return max(1024, 16 * self.global_rows)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class PlannerState:
    """The whole stream state. Keys: step, cursors (next global position per source), carry.

    ``carry`` holds samples already drawn but not placed (they did not fit the last step); the
    next step places them first.
    """

    step: int
    cursors: tuple[int, ...]
    carry: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def initial(num_sources: int) -> PlannerState:
        return PlannerState(0, (0,) * num_sources, ())


class Slot(NamedTuple):
    """One piece of a sample in a step: tokens ``[offset, offset + length)`` of the sample at
    global position ``gpos`` of ``source``; ``padded`` is what it occupies in its row.

    A named tuple: a step holds one per piece, tens of thousands, and these are built fastest.
    """

    source: int
    gpos: int
    length: int
    offset: int = 0
    padded: int = 0


_new_slot = functools.partial(tuple.__new__, Slot)


@dataclass(frozen=True)
class Counts:
    """What the long-sample policy did in a step; ``truncated_tokens``: (source, tokens cut off
    samples of it), sorted, sources with none left out; ``empty``: samples that hold no tokens
    (placed: they take a position of the stream and no room)."""

    split: int = 0
    truncated: int = 0
    dropped: int = 0
    truncated_tokens: tuple[tuple[int, int], ...] = ()
    empty: int = 0


PIECE_COLUMNS = ("source", "gpos", "length", "offset", "padded")


@dataclass(frozen=True, eq=False)
class Pieces:
    """A step's pieces as columns: read-only int64 arrays, one entry per piece, ordered by global
    row and, inside a row, as placed. The pieces of global row g (row j of rank r is
    g = r × rows_per_rank + j) are ``bounds[g] : bounds[g + 1]``."""

    columns: tuple[np.ndarray, ...]  # in the order of PIECE_COLUMNS
    bounds: np.ndarray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pieces):
            return NotImplemented
        mine, theirs = (*self.columns, self.bounds), (*other.columns, other.bounds)
        return all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))

    def __hash__(self) -> int:
        return hash(self.bounds.tobytes())

    def in_rows(self) -> tuple[np.ndarray, ...]:
        """The columns of the pieces that are in rows (those of ``StepPlan.rows``)."""
        lo, hi = int(self.bounds[0]), int(self.bounds[-1])
        return tuple(column[lo:hi] for column in self.columns)

    def keys(self) -> np.ndarray:
        """The (source, gpos) of each piece in rows, as the rows of an array."""
        source, gpos = self.in_rows()[:2]
        return np.stack((source, gpos), axis=1)


@dataclass(frozen=True)
class StepPlan:
    """``rows[r][j]``: the pieces packed, in order, in row j of data-parallel rank r (row j is in
    micro-batch ``j // micro_batch_size``). Planned as ``pieces`` (columns); the ``Slot`` objects
    of ``rows`` are built on first use."""

    step: int
    pieces: Pieces
    rows_per_rank: int
    counts: Counts = Counts()
    dropped: tuple[tuple[int, int], ...] = ()

    @cached_property
    def rows(self) -> tuple[tuple[tuple[Slot, ...], ...], ...]:
        # tuple.__new__ builds each Slot in C, without the generated __new__'s Python call
        columns = (column.tolist() for column in self.pieces.columns)
        slots = list(map(_new_slot, zip(*columns, strict=True)))
        bounds, per_rank = self.pieces.bounds.tolist(), self.rows_per_rank
        rows = list(map(tuple, map(slots.__getitem__, map(slice, bounds[:-1], bounds[1:]))))
        return tuple(map(tuple, zip(*(rows[j::per_rank] for j in range(per_rank)), strict=True)))

    @property
    def slots(self) -> list[Slot]:
        return [slot for rank in self.rows for row in rank for slot in row]


@dataclass(frozen=True)
class NeedData:
    """Planning waits for the length of sample ``gpos`` of ``source``. ``soon``: the other
    unknown draws looked up with it, (source, gpos) pairs the step will most likely need too,
    so the caller can ask for all of them at once."""

    source: int
    gpos: int
    soon: tuple[tuple[int, int], ...] = ()
    # the selection so far, for the retry to continue (not part of what the answer says)
    resume: Resume | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class EndOfStream:
    step: int


def pieces(spec: StreamSpec, source: int, gpos: int, length: int) -> tuple[list[Slot], Counts]:
    """A sample as the pieces it is planned as: whole, split, truncated, or none (dropped)."""
    cut, split, truncated = _cut(length, spec.seq_len, spec.long_samples, spec.global_rows)
    m = spec.pad_multiple
    lost = ((source, length - sum(n for n, _ in cut)),) if truncated else ()
    counts = Counts(split, truncated, int(not cut), lost)
    return [Slot(source, gpos, n, offset, -(-n // m) * m) for n, offset in cut], counts


def _cut(
    length: int, seq_len: int, policy: LongSamples, max_pieces: int
) -> tuple[list[tuple[int, int]], int, int]:
    """(length, offset) of each piece of a sample, and whether it was split, truncated."""
    if length <= seq_len:
        return [(length, 0)], 0, 0
    if policy == "drop":
        return [], 0, 0
    if policy == "truncate":
        return [(seq_len, 0)], 0, 1
    n = min(-(-length // seq_len), max_pieces)  # a step holds at most its rows
    cut = [(min(seq_len, length - k * seq_len), k * seq_len) for k in range(n)]
    return cut, 1, int(n * seq_len < length)


def _active(spec: StreamSpec, weights: np.ndarray, cursors: np.ndarray) -> np.ndarray:
    """Which sources can be drawn: a positive weight, and samples left (or repeating)."""
    return (weights > 0) & (spec.repeats | (cursors < spec.sizes))


class _Selection:
    """The samples offered to a step so far: pieces placed (column blocks, in order), samples
    that did not fit (``misfits``, carried to the next step) and samples dropped."""

    def __init__(self, spec: StreamSpec, patches: PatchCount | None = None) -> None:
        self.spec = spec
        self.patches = patches
        self.packer: RowPacker | PatchRowPacker = RowPacker(spec.global_rows, spec.seq_len)
        if spec.max_patches is not None:
            self.packer = PatchRowPacker(
                spec.global_rows, spec.seq_len, spec.micro_batch_size, spec.max_patches
            )
        self.blocks: list[list[np.ndarray]] = []
        self.misfits: list[tuple[int, int]] = []
        self.dropped: list[tuple[int, int]] = []
        self.split = self.truncated = 0
        self.truncated_tokens: dict[int, int] = {}
        self.empty = 0  # samples offered that hold no tokens

    @property
    def closed(self) -> bool:
        return len(self.misfits) >= self.spec.carry_limit or self.empty >= self.spec.empty_limit

    def within_empty_limit(self, lens: np.ndarray) -> int:
        """How many of these (known) lengths to offer: up to the empty sample that reaches
        ``empty_limit``, so the step closes at the same sample however draws are chunked."""
        zeros = np.flatnonzero(lens == 0)
        room = self.spec.empty_limit - self.empty
        return len(lens) if len(zeros) < room else int(zeros[room - 1]) + 1

    def next_chunk(self) -> int:
        """How many draws to look up at once: about as many as the rows still hold."""
        packer, free = self.packer, self.packer.free_tokens()
        placed = packer.num_rows * packer.row_tokens - free
        mean = placed / packer.count if packer.count else self.spec.seq_len / 2
        return int(min(max(free / max(mean, 1.0), 16), 1 << 16))

    def offer(self, sources: np.ndarray, gpos: np.ndarray, lens: np.ndarray, misfits: int) -> int:
        """Offer samples (``lens``: their lengths, all known) in order until ``misfits`` of them
        did not fit; how many were offered."""
        spec, m = self.spec, self.spec.pad_multiple
        padded = -(-lens // m) * m
        cut = _Long.of(lens, spec)
        padded[cut.at] = spec.seq_len + 1  # fits no row alone: placed as its group
        groups = cut.groups()
        if isinstance(self.packer, PatchRowPacker):
            each, of_groups = self._patches(sources, gpos, cut)
            offered, missed = self.packer.place_each(
                padded.tolist(), groups, misfits, each, of_groups
            )
        else:
            offered, missed = self.packer.place_each(padded.tolist(), groups, misfits)
        self.misfits += [(int(sources[j]), int(gpos[j])) for j in missed]
        placed = (cut.at < offered) & ~np.isin(cut.at, missed)
        self._count(cut, placed, sources, gpos)
        self.empty += int(np.count_nonzero(lens[:offered] == 0))
        columns = (sources, gpos, lens, 0 * lens, padded)
        self.blocks.append(_expand([c[:offered] for c in columns], missed, cut, placed, m))
        return offered

    def _count(self, cut: _Long, placed: np.ndarray, sources: np.ndarray, gpos: np.ndarray) -> None:
        """What the long-sample policy did to the samples placed (``placed``: of ``cut.at``)."""
        at, policy = cut.at[placed], self.spec.long_samples
        self.split += len(at) if policy == "split" else 0
        truncated = at[cut.truncated[placed]]
        self.truncated += len(truncated)
        lost = cut.lost[placed][cut.truncated[placed]]
        for source, tokens in zip(sources[truncated].tolist(), lost.tolist(), strict=True):
            self.truncated_tokens[source] = self.truncated_tokens.get(source, 0) + tokens
        if policy == "drop":
            self.dropped += zip(sources[at].tolist(), gpos[at].tolist(), strict=True)

    def _patches(
        self, sources: np.ndarray, gpos: np.ndarray, cut: _Long
    ) -> tuple[list[int], dict[int, list[int]]]:
        """The patches of each sample offered (whole), and of each piece of those cut."""
        count = self.patches
        bounds = cut.bounds().tolist()
        if count is None:
            of_groups = {
                j: [0] * (bounds[i + 1] - bounds[i]) for i, j in enumerate(cut.at.tolist())
            }
            return [0] * len(sources), of_groups
        each = count(sources, gpos, np.zeros(len(sources), dtype=np.int64)).tolist()
        of_groups = {}
        for i, j in enumerate(cut.at.tolist()):
            offsets = cut.offsets[bounds[i] : bounds[i + 1]]
            n = len(offsets)
            of_groups[j] = count(np.full(n, sources[j]), np.full(n, gpos[j]), offsets).tolist()
        return [int(p) for p in each], {j: [int(p) for p in v] for j, v in of_groups.items()}

    def columns(self) -> list[np.ndarray]:
        if not self.blocks:
            return [np.zeros(0, dtype=np.int64)] * len(PIECE_COLUMNS)
        return [np.concatenate([b[c] for b in self.blocks]) for c in range(len(PIECE_COLUMNS))]


class _Long(NamedTuple):
    """The samples longer than a row among those offered (at positions ``at``) and the pieces
    each is planned as: ``num_pieces`` of them (0: dropped), their ``lengths``, ``offsets``
    and ``padded`` (one entry per piece, sample after sample); ``truncated``: whether tokens
    were cut off, ``lost`` how many."""

    at: np.ndarray
    num_pieces: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    padded: np.ndarray
    truncated: np.ndarray
    lost: np.ndarray

    @staticmethod
    def of(lens: np.ndarray, spec: StreamSpec) -> _Long:
        """``_cut`` of every sample longer than ``seq_len``, at once."""
        seq_len, m = spec.seq_len, spec.pad_multiple
        at = np.flatnonzero(lens > seq_len)
        full = lens[at]
        if spec.long_samples == "drop":
            count = np.zeros(len(at), dtype=np.int64)
        elif spec.long_samples == "truncate":
            count = np.ones(len(at), dtype=np.int64)
        else:  # split; a step holds at most its rows
            count = np.minimum(-(-full // seq_len), spec.global_rows)
        first = np.repeat(np.cumsum(count) - count, count)
        offsets = (np.arange(len(first)) - first) * seq_len
        lengths = np.minimum(seq_len, np.repeat(full, count) - offsets)
        kept = np.minimum(full, count * seq_len)
        truncated = (kept < full) & (spec.long_samples != "drop")
        padded = -(-lengths // m) * m
        return _Long(at, count, lengths, offsets, padded, truncated, full - kept)

    def bounds(self) -> np.ndarray:
        """Sample i's pieces are ``bounds[i] : bounds[i + 1]``."""
        return np.concatenate([[0], np.cumsum(self.num_pieces)])

    def groups(self) -> dict[int, list[int]]:
        """The padded pieces of each sample, by its position (placed all or none)."""
        padded, bounds = self.padded.tolist(), self.bounds().tolist()
        return {j: padded[bounds[i] : bounds[i + 1]] for i, j in enumerate(self.at.tolist())}


def _expand(
    columns: list[np.ndarray],
    missed: list[int],
    cut: _Long,
    placed: np.ndarray,
    pad_multiple: int,
) -> list[np.ndarray]:
    """One row per sample offered -> one row per piece placed: none for a sample that did not
    fit or was dropped, one per piece for a sample cut into pieces."""
    count = np.ones(len(columns[0]), dtype=np.int64)
    count[missed] = 0
    count[cut.at[placed]] = cut.num_pieces[placed]
    block = [np.repeat(column, count) for column in columns]
    pieces = np.repeat(placed, cut.num_pieces)  # the pieces of the samples placed
    if pieces.any():  # write each cut sample's pieces over its copies
        at = (np.cumsum(count) - count)[cut.at[placed]]
        per = cut.num_pieces[placed]
        first = np.repeat(np.cumsum(per) - per, per)
        where = np.repeat(at, per) + np.arange(len(first)) - first
        block[2][where] = cut.lengths[pieces]
        block[3][where] = cut.offsets[pieces]
        block[4][where] = cut.padded[pieces]
    return block


def _until_exhausted(spec: StreamSpec, sources: np.ndarray, gpos: np.ndarray) -> int:
    """How many of these draws come before a finite source runs out (the one taking its last
    sample included): after it, the rest are drawn over fewer sources."""
    last = np.flatnonzero((gpos == spec.sizes[sources] - 1) & ~spec.repeats[sources])
    return int(last[0]) + 1 if len(last) else len(sources)


def _positions(sources: np.ndarray, cursors: np.ndarray) -> np.ndarray:
    """The global position each draw takes: its source's cursor plus earlier draws of it."""
    keys = sources.astype(np.uint16) if len(cursors) < 2**16 else sources  # radix-sorted
    order = np.argsort(keys, kind="stable")
    grouped = sources[order]
    earlier = np.arange(len(sources)) - np.searchsorted(grouped, grouped, side="left")
    gpos = np.empty(len(sources), dtype=np.int64)
    gpos[order] = cursors[grouped] + earlier
    return gpos


def _look_up(lookup: Lookup, sources: np.ndarray, gpos: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """The lengths of these draws up to the first unknown one, and where the unknown ones are.
    A lookup with a ``many(sources, gpos)`` method (lengths, -1 where unknown) answers all at
    once."""
    many = getattr(lookup, "many", None)
    if many is not None:
        found = np.asarray(many(sources, gpos), dtype=np.int64)
        missing = np.flatnonzero(found < 0)
        return found[: missing[0] if len(missing) else len(found)], missing.tolist()
    lengths = list(map(lookup, sources.tolist(), gpos.tolist()))
    if None not in lengths:
        return np.array(lengths, dtype=np.int64), []
    known = lengths.index(None)
    unknown = [j for j in range(known, len(lengths)) if lengths[j] is None]
    return np.array(lengths[:known], dtype=np.int64), unknown


@dataclass
class Resume:
    """A step's selection stopped at a sample whose length is not known yet: what was drawn,
    looked up and packed so far, valid for that ``spec`` and ``state`` (the same objects)."""

    spec: StreamSpec
    state: PlannerState
    sel: _Selection
    cursors: np.ndarray
    draws: SourceDraws
    active: np.ndarray


def _begin(
    spec: StreamSpec, state: PlannerState, lookup: Lookup, patches: PatchCount | None
) -> Resume | NeedData:
    """A step's selection with the carried samples offered first, before any fresh draw."""
    sel = _Selection(spec, patches)
    lengths = [lookup(s, g) for s, g in state.carry]
    if None in lengths:
        return NeedData(*state.carry[lengths.index(None)])
    carry = np.array(state.carry, dtype=np.int64).reshape(-1, 2)
    sel.offer(carry[:, 0], carry[:, 1], np.array(lengths, dtype=np.int64), len(lengths) + 1)
    cursors = np.array(state.cursors, dtype=np.int64)
    weights = np.asarray(spec.schedule.weights_at(state.step), dtype=np.float64)
    draws = SourceDraws(step_rng(spec.seed, state.step), weights)
    active = _active(spec, weights, cursors)
    draws.set_active(active)
    return Resume(spec, state, sel, cursors, draws, active)


def _select(
    spec: StreamSpec,
    state: PlannerState,
    lookup: Lookup,
    patches: PatchCount | None = None,
    resume: Resume | None = None,
) -> tuple[_Selection, list[int]] | NeedData:
    """Carry first, then fresh draws, until ``carry_limit`` samples did not fit.

    Draws are looked up a chunk at a time (about as many as the rows still hold); a draw after
    the step closes is never taken, and ``NeedData`` names the first unknown draw it needs. What
    was offered before it stays offered in ``NeedData.resume``: which samples form the step does
    not depend on how draws are chunked, so continuing there gives what starting again would.
    """
    if resume is not None and resume.spec is spec and resume.state is state:
        part: Resume | NeedData = resume
    else:
        part = _begin(spec, state, lookup, patches)
    if isinstance(part, NeedData):
        return part
    sel, cursors, draws, active = part.sel, part.cursors, part.draws, part.active
    while not sel.closed and active.any():
        sources = draws.peek(sel.next_chunk())
        gpos = _positions(sources, cursors)
        cut = _until_exhausted(spec, sources, gpos)
        sources, gpos = sources[:cut], gpos[:cut]
        lens, unknown = _look_up(lookup, sources, gpos)
        known = len(lens)
        lens = lens[: sel.within_empty_limit(lens)]
        offered = sel.offer(sources, gpos, lens, spec.carry_limit - len(sel.misfits))
        draws.advance(offered)
        drawn = np.bincount(sources[:offered])  # up to the largest source drawn
        cursors[: len(drawn)] += drawn
        out = np.flatnonzero(drawn)
        out = out[~spec.repeats[out] & (cursors[out] >= spec.sizes[out])]
        if len(out) and active[out].any():  # a finite source ran out: draw over the rest
            active[out] = False
            draws.set_active(active)
        if offered == known < len(sources) and not sel.closed:
            soon = tuple(zip(sources[unknown].tolist(), gpos[unknown].tolist(), strict=True))
            return NeedData(int(sources[known]), int(gpos[known]), soon, part)
    return sel, cursors.tolist()


def plan_step(
    spec: StreamSpec,
    state: PlannerState,
    lookup: Lookup,
    encoder: EncoderCost | None = None,
    patches: PatchCount | None = None,
    resume: Resume | None = None,
) -> tuple[StepPlan, PlannerState] | NeedData | EndOfStream:
    """Plan ``state.step``; returns the plan and the state after it. ``encoder``: the vision
    encoder's cost of samples with images, balanced together with the backbone's; ``patches``:
    each piece's image patches, kept within ``spec.max_patches`` per micro-batch; ``resume``:
    the ``NeedData.resume`` of the last attempt (ignored unless made for this spec and state)."""
    if spec.steps is not None and state.step >= spec.steps:
        return EndOfStream(state.step)
    selected = _select(spec, state, lookup, patches, resume)
    if isinstance(selected, NeedData):
        return selected
    sel, cursors = selected
    columns = sel.columns()
    if not len(columns[0]):
        return EndOfStream(state.step)
    lost = tuple(sorted(sel.truncated_tokens.items()))
    counts = Counts(sel.split, sel.truncated, len(sel.dropped), lost, sel.empty)
    extra = None if encoder is None else encoder(columns[0], columns[1], columns[2])
    row_of = _split_over_ranks(spec, columns[4], extra)
    if isinstance(sel.packer, PatchRowPacker):
        zeros = np.zeros(len(row_of))
        counted = zeros if patches is None else patches(columns[0], columns[1], columns[3])
        row_of = _within_patches(spec, row_of, counted, sel.packer.rows, columns[4], extra)
    placed = _in_rows(spec, columns, row_of)
    plan = StepPlan(state.step, placed, spec.rows_per_rank, counts, tuple(sel.dropped))
    return plan, PlannerState(state.step + 1, tuple(cursors), tuple(sel.misfits))


def _split_over_ranks(
    spec: StreamSpec, padded: np.ndarray, extra: np.ndarray | None = None
) -> np.ndarray:
    """The global row of each piece: balanced; if the balancer cannot place them all, the rows
    packed during selection, dealt whole (with ``max_patches``: left at -1 for
    ``_within_patches``, which knows those rows)."""
    costs = spec.cost(padded)
    shape = (spec.dp, spec.micro_batches, spec.micro_batch_size, spec.seq_len, spec.method)
    if extra is None:
        row_of = placement(padded, costs, *shape)
    else:
        row_of = hybrid_placement(padded, costs, extra, *shape)
        costs = costs + extra
    if np.any(row_of < 0) and spec.max_patches is None:
        members = best_fit_rows(padded.tolist(), spec.global_rows, spec.seq_len)
        dealt = deal_rows(members, costs, spec.dp, spec.rows_per_rank, spec.micro_batch_size)
        for g, row in enumerate(row for rank in dealt for row in rank):
            row_of[list(row)] = g
    return row_of


def _within_patches(
    spec: StreamSpec,
    row_of: np.ndarray,
    patches: np.ndarray,
    packed: list[int],
    padded: np.ndarray,
    extra: np.ndarray | None,
) -> np.ndarray:
    """The balanced split if it keeps every micro-batch within ``max_patches``; else the rows
    packed during selection (which do), dealt to ranks a micro-batch at a time."""
    assert spec.max_patches is not None
    per_micro = micro_batch_patches(row_of, patches, spec.micro_batch_size, spec.global_rows)
    if np.all(row_of >= 0) and per_micro.max(initial=0) <= spec.max_patches:
        return row_of
    costs = spec.cost(padded) if extra is None else spec.cost(padded) + extra
    shape = (spec.dp, spec.rows_per_rank, spec.micro_batch_size, spec.global_rows)
    return deal_micro_batches(packed, costs, *shape)


def _in_rows(spec: StreamSpec, columns: list[np.ndarray], row_of: np.ndarray) -> Pieces:
    keys = row_of.astype(np.uint16) if spec.global_rows < 2**16 else row_of  # radix-sorted
    order = np.argsort(keys, kind="stable")
    ordered = tuple(column[order] for column in columns)
    bounds = np.searchsorted(row_of[order], np.arange(spec.global_rows + 1))
    for array in (*ordered, bounds):
        array.flags.writeable = False
    return Pieces(ordered, bounds)
