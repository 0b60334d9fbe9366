"""DataLoader workers that exit when the process that started them is gone.

A worker started through the forkserver (worker_context()) is the forkserver's child, not the training
process's: torch's own watchdog checks the worker's parent, which stays alive. And the forkserver waits for its
children to let go of its pipe. So a training process that is SIGKILLed (a crashed launcher, torchrun stopping a
failed group, an OOM kill) left its data workers and their forkserver running for good: each holding torch and
the data stack (about 250 MB each, measured) and its open shards, one more set after every restart.

ShardedDataset records its owner's pid when it is pickled for a worker; in the worker, `watch(pid)` starts a
daemon thread that waits on a pidfd of that process (no polling) and ends the worker when it exits. The
forkserver then sees its pipe close and exits too. Where pidfd_open is missing (not Linux >= 5.3) the thread
checks the pid once a second."""

from __future__ import annotations

import os
import select
import threading
import time

_watched: set[int] = set()  # owners this process already watches (a worker iterates once per epoch)
_lock = threading.Lock()
POLL_S = 1.0


def watch(owner: int) -> None:
    """End this process (exit 1) once process `owner` has exited; returns at once. A no-op for this process
    itself, for its direct parent (torch's watchdog covers that) and for an owner already watched."""
    if owner <= 1 or owner == os.getpid() or owner == os.getppid():
        return
    with _lock:
        if owner in _watched:
            return
        _watched.add(owner)
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:  # gone before we looked
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd here: look once a second
        fd = None
    threading.Thread(target=_wait, args=(owner, fd), name=f"trainready-owner-watch-{owner}", daemon=True).start()


def _wait(owner: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # readable when the process exits
    else:
        while _alive(owner):
            time.sleep(POLL_S)
    os._exit(1)  # no cleanup to wait for: the training process that would read our results is gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's (a reused pid): treat as alive
        return True
    return True
