"""Driving `trainready run` as a user does: a real launcher process, torchrun, gloo workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_GPT = ROOT / "examples" / "tiny_gpt.py"
SRC = ROOT / "src"
EXIT_FAST = str(ROOT / "tests" / "exit_fast")  # conftest.py puts it on every test subprocess's PYTHONPATH


def env_for_run(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINREADY_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["TRAINREADY_NO_IMDS"] = "1"
    env["COLUMNS"] = "250"  # Rich wraps messages at the terminal width; keep them on one line
    env.update(extra or {})
    return env


SMALL_MODEL = ("--d", "64", "--layers", "2", "--heads", "2")
"""tiny_gpt at a fifth of its default width and a third of its depth: a step in ~0.03 s instead of ~0.25 s on two
CPU processes, and the loss still falls (5.5 -> 3.0 in 40 steps). The tests check what the runs do (saves, stops,
resumes, digests), not what the model learns; a test's own script_args come after it and win."""


def run_cmd(run_dir: Path, *opts: str, steps: int = 40, script_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), *opts, "--",
            "python", str(TINY_GPT), "--steps", str(steps), *SMALL_MODEL, *script_args]


def start(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env_for_run(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 180) -> tuple[int, str]:
    proc = start(cmd, cwd, env)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "telemetry.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def losses(run_dir: Path) -> dict[int, float]:
    """Per-step loss as logged through the session (the last launch that ran a step wins)."""
    return {r["step"]: r["metrics"]["loss"] for r in records(run_dir) if r["type"] == "step"}


def digest(output: str) -> str | None:
    found = re.findall(r"final_state_sha256=([0-9a-f]{64})", output)
    return found[-1] if found else None


def worker_pids(run_dir: Path) -> list[int]:
    return [w["pid"] for r in records(run_dir) if r["type"] == "start" for w in r.get("workers", [])]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def kill_launcher(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGKILL the launcher alone; its workers must follow within seconds (no orphans)."""
    pids = worker_pids(run_dir)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_for(lambda: not any(alive(p) for p in pids), 15, f"workers {pids} to exit after the launcher was killed")
