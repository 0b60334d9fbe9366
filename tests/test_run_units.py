"""The pure parts of `trainready run`: budget arithmetic, Young/Daly, settings, telemetry,
torchrun argv and failure parsing, summaries, the live panel, the orphan watchdog."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console
from run_helpers import env_for_run

from trainready.errors import UsageError
from trainready.run.budget import BudgetGuard, CostClock
from trainready.run.failure import describe_exit, explain_failure, failed_ranks
from trainready.run.interval import choose_interval, job_mtbf
from trainready.run.launcher import LaunchSpec, torchrun_argv
from trainready.run.live import LiveView
from trainready.run.scaling import ScalingPoint, findings, parse_counts
from trainready.run.settings import RunSettings
from trainready.run.summary import summarize
from trainready.run.telemetry import TelemetryWriter, read_records
from trainready.run.watchdog import process_start_ticks


def guard(budget=10.0, spent_s=0.0, exit_s=0.0):
    return BudgetGuard(budget, CostClock(usd_per_hour=3600.0, nnodes=1, prior_s=spent_s, launch_unix=1000.0),
                       exit_s=exit_s)


def test_budget_stops_only_when_the_next_step_final_save_and_exit_would_not_fit():
    g = guard()
    assert not g.assess(8.5, step_s=0.5, final_save_s=0.5, remaining_steps=100).stop  # 8.5 + 1.1 < 10
    assert g.assess(9.0, step_s=0.5, final_save_s=0.5, remaining_steps=100).stop  # 9.0 + 1.1 > 10
    assert not g.assess(9.0, step_s=0.5, final_save_s=0.5, remaining_steps=0).stop  # nothing left to run
    unpriced = BudgetGuard(10.0, CostClock(None, 1, 0.0, 1000.0))
    assert not unpriced.assess(4000.0, 1.0, 1.0, 10).stop
    shutdown = guard(exit_s=2.0)  # the workers and the launcher take 2 s to exit after the final save: billed too
    assert shutdown.assess(7.5, step_s=0.5, final_save_s=0.5, remaining_steps=100).stop  # 7.5 + 3.3 > 10
    assert not shutdown.assess(6.5, step_s=0.5, final_save_s=0.5, remaining_steps=100).stop  # 6.5 + 3.3 < 10


def test_budget_counts_earlier_launches_and_every_node():
    g = BudgetGuard(100.0, CostClock(usd_per_hour=1800.0, nnodes=4, prior_s=10.0, launch_unix=1000.0))
    view = g.assess(g.clock.billed_s(1005.0), 1.0, 1.0, 10)
    assert view.spent_usd == pytest.approx(2.0 * 15)  # $0.5/s per node x 4 nodes x (10 + 5) s
    assert view.projected_usd == pytest.approx(30 + 2.0 * 10)
    assert view.eta_s == 10.0


def test_budget_warnings_fire_once_each_in_order_when_crossed():
    g = guard()
    first = g.assess(1.0, 0.1, 0.1, 5)
    assert first.warnings == ()
    at_half = g.assess(5.0, 0.1, 0.1, 5)
    assert at_half.warnings == ("spent $5.00, 50% of the $10.00 budget",)
    assert g.assess(5.5, 0.1, 0.1, 5).warnings == ()
    over = g.assess(8.0, 1.0, 0.1, 50)
    assert over.warnings[0] == "spent $8.00, 80% of the $10.00 budget" and "projected cost" in over.warnings[1]
    assert g.assess(8.1, 1.0, 0.1, 50).warnings == ()
    assert guard().assess(9.5, 1.0, 0.1, 50, peek=True).warnings == ()  # the telemetry view changes nothing
    both = guard().assess(8.5, 0.1, 0.1, 1).warnings  # both crossed since the last look: still in order
    assert [w.split(", ")[1][:3] for w in both] == ["50%", "80%"]


def test_spend_warnings_do_not_announce_what_earlier_launches_crossed():
    from trainready.run.budget import SpendWarnings

    warn = SpendWarnings(10.0, already_usd=6.0)  # a relaunch: 60% spent before it
    assert warn.crossed(6.5) == []
    assert warn.crossed(8.2) == ["spent $8.20, 80% of the $10.00 budget"]
    assert warn.crossed(9.9) == []
    launcher_side = BudgetGuard(10.0, CostClock(3600.0, 1, 0.0, 1000.0), warn_spent=False)
    assert launcher_side.assess(9.0, 0.1, 0.1, 100).warnings[0].startswith("projected cost")  # 50%/80%: the launcher


def test_young_daly_interval():
    choice = choose_interval(stall_s=1.0, step_s=2.0, mtbf_h=24.0, assumption="x")
    assert choice.tau_s == pytest.approx(math.sqrt(2 * 1.0 * 86400) - 1.0)
    assert choice.every_steps == round(choice.tau_s / 2.0)
    assert "Young/Daly" in choice.describe() and "every" in choice.describe()
    assert choose_interval(1.0, 1e6, 1.0, "x").every_steps == 1
    assert job_mtbf(2, 8, spot=True, override_h=None)[0] == pytest.approx(12.0)
    assert job_mtbf(1, 8, spot=False, override_h=None)[0] == pytest.approx(50_676.0 / 8)
    assert job_mtbf(3, 8, spot=True, override_h=5.0) == (5.0, "MTBF 5 h given")


def test_settings_round_trip_through_the_environment(tmp_path):
    s = RunSettings(run_dir=tmp_path, archive="s3://b/p", ckpt_every="auto", budget_usd=12.5, spot=True, nnodes=2)
    back = RunSettings.from_env(s.to_env())
    assert back == s
    assert RunSettings.from_env({"TRAINREADY_CKPT_EVERY": "25"}).ckpt_every == 25
    assert RunSettings.from_env({}, ckpt_every=3).ckpt_every == 3
    assert RunSettings.from_env({}).hot_dir == "checkpoints"
    with pytest.raises(UsageError, match="TRAINREADY_CKPT_EVERY='0'"):
        RunSettings.from_env({"TRAINREADY_CKPT_EVERY": "0"})
    with pytest.raises(UsageError, match=r"init\(budget_usd=...\)"):
        RunSettings.from_env({}, budget_usd=-1)


def test_telemetry_is_strict_json_and_survives_a_torn_line(tmp_path):
    w = TelemetryWriter(tmp_path, source="test")
    w.write("step", step=0, metrics={"loss": float("nan")}, mfu=float("inf"))
    w.close()
    with open(tmp_path / "telemetry.jsonl", "a") as f:
        f.write('{"type": "step", "step": 1, "metr')  # a crash mid-write
    records, offset = read_records(tmp_path / "telemetry.jsonl")
    assert len(records) == 1 and records[0]["schema_version"] == 1
    assert records[0]["metrics"] == {"loss": None, "nonfinite": ["loss"]} and records[0]["nonfinite"] == ["mfu"]
    with open(tmp_path / "telemetry.jsonl", "a") as f:
        f.write('ics": {}}\n')
    more, _ = read_records(tmp_path / "telemetry.jsonl", offset)
    assert [r["step"] for r in more] == [1]


TORCHRUN_FAILURE = """\
Failures:
[1]:
  time      : 2026-11-30_01:14:04
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 19773)  (SIGTERM)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_01:14:04
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 19774)
"""


def test_torchrun_failure_summary_root_cause_first():
    ranks = failed_ranks(TORCHRUN_FAILURE.splitlines())
    assert [(r["rank"], r["exit_code"], r["root_cause"]) for r in ranks] == [(1, 1, True), (0, -15, False)]
    assert "OOM killer" in describe_exit(-9) and describe_exit(3) == "exit code 3"


def test_sigabrt_after_a_traceback_is_the_root_cause_not_a_victim(tmp_path):
    """torch can abort at exit after a script raised: the rank that raised is named, with why."""
    attempt = tmp_path / "logs" / "run_x" / "attempt_0"
    logs = {0: "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer\n",
            1: "Traceback (most recent call last):\n  File \"train.py\", line 9\nValueError: boom\n"
               "terminate called without an active exception\n",
            2: "Fatal Python error: Aborted\n"}
    for local_rank, text in logs.items():
        (attempt / str(local_rank)).mkdir(parents=True)
        (attempt / str(local_rank) / "stderr.log").write_text(text)
    summary = "".join(f"  rank      : {r} (local_rank: {r})\n  exitcode  : {code} (pid: {100 + r})\n"
                      for r, code in ((2, -6), (0, 1), (1, -6)))
    result = explain_failure(LaunchSpec(command=["python", "train.py"], settings=RunSettings(run_dir=tmp_path)),
                             ["Root Cause (first observed failure):", *summary.splitlines()], 1)
    # ranks 0 (lost its peer) and 2 (aborted with no exception of its own) are victims, in torchrun's order
    assert [r["rank"] for r in result.failed_ranks] == [1, 2, 0]
    assert result.message.startswith("worker rank 1 (local rank 1) failed: killed by SIGABRT after raising a Python "
                                     "exception")
    assert describe_exit(-6) == "killed by SIGABRT"


def test_torchrun_argv(tmp_path):
    spec = LaunchSpec(command=["python", "train.py", "--d", "1"], settings=RunSettings(run_dir=tmp_path),
                      nproc_per_node=8, max_restarts=2)
    argv = torchrun_argv(spec)
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in argv
    assert argv[-1].endswith("shim.py") and "--d" not in argv  # the command travels in TRAINREADY_COMMAND
    from torch.distributed.run import get_args_parser

    parsed = get_args_parser().parse_args(argv[3:])
    assert parsed.nproc_per_node == "8" and parsed.max_restarts == 2
    spec.nnodes, spec.rdzv_endpoint = 2, "10.0.0.1:29500"
    argv = torchrun_argv(spec)
    assert "--standalone" not in argv and argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500"


def _records(tmp_path: Path, rows: list[dict]) -> None:
    w = TelemetryWriter(tmp_path, source="test")
    for row in rows:
        w.write(row.pop("type"), **row)
    w.close()


def test_summary_skips_warm_up_and_shares_add_up(tmp_path):
    steps = [{"type": "step", "step": i, "interval_s": 10.0 if i < 2 else 1.0, "data_s": 0.2, "comm_s": 0.1,
              "compute_s": 0.5, "optimizer_s": 0.1, "tokens": 100, "tokens_per_s": 100.0 if i >= 2 else 1.0,
              "metrics": {"loss": 5.0 - i}} for i in range(6)]
    _records(tmp_path, [{"type": "start", "world_size": 2, "total_steps": 10, "usd_per_hour": 1.0}, *steps])
    s = summarize(tmp_path)
    assert s.tokens_per_s_median == 100.0 and s.step_s_median == 1.0 and s.steps_logged == 6
    shares = s.shares
    assert shares.data == pytest.approx(0.2) and shares.other == pytest.approx(0.1)
    assert shares.data + shares.comm + shares.compute + shares.optimizer + shares.other == pytest.approx(1.0)
    assert (s.loss_first, s.loss_last, s.status) == (5.0, 0.0, "unknown")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="not a trainready run directory"):
        summarize(tmp_path / "empty")


def test_live_panel_renders_with_partial_and_full_data():
    buf = io.StringIO()
    view = LiveView(Console(file=buf, width=120), "python train.py", live=False)
    view.print("[default0]:hello")
    view.update([{"type": "start", "world_size": 2, "total_steps": 40, "budget_usd": 9.0}])
    Console(file=buf, width=120).print(view.render())
    view.update([{"type": "step", "step": 3, "interval_s": 0.5, "data_s": 0.1, "comm_s": 0.05, "tokens_per_s": 2000.0,
                  "mfu": 0.41, "eta_s": 100.0, "cost_usd": 1.5, "projected_usd": 4.0, "metrics": {"loss": 2.5},
                  "ckpt": {"last_saved": 2, "archived": 1, "saving": True}},
                 {"type": "budget", "message": "spent $4.50, 50% of the $9.00 budget"}])
    Console(file=buf, width=120).print(view.render())
    text = buf.getvalue()
    for want in ("hello", "3 / 40", "2.5000", "41.0%", "20.0%", "$1.50", "budget $9.00", "saving", "50% of the"):
        assert want in text, want


def test_scaling_names_where_the_time_went():
    def point(n, step, data, comm, compute):
        return ScalingPoint(processes=n, exit_code=0, steps_measured=5, tokens_per_s=1000.0 * n / step,
                            tokens_per_s_per_process=1000.0 / step, efficiency=1.0 / step, step_s=step, data_s=data,
                            comm_s=comm, compute_s=compute, optimizer_s=0.0, other_s=0.0)

    lines = findings([point(1, 1.0, 0.1, 0.0, 0.9), point(4, 1.6, 0.6, 0.1, 0.9)])
    assert "most went to data" in lines[0] and "data +0.500 s" in lines[0]
    assert parse_counts("4,1,2,2") == [1, 2, 4]
    with pytest.raises(UsageError):
        parse_counts("1,x")
    with pytest.raises(UsageError):
        parse_counts("0,2")


def test_process_start_ticks():
    assert isinstance(process_start_ticks(os.getpid()), int)
    assert process_start_ticks(2**22 + 12345) is None


WATCHED = textwrap.dedent("""
    import sys, time
    from trainready.run.watchdog import process_start_ticks, start_watch
    pid = int(sys.argv[1])
    start_watch(pid, process_start_ticks(pid), watch_parent=False)
    print("watching", flush=True)
    time.sleep(60)
""")


def test_worker_dies_when_the_launcher_is_gone(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = subprocess.Popen([sys.executable, "-c", WATCHED, str(launcher.pid)], env=env_for_run(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "watching"
    launcher.kill()
    launcher.wait()
    t0 = time.monotonic()
    worker.wait(timeout=10)
    assert worker.returncode == -9 and time.monotonic() - t0 < 5
    assert "launcher (pid" in worker.stderr.read()


INIT_WITH_ARGUMENTS = textwrap.dedent("""
    import sys, torch, trainready
    sess = trainready.init(run_dir=sys.argv[1], hot=sys.argv[1] + "/hot", ckpt_every=2, total_steps=5)
    model = torch.nn.Linear(2, 2)
    state = {"model": model}
    start = sess.restore(state)
    for step in range(sess.start_step, 5):
        with sess.step(tokens=2) as t:
            model(t.data(torch.ones(1, 2))).sum().backward()
            t.log(loss=float(step))
        sess.maybe_save(step, state)
    sess.finish()
    print("restored", start, "world", sess.world_size)
""")


def test_init_with_arguments_and_no_launcher(tmp_path):
    out = subprocess.run([sys.executable, "-c", INIT_WITH_ARGUMENTS, str(tmp_path / "run")], env=env_for_run(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "restored None world 1" in out.stdout
    saved = [json.loads(line)["step"] for line in (tmp_path / "run" / "telemetry.jsonl").read_text().splitlines()
             if '"type":"ckpt"' in line]
    assert saved == [1, 3, 4]  # every 2 steps, and the last one
    assert sorted(p.name.split("-g")[0] for p in (tmp_path / "run" / "hot").glob("step-*")) == [
        "step-000000000003", "step-000000000004"]  # keep_hot=2


def test_relaunch_needs_start_up_two_steps_and_shutdown():
    from trainready.run.launcher import measured_exit_s, measured_relaunch_s

    assert measured_relaunch_s([])[0] == 0.0
    records = [{"type": "launch", "t": 100.0}, {"type": "step", "t": 110.0, "interval_s": 4.0},
               {"type": "step", "t": 111.0, "interval_s": 1.0}, {"type": "step", "t": 112.0, "interval_s": 1.0},
               {"type": "stop", "t": 113.0}, {"type": "end", "t": 113.5}, {"type": "exit", "t": 117.0, "reason": "budget"},
               {"type": "launch", "t": 200.0}, {"type": "step", "t": 203.0, "interval_s": 1.0}]
    assert measured_exit_s(records) == pytest.approx(4.0)  # from the workers' stop to the launcher's exit
    need, why = measured_relaunch_s(records)
    assert need == pytest.approx(6.0 + 2 * 1.0 + 4.0) and "start-up" in why  # slowest start-up 110-100-4 = 6 s
    # a launch the budget stopped before its first step: its length is a lower bound on start-up
    starved = [{"type": "launch", "t": 100.0}, {"type": "start", "t": 107.0}, {"type": "exit", "t": 109.0, "reason": "budget"}]
    need, why = measured_relaunch_s(starved)
    assert need == pytest.approx(9.0) and "more than 9 s" in why
    failed = [{"type": "launch", "t": 100.0}, {"type": "exit", "t": 101.0, "reason": "failed"}]
    assert measured_relaunch_s(failed)[0] == 0.0  # a script that crashed at once says nothing about start-up


def test_ckpt_every_defaults_to_auto_and_off_says_what_a_crash_costs():
    from trainready.run.configure import _ckpt_every, describe_checkpoints

    assert _ckpt_every(None) == "auto" and _ckpt_every("off") is None and _ckpt_every("25") == 25
    with pytest.raises(UsageError, match="'auto' .* or 'off'"):
        _ckpt_every("0")
    assert "a crash loses everything since the start" in describe_checkpoints(None)
    assert "a crash loses at most 25 step(s)" in describe_checkpoints(25)
    assert RunSettings.from_env({"TRAINREADY_CKPT_EVERY": "off"}).ckpt_every is None


def test_report_reads_the_final_checkpoint_status_from_the_end_record(tmp_path):
    """Step 49's record was written while its save and upload ran (archived 39); the end record,
    written after both finished, has the truth (49)."""
    _records(tmp_path, [{"type": "start", "archive": "s3://b/x", "world_size": 1},
                        {"type": "step", "step": 49, "interval_s": 1.0,
                         "ckpt": {"last_saved": 39, "saving": False, "uploading": None, "archived": 39}},
                        {"type": "ckpt", "step": 49, "stall_s": 0.1, "async_save": True, "hot": "h"},
                        {"type": "end", "last_step": 49, "steps_this_launch": 50, "last_saved": 49, "archived": 49}])
    s = summarize(tmp_path)
    assert (s.last_checkpoint, s.last_archived, s.archive) == (49, 49, "s3://b/x")


def _render(summary, width=80) -> str:
    from trainready.cli.render_run import render_summary

    buf = io.StringIO()
    render_summary(Console(file=buf, width=width, markup=False), summary)
    return buf.getvalue()


def test_report_never_shows_python_none(tmp_path):
    _records(tmp_path, [{"type": "launch", "argv": [], "node_rank": 0, "prior_billed_s": 0.0}])
    text = _render(summarize(tmp_path))
    assert "None" not in text and "none yet" in text and "none committed, no archive" in text
    _records(tmp_path, [{"type": "start", "archive": "/mnt/archive", "usd_per_hour": 2.5, "nnodes": 2},
                        {"type": "step", "step": 0, "interval_s": 1.0, "cost_usd": 0.001,
                         "ckpt": {"last_saved": None, "saving": True, "uploading": None, "archived": None}}])
    text = _render(summarize(tmp_path))
    assert "None" not in text and "none committed, none archived" in text and "$2.5/h x 2 node(s)" in text


def test_live_view_prints_commands_and_messages_as_written():
    """A Panel reads a plain-string title as markup even on a markup-off console: `[/]` in a
    command crashed the live view, `[bold]` vanished."""
    buf = io.StringIO()
    view = LiveView(Console(file=buf, width=80), "python t.py --tag [bold]x --p [/]", live=False)
    view.update([{"type": "start", "world_size": 2, "archive": "/a"},
                 {"type": "budget", "message": "spent $5.00 [red]x[/red], 50% of the $10.00 budget"},
                 {"type": "step", "step": 9, "interval_s": 1.0, "tokens_per_s": 123456789.0,
                  "ckpt": {"last_saved": 4, "archived": 4, "saving": True}},
                 {"type": "end", "last_step": 9, "steps_this_launch": 10, "last_saved": 9, "archived": 9},
                 {"type": "stop", "message": "budget guard: stopped"}])
    Console(file=buf, width=80).print(view.render())
    text = buf.getvalue()
    assert "--tag [bold]x --p [/]" in text and "[red]x[/red]" in text
    assert "hot 9  archived 9" in text and "123,456,789" in text  # final status; numbers whole at 80 columns
    assert "budget guard: stopped" not in text  # a stop is said once, by the launcher's result line


def test_launchers_run_dir_wins_over_a_scripts_own(monkeypatch, tmp_path, caplog):
    from trainready.run.session import _keep_launchers_run_dir

    mine = {"run_dir": tmp_path / "mine", "hot": "/x"}
    _keep_launchers_run_dir(mine)  # plain python/torchrun: the script's argument stands
    assert mine["run_dir"] == tmp_path / "mine"
    monkeypatch.setenv("TRAINREADY_RUN_DIR", str(tmp_path / "launcher"))
    monkeypatch.setenv("TRAINREADY_LAUNCHER_PID", "12345")
    _keep_launchers_run_dir(mine)
    assert mine == {"hot": "/x"} and "init(run_dir=" in caplog.text and "ignored" in caplog.text
    same = {"run_dir": str(tmp_path / "launcher")}
    caplog.clear()
    _keep_launchers_run_dir(same)
    assert same == {} and not caplog.text  # the same directory: nothing to say


def test_emit_passes_ckpt_every_off_to_the_launcher_and_the_workers():
    from trainready.run.emit import EmitSpec

    spec = EmitSpec(command=["python", "train.py"], ckpt_every="off")
    assert spec.run_options[-2:] == ["--ckpt-every", "off"]
    assert RunSettings.from_env(spec.worker_env).ckpt_every is None  # plain torchrun: the workers read it


def test_the_same_experiment_spelled_differently_is_one_run(tmp_path, monkeypatch):
    from trainready.run.launcher import command_key

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "conf.yaml").write_text("")
    same = [
        (["/abs/.venv/bin/python", "train.py", "--lr", "3e-4"], [".venv/bin/python3", "./train.py", "--lr", "3e-4"]),
        (["python", "train.py", "--config=conf.yaml"],
         ["python3.11", str(tmp_path / "train.py"), f"--config={tmp_path}/conf.yaml"]),
    ]
    for a, b in same:
        assert command_key(a) == command_key(b), (a, b)
    different = [
        (["python", "train.py", "--lr", "3e-4"], ["python", "train.py", "--lr", "1e-4"]),
        (["python", "train.py"], ["python", "other.py"]),  # other.py does not exist: compared as written
        (["torchrun", "train.py"], ["python", "train.py"]),
        (["python", "train.py", "--steps", "150"], ["python", "train.py", "--steps", "151"]),
    ]
    for a, b in different:
        assert command_key(a) != command_key(b), (a, b)


def test_emitted_launches_checkpoint_by_default():
    from trainready.run.emit import EmitSpec

    spec = EmitSpec(command=["python", "train.py"])
    assert spec.ckpt_every == "auto"
    assert spec.worker_env["TRAINREADY_CKPT_EVERY"] == "auto"
    assert spec.run_options[spec.run_options.index("--ckpt-every") + 1] == "auto"


def test_the_launcher_failure_and_session_modules_import_no_circle():
    """launch_spec.py holds LaunchSpec, LaunchResult and the exit codes (issue 25): failure.py and session.py take
    them from there, not from the launcher, so no module of run/ imports the launcher back."""
    import ast
    from pathlib import Path

    import trainready.run as run

    folder = Path(run.__file__).parent
    for name in ("failure.py", "session.py", "launch_spec.py", "configure.py"):
        for node in ast.walk(ast.parse((folder / name).read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("launcher", "trainready.run.launcher"), f"{name} imports the launcher"


def test_the_billing_formula_is_written_once():
    """price per node-hour x nodes / 3600 lives in budget.usd_per_second (issue 25): no other module of run/
    writes it again."""
    import re
    from pathlib import Path

    import trainready.run as run
    from trainready.run.budget import usd_per_second

    assert usd_per_second(36.0, 2) == pytest.approx(0.02) and usd_per_second(None, 2) is None
    folder = Path(run.__file__).parent
    formula = re.compile(r"(usd_per_hour|price)\b[^\n#]*\*[^\n#]*/\s*3600")
    offenders = [f"{p.name}:{i}" for p in folder.rglob("*.py") if p.name != "budget.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if formula.search(line)]
    assert offenders == []


def test_run_dir_owns_its_files_and_reads_them_as_hostile(tmp_path):
    """RunDir names run.json, telemetry.jsonl, stop.json, summary.json and logs/ once, and reads them through the
    bounded regular-file reader: a FIFO in place of stop.json or run.json neither hangs the launcher nor
    crashes it (stop.json: unknown; run.json: a usage error naming it)."""
    import os

    from trainready.errors import UsageError
    from trainready.run.run_dir import RunDir

    rd = RunDir(tmp_path)
    assert not rd.holds_a_run() and rd.read_run_info() == {} and rd.read_stop() is None
    good = {"schema_version": 1, "reason": "signal", "step": 5, "checkpoint": 5, "message": "stopped by SIGTERM",
            "exit_code": 143, "upload_error": None, "cost_usd": 0.5}
    rd.write_stop({**good, "a_field_of_a_newer_version": 1})
    stop = rd.read_stop()
    assert (stop.reason, stop.exit_code, stop.checkpoint) == ("signal", 143, 5)
    for hostile in ({**good, "exit_code": "x"}, {**good, "exit_code": 10**30}, {**good, "exit_code": -1},
                    {**good, "reason": "rm -rf"}, {**good, "message": 5}, {"reason": "signal"}):
        rd.write_stop(hostile)
        assert rd.read_stop() is None, hostile  # unknown, never a crash of the launcher's outcome
    rd.clear_stop()
    assert rd.read_stop() is None
    os.mkfifo(rd.stop_json)
    assert rd.read_stop() is None  # returned at once: the FIFO is not opened for a blocking read
    rd.stop_json.unlink()
    rd.stop_json.write_text("[1, 2]")
    assert rd.read_stop() is None  # not an object: unknown
    os.mkfifo(rd.run_json)
    with pytest.raises(UsageError, match="run.json.*not a regular file"):
        rd.read_run_bytes()
    with pytest.raises(UsageError, match="not a regular file"):
        rd.read_run_info()
    rd.run_json.unlink()
    rd.write_run_info({"launches": []})
    assert rd.holds_a_run() and rd.read_run_info() == {"launches": []}
    assert (rd.telemetry.name, rd.summary_json.name, rd.logs.name) == ("telemetry.jsonl", "summary.json", "logs")


def test_a_telemetry_writer_in_a_with_block_closes_its_file_when_a_write_raises(tmp_path, monkeypatch):
    from trainready.run import telemetry

    def refuse(*_a, **_k):
        raise ValueError("not JSON")

    closed = []
    with pytest.raises(ValueError):
        with TelemetryWriter(tmp_path, "launcher") as writer:
            assert writer._fd is not None
            monkeypatch.setattr(telemetry.json, "dumps", refuse)
            real_close = os.close
            monkeypatch.setattr(telemetry.os, "close", lambda fd: closed.append(fd) or real_close(fd))
            writer.write("exit", exit_code=0)
    assert writer._fd is None and len(closed) == 1  # the descriptor was closed, not leaked
