"""How every msd process logs: one line per event, naming the role, its step and the level.

A role process calls ``setup(role, name)`` once; ``set_step`` keeps the step its lines carry
current. The CLI calls ``setup("msd", ...)`` with the level its ``-v`` asked for; roles started
by a launcher inherit that level through ``MSD_LOG_LEVEL``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

LEVEL_ENV = "MSD_LOG_LEVEL"  # the level roles log at (a name: DEBUG, INFO, WARNING)
FORMAT = "%(asctime)s %(levelname)s %(role)s step=%(step)s %(name)s: %(message)s"

_context: dict[str, str] = {"role": "msd", "step": "-"}


class _Context(logging.Filter):
    """Adds the process's role and current step to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = _context["role"]
        record.step = _context["step"]
        return True


class _Stderr(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is when a record comes (a redirect, a test's capture),
    not to the stream it was when ``setup`` ran."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def level_from_verbosity(verbose: int, quiet: int = logging.WARNING) -> int:
    """``-v`` counted: none → ``quiet``, one → INFO, two or more → DEBUG."""
    if verbose <= 0:
        return quiet
    return logging.INFO if verbose == 1 else logging.DEBUG


def role_level() -> int:
    """The level a role logs at: ``MSD_LOG_LEVEL`` if it names one (or is a number), else INFO."""
    value = os.environ.get(LEVEL_ENV, "INFO").strip().upper()
    if value.isdigit():
        return int(value)
    level = logging.getLevelName(value)
    return level if isinstance(level, int) else logging.INFO


def setup(role: str, name: str = "", level: int | None = None) -> None:
    """Send msd's records to stderr, one line each; replaces an earlier set-up."""
    _context["role"] = f"{role}[{name}]" if name and name != role else role
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(_Context())
    root = logging.getLogger("msd")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(role_level() if level is None else level)
    root.propagate = False


def set_step(step: int) -> None:
    """The step this process's next lines are about."""
    _context["step"] = str(step)
