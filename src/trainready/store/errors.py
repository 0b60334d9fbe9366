"""What can go wrong with checkpoints, as errors that carry a message meant for the user."""

from __future__ import annotations

from trainready.errors import TrainreadyError, UsageError


class CheckpointError(TrainreadyError):
    """A checkpoint could not be written, read or verified."""


class StorageFullError(CheckpointError):
    """The hot tier ran out of space; committed checkpoints are untouched."""


class FencedError(CheckpointError):
    """Another writer (a newer generation or another run) owns this checkpoint prefix."""


class ArchiveUnavailableError(CheckpointError):
    """The archive could not be reached."""


class BadStateError(UsageError):
    """The state passed to save/restore cannot be checkpointed as given."""


__all__ = ["CheckpointError", "StorageFullError", "FencedError", "ArchiveUnavailableError", "BadStateError"]
