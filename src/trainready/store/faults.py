"""Named fault-injection points, so crash tests are exact rather than timed.

`TRAINREADY_FAULT` holds comma-separated rules `POINT[:ACTION][#HIT][@RANK]`:
ACTION is `kill` (SIGKILL this process, the default), `enospc` or `eio` (raise that OSError),
`hang` (sleep for an hour: a stuck writer); HIT fires on the N-th time the point is reached
(default 1); RANK limits the rule to one global rank. Unset, a point costs one dict lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

ENV = "TRAINREADY_FAULT"
MARKER_ENV = "TRAINREADY_FAULT_MARKER"  # a file a hanging point appends "POINT PID" to
HANG_S = 3600.0

# Every point the store passes, in the order a save reaches them (the soak sweeps them all).
POINTS = (
    "save.staged",             # state copied to host memory, nothing written yet
    "hot.data_written",        # tensor and JSON files written into the temporary directory
    "hot.manifest_written",    # manifest in the temporary directory, not yet renamed
    "hot.renamed",             # renamed into place, parent directory not yet fsynced
    "hot.committed",           # committed on the hot tier, not yet handed to replication
    "archive.file_uploaded",   # first data object uploaded
    "archive.data_uploaded",   # every data object uploaded and checked, no manifest yet
    "archive.committed",       # archive manifest written
    "retention.deleting",      # an old checkpoint's manifest removed, its data not yet
    "restore.downloaded",      # archive checkpoint downloaded to the hot tier, not yet committed
)

_counts: dict[str, int] = {}
_counted_for = [""]  # the rule set the counts belong to: a new TRAINREADY_FAULT starts from zero
_lock = threading.Lock()


def _rules() -> list[tuple[str, str, int, int | None]]:
    spec = os.environ.get(ENV, "").strip()
    rules = []
    for raw in filter(None, (part.strip() for part in spec.split(","))):
        rank = None
        if "@" in raw:
            raw, rank_text = raw.split("@", 1)
            rank = int(rank_text)
        hit = 1
        if "#" in raw:
            raw, hit_text = raw.split("#", 1)
            hit = int(hit_text)
        point, _, action = raw.partition(":")
        rules.append((point, action or "kill", hit, rank))
    return rules


def fault_point(name: str) -> None:
    """Pass the named point; act if a rule in TRAINREADY_FAULT targets it."""
    if ENV not in os.environ:
        return
    rank = int(os.environ.get("RANK", "0"))
    with _lock:
        if _counted_for[0] != os.environ[ENV]:
            _counted_for[0] = os.environ[ENV]
            _counts.clear()
        count = _counts[name] = _counts.get(name, 0) + 1
    for point, action, hit, only_rank in _rules():
        if point != name or count != hit or (only_rank is not None and only_rank != rank):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)  # the signal is asynchronous; never run past the point
        if action == "enospc":
            raise OSError(errno.ENOSPC, f"No space left on device (injected at {name})")
        if action == "eio":
            raise OSError(errno.EIO, f"Input/output error (injected at {name})")
        if action == "hang":
            marker = os.environ.get(MARKER_ENV)
            if marker:  # tests wait for this file, then kill whatever they like mid-point
                with open(marker, "a") as f:
                    f.write(f"{name} {os.getpid()}\n")
            time.sleep(HANG_S)
