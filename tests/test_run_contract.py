"""The determinism contract of `trainready run` + examples/tiny_gpt.py, with 2 gloo processes:
killed with SIGKILL at any moment (during a save, during an upload, mid-step; the launcher or a
worker) and started again with the same command, a run ends with the same final digest and the
same per-step losses as a run never interrupted; also when the hot tier is wiped and the
checkpoint comes back from S3 (moto_server on 127.0.0.1). bench/run_soak.py sweeps every point."""

from __future__ import annotations

import shutil
import signal

import pytest
from run_helpers import alive, digest, kill_launcher, losses, records, run, run_cmd, start, wait_for, worker_pids
from shared_runs import shared_result

STEPS = 40
OPTS = ("--nproc-per-node", "2", "--ckpt-every", "5")
PACE = ("--data-delay-ms", "50")
"""A sleep per step (no CPU, the same numbers): the small model's 40 steps would otherwise end before a kill that
waits for a step can land."""


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The uninterrupted run: made once per test session whichever xdist workers these tests land on (shared_runs).
    JSON keys are text: the losses come back keyed by step number."""
    digest_, base = shared_result(tmp_path_factory, "run-contract-baseline", _baseline)
    return digest_, {int(step): loss for step, loss in base.items()}


def _baseline(cwd):
    run_dir = cwd / "run"
    code, out = run(run_cmd(run_dir, *OPTS, steps=STEPS), cwd)
    assert code == 0, out[-3000:]
    base = losses(run_dir)
    assert sorted(base) == list(range(STEPS)) and digest(out)
    return digest(out), base


def assert_same_as_baseline(run_dir, out, baseline):
    want_digest, want_losses = baseline
    assert digest(out) == want_digest, out[-3000:]
    seen = [r for r in records(run_dir) if r["type"] == "step"]
    assert {r["step"] for r in seen} == set(range(STEPS))
    for r in seen:  # every step ever logged, by every launch, matches the uninterrupted run bit for bit
        assert r["metrics"]["loss"] == want_losses[r["step"]], r


def test_uninterrupted_run_is_reproducible(baseline, tmp_path):
    code, out = run(run_cmd(tmp_path / "run", *OPTS, steps=STEPS), tmp_path)
    assert code == 0
    assert_same_as_baseline(tmp_path / "run", out, baseline)


def test_launcher_killed_during_a_save(baseline, tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    cmd = run_cmd(run_dir, *OPTS, steps=STEPS)
    proc = start(cmd, tmp_path, {"TRAINREADY_FAULT": "hot.data_written:hang#3@0", "TRAINREADY_FAULT_MARKER": str(marker)})
    wait_for(marker.exists, 90, "the third save to reach hot.data_written")
    kill_launcher(proc, run_dir)  # also asserts that no worker outlives it
    assert list((run_dir / "checkpoints").glob("step-*")), "two checkpoints were committed before the kill"
    code, out = run(cmd, tmp_path)
    assert code == 0, out[-3000:]
    restored = [r for r in records(run_dir) if r["type"] == "restore"][-1]
    assert restored["step"] == 9  # the third save (step 14) never committed
    assert_same_as_baseline(run_dir, out, baseline)


def test_killed_during_an_upload_then_hot_tier_wiped(baseline, tmp_path, s3_bucket):
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    # steps paced by a 0.2 s data wait (a sleep: the same numbers, no CPU) so each checkpoint's upload ends before
    # the next one is committed: the third upload is then step 14's, as with the default model's slower steps
    cmd = run_cmd(run_dir, *OPTS, "--archive", f"s3://{s3_bucket}/tiny", steps=STEPS,
                  script_args=("--data-delay-ms", "200"))
    proc = start(cmd, tmp_path, {"TRAINREADY_FAULT": "archive.file_uploaded:hang#3", "TRAINREADY_FAULT_MARKER": str(marker)})
    wait_for(marker.exists, 90, "the third upload to start")
    kill_launcher(proc, run_dir)
    shutil.rmtree(run_dir / "checkpoints")  # the node is gone: only S3 is left
    code, out = run(cmd, tmp_path)
    assert code == 0, out[-3000:]
    restored = [r for r in records(run_dir) if r["type"] == "restore"][-1]
    assert restored["tier"] == "archive" and restored["step"] == 9, restored
    assert_same_as_baseline(run_dir, out, baseline)


@pytest.mark.parametrize("after_step", [7, 23])
def test_launcher_killed_mid_step(baseline, tmp_path, after_step):
    run_dir = tmp_path / "run"
    cmd = run_cmd(run_dir, *OPTS, steps=STEPS, script_args=PACE)
    proc = start(cmd, tmp_path)
    wait_for(lambda: any(r["type"] == "step" and r["step"] >= after_step for r in records(run_dir)), 90,
             f"step {after_step}")
    kill_launcher(proc, run_dir)
    assert not any(r["type"] == "end" for r in records(run_dir)), "the run ended before the kill: nothing was tested"
    code, out = run(cmd, tmp_path)
    assert code == 0, out[-3000:]
    assert_same_as_baseline(run_dir, out, baseline)


def test_worker_killed_and_restarted_by_torchrun(baseline, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_cmd(run_dir, *OPTS, "--max-restarts", "2", steps=STEPS, script_args=PACE), tmp_path)
    wait_for(lambda: any(r["type"] == "step" and r["step"] >= 12 for r in records(run_dir)), 90, "step 12")
    victim = [w for r in records(run_dir) if r["type"] == "start" for w in r["workers"] if w["rank"] == 1][0]["pid"]
    import os

    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    starts = [r for r in records(run_dir) if r["type"] == "start"]
    assert [s["restart_count"] for s in starts] == [0, 1]
    assert not any(alive(p) for p in worker_pids(run_dir))
    assert_same_as_baseline(run_dir, out, baseline)
