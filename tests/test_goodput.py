"""Goodput across launches (run/goodput.py) and the step split's sources (run/timing.py): synthetic run
directories with known badput give exact figures; a real 2-rank gloo run adds up to its billed time;
hostile telemetry is skipped and counted; the CUDA-event path through its seam (and on a GPU when there is one)."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest
from rich.console import Console
from run_helpers import run, run_cmd

from trainready.cli.render_run import render_summary
from trainready.run.goodput import compute_goodput
from trainready.run.scaling import findings, measure
from trainready.run.session import split_fields
from trainready.run.summary import RunSummary, summarize
from trainready.run.timing import CommWatch, HostMarks, SplitQueue, StepTimer, StepTimes

PRICE = 36.0  # $/node-hour: $0.01 per second, so dollars are seconds / 100


def rec(type_: str, t: float, **fields) -> dict:
    return {"schema_version": 1, "type": type_, "t": t, "source": "rank0", **fields}


def step(i: int, t: float, **fields) -> dict:
    """A 5 s step interval: split 4.5 s (data 0.5, comm 0.5, optimizer 0.5, compute 3.0), 0.5 s outside the step;
    rank 1 works 1 s longer than rank 0 (rank 0 waits for it in the all-reduce: its comm is 1 s)."""
    r = rec("step", t, step=i, step_s=4.5, interval_s=5.0, timing="host", split_step=i, data_s=0.5, data_s_max=0.5,
            comm_s=0.5, optimizer_s=0.5, compute_s=3.0, unattributed_s=None, unmeasured=[], straggler_s=1.0,
            rank_step_s=[4.5, 4.5], rank_comm_s=[1.0, 0.0], tokens=100, tokens_per_s=20.0, mfu=None, slowest_rank=1,
            cost_usd=None, projected_usd=None, eta_s=None, ckpt={"last_saved": None}, metrics={"loss": 1.0})
    r.update(fields)
    return r


def start(t: float, world: int = 2, restart: int = 0) -> dict:
    return rec("start", t, world_size=world, restart_count=restart, usd_per_hour=PRICE, nnodes=1)


def crash_then_resume() -> tuple[list[dict], list[dict]]:
    """Launch 0 (1000-1100 s): start-up 10 s, a 2 s fresh restore, steps 0-9 (5 s each), a checkpoint of step 4
    (0.2 s stall inside step 5's span), then a crash: 38 s until the launcher ended. Launch 1 (1200-1300 s):
    start-up 10 s, a 20 s restore of step 4, steps 5-14, the final save (1 s stall) and 19 s of shutdown."""
    records = [rec("launch", 1000.5), start(1010), rec("restore", 1012, step=None, duration_s=2.0)]
    records += [step(i, 1012 + (i + 1) * 5, ckpt={"last_saved": 4 if i > 4 else None}) for i in range(10)]
    records.insert(8, rec("ckpt", 1037.2, step=4, stall_s=0.2))
    records += [rec("launch", 1200.5), start(1205), rec("restore", 1230, step=4, duration_s=20.0)]
    records += [step(i, 1235 + (i - 5) * 5) for i in range(5, 15)]
    records += [rec("ckpt", 1281, step=14, stall_s=1.0), rec("end", 1282, last_step=14, steps_this_launch=10,
                                                             last_saved=14), rec("exit", 1290)]
    launches = [{"start_unix": 1000.0, "end_unix": 1100.0, "reason": "failed", "exit_code": 1},
                {"start_unix": 1200.0, "end_unix": 1300.0, "reason": "finished", "exit_code": 0}]
    return launches, records


def causes(report) -> dict:
    return {c.cause: c.seconds for c in report.causes}


def in_billed_total(report) -> float:
    return report.productive_s + sum(c.seconds or 0 for c in report.causes if c.in_billed)


def test_a_crash_a_long_restore_and_a_slow_rank_give_exact_badput():
    g = compute_goodput(*crash_then_resume())
    assert g.billed_s == 200.0 and g.billed_usd == 2.0 and g.usd_per_hour == PRICE
    # 15 kept steps x (4.5 s split - 0.5 data - 1.0 waiting for rank 1) = 45 s
    assert g.productive_s == pytest.approx(45.0) and g.goodput == pytest.approx(0.225) and not g.upper_bound
    assert causes(g) == pytest.approx({
        "startup": 20.0, "restore": 22.0, "data_wait": 7.5, "ckpt_stall": 1.0,
        "lost_progress": 25.0,  # steps 5-9 of launch 0, recomputed after restoring step 4 (stall inside included)
        "straggler_wait": 15.0, "shutdown": 57.0, "other": 7.5, "idle_between_launches": 100.0})
    assert in_billed_total(g) == pytest.approx(g.billed_s)
    by_cause = {c.cause: c for c in g.causes}
    assert by_cause["lost_progress"].usd == pytest.approx(0.25) and by_cause["lost_progress"].share == 0.125
    assert by_cause["restore"].hours == pytest.approx(22 / 3600, abs=1e-6)
    assert not by_cause["idle_between_launches"].in_billed and by_cause["idle_between_launches"].share is None
    assert (g.steps_kept, g.steps_lost) == (15, 5)
    first, second = g.launches
    assert (first.outcome, first.steps_lost, first.restored_step) == ("failed", 5, None)
    assert (second.outcome, second.restored_step, second.first_step, second.last_step) == ("finished", 4, 5, 14)
    ranks = {r.rank: r for r in g.ranks}
    assert ranks[1].straggler_score == pytest.approx(4.5 / 4.0) and ranks[0].straggler_score == pytest.approx(3.5 / 4.0)
    assert g.slowest_ranks == [1] and ranks[1].slowest_steps == 20 and ranks[0].work_s_median == 3.5
    assert g.rank_windows and g.rank_windows[0].work_s == [3.5, 4.5] and g.timing_sources == {"host": 20}
    assert g.skipped == {}


def test_restart_inside_a_launch_and_an_unsaved_tail_after_a_crash():
    """torchrun restarts the workers once (a second start record); the restarted attempt restores step 2 and runs
    3-7; the launcher is then killed (no end record, no recorded end): steps after the newest committed checkpoint
    (5) are in no checkpoint. While the launch still runs they count as progress."""
    records = [rec("launch", 0.5 + 1e9), start(1e9 + 5), rec("restore", 1e9 + 6, step=None, duration_s=1.0)]
    records += [step(i, 1e9 + 6 + (i + 1) * 5, ckpt={"last_saved": 2 if i > 2 else None}) for i in range(6)]
    records += [start(1e9 + 50, restart=1), rec("restore", 1e9 + 54, step=2, duration_s=3.0)]
    records += [step(i, 1e9 + 54 + (i - 2) * 5, ckpt={"last_saved": 5 if i > 5 else 2}) for i in range(3, 8)]
    launches = [{"start_unix": 1e9, "end_unix": None, "reason": None}]
    g = compute_goodput(launches, records)
    assert g.billed_s == pytest.approx(79.0)  # to the last record: the launcher's end was never written
    assert g.launches[0].attempts == 2 and g.launches[0].outcome == "unknown"
    assert (g.steps_kept, g.steps_lost) == (6, 5)  # 0-2 then 3-5 kept; 3-5 of attempt 1 and 6-7 lost
    c = causes(g)
    assert c["lost_progress"] == pytest.approx(25.0)
    assert c["startup"] == pytest.approx(5.0 + 15.0)  # launch to restore, then the restart (last step 36 s -> 51 s)
    assert c["restore"] == pytest.approx(4.0) and c["shutdown"] == 0.0
    assert in_billed_total(g) == pytest.approx(g.billed_s)
    running = compute_goodput(launches, records, running=True)
    assert (running.steps_kept, running.steps_lost) == (8, 3) and running.launches[0].outcome == "running"


def test_cuda_event_splits_are_matched_to_the_step_they_describe():
    """With CUDA events a record carries the previous step's split (split_step); the first has none, and the
    last step's split was never written: that one step is unmeasured and goodput an upper bound."""
    records = [start(2000.0, world=1), rec("restore", 2001.0, step=None, duration_s=0.5)]
    for i in range(4):
        r = step(i, 2001.0 + (i + 1) * 2, interval_s=2.0, timing="cuda-events", split_step=i - 1 if i else None,
                 data_s=0.25 if i else None, comm_s=0.0 if i else None, optimizer_s=0.25 if i else None,
                 compute_s=1.0 if i else None, straggler_s=0.0 if i else None, rank_step_s=[1.5] if i else None,
                 rank_comm_s=[0.0] if i else None, unmeasured=[])
        records.append(r)
    g = compute_goodput([{"start_unix": 1999.0, "end_unix": 2010.0, "reason": "finished"}], records)
    assert g.timing_sources == {"cuda-events": 4} and g.upper_bound
    data = next(c for c in g.causes if c.cause == "data_wait")
    assert data.seconds == pytest.approx(0.75) and data.unmeasured_steps == 1  # steps 0-2 measured, step 3 not
    # steps 0-2: 1.5 s split - 0.25 data = 1.25 productive each, 0.5 s outside; step 3: its whole 2 s span
    assert g.productive_s == pytest.approx(3 * 1.25 + 2.0)
    assert causes(g)["other"] == pytest.approx(1.5) and in_billed_total(g) == pytest.approx(11.0)


def test_unmeasured_comm_is_unknown_not_zero():
    records = [start(3000.0), rec("restore", 3001.0, step=None, duration_s=0.0)]
    records += [step(i, 3001.0 + (i + 1) * 5, comm_s=None, compute_s=None, unattributed_s=3.5, unmeasured=["comm"],
                     straggler_s=None, rank_comm_s=[None, None]) for i in range(5)]
    g = compute_goodput([{"start_unix": 3000.0, "end_unix": 3030.0, "reason": "finished"}], records)
    wait = next(c for c in g.causes if c.cause == "straggler_wait")
    assert wait.seconds is None and wait.usd is None and wait.unmeasured_steps == 5 and g.upper_bound
    assert all(r.work_s_median is None for r in g.ranks) and any("not measured" in n for n in g.notes)
    assert in_billed_total(g) == pytest.approx(30.0)


def test_scaling_advice_does_not_count_unknown_comm_as_zero(tmp_path):
    for n, unattributed in ((1, 0.5), (2, 0.9)):
        d = tmp_path / f"n{n}"
        d.mkdir()
        rows = [step(i, 4000.0 + i, interval_s=0.8 + unattributed, data_s=0.1, comm_s=None, optimizer_s=0.1, compute_s=None,
                     unattributed_s=unattributed, unmeasured=["comm"], tokens_per_s=100.0 * n / (0.7 + unattributed))
                for i in range(6)]
        (d / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    points = [measure(tmp_path / f"n{n}", n, 0) for n in (1, 2)]
    assert points[1].comm_s is None and points[1].compute_s is None and points[1].unattributed_s == pytest.approx(0.9)
    points[1].efficiency = 0.6
    (line,) = findings(points)
    assert "comm not measured" in line and "most went to unattributed" in line and "comm +" not in line


def test_hostile_telemetry_is_skipped_and_counted(tmp_path):
    launches, records = crash_then_resume()
    lines = [json.dumps(r) for r in records]
    lines.insert(5, '{"schema_version":1,"type":"step","t":1030,"step":3,"interval_s":')  # torn
    lines += [json.dumps(step(15, 1290.5, interval_s="5")),  # wrong type
              json.dumps(step(16, 1291.0, interval_s=-3.0)),  # negative
              json.dumps(step(17, 1291.5, interval_s=1e300)),  # huge
              json.dumps(rec("ckpt", 1292.0, step=14, stall_s=float("nan"))).replace("NaN", "NaN"),
              json.dumps(step(18, "late", interval_s=1.0)),
              json.dumps(rec("restore", 1293.0, step="4")),
              '["not", "a", "record"]', "{}"]
    bad_ranks = step(3, 1032.0, rank_step_s=[4.5, 4.5, 4.5, 4.5], slowest_rank=999)  # 4 ranks in a 2-rank world
    lines[lines.index(json.dumps(records[6]))] = json.dumps(bad_ranks)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "telemetry.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "run.json").write_text(json.dumps({"schema_version": 1, "kind": "trainready-run", "command": ["x"],
                                                  "config": {}, "environment": {}, "created_unix": 1000.0,
                                                  "launches": launches + [{"start_unix": "soon"}]}))
    s = summarize(run_dir)
    g = s.goodput
    assert g.skipped["unreadable line"] == 3, g.skipped  # the torn line, a list, an object without a type
    assert sum(g.skipped.values()) >= 11, g.skipped
    assert any("interval_s negative" in k for k in g.skipped) and any("too large" in k for k in g.skipped)
    assert any("not a number" in k for k in g.skipped) and any("length" in k for k in g.skipped)
    assert any(k.startswith("launch:") for k in g.skipped)
    assert g.billed_s == 200.0 and in_billed_total(g) == pytest.approx(200.0)
    assert (g.steps_kept, g.steps_lost) == (15, 5)  # the hostile records changed nothing measured
    RunSummary.model_validate_json(s.model_dump_json())
    buf = io.StringIO()
    render_summary(Console(file=buf, width=80), s)
    text = buf.getvalue()
    assert "skipped" in text and "goodput 22.5%" in text and "Traceback" not in text


def test_a_real_two_rank_run_adds_up_to_its_billed_time(tmp_path):
    run_dir = tmp_path / "run"
    code, out = run(run_cmd(run_dir, "--nproc-per-node", "2", "--usd-per-hour", str(PRICE), "--ckpt-every", "3",
                            steps=6), tmp_path)
    assert code == 0, out[-3000:]
    summary = RunSummary.model_validate_json((run_dir / "summary.json").read_text())  # = report --json
    assert summary.goodput == summarize(run_dir).goodput
    g = summary.goodput
    assert g is not None and g.billed_s == pytest.approx(summary.wall_s, abs=0.01)
    assert in_billed_total(g) == pytest.approx(g.billed_s, abs=0.01)
    assert 0 < g.goodput < 1 and g.billed_usd == pytest.approx(g.billed_s / 100, abs=1e-3)
    assert g.steps_kept == 6 and g.steps_lost == 0 and g.timing_sources == {"host": 6}
    assert [r.rank for r in g.ranks] == [0, 1] and all(r.work_s_median is not None for r in g.ranks)
    straggler = next(c for c in g.causes if c.cause == "straggler_wait")
    assert straggler.seconds is not None  # tiny_gpt watches its DDP model: comm measured on gloo
    assert summary.shares is not None and summary.shares.comm is not None and summary.shares.timing == "host"
    print(f"\nreal 2-rank run: goodput {g.goodput:.1%} of {g.billed_s:.1f} s billed; "
          + ", ".join(f"{c.cause} {c.seconds:.2f}" for c in g.causes if c.seconds))
    buf = io.StringIO()
    render_summary(Console(file=buf, width=80), summary)
    text = buf.getvalue()
    assert "goodput" in text and "step time per rank" in text
    assert max(len(line) for line in text.splitlines()) <= 80


# ---- where the split comes from ------------------------------------------------------------------


class FakeEvent:
    def __init__(self, gpu_t: float):
        self.gpu_t = gpu_t
        self.waited = False


class FakeCudaMarks:
    """The CudaMarks seam with a scripted device clock: each record() takes the next GPU timestamp."""

    source = "cuda-events"
    lagged = True

    def __init__(self, times: list[float]):
        self.times = list(times)
        self.done_until = -math.inf  # a stream's events complete in order: waiting for one completes the earlier

    def record(self) -> FakeEvent:
        return FakeEvent(self.times.pop(0))

    def elapsed_s(self, a: FakeEvent, b: FakeEvent) -> float:
        assert max(a.gpu_t, b.gpu_t) <= self.done_until, "an event read before the device reached it"
        return b.gpu_t - a.gpu_t

    def wait(self, handle: FakeEvent) -> None:
        self.done_until = max(self.done_until, handle.gpu_t)

    def latest(self, handles: list) -> FakeEvent:
        return handles[-1]


def test_cuda_marks_are_read_one_step_later_with_the_devices_times():
    # begin 0, data 0.2 (the GPU idled 0.2 s for the batch), optimizer 1.0-1.3, end 1.5; all-reduce tail 0.8-0.9
    marks = FakeCudaMarks([0.0, 0.2, 1.0, 1.3, 1.5, 0.8, 0.9])
    watch = CommWatch(marks)
    queue, measured = SplitQueue(), {"comm"}  # as a watched DDP model adds
    timer = StepTimer(tokens=8, comm_watch=watch, marks=marks, measured=measured)
    timer.begin()
    timer.data()
    with timer.optimizer():
        pass
    end = marks.record  # the hook runs inside backward; here its two marks are taken after the step's
    finished = timer.end()
    assert finished.pending.tail is None
    finished.pending.tail = (end(), end())
    assert queue.push(0, finished.pending) is None  # nothing read yet: step 0 is still on the device
    times_next = FakeCudaMarks([2.0, 2.0, 3.0])
    nxt = StepTimer(marks=times_next, measured=measured)
    nxt.begin()
    nxt.data()
    of, split = queue.push(1, nxt.end().pending)
    assert of == 0 and split.source == "cuda-events"
    assert split.step_s == pytest.approx(1.5) and split.data_s == pytest.approx(0.2)
    assert split.optimizer_s == pytest.approx(0.3) and split.comm_s == pytest.approx(0.1)  # the all-reduce tail
    assert split.compute_s == pytest.approx(0.9) and split.unattributed_s is None and split.unmeasured == []
    unwatched = StepTimer(marks=FakeCudaMarks([0.0, 1.0]), measured=set())  # two ranks, nothing watched or marked
    unwatched.begin()
    alone = unwatched.end().pending
    alone.marks.wait(alone.end)
    times = alone.resolve()
    assert times.unmeasured == ["data", "comm", "optimizer"] and times.compute_s is None
    assert times.unattributed_s == pytest.approx(1.0)  # never folded into compute

def test_host_marks_resolve_at_once_and_comm_counts_once_measured():
    measured = {"comm"}  # one rank: nothing to communicate
    timer = StepTimer(tokens=4, marks=HostMarks(), measured=measured)
    timer.begin()
    timer.data()
    with timer.optimizer():
        pass
    of, split = SplitQueue().push(7, timer.end().pending)
    assert of == 7 and split.source == "host" and split.unmeasured == [] and split.comm_s == 0.0
    assert split.compute_s is not None and split.unattributed_s is None
    assert StepTimes(step_s=1.0, data_s=0.2, comm_s=0.3, optimizer_s=0.1).compute_s == pytest.approx(0.4)


def test_split_fields_mean_over_ranks_straggler_and_unknowns():
    nan = math.nan
    col = {"step_s": [1.0, 1.0], "split_of": [3.0, 3.0], "split_s": [1.0, 1.0], "data_s": [0.1, 0.3],
           "comm_s": [0.4, 0.1], "optimizer_s": [0.1, 0.1]}
    out = split_fields(col, "host")
    assert out["split_step"] == 3 and out["data_s"] == pytest.approx(0.2) and out["data_s_max"] == 0.3
    assert out["straggler_s"] == pytest.approx(0.3) and out["slowest_rank"] == 1  # work 0.6 vs 0.9
    assert out["rank_comm_s"] == [0.4, 0.1] and out["compute_s"] == pytest.approx(0.45)
    unknown = split_fields({**col, "comm_s": [nan, 0.1]}, "host")
    assert unknown["comm_s"] is None and unknown["straggler_s"] is None and unknown["compute_s"] is None
    assert unknown["unmeasured"] == ["comm"] and unknown["rank_comm_s"] == [None, 0.1]
    assert unknown["unattributed_s"] == pytest.approx(0.7)
    json.dumps(unknown, allow_nan=False)  # strict JSON: NaN never reaches the file
    first = split_fields({**col, "split_of": [nan, nan], "split_s": [nan, nan], "data_s": [nan, nan]}, "cuda-events")
    assert first["split_step"] is None and "rank_step_s" not in first and first["data_s"] is None


def test_cuda_events_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the CUDA-event path is covered through FakeCudaMarks above")
    from trainready.run.timing import CudaMarks

    marks, queue = CudaMarks(), SplitQueue()
    x = torch.randn(4096, 4096, device="cuda")
    results = []
    for i in range(3):
        timer = StepTimer(marks=marks, measured={"comm"})
        timer.begin()
        timer.data()
        y = x @ x
        with timer.optimizer():
            y = y @ x
        results.append(queue.push(i, timer.end().pending))
    assert results[0] is None and results[1][0] == 0 and results[2][0] == 1
    split = results[2][1]
    assert split.source == "cuda-events" and split.step_s > 0 and split.optimizer_s > 0
    assert split.compute_s is not None and split.step_s >= split.optimizer_s


LAGGED_SESSION = """
import sys, time, torch, trainready
import trainready.run.session as session
from trainready.run.timing import HostMarks

class LaggedMarks(HostMarks):  # the CudaMarks seam: read a step later, as on a GPU
    source = "cuda-events"
    lagged = True

session._marks = lambda device, timing, clock: LaggedMarks()
sess = trainready.init(run_dir=sys.argv[1], hot=sys.argv[1] + "/hot", total_steps=4)
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sess.restore({"model": model})
for step in range(sess.start_step, 4):
    with sess.step(tokens=2) as t:
        time.sleep(0.02)
        batch = t.data(torch.ones(1, 2))
        model(batch).sum().backward()
        with t.optimizer():
            opt.step()
            opt.zero_grad()
    sess.maybe_save(step, {"model": model})
sess.finish()
"""


def test_a_session_with_lagged_marks_writes_each_split_under_the_step_it_describes(tmp_path):
    import subprocess

    from run_helpers import env_for_run, records

    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-c", LAGGED_SESSION, str(run_dir)], env=env_for_run(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [r for r in records(run_dir) if r["type"] == "step"]
    assert [r["split_step"] for r in steps] == [None, 0, 1, 2] and {r["timing"] for r in steps} == {"cuda-events"}
    assert steps[0]["data_s"] is None and all(r["data_s"] >= 0.015 for r in steps[1:])  # the 20 ms before t.data()
    assert all(r["comm_s"] == 0.0 and r["unmeasured"] == [] and r["rank_step_s"] for r in steps[1:])  # one rank
    g = summarize(run_dir).goodput
    assert g.timing_sources == {"cuda-events": 4} and g.steps_kept == 4
    data = next(c for c in g.causes if c.cause == "data_wait")
    assert data.unmeasured_steps == 1 and data.seconds >= 3 * 0.015  # the last step's split was never read


def test_bad_rank_times_drop_their_sample_and_keep_the_view():
    """The decoder checks every rank time (record_decoder): a record with one bad value loses its rank times
    (counted), unknown (None) times stay unknown, a launch with fewer ranks fills the others with unknown, and
    the scores are those of the plain records."""
    launches, records = crash_then_resume()
    clean = compute_goodput(launches, records)
    holes = [dict(r, rank_step_s=[None, 4.5], rank_comm_s=[None, 0.0]) if r.get("step") == 7 else r for r in records]
    g = compute_goodput(launches, holes)
    assert g.ranks[0].samples == clean.ranks[0].samples - 2 and g.ranks[1].samples == clean.ranks[1].samples  # ran twice
    assert [r.straggler_score for r in g.ranks] == [r.straggler_score for r in clean.ranks] and g.skipped == {}
    for bad in ("4.5", True, -1.0, float("nan"), 10**400):
        hostile = [dict(r, rank_step_s=[bad, 4.5]) if r.get("step") == 7 else r for r in records]
        g = compute_goodput(launches, hostile)
        assert g.skipped == {"step field: rank_step_s " + ("not a number" if bad in ("4.5", True) else
                                                          "negative" if bad == -1.0 else
                                                          "not finite" if bad != bad else "too large"): 2}, bad
        assert g.ranks[1].samples == clean.ranks[1].samples - 2 and g.slowest_ranks == [1]
    third = {"step": dict(rank_step_s=[4.5, 4.5, 4.0], rank_comm_s=[1.0, 0.0, 1.5]), "start": dict(world_size=3)}
    wider = [dict(r, **third.get(r["type"], {})) if r["t"] > 1100 else r for r in records]  # launch 1: 3 ranks
    g = compute_goodput(launches, wider)
    assert [r.samples for r in g.ranks] == [20, 20, 10] and g.skipped == {}
    assert g.rank_windows[0].step_s == [4.5, 4.5, None] and g.rank_windows[-1].step_s == [4.5, 4.5, 4.0]


def test_the_fast_telemetry_reader_reads_what_json_reads(tmp_path, monkeypatch):
    """orjson (the report extra) parses telemetry.jsonl; whatever it refuses, and any integer of 19+ digits
    (it would make a float of one past 64 bits), goes to json: the same records and counts either way."""
    pytest.importorskip("orjson", reason="orjson (the report extra) is not installed: nothing to compare")
    import trainready.run.telemetry as telemetry

    lines = [b'{"type":"step","step":123456789012345678901234,"t":1.5}', b'{"type":"x","v":-9223372036854775809}',
             b'{"type":"x","v":18446744073709551616,"w":9223372036854775807}', b'{"type":"x","v":NaN,"w":-Infinity}',
             b'{"type":"x","v":1e400,"w":5e-324,"z":-0.0}', b'{"type":"x","s":"\\ud800"}', b'\xef\xbb\xbf{"type":"bom"}',
             b'{"type":"x","s":"\xff"}', b'{"type":"x","s":"\t"}', b'[' * 5000 + b']' * 5000, b'{"type":"x","a":1,"a":2}',
             b'{"type":', b'[1, 2]', b'{"no type":1}', b'{"type":"step","t":1767225627.736,"step_s":1.3562029513863865}']
    path = tmp_path / "telemetry.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    fast_skipped: dict[str, int] = {}
    fast = telemetry.read_records(path, skipped=fast_skipped)
    monkeypatch.setattr(telemetry, "orjson", None)
    plain_skipped: dict[str, int] = {}
    plain = telemetry.read_records(path, skipped=plain_skipped)
    assert repr(fast) == repr(plain) and fast_skipped == plain_skipped == {"unreadable line": 6}
    assert fast[0][0]["step"] == 123456789012345678901234 and type(fast[0][2]["v"]) is int


def test_reading_a_run_pauses_the_cycle_collector_and_gives_it_back():
    import gc

    from trainready.run.summary import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # nested: the outer pause holds
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError
    assert gc.isenabled()


def test_a_multi_node_run_reads_each_nodes_telemetry_once(tmp_path, monkeypatch):
    """report finds the node where rank 0 ran by reading the nodes' telemetry, summarizes that node from the
    records already read, and its plan check asks again without reading anything while no file changed."""
    import trainready.run.summary as summary_module

    launches, records = crash_then_resume()
    run_json = json.dumps({"schema_version": 1, "kind": "trainready-run", "command": ["x"], "config": {},
                           "environment": {}, "created_unix": 1000.0, "launches": launches})
    for node, lines in (("node0", [r for r in records if r["type"] in ("launch", "exit")]), ("node1", records)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "run.json").write_text(run_json)
        (tmp_path / node / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    reads = []
    import trainready.run.run_dir as run_dir_module  # the one reader of a run directory's files

    real = run_dir_module.read_records
    monkeypatch.setattr(run_dir_module, "read_records", lambda path, **kw: reads.append(path) or real(path, **kw))
    s = summarize(tmp_path)
    assert s.run_dir == str(tmp_path / "node1") and s.steps_logged == 20 and s.goodput.steps_kept == 15
    assert summary_module._lead_node_dir(tmp_path) == tmp_path / "node1"
    assert [p.parent.name for p in reads] == ["node0", "node1"]  # each once, the lead's records reused
    with open(tmp_path / "node0" / "telemetry.jsonl", "a") as f:  # rank 0 on node0 now: decided anew
        f.write(json.dumps(start(1400)) + "\n")
    assert summary_module._lead_node_dir(tmp_path) == tmp_path / "node0" and len(reads) == 3
