"""A launcher SIGKILLed (or its budget guard killing torchrun) while the workers start up leaves no orphan.

The workers' orphan watchdog starts in trainready.init() after init_process_group(). Workers that
share the store torchrun's agent listens on (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0) and have not yet
connected to it when the agent dies retry the connection to a dead port until the store timeout
(30 min, torch's default_pg_timeout) before the watchdog ever runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from run_helpers import alive, env_for_run, start, wait_for

from trainready.run.watchdog import children

SLOW_START = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(2)  # still starting (imports, data): not yet connected to the store when the launcher goes
import trainready
sess = trainready.init(total_steps=2)
sess.finish()
"""


@pytest.mark.parametrize("restarts", [0, 1])
def test_launcher_killed_during_worker_start_up_leaves_no_orphan(tmp_path, restarts):
    (tmp_path / "slow.py").write_text(SLOW_START)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = start([sys.executable, "-m", "trainready", "run", "--run-dir", str(tmp_path / "run"), "--nproc-per-node", "2",
                  "--max-restarts", str(restarts), "--", "python", "slow.py", str(marks)], tmp_path)
    pid_files = [marks / "pid-0", marks / "pid-1"]
    try:
        wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files), 120, "both workers to start")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    pids = [int(p.read_text()) for p in pid_files]
    try:
        wait_for(lambda: not any(alive(p) for p in pids), 20, f"workers {pids} to exit after the launcher was killed")
    finally:
        for pid in pids:  # never leave them behind, pass or fail
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_check_deep_killed_while_its_ranks_start_takes_them_along(tmp_path):
    """`check --deep`'s local collectives spawn ranks that connect to a store the parent hosts; a parent
    killed outright while they import torch left them retrying its dead store for 5 minutes."""
    proc = subprocess.Popen([sys.executable, "-c", "from trainready.check.deep import collectives_local; "
                             "collectives_local()"], env=env_for_run(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ranks: list[int] = []

    def spawned() -> bool:  # the two ranks (multiprocessing's resource tracker is a child too)
        ranks[:] = [c for c in children(proc.pid) if "_spawned" in _cmdline(c) or "spawn_main" in _cmdline(c)]
        return len(ranks) >= 2

    try:
        wait_for(spawned, 120, "the ranks to be spawned")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    try:
        wait_for(lambda: not any(alive(p) for p in ranks), 20, f"ranks {ranks} to exit after check was killed")
    finally:
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
