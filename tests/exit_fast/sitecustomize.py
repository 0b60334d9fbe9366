"""Imported at start-up by every Python the test suite starts (conftest.py puts this folder on PYTHONPATH).

At exit it freezes the heap (gc.freeze) so that the interpreter's final collections skip it. A process that has
imported torch spends 0.3-1 s of CPU in those collections, every torchrun agent and worker among them: on two
cores that is about 1.5 s of each 2-process `trainready run` launch (bench: 8.9 -> 7.3 s of CPU). Nothing the
tests check happens there: our processes flush, close and release explicitly, so a file or process group that
only a collection at exit would have finished is a defect the tests now see rather than one they hide.

A sitecustomize found later on the path (Debian's, a user's) still runs: this one imports it after itself."""

import atexit
import gc
import importlib.machinery
import importlib.util
import os
import sys

atexit.register(gc.freeze)  # registered first, so it runs last: after every other exit handler

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
