"""Child processes that die with their parent (Linux's PR_SET_PDEATHSIG), standard library only.

A child that outlives its parent keeps its GPU memory and may write beside a restarted run. The
workers' watchdog (run/watchdog.py) covers a training process once `trainready.init()` has run;
the signal covers what comes before it: a worker still importing, or still connecting to a store
its dead parent hosted (it retries until the store's timeout, 30 minutes by default)."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux/glibc: the watchdog alone
        return None


def setter() -> Callable[[], None] | None:
    """For Popen's preexec_fn: resolved here, before the fork (no dlopen in a forked child while
    other threads run). The signal comes when the thread that started the child exits."""
    prctl = _prctl()
    if prctl is None:
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with_parent() -> None:
    """In the child itself, first thing: SIGKILL when the parent goes, kept across exec (not for
    set-user-ID programs). A parent that went before the call takes this process with it now."""
    parent = os.getppid()
    prctl = _prctl()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), signal.SIGKILL)
