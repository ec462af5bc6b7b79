"""What ``balance.long_samples`` keeps of a sample longer than ``seq_len``, and what a source
loses to it: the numbers behind the warnings of ``msd validate``, ``msd plan`` and ``msd launch``.

``split`` cuts a sample into ``seq_len`` pieces, but a step holds at most its rows
(``dp × rows_per_rank``), so a sample longer than one step's tokens keeps only its first
``step_rows × seq_len`` tokens (the rest is counted as truncated). ``truncate`` keeps the first
``seq_len`` tokens; ``drop`` keeps nothing (what the user asked for: not a loss reported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def kept_tokens(length: int, seq_len: int, policy: str, step_rows: int) -> int:
    """How many of a sample's ``length`` tokens the stream delivers (as ``msd.plan.step``)."""
    if length <= seq_len:
        return length
    if policy == "drop":
        return 0
    if policy == "truncate":
        return seq_len
    return min(length, step_rows * seq_len)


@dataclass(frozen=True)
class Loss:
    """Of ``samples`` samples looked at (a profile of the source's first rows), ``cut`` lose
    tokens to truncation: ``lost_tokens`` of their ``tokens``; the longest has ``longest``."""

    source: str
    samples: int
    cut: int
    tokens: int
    lost_tokens: int
    longest: int


def loss(
    source: str, lengths: Sequence[int], seq_len: int, policy: str, step_rows: int
) -> Loss | None:
    """What truncation costs these samples of ``source``; None when it costs nothing."""
    if policy == "drop":
        return None
    cut = [n for n in lengths if kept_tokens(n, seq_len, policy, step_rows) < n]
    if not cut:
        return None
    lost = sum(n - kept_tokens(n, seq_len, policy, step_rows) for n in cut)
    return Loss(source, len(lengths), len(cut), sum(cut), lost, max(cut))


def warning(found: Loss, seq_len: int, policy: str, step_rows: int) -> str:
    """One sentence naming the source, what is kept and the tokens lost, and what to do."""
    if policy == "truncate":
        keeps = f"long_samples: truncate keeps the first {seq_len:,} tokens (seq_len)"
        fix = "use long_samples: split"
    else:
        keeps = (
            f"long_samples: split keeps at most one step's rows ({step_rows} × {seq_len:,} = "
            f"{step_rows * seq_len:,} tokens) of a sample"
        )
        fix = "raise global_batch_tokens, or cut such documents before msd"
    return (
        f"source {found.source}: {found.cut} of the {found.samples} samples profiled are longer "
        f"than {keeps}; they lose {found.lost_tokens:,} of their {found.tokens:,} tokens "
        f"(the longest has {found.longest:,}); the run summary counts them "
        f"(truncated_tokens). To keep them, {fix}."
    )
