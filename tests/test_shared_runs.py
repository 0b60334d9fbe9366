"""tests/shared_runs.py: a slow run several tests read is made once per session, across xdist's workers."""

from __future__ import annotations

import pytest
import shared_runs
from shared_runs import shared_result


class Factory:
    """A TempPathFactory whose base folder is one worker's (popen-gwN) under the session's folder."""

    def __init__(self, session, worker):
        self.base = session / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self):
        return self.base

    def mktemp(self, name):
        path = self.base / name
        path.mkdir()
        return path


def test_made_once_for_every_worker_and_a_failure_fails_each_reader_without_running_again(tmp_path, monkeypatch):
    calls = []

    def make(folder):
        calls.append(folder)
        (folder / "out").write_text("x")
        return {"rows": [1, 2]}

    monkeypatch.setattr(shared_runs, "_made", {})
    assert shared_result(Factory(tmp_path, "gw0"), "demo", make, "gw0") == {"rows": [1, 2]}
    monkeypatch.setattr(shared_runs, "_made", {})  # another worker: another process, nothing in memory
    assert shared_result(Factory(tmp_path, "gw1"), "demo", make, "gw1") == {"rows": [1, 2]}
    assert len(calls) == 1 and calls[0].parent == tmp_path / "shared-runs"
    (tmp_path / "shared-runs" / "left-behind").mkdir()  # a worker killed while making "left-behind"
    monkeypatch.setattr(shared_runs, "_made", {})
    assert shared_result(Factory(tmp_path, "gw0"), "left-behind", make, "gw0") == {"rows": [1, 2]}

    def broken(folder):
        calls.append(folder)
        raise AssertionError("rank 1 never started")

    for worker in ("gw0", "gw1"):
        monkeypatch.setattr(shared_runs, "_made", {})
        with pytest.raises(pytest.fail.Exception, match="(?s)shared run .broken. failed.*rank 1 never started"):
            shared_result(Factory(tmp_path, worker), "broken", broken, worker)
    assert len(calls) == 3  # the failure was stored, not made again


def test_without_xdist_it_is_made_in_this_process_in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(shared_runs, "_made", {})
    seen = []
    for _ in range(2):
        assert shared_result(Factory(tmp_path, "master"), "solo", lambda f: seen.append(f) or 7, "master") == 7
    assert len(seen) == 1 and not (tmp_path / "shared-runs").exists()


def test_every_python_the_tests_start_freezes_its_heap_at_exit_and_still_runs_the_next_sitecustomize(tmp_path):
    """conftest.py puts tests/exit_fast first on PYTHONPATH: a child's sitecustomize is ours, its exit handler
    gc.freeze, and a sitecustomize later on the path (Debian's, a user's) still runs."""
    import os
    import subprocess
    import sys

    from run_helpers import EXIT_FAST

    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.stdout.write('next one ran\\n')\n")
    # atexit's handlers run now, by hand (they are cleared, so the real exit runs none): the heap is frozen after
    probe = ("import atexit, gc, sys; print(sys.modules['sitecustomize'].__file__); print(gc.get_freeze_count() > 0); "
             "atexit._run_exitfuncs(); print(gc.get_freeze_count() > 0)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([EXIT_FAST, str(tmp_path)])}
    assert EXIT_FAST in os.environ["PYTHONPATH"].split(os.pathsep)  # what every test subprocess inherits
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert lines[0] == "next one ran" and lines[1] == os.path.join(EXIT_FAST, "sitecustomize.py"), out
    assert lines[2:] == ["False", "True"], out
