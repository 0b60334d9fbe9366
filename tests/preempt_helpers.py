"""SIGTERM trials of the documented pattern (examples/train_with_checkpoints.py) under torchrun
with 2 gloo ranks: start it, stop the whole process group with SIGTERM at a given step (as a
spot reclaim, Slurm preemption or systemd shutdown does), check that it ends in time, run the
same command again and compare the final state with an uninterrupted run bit for bit.
Used by tests/test_store_preempt.py (a few trials) and bench/preempt_soak.py (the sweep)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_with_checkpoints.py"
STOP_DEADLINE_S = 60.0   # from SIGTERM to every process gone (spot gives 120 s)
RUN_DEADLINE_S = 120.0


@dataclass(frozen=True)
class Mode:
    sync: bool
    handler: bool
    when_busy: str

    def flags(self) -> list[str]:
        return ((["--sync"] if self.sync else []) + ([] if self.handler else ["--no-preemption-handler"])
                + ["--when-busy", self.when_busy])

    def __str__(self) -> str:
        return f"{'sync ' if self.sync else 'async'} handler={'on ' if self.handler else 'off'} {self.when_busy:4}"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINREADY_FAULT", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def command(base: Path, mode: Mode, steps: int, out: Path | None = None, step_sleep: float = 0.03) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(EXAMPLE), "--hot", str(base / "hot"), "--archive", str(base / "archive"), "--steps", str(steps),
           "--save-every", "1", "--step-sleep", str(step_sleep), "--progress", str(base / "progress"), *mode.flags()]
    return cmd + (["--out", str(out)] if out else [])


def run_to_end(cmd: list[str], cwd: Path, timeout: float = RUN_DEADLINE_S) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def reference_digest(base: Path, steps: int) -> str:
    base.mkdir(parents=True, exist_ok=True)
    out = base / "out.json"
    code, log = run_to_end(command(base, Mode(True, True, "wait"), steps, out, step_sleep=0.0), base)
    if code != 0:
        raise RuntimeError(f"reference run failed ({code}): {log[-2000:]}")
    return json.loads(out.read_text())["digest"]


def trial(base: Path, mode: Mode, steps: int, stop_at: int, reference: str) -> tuple[bool, str]:
    """One SIGTERM trial; (held, what happened)."""
    base.mkdir(parents=True, exist_ok=True)
    progress = base / "progress"
    proc = subprocess.Popen(command(base, mode, steps), cwd=base, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + RUN_DEADLINE_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if int(progress.read_text() or 0) >= stop_at:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    if proc.poll() is not None:
        return False, f"ended (exit {proc.returncode}) before step {stop_at}: {proc.stdout.read()[-1500:]}"
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)  # the whole job, as a reclaim or a shutdown does
    try:
        proc.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False, f"still running {STOP_DEADLINE_S:.0f} s after SIGTERM (hung): {proc.stdout.read()[-1500:]}"
    stop_s = time.monotonic() - signalled
    _reap_group(proc.pid)
    out = base / "out.json"
    code, log = run_to_end(command(base, mode, steps, out), base)
    if code != 0:
        return False, f"the resumed run failed ({code}): {log[-1500:]}"
    result = json.loads(out.read_text())
    restored = result["restored"]
    if mode.handler and (restored or 0) < stop_at:
        return False, f"signalled at step {stop_at} but resumed from {restored}: the preemption save was lost"
    if result["digest"] != reference:
        return False, f"resumed from step {restored}, final state differs from the uninterrupted run"
    return True, f"stopped in {stop_s:.1f} s, resumed from step {restored}, bit-identical"


def _reap_group(pgid: int) -> None:
    """Workers of a torchrun killed by the signal must not linger (they would hold the hot tier)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
