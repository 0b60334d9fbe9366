"""`trainready run` end to end (one tiny worker, no training): the run directory is private,
secrets stay out of it and of the console, and a torn run.json between launches does not make
the budget forget what the first launch spent."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_helpers import env_for_run

SECRETS = ("sigSECRET123", "hfSECRET456", "archSECRET000")
SCRIPT = "import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('worker done')\n"


def launch(tmp_path, run_dir, *opts, env=None, sleep_s: float = 1.5) -> tuple[int, str]:
    (tmp_path / "sleepy.py").write_text(SCRIPT)
    cmd = [sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), *opts, "--", "python", "sleepy.py", str(sleep_s),
           "--data", "https://b.s3.amazonaws.com/x?X-Amz-Signature=sigSECRET123", "--hf-token", "hfSECRET456"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env_for_run(env), capture_output=True, text=True, timeout=180,
                          preexec_fn=lambda: os.umask(0o022))  # the modes asserted must not depend on the tester's umask
    return proc.returncode, proc.stdout + proc.stderr


def modes(run_dir) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): stat.S_IMODE(p.lstat().st_mode) for p in run_dir.iterdir()}


def log_modes(run_dir) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {"dir": set(), "file": set()}
    for path in [run_dir / "logs", *(run_dir / "logs").rglob("*")]:
        found["dir" if path.is_dir() else "file"].add(stat.S_IMODE(path.lstat().st_mode))
    return found


def test_run_dir_is_private_and_holds_no_secret(tmp_path):
    run_dir = tmp_path / "run"
    code, out = launch(tmp_path, run_dir, "--archive", "https://user:archSECRET000@host/x")
    assert code == 0, out[-3000:]
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700  # what keeps torchrun's own logs/ private
    found = modes(run_dir)
    assert (run_dir / "logs").is_dir() and list((run_dir / "logs").rglob("stdout.log"))
    # torchrun writes the per-rank logs under our umask, not the tester's 022 (issue 26)
    assert log_modes(run_dir) == {"dir": {0o700}, "file": {0o600}}
    assert {name: mode for name, mode in found.items() if name != "logs"} == {
        name: 0o600 for name in (".lock", "run.json", "summary.json", "telemetry.jsonl", "launcher.log")}
    assert not [s for s in SECRETS if s in out]
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert not [s for s in SECRETS if s in path.read_text(errors="replace")], path
    info = json.loads((run_dir / "run.json").read_text())
    assert info["command"][-3:] == ["https://b.s3.amazonaws.com/x?X-Amz-Signature=***", "--hf-token", "***"]


def test_torn_run_json_between_launches_still_counts_the_first_launchs_spend(tmp_path):
    run_dir = tmp_path / "run"
    budget = ("--usd-per-hour", "3600", "--budget-usd", "10")  # $1 per second: the first launch spends it all
    group = {"TRAINREADY_FILE_MODE": "group"}
    # a script that never reports a step (no trainready.init()): the launcher itself stops it before the budget
    code, out = launch(tmp_path, run_dir, *budget, env=group, sleep_s=600)
    assert code == 4 and "budget guard: stopped during start-up (no step reported yet)" in out, out[-3000:]
    first = json.loads((run_dir / "run.json").read_text())["launches"][0]
    assert first["reason"] == "budget" and first["end_unix"] - first["start_unix"] <= 10.0  # $1/s: within $10
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o750
    assert {mode for name, mode in modes(run_dir).items() if name != "logs"} == {0o640}
    found = log_modes(run_dir)  # torchrun makes its own run-id directory with mkdtemp (0700): narrower is fine
    assert stat.S_IMODE((run_dir / "logs").stat().st_mode) == 0o750 and found["dir"] <= {0o750, 0o700}
    assert found["file"] == {0o640}
    whole = (run_dir / "run.json").read_bytes()
    (run_dir / "run.json").write_bytes(whole[: len(whole) // 2])  # torn, as by a crash mid-write
    code, out = launch(tmp_path, run_dir, *budget, env=group)
    assert code == 2 and "already spent" in out and "Traceback" not in out, out[-3000:]
    assert "was unreadable" in out and "rebuilt 1 earlier launch(es) from telemetry.jsonl" in out
    assert [p.read_bytes() for p in run_dir.glob("run.json.corrupt-*")] == [whole[: len(whole) // 2]]


STEPS_SCRIPT = """import sys, torch, trainready
sess = trainready.init(total_steps=int(sys.argv[1]), ckpt_every="off")
w = torch.zeros(2)
for step in range(sess.start_step, int(sys.argv[1])):
    with sess.step(tokens=8):
        w += 1
sess.finish()
print("worker done")
"""


def test_the_same_command_in_a_finished_run_launches_nothing(tmp_path):
    """issue 25: re-running the command of a finished run started torchrun again (about 25 s of billed start-up on
    a GPU node) only to restore the last step and exit. A run that reached the total_steps it declared is said to
    be finished and nothing is launched; --resume goes on. A script that declared no length (an eval, data prep)
    runs again: it may do something new each time."""
    (tmp_path / "steps.py").write_text(STEPS_SCRIPT)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), "--", "python", "steps.py", "3"]

    def launch_steps(*extra: str) -> tuple[int, str]:
        proc = subprocess.run([*cmd[:4], *extra, *cmd[4:]], cwd=tmp_path, env=env_for_run(None), capture_output=True,
                              text=True, timeout=180)
        return proc.returncode, proc.stdout + proc.stderr

    code, out = launch_steps()
    assert code == 0 and "worker done" in out, out[-3000:]
    from cloud_stubs import cli_run  # nothing is launched: the entry function in this process (issue 25)

    again = cli_run(*cmd[3:], cwd=tmp_path, env={"TRAINREADY_NO_IMDS": "1"})
    code, out = again.returncode, again.stdout + again.stderr
    assert code == 0 and out.count("already finished (step 3 of 3): nothing launched") == 1, out[-3000:]
    assert "add --resume" in out and "worker done" not in out
    assert len(json.loads((run_dir / "run.json").read_text())["launches"]) == 1
    code, out = launch_steps("--resume")
    assert code == 0 and "worker done" in out, out[-3000:]
    assert len(json.loads((run_dir / "run.json").read_text())["launches"]) == 2
    # no declared length: the same command runs again
    code, out = launch(tmp_path, tmp_path / "plain", sleep_s=0)
    code, out = launch(tmp_path, tmp_path / "plain", sleep_s=0)
    assert code == 0 and "worker done" in out and "already finished" not in out, out[-3000:]


def test_the_script_keeps_the_users_umask(tmp_path):
    """The private umask is for torchrun's own log files: what the training script writes outside the run directory
    (checkpoints, a shared cache) keeps the umask the user launched with."""
    (tmp_path / "writer.py").write_text("import os, sys\nos.makedirs(sys.argv[1] + '/sub')\n"
                                        "open(sys.argv[1] + '/sub/w.bin', 'w').write('x')\nprint('worker done')\n")
    out_dir = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "trainready", "run", "--run-dir", str(tmp_path / "run"), "--",
                           "python", "writer.py", str(out_dir)], cwd=tmp_path, env=env_for_run(None),
                          capture_output=True, text=True, timeout=180, preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    assert stat.S_IMODE((out_dir / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((out_dir / "sub" / "w.bin").stat().st_mode) == 0o644
    assert log_modes(tmp_path / "run")["file"] == {0o600}  # while torchrun's logs stay private


def test_a_run_dir_that_cannot_be_written_is_a_usage_error(tmp_path):
    """issue 27: `run --run-dir` on a read-only file system exited 3 ("internal error: OSError"); every other
    command exits 2 for that. A path through a file (ENOTDIR) takes the same path as EROFS; a read-only mount is
    tried too where this machine allows one (root with CAP_SYS_ADMIN)."""
    (tmp_path / "a-file").write_text("")
    places = [tmp_path / "a-file" / "run"]
    mount = tmp_path / "ro"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(mount)], capture_output=True).returncode == 0
    if mounted:
        places.append(mount / "run")
    try:
        for run_dir in places:
            code, out = launch(tmp_path, run_dir, sleep_s=0)
            assert code == 2 and "internal error" not in out and str(run_dir) in out, out[-2000:]
            assert "Read-only file system" in out or "Not a directory" in out, out[-2000:]
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], capture_output=True)


OOM_SCRIPT = "import time\nchunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n    time.sleep(0.01)\n"


def _memory_cgroup(tmp_path, limit_mb: int):
    """A fresh cgroup-v1 memory cgroup with a limit, where this machine lets root make one; else None."""
    root = Path("/sys/fs/cgroup/memory")
    if os.getuid() != 0 or not (root / "cgroup.procs").exists():
        return None
    group = root / f"trainready-test-{os.getpid()}-{tmp_path.name[-12:]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(f"{limit_mb}M")
    except OSError:
        return None
    return group


def test_a_sigkill_says_who_sent_it_when_the_machine_knows(tmp_path):
    """issue 27: a launch ended by SIGKILL showed outcome "unknown" in report. A launcher killed with SIGKILL is
    "killed" (the one signal it cannot record), and a worker's SIGKILL names the OOM killer when this memory
    cgroup's kill count rose during the launch, else something outside trainready. The OOM half runs in a real
    memory cgroup where this machine lets root make one (it does here), and is skipped where it does not."""
    (tmp_path / "sleepy.py").write_text("import time\ntime.sleep(120)\n")
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), "--", "python",
                             "sleepy.py"], cwd=tmp_path, env=env_for_run(None), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (run_dir / "logs").exists():
        time.sleep(0.2)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and everything it started, as kill -9 on a process group
    proc.wait(timeout=30)
    report = subprocess.run([sys.executable, "-m", "trainready", "report", str(run_dir), "--json"],
                            capture_output=True, text=True, timeout=60)
    doc = json.loads(report.stdout)
    assert doc["status"] == "killed" and "SIGKILL, signal 9" in doc["message"], doc["message"]
    assert [launch["outcome"] for launch in doc["goodput"]["launches"]] == ["killed"]
    # read where that pid means nothing (another host, another pid namespace): unknown, not killed
    info = json.loads((run_dir / "run.json").read_text())
    info["launches"][-1]["host"] = "another-node"
    (run_dir / "run.json").write_text(json.dumps(info))
    doc = json.loads(subprocess.run([sys.executable, "-m", "trainready", "report", str(run_dir), "--json"],
                                    capture_output=True, text=True, timeout=60).stdout)
    assert doc["status"] == "unknown", doc["status"]

    group = _memory_cgroup(tmp_path, 1536)
    if group is None:
        pytest.skip("no memory cgroup can be made here: the OOM killer half needs root and cgroup v1")
    try:
        (tmp_path / "hog.py").write_text(OOM_SCRIPT)
        run_dir = tmp_path / "oom"
        proc = subprocess.run([sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), "--json", "--",
                               "python", "hog.py"], cwd=tmp_path, env=env_for_run(None), capture_output=True, text=True,
                              timeout=300, preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        outcome = json.loads(proc.stdout)
        assert outcome["reason"] == "failed" and "killed by SIGKILL" in outcome["message"], outcome["message"]
        assert "most likely by the kernel's OOM killer" in outcome["message"], outcome["message"]
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def test_workers_stopped_by_the_guard_say_so(tmp_path):
    """issue 27 (who killed it): workers that ignore the stop signal past --grace are stopped by trainready's guard
    (through torchrun: SIGTERM, then SIGKILL): the outcome says so rather than leaving the kill unexplained."""
    (tmp_path / "stubborn.py").write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                          "print('started', flush=True)\ntime.sleep(120)\n")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), "--grace", "2",
                             "--json", "--", "python", "stubborn.py"], cwd=tmp_path, env=env_for_run(None),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((run_dir / "logs").rglob("stdout.log")):
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    outcome = json.loads(out)
    assert outcome["exit_code"] == 143 and outcome["reason"] == "signal", outcome
    assert "did not stop within the 2 s grace period" in outcome["message"], outcome["message"]


def test_a_console_that_goes_away_never_hangs_the_training(tmp_path):
    """A second review: `trainready run ... | head` left torchrun blocked on a full pipe once the launcher's output
    pump died of EPIPE, and the training hung. The pump drains to the end; the run finishes and records it."""
    (tmp_path / "chatty.py").write_text("for i in range(200000):\n    print('line', i, 'x' * 100)\nprint('done')\n")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainready", "run", "--run-dir", str(run_dir), "--", "python",
                             "chatty.py"], cwd=tmp_path, env=env_for_run(None), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    # read until the workers print (before the launch, a closed console ends the command as any Unix tool: 141)
    while True:
        got = proc.stdout.readline()
        if not got or b"line " in got:  # torchrun prefixes each worker line with its rank
            break
    proc.stdout.close()  # as `head` does: the reader is gone
    proc.wait(timeout=120)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["launches"][-1]["reason"] == "finished", info["launches"][-1]
    assert (run_dir / "launcher.log").read_text().rstrip().endswith("done")  # every line still reached the log
