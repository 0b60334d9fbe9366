"""Workers die with their launcher.

torchrun starts workers in their own session with no parent-death signal, so a launcher (or
torchrun agent) killed outright (SIGKILL, the OOM killer) would leave them running, writing
checkpoints beside the restarted run. Each worker therefore watches the launcher's pid (a
pidfd, immune to pid reuse; its start time is checked when the fd is opened) and its own
parent, the torchrun agent, and SIGKILLs itself when either is gone: nothing uncommitted is
lost (commits are atomic), and a half-written save is a temporary directory the next run removes.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading

log = logging.getLogger("trainready.run")
POLL_S = 0.5


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (/proc/PID/stat field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 else None


def _open_pidfd(pid: int, start_ticks: int | None) -> int | None:
    """A pidfd for `pid` if it is still the same process; -1 when it is already gone."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return -1
    except OSError:
        return None
    if start_ticks is not None and process_start_ticks(pid) != start_ticks:
        os.close(fd)
        return -1  # the pid now names another process: ours is gone
    return fd


def children(pid: int) -> list[int]:
    """Direct children of `pid` (of any of its threads), from /proc."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(k) for k in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Children, grandchildren, ... of `pid` (DataLoader workers and theirs)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def _die(why: str) -> None:
    sys.stderr.write(f"trainready: {why}; this worker exits so no orphan keeps training or writing checkpoints\n")
    sys.stderr.flush()
    for child in descendants(os.getpid()):  # its DataLoader workers too: they may hold shard-cache locks
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def start_watch(launcher_pid: int | None, launcher_start_ticks: int | None, watch_parent: bool) -> threading.Thread | None:
    """Start the daemon thread; returns None when there is nothing to watch."""
    parent = os.getppid() if watch_parent else None
    fd = _open_pidfd(launcher_pid, launcher_start_ticks) if launcher_pid else None
    if fd == -1:
        _die(f"launcher pid {launcher_pid} is already gone")
    if parent is None and launcher_pid is None:
        return None

    def loop() -> None:
        poller = select.poll()
        if fd is not None:
            poller.register(fd, select.POLLIN)
        while True:
            if fd is not None and poller.poll(POLL_S * 1000):
                _die(f"launcher (pid {launcher_pid}) is gone")
            elif fd is None:
                threading.Event().wait(POLL_S)
                if launcher_pid and process_start_ticks(launcher_pid) != launcher_start_ticks:
                    _die(f"launcher (pid {launcher_pid}) is gone")
            if parent is not None and os.getppid() != parent:
                _die(f"parent process (pid {parent}, the torchrun agent) is gone")

    thread = threading.Thread(target=loop, name="trainready-orphan-watch", daemon=True)
    thread.start()
    return thread
