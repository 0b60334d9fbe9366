"""CheckpointManagerOptions: how a CheckpointManager keeps, writes and uploads (Orbax's options object).

What the manager works with (the process group, the stop signal path, the clock) is passed to it beside the
options, not chosen by them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import BadStateError


@dataclass(frozen=True)
class CheckpointManagerOptions:
    """keep_hot / keep_archive: committed checkpoints to keep per tier (None: keep all). The hot tier also keeps
      the newest archived checkpoint; during an archive outage older unarchived ones are dropped
      (status().dropped_unarchived) rather than filling the disk.
    async_save: stage to host memory and write in the background.
    when_busy: a save while one is still being written either "wait"s for it or is "skip"ped (agreed by all
      ranks).
    save_interval_steps: `should_save(step)` is true every this many steps (None or 0: only for a preemption).
    checksums: "auto" (for small files and files changed since commit), "always" or "never" (sizes are always
      checked) when restoring from the hot tier; downloads are always checked.
    retry_initial_s / retry_max_s: the replicator's back-off after a failed upload, doubling up to the maximum.
    claim_wait_s: how long to wait for an unreachable archive at start when this node's hot tier knows nothing
      of the run (starting without it could start from scratch while the archive holds the run's checkpoints:
      after this, ArchiveUnavailableError). A hot tier that knows the run starts at once and catches up with
      the archive later."""

    keep_hot: int = 2
    keep_archive: int | None = None
    async_save: bool = True
    when_busy: Literal["wait", "skip"] = "wait"
    save_interval_steps: int | None = None
    checksums: Literal["auto", "always", "never"] = "auto"
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    claim_wait_s: float = 60.0

    def __post_init__(self) -> None:
        _whole("keep_hot", self.keep_hot, 1, "keep at least 1 checkpoint on the hot tier")
        if self.keep_archive is not None:
            _whole("keep_archive", self.keep_archive, 1, "use None to keep every archived checkpoint, or >= 1")
        if self.save_interval_steps is not None:  # 0, as in earlier releases: the same as None
            _whole("save_interval_steps", self.save_interval_steps, 0, "use None (or 0) to save only for a stop, "
                                                                       "or >= 1")
        if not isinstance(self.async_save, bool):
            raise BadStateError(f"async_save={self.async_save!r}: valid values are True, False")
        if self.when_busy not in ("wait", "skip"):
            raise BadStateError(f"when_busy={self.when_busy!r}: valid values are 'wait', 'skip'")
        if self.checksums not in ("auto", "always", "never"):
            raise BadStateError(f"checksums={self.checksums!r}: valid values are 'auto', 'always', 'never'")
        for name in ("retry_initial_s", "retry_max_s", "claim_wait_s"):
            if not _seconds(getattr(self, name)):
                raise BadStateError(f"{name}={getattr(self, name)!r}: give a finite number of seconds from 0 to "
                                    f"{MAX_SECONDS:g}")
        if self.retry_max_s < self.retry_initial_s:
            raise BadStateError(f"retry_max_s={self.retry_max_s} is below retry_initial_s={self.retry_initial_s}: "
                                "the back-off starts at the first and doubles up to the second")

    @property
    def verify_checksums(self) -> bool | None:
        """checksums as the hot tier's verify takes it: None = decide per file."""
        return {"auto": None, "always": True, "never": False}[self.checksums]


MAX_SECONDS = 1e9
"""About 32 years: a wait or back-off past it is a mistake (and a deadline past a float's range an overflow)."""


def _seconds(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return 0 <= float(value) <= MAX_SECONDS  # NaN fails; float(10**400) raises
    except OverflowError:
        return False


def _whole(name: str, value: object, least: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BadStateError(f"{name}={value!r}: {hint}")
