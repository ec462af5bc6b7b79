"""The errors a user can see: one actionable sentence each, printed without a traceback."""

from __future__ import annotations


class MsdError(Exception):
    """Base of every error msd reports to a user."""


class RecipeError(MsdError):
    """The recipe is malformed or inconsistent (names the file, line and key)."""


class SourceError(MsdError):
    """A data source cannot be opened, read or understood."""


class LaunchError(MsdError):
    """A job could not be started, or a role of a running job failed."""


class CheckpointError(MsdError):
    """A checkpoint or client state is missing, corrupt or from another recipe."""


class ProtocolError(MsdError):
    """A peer sent a message that does not follow the wire protocol."""
