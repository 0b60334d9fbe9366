"""One slow multi-process run whose result several tests read, made once per test session.

Under pytest-xdist each worker is a process of its own, so a session fixture would run once per worker. The
first test to ask makes the result under a file lock in the session's shared temporary folder; a test on another
worker waits on the lock and reads the stored result. A run that failed is stored as a failure, so the other
tests fail at once with its message rather than running it again. Without xdist it is made in this process.
Results are JSON: what the tests compare (names, numbers, lines), never a live object."""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

_made: dict[str, dict[str, Any]] = {}  # without xdist (or for a second test on the same worker): kept here too


def shared_result(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any],
                  worker_id: str | None = None) -> Any:
    """`make(folder)`'s JSON result, made once per session for every worker (`worker_id`: xdist's worker, read from
    PYTEST_XDIST_WORKER, so this works with xdist not loaded too). A failure inside `make` fails every test that
    asks, with the first failure's text."""
    worker = worker_id if worker_id is not None else os.environ.get("PYTEST_XDIST_WORKER", "master")
    if name not in _made:
        if worker == "master":  # one process: its own base folder is this session's alone
            _made[name] = _make(tmp_path_factory.mktemp(name), make)
        else:  # the base folder's parent is this session's, shared by its workers
            root = tmp_path_factory.getbasetemp().parent / "shared-runs"
            root.mkdir(exist_ok=True)
            stored = root / f"{name}.json"
            with FileLock(str(stored) + ".lock"):
                if stored.is_file():
                    _made[name] = json.loads(stored.read_text())
                else:  # a folder of its own: one left by a worker that died while making it is not reused
                    _made[name] = _make(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root)), make)
                    stored.write_text(json.dumps(_made[name]))
    outcome = _made[name]
    if not outcome["ok"]:
        pytest.fail(f"the shared run {name!r} failed (made once for every test that reads it):\n{outcome['error']}",
                    pytrace=False)
    return outcome["result"]


def _make(folder: Path, make: Callable[[Path], Any]) -> dict[str, Any]:
    """The outcome as every worker reads it: through JSON also on the worker that made it (tuples as lists, keys as
    text), so a test cannot pass on one worker and fail on another; a result JSON cannot hold is a failure."""
    try:
        return json.loads(json.dumps({"ok": True, "result": make(folder)}))
    except BaseException as exc:  # pytest.fail's Failed is a BaseException; KeyboardInterrupt goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"ok": False, "error": "".join(traceback.format_exception(exc))[-6000:]}
