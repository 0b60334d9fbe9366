"""Hostile run directories and files for `report` (issue 15) and `check --bundle` (issue 16): wrong types
become unknown, odd files a clear UsageError, never an internal error or a hang."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from synthetic_run import make_run_dir

from trainready.errors import UsageError
from trainready.run.summary import summarize


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_run_dir(tmp_path_factory.mktemp("run") / "r", steps=30, ranks=2, ckpt_every=10)


def _copy(base: Path, dst: Path, *, step=None, launch=None, info=None) -> Path:
    dst.mkdir()
    records = [json.loads(line) for line in (base / "telemetry.jsonl").read_text().splitlines()]
    for r in records:
        if r["type"] == "step" and step:
            r.update(step)
    run = json.loads((base / "run.json").read_text())
    for la in run["launches"]:
        la.update(launch or {})
    (dst / "run.json").write_text(json.dumps(run if info is None else info))
    (dst / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return dst


@pytest.mark.parametrize("timing", [True, ["cuda-events"], {"a": 1}, 3])
def test_a_timing_that_is_not_text_is_unknown(base, tmp_path, timing):
    shares = summarize(_copy(base, tmp_path / "r", step={"timing": timing})).shares
    assert shares is not None and shares.timing == "unknown"


@pytest.mark.parametrize("code", ["1", "abc", 1.5, True, [1]])
def test_an_exit_code_that_is_not_an_integer_is_unknown(base, tmp_path, code):
    assert summarize(_copy(base, tmp_path / "r", launch={"exit_code": code})).exit_code is None


@pytest.mark.parametrize("field", ["reason", "message"])
def test_a_reason_or_message_that_is_not_text_is_unknown(base, tmp_path, field):
    s = summarize(_copy(base, tmp_path / "r", launch={field: ["finished"]}))
    assert s.status in ("finished", "failed", "unknown") and (field != "message" or s.message is None)


def test_a_nonfinite_list_that_is_not_a_list_is_left_out(base, tmp_path):
    assert summarize(_copy(base, tmp_path / "r", step={"metrics": {"loss": 1.0, "nonfinite": 5}})).nonfinite_losses == 0


def test_a_pid_that_names_this_process_is_not_a_running_launch(base, tmp_path):
    s = summarize(_copy(base, tmp_path / "r", launch={"pid": "self", "end_unix": None, "exit_code": None}))
    assert s.status == "unknown"


@pytest.mark.parametrize("info", [[1, 2], "x", 3])
def test_run_json_that_is_not_an_object_is_a_usage_error(base, tmp_path, info):
    with pytest.raises(UsageError, match="not an object"):
        summarize(_copy(base, tmp_path / "r", info=info))


def test_run_json_nested_past_the_parser_is_a_usage_error(base, tmp_path):
    run = _copy(base, tmp_path / "r")
    (run / "run.json").write_text('{"launches": ' + "[" * 200_000)  # was RecursionError: exit 3, internal error
    with pytest.raises(UsageError, match=r"run\.json: unreadable \(JSON nested too deep\)"):
        summarize(run)


@pytest.mark.parametrize("target", ["dir", "fifo", "loop"])
def test_telemetry_that_is_not_a_regular_file_is_a_usage_error(base, tmp_path, target):
    run = _copy(base, tmp_path / "r")
    tel = run / "telemetry.jsonl"
    tel.unlink()
    if target == "dir":
        tel.mkdir()
    elif target == "fifo":
        os.mkfifo(tel)  # reading it would block forever, as a symlink to /dev/zero never ends
    else:
        tel.symlink_to(run / "loop")
        (run / "loop").symlink_to(tel)
    with pytest.raises(UsageError, match="not a regular file|unreadable"):
        summarize(run)


def test_html_to_a_device_or_fifo_is_refused_not_replaced(tmp_path):
    from trainready.io import output_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="^--html .*pipe: not a regular file"):
        output_file(fifo, "--html", "report.html")
    assert not fifo.is_file()
    assert output_file(tmp_path / "ok.html", "--html", "report.html") == tmp_path / "ok.html"


def test_output_file_the_system_cannot_look_at_is_a_usage_error(tmp_path):
    """A name longer than the file system takes: pathlib's is_dir raises OSError (ENAMETOOLONG; EACCES for a
    directory without search permission), which reached the user as an internal error, exit 3."""
    from trainready.io import output_file

    with pytest.raises(UsageError, match=r"^--html .*a{255}.*\.html: File name too long; give a file name, e\.g\. "):
        output_file(tmp_path / ("a" * 300 + ".html"), "--html", "report.html")


@pytest.mark.parametrize("content", [b"\x00\xff\xfe garbage \x1b[31m\n", "\u202e\U0001f600 nvme?\n".encode()])
def test_unreadable_nvme_devices_is_unknown_not_zero_controllers(tmp_path, content):
    from check_bundles import make_bundle

    from trainready.check import checks  # noqa: F401  (register the checks)
    from trainready.check.analyze import analyze
    from trainready.check.bundle import Bundle

    directory = make_bundle("p5", tmp_path, replace={"nvme-devices.txt": content})
    found = {f.id: f for f in analyze(Bundle.load(directory)).checks}["storage.nvme-count"]
    assert found.status == "skip" and "unreadable" in found.reason
    empty = make_bundle("p5", tmp_path, replace={"nvme-devices.txt": ""})  # the probe's output with no NVMe at all
    assert {f.id: f for f in analyze(Bundle.load(empty)).checks}["storage.nvme-count"].status == "fail"


def test_calibration_save_target_that_is_a_directory_or_fifo_is_a_usage_error(tmp_path):
    from trainready.io import output_file

    os.mkfifo(tmp_path / "pipe")
    for target, words in ((tmp_path, "is a directory"), (tmp_path / "pipe", "not a regular file"),
                          (tmp_path / "nope" / "x.json", "does not exist")):
        with pytest.raises(UsageError, match=f"^--calibration .*{words}"):
            output_file(target, "--calibration", "my-gpu.json")
    output_file(tmp_path / "mine.json", "--calibration", "my-gpu.json")


def test_a_refused_deep_json_says_why_not_that_it_is_missing(tmp_path):
    from trainready.catalog import load_catalog
    from trainready.report.calibration import bundle_measurements

    (tmp_path / "instance-type.txt").write_text("p5en.48xlarge\n")
    (tmp_path / "deep.json").symlink_to(tmp_path / "instance-type.txt")
    with pytest.raises(UsageError, match="not read: a symlink"):
        bundle_measurements(tmp_path, load_catalog())


def _with_records(base: Path, dst: Path, extra: list[dict], start: dict | None = None) -> Path:
    run = _copy(base, dst)
    records = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    records = [{**r, **(start or {})} if r["type"] == "start" else r for r in records]
    t = records[-1]["t"]
    (run / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records + [{**e, "t": t} for e in extra]))
    return run


def test_a_budget_or_stop_cost_that_is_not_a_number_is_unknown(base, tmp_path):
    s = summarize(_with_records(base, tmp_path / "r", [{"type": "stop", "cost_usd": "x"}], start={"budget_usd": "x"}))
    assert s.cost.budget_usd is None and s.cost.spent_usd is not None


@pytest.mark.parametrize("where", ["loss", "interval_s", "tokens", "t", "start_unix"])
def test_an_integer_past_a_floats_range_is_unknown_not_an_overflow(base, tmp_path, where):
    from trainready.report.run_page import write_run_page

    big = 10**400
    if where == "loss":
        run = _copy(base, tmp_path / "r", step={"metrics": {"loss": big}})
    elif where == "start_unix":
        run = _copy(base, tmp_path / "r", launch={"start_unix": big})
    else:
        run = _copy(base, tmp_path / "r", step={where: big})
    s = summarize(run)
    assert s.loss_last is None if where == "loss" else True
    write_run_page(run, tmp_path / "page.html")
    assert (tmp_path / "page.html").stat().st_size > 0


@pytest.mark.parametrize("plant", ["fifo", "symlink", "directory", "huge"])
def test_run_json_that_is_not_ours_is_a_usage_error_never_a_hang(tmp_path, plant):
    from trainready.run.summary import load_run_info

    info = tmp_path / "run.json"
    if plant == "fifo":
        os.mkfifo(info)
    elif plant == "symlink":
        (tmp_path / "elsewhere.json").write_text("{}")
        info.symlink_to(tmp_path / "elsewhere.json")
    elif plant == "directory":
        info.mkdir()
    else:
        with open(info, "wb") as f:
            f.truncate((64 << 20) + 1)
    with pytest.raises(UsageError, match=r"run\.json: unreadable \((not a regular file|more than 64 MiB)\)"):
        load_run_info(tmp_path)


def test_a_job_spec_that_run_json_names_as_a_fifo_is_never_opened_for_ever(base, tmp_path):
    """issue 26: a run.json whose config.job names a FIFO hung `report` (its plan check loads the job spec) and
    `estimate --calibrate`. A path a file names is read only as a regular file, without blocking."""
    import subprocess
    import sys

    run = _copy(base, tmp_path / "r")
    os.mkfifo(tmp_path / "job.toml")
    info = json.loads((run / "run.json").read_text())
    info.setdefault("config", {})["job"] = str(tmp_path / "job.toml")
    (run / "run.json").write_text(json.dumps(info))
    tr = [sys.executable, "-m", "trainready"]
    report = subprocess.run([*tr, "report", str(run), "--json"], capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and json.loads(report.stdout)["plan_check"] is None, report.stderr[-500:]
    calibrate = subprocess.run([*tr, "estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--gpus", "2",
                                "--calibrate", str(run)], capture_output=True, text=True, timeout=60)
    assert calibrate.returncode == 2, calibrate.stderr[-500:]
    assert "job.toml: not a regular file (a FIFO, socket or device)" in calibrate.stderr


def test_json_nested_past_the_parser_is_exit_2_naming_the_file_everywhere(tmp_path):
    """issue 25: a deeply nested calibration file or bundle deep.json ended in "internal error: RecursionError"
    (exit 3). Every reader parses through io.parse_json, which makes it a ValueError like any malformed JSON."""
    import subprocess
    import sys

    from trainready.catalog import load_catalog
    from trainready.report.calibration import bundle_measurements

    deep = "[" * 5000 + "]" * 5000
    (tmp_path / "cal.json").write_text(deep)
    proc = subprocess.run([sys.executable, "-m", "trainready", "estimate", "--model", "llama-2-7b", "--gpu", "a100-80gb",
                           "--gpus", "8", "--calibration", str(tmp_path / "cal.json")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "cal.json is not JSON: JSON nested too deep" in proc.stderr, proc.stderr[-500:]
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "instance-type.txt").write_text("p5.48xlarge\n")
    (bundle / "deep.json").write_text(deep)
    with pytest.raises(UsageError, match="deep.json is not JSON"):
        bundle_measurements(bundle, load_catalog())


def test_no_reader_parses_json_but_through_parse_json():
    """The mechanism: json.loads appears only inside io.parse_json (and the worker shim, which reads our own
    environment variable), so a new reader cannot bring the RecursionError back."""
    root = Path(__file__).resolve().parents[1] / "src" / "trainready"
    import re

    call = re.compile(r"\bjson\.loads?\(")  # orjson's own parser has a depth limit and raises its JSONDecodeError
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if call.search(p.read_text()))
    assert users == ["io/files.py", "run/shim.py"]


def test_a_stop_record_nested_deep_is_no_internal_error(base, tmp_path):
    """Telemetry is parsed with orjson where installed, which takes up to 1,024 levels; the stop record was then
    redacted by a recursive walk that ran out of stack at about 600 (exit 3). Past 64 levels it is replaced."""
    deep: object = "x"
    for _ in range(900):
        deep = {"a": deep}
    run = _with_records(base, tmp_path / "r", [{"type": "stop", "source": "rank0", "reason": "signal", "exit_code": 143,
                                                "message": "stopped", "detail": deep}])
    s = summarize(run)
    assert s is not None
    from trainready.io import redact_json

    assert "nested past 64 levels" in json.dumps(redact_json({"detail": deep}))
