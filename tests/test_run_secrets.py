"""`run` keeps secrets out of what it writes and prints, writes its small files durably and
privately, and keeps counting earlier spend when run.json is torn (units, no workers)."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest
from rich.console import Console

from trainready.errors import UsageError
from trainready.run.launcher import Launcher, LaunchResult, LaunchSpec
from trainready.run.records import RunInfo
from trainready.run.settings import RunSettings
from trainready.run.summary import billed_seconds, launches_from_telemetry, summarize
from trainready.run.telemetry import TelemetryWriter

SECRET_COMMAND = ["python", "train.py", "--data", "https://b.s3.amazonaws.com/x?X-Amz-Signature=sigSECRET123&X-Amz-Date=1",
                  "--hf-token", "hfSECRET456", "--db", "postgres://u:pwSECRET789@db/x"]
SECRETS = ("sigSECRET123", "hfSECRET456", "pwSECRET789", "archSECRET000")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _launcher(run_dir: Path, command=None, budget=None, said=None, resume=False) -> Launcher:
    settings = RunSettings(run_dir=run_dir, budget_usd=budget, usd_per_hour=3600.0 if budget else None,
                           archive="s3://AKIAABCDEFGHIJKLMNOP:archSECRET000@bucket/x")
    spec = LaunchSpec(command=command or ["python", "train.py"], settings=settings, resume=resume,
                      config={"archive": "https://user:archSECRET000@host/x", "hot": str(run_dir / "checkpoints")})
    return Launcher(spec, (said if said is not None else []).append, lambda records: None)


def _release(launcher: Launcher) -> None:
    os.close(launcher._lock_fd)


def _telemetry(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "telemetry.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({"schema_version": 1, "source": "launcher", **r}) + "\n")


EARLIER = [{"type": "launch", "t": 1000.0, "argv": [], "node_rank": 0, "prior_billed_s": 0.0},
           {"type": "step", "t": 1050.0, "source": "rank0", "step": 0, "interval_s": 40.0},
           {"type": "exit", "t": 1100.0, "exit_code": 0, "reason": "finished", "message": "training finished"},
           {"type": "launch", "t": 2000.0, "argv": [], "node_rank": 0, "prior_billed_s": 100.0},
           {"type": "step", "t": 2030.0, "source": "rank0", "step": 1, "interval_s": 20.0}]  # killed: no exit record


# ---------------------------------------------------------------- prior spend when run.json is torn


def test_launches_rebuilt_from_telemetry_count_their_billed_time():
    launches = launches_from_telemetry(EARLIER)
    assert [(la["start_unix"], la["end_unix"], la["exit_code"]) for la in launches] == [(1000.0, 1100.0, 0), (2000.0, None, None)]
    assert all(la["recovered_from"] == "telemetry.jsonl" for la in launches)
    assert billed_seconds(launches, EARLIER) == pytest.approx(100.0 + 30.0)  # the killed one: to its last record
    assert launches_from_telemetry([]) == []


@pytest.mark.parametrize("damage", [b'{"schema_version": 1, "launches": [{"start_unix": 10', b"", b"\xff\xfe garbage",
                                    b'["not", "an", "object"]', b'{"launches": "none"}'])
def test_corrupt_run_json_is_moved_aside_and_spend_recovered(tmp_path, damage):
    run_dir = tmp_path / "run"
    _telemetry(run_dir, EARLIER)
    (run_dir / "run.json").write_bytes(damage)
    said: list[str] = []
    launcher = _launcher(run_dir, budget=1000.0, said=said)
    launcher._begin()
    _release(launcher)
    assert launcher.settings.prior_s == pytest.approx(130.0)  # was 0: the budget forgot what was spent
    aside = list(run_dir.glob("run.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damage
    assert any("unreadable" in line and aside[0].name in line and "130 s billed" in line for line in said), said
    info = json.loads((run_dir / "run.json").read_text())
    RunInfo.model_validate(info)
    assert [la.get("recovered_from") for la in info["launches"]] == ["telemetry.jsonl", "telemetry.jsonl", None]
    assert info["launches"][-1]["prior_billed_s"] == pytest.approx(130.0)


def test_corrupt_run_json_with_nothing_to_recover_says_so(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text("{torn")
    said: list[str] = []
    launcher = _launcher(run_dir, said=said)
    launcher._begin()
    _release(launcher)
    assert any("NOT counted by the budget" in line for line in said), said
    assert launcher.settings.prior_s == 0.0


def test_budget_refusal_after_recovery_keeps_the_rebuilt_record(tmp_path):
    run_dir = tmp_path / "run"
    _telemetry(run_dir, EARLIER)
    (run_dir / "run.json").write_text("{torn")
    launcher = _launcher(run_dir, budget=100.0)  # $1/s: 130 s already spent
    with pytest.raises(UsageError, match="already spent"):
        launcher._begin()
    _release(launcher)
    again = _launcher(run_dir, budget=100.0)  # run.json now parses, and still counts the 130 s
    with pytest.raises(UsageError, match=r"\$130\.00"):
        again._begin()
    _release(again)


def test_unreadable_run_json_is_a_usage_error_not_a_reset(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "run.json").mkdir(parents=True)  # EISDIR: not ours to move aside
    launcher = _launcher(run_dir)
    with pytest.raises(UsageError, match="cannot read"):
        launcher._begin()
    _release(launcher)


# ---------------------------------------------------------------- secrets in run.json, summary, messages


def test_run_json_holds_the_command_and_archive_redacted(tmp_path):
    run_dir = tmp_path / "run"
    said: list[str] = []
    launcher = _launcher(run_dir, SECRET_COMMAND, said=said)
    launcher._begin()
    launcher._end(LaunchResult(0, "finished", "training finished"))
    _release(launcher)
    text = (run_dir / "run.json").read_text()
    assert not [s for s in SECRETS if s in text], text
    info = json.loads(text)
    assert info["command"][:3] == ["python", "train.py", "--data"]
    assert "X-Amz-Signature=***" in info["command"][3] and info["command"][5] == "***"
    assert info["config"]["archive"] == "https://***@host/x"
    summary = (run_dir / "summary.json").read_text()
    assert not [s for s in SECRETS if s in summary] and json.loads(summary)["command"] == info["command"]
    # the same command again: compared in redacted form, so it is the same run (it resumes without a word)
    again = _launcher(run_dir, SECRET_COMMAND, said=said)
    again._begin()
    _release(again)
    assert not any("--resume" in line or "holds a run" in line for line in said), said
    other_command = ["python", "other.py", "--hf-token", "hfSECRET456"]
    other = _launcher(run_dir, other_command, said=said)
    with pytest.raises(UsageError, match="holds a run of `python train.py") as refused:  # another experiment
        other._begin()
    _release(other)
    assert "--resume" in str(refused.value) and not [s for s in SECRETS if s in str(refused.value)]
    other = _launcher(run_dir, other_command, said=said, resume=True)
    other._begin()
    _release(other)
    note = [line for line in said if "--resume: continuing the run of" in line]
    assert note and not [s for s in SECRETS if s in note[0]]


def test_summary_redacts_a_run_json_written_before_redaction(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"command": SECRET_COMMAND, "launches": [
        {"start_unix": 1.0, "end_unix": 2.0, "exit_code": 1, "reason": "failed", "pid": 1, "node_rank": 0,
         "prior_billed_s": 0, "message": "upload to https://u:pwSECRET789@h/x failed"}]}))
    text = summarize(run_dir).model_dump_json()
    assert not [s for s in SECRETS if s in text]


def test_preflight_archive_errors_redact_the_url(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from botocore.exceptions import ClientError

    from trainready.run import preflight

    class Client:
        def head_bucket(self, Bucket):
            raise ClientError({"Error": {"Code": "403", "Message": "denied"}}, "HeadBucket")

    monkeypatch.setattr(boto3, "client", lambda *a, **k: Client())
    with pytest.raises(UsageError) as exc:
        preflight.check_archive("s3://bucket/prefix?X-Amz-Signature=sigSECRET123")
    assert "sigSECRET123" not in str(exc.value) and "access denied" in str(exc.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://minio:pwSECRET789@127.0.0.1:9")
    with pytest.raises(UsageError) as exc:
        preflight.check_archive("s3://bucket/prefix")
    assert "pwSECRET789" not in str(exc.value)


def test_failure_tail_and_diagnosis_evidence_are_redacted(tmp_path):
    from trainready.run.diagnose import diagnose_text
    from trainready.run.failure import explain_failure

    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (url https://u:pwSECRET789@h/x)"
    stderr = tmp_path / "logs" / "r" / "attempt_0" / "0" / "stderr.log"
    stderr.parent.mkdir(parents=True)
    stderr.write_text(f"Traceback (most recent call last):\n{line}\n")
    result = explain_failure(LaunchSpec(command=SECRET_COMMAND, settings=RunSettings(run_dir=tmp_path)),
                             ["Root Cause (first observed failure):", "  rank      : 0 (local_rank: 0)",
                              "  exitcode  : 1 (pid: 7)"], 1)
    assert result.log_tail and "pwSECRET789" not in json.dumps(result.log_tail)
    diagnoses = diagnose_text(line)
    assert diagnoses and "pwSECRET789" not in json.dumps([d.model_dump() for d in diagnoses])


def test_live_title_is_redacted():
    from trainready.run.live import LiveView

    buffer = io.StringIO()
    view = LiveView(Console(file=buffer, width=200), " ".join(SECRET_COMMAND)[:200], live=False)
    assert not [s for s in SECRETS if s in view.title]


# ---------------------------------------------------------------- durable and private


def test_run_files_are_private_and_follow_trainready_file_mode(tmp_path, monkeypatch):
    old = os.umask(0o022)
    try:
        monkeypatch.delenv("TRAINREADY_FILE_MODE", raising=False)
        run_dir = tmp_path / "private"
        launcher = _launcher(run_dir)
        launcher._begin()
        launcher._end(LaunchResult(0, "finished", "training finished"))
        _release(launcher)
        assert _mode(run_dir) == 0o700
        assert {p.name: _mode(p) for p in run_dir.iterdir()} == {
            "run.json": 0o600, "summary.json": 0o600, "telemetry.jsonl": 0o600, ".lock": 0o600, "logs": 0o700}
        monkeypatch.setenv("TRAINREADY_FILE_MODE", "group")
        run_dir = tmp_path / "group"
        launcher = _launcher(run_dir)
        launcher._begin()
        launcher._end(LaunchResult(0, "finished", "training finished"))
        _release(launcher)
        assert _mode(run_dir) == 0o750
        assert {_mode(p) for p in run_dir.iterdir() if p.name != "logs"} == {0o640} and _mode(run_dir / "logs") == 0o750
        writer = TelemetryWriter(tmp_path / "standalone", source="rank0")  # init(run_dir=...) without the launcher
        writer.close()
        assert _mode(tmp_path / "standalone") == 0o750 and _mode(tmp_path / "standalone" / "telemetry.jsonl") == 0o640
    finally:
        os.umask(old)


def test_run_json_is_replaced_durably(tmp_path, monkeypatch):
    import trainready.run.run_dir as run_dir_module  # RunDir writes every file of a run directory

    calls = []
    real = run_dir_module.replace_durable
    monkeypatch.setattr(run_dir_module, "replace_durable", lambda path, data: (calls.append(Path(path).name), real(path, data)))
    launcher = _launcher(tmp_path / "run")
    launcher._begin()
    launcher._end(LaunchResult(0, "finished", "training finished"))
    _release(launcher)
    assert calls == ["run.json", "run.json", "summary.json"]
    assert not [p for p in (tmp_path / "run").iterdir() if ".tmp" in p.name]


def test_a_hostile_stop_json_is_unknown_not_a_crash(tmp_path):
    """stop.json is decoded into its documented shape (RunDir.read_stop): a wrong type or an exit code no process
    can have makes it unknown, and the launcher explains the exit from the exit status alone. `int("x")` used to
    raise inside the launcher's outcome (exit 3)."""
    import os

    launcher = _launcher(tmp_path / "run")
    launcher._begin()
    try:
        for hostile in ('{"reason": "signal", "exit_code": "x", "message": "m"}', '{"exit_code": 1e400}', '[]', '{'):
            (tmp_path / "run" / "stop.json").write_text(hostile)
            result = launcher._outcome(0)
            assert (result.exit_code, result.reason) == (0, "finished"), hostile
        (tmp_path / "run" / "stop.json").unlink()
        os.mkfifo(tmp_path / "run" / "stop.json")  # no hang either
        assert launcher._outcome(0).reason == "finished"
    finally:
        _release(launcher)


def test_hostile_run_json_is_exit_2_for_report_and_rebuilt_by_a_relaunch(tmp_path):
    """issue 26: `"command": 5` in run.json gave report an internal error (exit 3), and JSON nested past the
    parser's depth crashed a relaunch. report now says which field of which file; the launcher moves such a file
    aside and rebuilds its launches from telemetry, as it does a torn one."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from cloud_stubs import invoke

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text('{"schema_version": 1, "command": 5, "launches": []}')
    code, out, err = invoke("report", str(run_dir))
    assert code == 2 and "run.json: unreadable ('command' is a JSON number, not a list of strings)" in err, err
    deep = '{"x": ' * 100_000 + "1" + "}" * 100_000
    for hostile in (deep, '{"schema_version": 1, "command": 5, "launches": []}'):
        (run_dir / "run.json").write_text(hostile)
        said: list[str] = []
        launcher = _launcher(run_dir, said=said)
        try:
            launcher._begin()
        finally:
            _release(launcher)
        assert any("was unreadable (moved to run.json.corrupt-" in line for line in said), said
        for aside in run_dir.glob("run.json.corrupt-*"):
            aside.unlink()
