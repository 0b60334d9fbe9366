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


class PreemptedError(CheckpointError):
    """save() after the manager stopped for preemption: the loop should have left on reached_preemption."""


class BadStateError(UsageError):
    """The state passed to save/restore cannot be checkpointed as given."""


def describe(error: BaseException | None) -> tuple[str, str] | None:
    """(class name, message) of an error, to send to the other ranks; None for no error."""
    return (type(error).__name__, str(error)) if error is not None else None


def raise_agreed(mine: BaseException | None, everyone: list[tuple[str, str] | None]) -> None:
    """Raise on every rank if any rank failed: our own error, else the first failed rank's,
    rebuilt as the same class (so `except StorageFullError` works on every rank)."""
    if mine is not None:
        raise mine
    for described in everyone:
        if described is not None:
            kind, message = described
            cls = _BY_NAME.get(kind, CheckpointError)
            raise cls(message if message.startswith("another rank: ") else f"another rank: {message}")


_BY_NAME = {cls.__name__: cls for cls in (CheckpointError, StorageFullError, FencedError, ArchiveUnavailableError)}

__all__ = ["CheckpointError", "StorageFullError", "FencedError", "ArchiveUnavailableError", "BadStateError",
           "describe", "raise_agreed"]
