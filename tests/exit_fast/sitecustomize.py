"""Imported at start-up by every Python the test suite starts (conftest.py puts this folder on PYTHONPATH).

At exit it freezes the heap (gc.freeze) so that the interpreter's final collections skip it. A process that has
imported torch spends 0.3-1 s of CPU in those collections, every torchrun agent and worker among them: on two
cores that is about 1.5 s of each 2-process `trainready run` launch (8.9 -> 7.3 s of CPU, measured).

What changes for the processes under test: objects kept alive only by a reference cycle are not finalized at exit
(their __del__ does not run; a buffered file in a cycle is not flushed). Nothing the tests check may rest on that:
our processes flush, close and release explicitly, so a file or process group that only a collection at exit would
have finished now shows as a defect. The other way round, a finalizer that would hang or fail at a user's exit is
not run here; interpreter teardown proper (modules, threads, atexit handlers) is unchanged.

A sitecustomize found later on the path (Debian's, a user's, a test's injected one) still runs: this one imports it
after itself. Another copy of this folder on the path (a symlink, a second checkout) is skipped, not looped into."""

import atexit
import gc
import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    if getattr(sys, "_trainready_exit_fast", False):  # a copy of this file, reached through the path below
        return
    sys._trainready_exit_fast = True
    atexit.register(gc.freeze)  # registered first, so it runs last: after every other exit handler
    here = os.path.realpath(os.path.dirname(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin and \
            os.path.basename(os.path.dirname(spec.origin)) != "exit_fast":
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_chain()
