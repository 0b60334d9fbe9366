"""SIGKILL at named points of a save (real processes): the next run restores a committed
checkpoint, never a partial one, and continues exactly as the uninterrupted run would.
A representative few points run here; bench/ckpt_soak.py sweeps them all."""

import shutil

import ckpt_worker as job
import pytest
from store_helpers import result, run_job

_reference: dict[int, str] = {}


def reference(step: int) -> str:
    if step not in _reference:
        _reference[step] = job.reference_digest(step)
    return _reference[step]


def _resume_and_check(tmp_path, args, final=7):
    out = tmp_path / "resumed.json"
    assert run_job([*args, "--steps", str(final), "--out", str(out)]) == [0]
    res = result(out)
    assert res["restored"] is not None
    assert res["restored_digest"] == reference(res["restored"]), "restored state is not the committed step's state"
    assert res["digest"] == reference(final)
    return res


@pytest.mark.parametrize("point", ["save.staged#3", "hot.data_written#3", "hot.manifest_written#3", "hot.renamed#3",
                                   "archive.data_uploaded#2", "retention.deleting#1"])
def test_kill_during_save_leaves_only_committed_checkpoints(tmp_path, point):
    args = ["--hot", str(tmp_path / "hot"), "--archive", str(tmp_path / "archive")]
    codes = run_job([*args, "--steps", "5", "--sync"], env={"TRAINREADY_FAULT": point})
    assert codes == [-9], f"fault point {point} was not reached"
    res = _resume_and_check(tmp_path, args)
    assert res["restored"] >= 1


def test_kill_mid_upload_then_new_node_restores_from_s3(tmp_path, s3_bucket):
    args = ["--hot", str(tmp_path / "hot"), "--archive", f"s3://{s3_bucket}/run"]
    assert run_job([*args, "--steps", "4", "--wait-each"],
                   env={"TRAINREADY_FAULT": "archive.file_uploaded#3"}) == [-9]
    shutil.rmtree(tmp_path / "hot")  # the node is gone; only the archive remains
    res = _resume_and_check(tmp_path, args)
    assert (res["tier"], res["restored"]) == ("archive", 2)


def test_sigterm_saves_uploads_and_exits_within_the_deadline(tmp_path, s3_bucket):
    import signal
    import subprocess
    import sys
    import time

    from store_helpers import WORKER, base_env

    args = ["--hot", str(tmp_path / "hot"), "--archive", f"s3://{s3_bucket}/spot"]
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, str(WORKER), *args, "--steps", "100000", "--save-every", "1000000",
                             "--preempt", "60", "--ready", str(ready)], env=base_env())
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)  # what a spot interruption notice ends in
    assert proc.wait(timeout=60) == 143
    shutil.rmtree(tmp_path / "hot")  # the instance is gone: only S3 remains
    out = tmp_path / "resumed.json"
    assert run_job([*args, "--steps", "1", "--out", str(out)]) == [0]
    res = result(out)
    assert res["tier"] == "archive" and res["restored"] >= 2
    assert res["restored_digest"] == reference(res["restored"])
