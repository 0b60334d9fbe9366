"""DataLoader workers that exit when the process that started them is gone.

A worker started through the forkserver (worker_context()) is the forkserver's child, not the training
process's: torch's own watchdog checks the worker's parent, which stays alive. And the forkserver waits for its
children to let go of its pipe. So a training process that is SIGKILLed (a crashed launcher, torchrun stopping a
failed group, an OOM kill) left its data workers and their forkserver running for good: each holding torch and
the data stack (about 250 MB each, measured) and its open shards, one more set after every restart.

In each worker, ShardedDataset's iterator calls `watch_starter()`: a daemon thread waits on a pidfd of the
process that started the worker (multiprocessing.parent_process(): the training process under fork, spawn and the
forkserver alike; not a pid carried in the dataset, which a pickled copy would bring from another process) and ends
the worker when it exits. The forkserver then sees its pipe close and exits too. Where pidfd_open is missing or
refused the thread checks the pid once a second (a zombie counts as gone)."""

from __future__ import annotations

import multiprocessing
import os
import select
import threading
import time

_watched: set[int] = set()  # owners this process already watches (a worker iterates once per epoch)
_lock = threading.Lock()
POLL_S = 1.0


def watch_starter() -> None:
    """watch() the process that started this one (a no-op where that is its parent: torch's watchdog covers it)."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:
        watch(parent.pid)


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
        poller = select.poll()  # not select.select: a descriptor past 1023 is fine here
        poller.register(fd, select.POLLIN)
        poller.poll()  # readable when the process exits
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
    try:  # a killed process its parent has not reaped yet still answers kill(0): a zombie is gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
