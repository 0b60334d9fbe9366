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


def guard(budget=10.0, spent_s=0.0):
    return BudgetGuard(budget, CostClock(usd_per_hour=3600.0, nnodes=1, prior_s=spent_s, launch_unix=1000.0))


def test_budget_stops_only_when_the_next_step_and_final_save_would_not_fit():
    g = guard()
    assert not g.assess(8.5, step_s=0.5, final_save_s=0.5, remaining_steps=100).stop  # 8.5 + 1.1 < 10
    assert g.assess(9.0, step_s=0.5, final_save_s=0.5, remaining_steps=100).stop  # 9.0 + 1.1 > 10
    assert not g.assess(9.0, step_s=0.5, final_save_s=0.5, remaining_steps=0).stop  # nothing left to run
    unpriced = BudgetGuard(10.0, CostClock(None, 1, 0.0, 1000.0))
    assert not unpriced.assess(4000.0, 1.0, 1.0, 10).stop


def test_budget_counts_earlier_launches_and_every_node():
    g = BudgetGuard(100.0, CostClock(usd_per_hour=1800.0, nnodes=4, prior_s=10.0, launch_unix=1000.0))
    view = g.assess(g.clock.billed_s(1005.0), 1.0, 1.0, 10)
    assert view.spent_usd == pytest.approx(2.0 * 15)  # $0.5/s per node x 4 nodes x (10 + 5) s
    assert view.projected_usd == pytest.approx(30 + 2.0 * 10)
    assert view.eta_s == 10.0


def test_budget_warnings_fire_once_each():
    g = guard()
    first = g.assess(1.0, 0.1, 0.1, 5)
    assert first.warnings == ()
    at_half = g.assess(5.0, 0.1, 0.1, 5)
    assert len(at_half.warnings) == 1 and "50%" in at_half.warnings[0]
    assert g.assess(5.5, 0.1, 0.1, 5).warnings == ()
    over = g.assess(8.0, 1.0, 0.1, 50)
    assert any("80%" in w for w in over.warnings) and any("projected cost" in w for w in over.warnings)
    assert g.assess(8.1, 1.0, 0.1, 50).warnings == ()
    assert guard().assess(9.5, 1.0, 0.1, 50, peek=True).warnings == ()  # the telemetry view changes nothing


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


def test_relaunch_needs_start_up_and_two_steps():
    from trainready.run.launcher import measured_relaunch_s

    assert measured_relaunch_s([])[0] == 0.0
    records = [{"type": "launch", "t": 100.0}, {"type": "step", "t": 110.0, "interval_s": 4.0},
               {"type": "step", "t": 111.0, "interval_s": 1.0}, {"type": "step", "t": 112.0, "interval_s": 1.0},
               {"type": "launch", "t": 200.0}, {"type": "step", "t": 203.0, "interval_s": 1.0}]
    need, why = measured_relaunch_s(records)
    assert need == pytest.approx(6.0 + 2 * 1.0) and "start-up" in why  # slowest start-up 110-100-4 = 6 s


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
