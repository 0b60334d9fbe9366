"""One decoder for every file of a run directory, built from the documented models (issue 25 §2): every field the
models name is checked on every record read, by every reader (summary, goodput, report, scaling, preflight,
exporters, the launcher), and a bad value costs what the model says: the record (READ_CORE) or the field."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from synthetic_run import make_run_dir

from trainready.errors import UsageError
from trainready.run.preflight import measured_step_s
from trainready.run.record_decoder import RECORD_MODELS, BadRecord, _reader, decode_launches, decode_record
from trainready.run.records import Launch, StepRecord, TelemetryLine
from trainready.run.run_dir import RunDir
from trainready.run.scaling import measure

HOSTILE = ["5", True, float("nan"), float("inf"), -1e30, 10**400, [1], {"a": 1}, None]


def _samples(tmp_path) -> dict[str, dict]:
    run = make_run_dir(tmp_path / "run", steps=40, ckpt_every=10)
    lines = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    found: dict[str, dict] = {}
    for record in lines:
        found.setdefault(record["type"], record)
    return found


def test_the_synthetic_run_is_what_the_documented_models_say(tmp_path):
    samples = _samples(tmp_path)
    assert {"launch", "start", "restore", "step", "ckpt", "end", "exit"} <= set(samples)
    for record in samples.values():
        TelemetryLine.model_validate(record)  # the fixtures below start from records the strict schema accepts


def test_every_named_field_is_checked_and_a_bad_one_costs_what_the_model_says(tmp_path):
    """Each field of each record type, given each hostile value: the record is left out when the field is core,
    else the field becomes unknown (its fallback), counted; what comes out always passes the reader's checks."""
    checked = 0
    for kind, sample in _samples(tmp_path).items():
        model = RECORD_MODELS[kind]
        for name in model.model_fields:
            if name in ("type", "schema_version", "source"):
                continue
            for value in HOSTILE:
                record, skipped = dict(sample, **{name: value}), Counter()
                if _accepts(model, name, value):
                    continue
                checked += 1
                if name in model.READ_CORE:
                    with pytest.raises(BadRecord, match=name):
                        decode_record(record, skipped)
                    continue
                out = decode_record(record, skipped)
                assert out[name] == model.READ_FALLBACK.get(name), (kind, name, value)
                assert sum(skipped.values()) == 1 and name in next(iter(skipped)), (kind, name, value, skipped)
                # every other field still passes the reader's checks: only the bad one became unknown
                _reader(model).model_validate({k: v for k, v in out.items() if k != name})
    assert checked > 300


def _accepts(model, name, value) -> bool:
    try:
        _reader(model).model_validate({name: value})
        return True
    except Exception:
        return False


@pytest.mark.parametrize("value, why", [("5", "not a number"), (-3.0, "negative"), (1e300, "too large"),
                                        (float("nan"), "not finite"), (10**400, "too large"), (True, "not a number")])
def test_a_bad_core_field_says_why(value, why):
    skipped = Counter()
    with pytest.raises(BadRecord, match=f"interval_s {why}"):
        decode_record({"type": "step", "t": 1.0, "step": 1, "interval_s": value}, skipped)


def test_older_and_newer_writers_stay_readable():
    older = {"schema_version": 1, "type": "step", "t": 1.0, "step": 3, "interval_s": 1.0}  # fields absent
    newer = dict(older, schema_version=2, a_field_of_tomorrow={"x": 1})
    unknown_type = {"type": "gpu_temperature", "t": 2.0, "celsius": 71}
    skipped = Counter()
    assert [decode_record(r, skipped) for r in (older, newer, unknown_type)] == [older, newer, unknown_type]
    assert not skipped
    assert "split_step" not in decode_record(older, skipped)  # absent stays absent: the reader tells them apart


def test_nested_shapes_are_checked_too():
    base = {"type": "step", "t": 1.0, "step": 1, "interval_s": 1.0}
    skipped = Counter()
    out = decode_record(dict(base, metrics={"loss": 2.0, "nonfinite": "loss"}), skipped)
    assert out["metrics"] == {} and skipped == {"step field: metrics.nonfinite not a list": 1}
    out["metrics"]["mutated"] = 1
    assert StepRecord.READ_FALLBACK["metrics"] == {}, "a fallback is a fresh value per record"
    skipped = Counter()
    out = decode_record(dict(base, ckpt={"last_saved": "4", "saving": False}), skipped)
    assert out["ckpt"] == {} and skipped == {"step field: ckpt.last_saved not an integer": 1}


def test_launches_decode_as_records_do():
    skipped = Counter()
    launches = decode_launches([{"start_unix": 10.0, "end_unix": 5.0}, {"start_unix": "soon"}, "x",
                                {"start_unix": 1.0, "end_unix": None, "pid": 0, "exit_code": True, "reason": 5,
                                 "node_rank": 0}], skipped)
    assert launches == [{"start_unix": 1.0, "end_unix": None, "pid": None, "exit_code": None, "reason": None,
                         "node_rank": 0}]
    assert skipped == {"launch: ends before it starts": 1, "launch: start_unix not a number": 1,
                       "launch: not an object": 1, "launch field: pid below 1": 1,
                       "launch field: exit_code not an integer": 1, "launch field: reason not a string": 1}
    assert set(Launch.READ_CORE) == {"start_unix", "end_unix"}


def test_run_dir_reads_its_telemetry_through_the_decoder(tmp_path):
    run = make_run_dir(tmp_path / "run", steps=30, ckpt_every=10)
    with open(run / "telemetry.jsonl", "a") as f:
        f.write(json.dumps({"schema_version": 1, "type": "step", "t": 1e9, "step": 31, "interval_s": "7"}) + "\n")
        f.write("{torn\n")
    skipped: dict[str, int] = {}
    records = RunDir(run).read_records(skipped)
    assert skipped == {"step: interval_s not a number": 1, "unreadable line": 1}
    assert all(isinstance(r["interval_s"], float) for r in records if r["type"] == "step")
    (tmp_path / "fifo").mkdir()
    import os

    os.mkfifo(tmp_path / "fifo" / "telemetry.jsonl")
    with pytest.raises(UsageError, match="not a regular file"):
        RunDir(tmp_path / "fifo").read_records()


def test_preflight_and_scaling_read_hostile_telemetry_without_a_traceback(tmp_path):
    """Both read step times straight from telemetry.jsonl; a string among them ended in a TypeError (statistics on
    a str and a float) before they went through the decoder."""
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"schema_version": 1, "type": "step", "t": 100.0 + i, "step": i, "interval_s": 2.0} for i in range(8)]
    lines.insert(3, {"schema_version": 1, "type": "step", "t": 103.5, "step": 3, "interval_s": "2.5"})
    (run / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert measured_step_s(run) == 2.0
    point = measure(run, 1, 0)
    assert point.step_s is None or math.isfinite(point.step_s)


def test_only_the_run_directory_reads_telemetry_and_every_reader_decodes():
    """telemetry.read_records (the raw lines) is imported by run_dir.RunDir alone, which decodes what it reads; and
    the goodput module keeps no hand-written checks of its own (the models' bounds are the one place)."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "trainready"
    importers = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("telemetry") and \
                    any(alias.name == "read_records" for alias in node.names):
                importers.append(path.relative_to(src).as_posix())
    assert importers == ["run/run_dir.py"]
    writers = sorted(path.relative_to(src).as_posix() for path in src.rglob("*.py")
                     if "TelemetryWriter(" in path.read_text() and path.name != "telemetry.py")
    assert writers == ["run/run_dir.py", "run/session.py"]  # the session's other ranks: a writer to nowhere
    assert "TelemetryWriter(None," in (src / "run" / "session.py").read_text()
    goodput = (src / "run" / "goodput.py").read_text()
    assert "MAX_S" not in goodput and "isinstance(value" not in goodput and "def _num(" not in goodput


def test_nulls_and_long_runs_the_readers_take_as_unknown(tmp_path):
    """From the review: a script's own `t.log(nonfinite=None)` made report end in a TypeError; an ETA past 11.6
    days was called malformed; a start record with a null world size lost the run's price and budget."""
    run = make_run_dir(tmp_path / "run", steps=20, ckpt_every=10)
    lines = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    for record in lines:
        if record["type"] == "step":
            record["metrics"] = {"loss": 1.0, "nonfinite": None}
            record["eta_s"] = 2e6
        if record["type"] == "start":
            record.update(world_size=None, nnodes=None, restart_count=None)
    (run / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    from trainready.run.summary import summarize

    summary = summarize(run)
    assert summary.nonfinite_losses == 0 and summary.eta_s == 2e6
    assert summary.cost.usd_per_hour is not None and summary.world_size is None
    assert summary.worker_restarts == 0
    kept = RunDir(run).read_records()
    assert all(r["eta_s"] == 2e6 for r in kept if r["type"] == "step")


def test_the_launcher_rebuilds_a_run_json_whose_launch_cannot_be_counted(tmp_path):
    """A launch whose start is not a time ended `trainready run` in a TypeError (billing subtracted strings): the
    file is moved aside and rebuilt from telemetry, as a torn one is."""
    from trainready.run.launcher import Launcher
    from trainready.run.launch_spec import LaunchSpec
    from trainready.run.settings import RunSettings

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"schema_version": 1, "kind": "trainready-run", "command": ["python", "t.py"],
                                              "config": {}, "environment": {}, "created_unix": 1.0,
                                              "launches": [{"start_unix": "x", "end_unix": None}]}))
    said: list[str] = []
    launcher = Launcher(LaunchSpec(command=["python", "t.py"], settings=RunSettings(run_dir=run)), said.append,
                        lambda records: None)
    launcher._begin()
    import os

    os.close(launcher._lock_fd)
    assert list(run.glob("run.json.corrupt-*")) and any("was unreadable" in line for line in said)
