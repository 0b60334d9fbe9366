"""CheckpointManager, Session and Launcher take an options object and what they work with (the ranks' context,
the stop signal path, the clock, the process spawner) instead of building them (issue 25 §4): each is driven here
through what it is given, with no real waiting, no global signal state and no torchrun."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch

from trainready.clock import SYSTEM_CLOCK
from trainready.dist import STOP, DistContext, StopRequest
from trainready.run.launch_spec import EXIT_BUDGET, LaunchSpec
from trainready.run.launcher import Launcher, torchrun_argv
from trainready.run.session import Session
from trainready.run.settings import RunSettings
from trainready.store import ArchiveUnavailableError, BadStateError, CheckpointManager, CheckpointManagerOptions


class FakeClock:
    """Time that moves only when told to (or when slept through)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self.slept: list[float] = []
        self.on_sleep = None

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now - 1_700_000_000.0

    def perf_counter(self) -> float:
        return self.monotonic()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)
        if self.on_sleep is not None:
            self.on_sleep()
        time.sleep(0.01)  # let the real processes it polls move on


@pytest.fixture(autouse=True)
def _global_stop_untouched():
    assert STOP.signum is None
    yield
    assert STOP.signum is None, "a stop request passed in must not reach the process's global one"


# ---- CheckpointManager ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, named", [
    ({"keep_hot": 0}, "keep_hot=0"), ({"keep_archive": 0}, "keep_archive=0"),
    ({"save_interval_steps": -1}, "save_interval_steps=-1"), ({"keep_hot": True}, "keep_hot=True"),
    ({"when_busy": "queue"}, "'wait', 'skip'"), ({"checksums": "sometimes"}, "'auto', 'always', 'never'"),
    ({"retry_initial_s": -1}, "retry_initial_s=-1"), ({"claim_wait_s": float("nan")}, "claim_wait_s=nan"),
    ({"retry_initial_s": 5, "retry_max_s": 1}, "below retry_initial_s=5"), ({"async_save": "yes"}, "async_save='yes'"),
    ({"claim_wait_s": 10**400}, "claim_wait_s=1000"), ({"retry_max_s": float("inf")}, "retry_max_s=inf"),
])
def test_options_name_the_bad_value_and_the_valid_ones(fields, named):
    with pytest.raises(BadStateError, match=named.replace("(", r"\(")):
        CheckpointManagerOptions(**fields)


def test_options_are_one_object_not_also_keywords(tmp_path):
    with pytest.raises(BadStateError, match="not also as keywords \\(keep_hot\\)"):
        CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(), keep_hot=3)
    with pytest.raises(TypeError, match="keep_hots.*its options are"):
        CheckpointManager(tmp_path / "hot", keep_hots=3)
    with pytest.warns(DeprecationWarning, match="options=CheckpointManagerOptions"):
        mgr = CheckpointManager(tmp_path / "hot", keep_hot=3, async_save=False)
    with mgr:
        assert mgr.options == CheckpointManagerOptions(keep_hot=3, async_save=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the options object alone warns of nothing
        CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(keep_hot=3)).close()


def test_manager_waits_for_an_unreachable_archive_on_the_clock_it_is_given(tmp_path, monkeypatch):
    """claim_wait_s of a whole minute passes on the clock given, in no real time: the refusal comes after it."""
    from trainready.store import tiers

    def unreachable(*_a, **_k):
        raise ArchiveUnavailableError("endpoint unreachable")

    monkeypatch.setattr(tiers.ArchiveTier, "read_lease", unreachable)
    clock = FakeClock()
    started = time.monotonic()
    with pytest.raises(ArchiveUnavailableError, match="Waited 60s"):
        CheckpointManager(tmp_path / "hot", tmp_path / "archive",
                          CheckpointManagerOptions(claim_wait_s=60.0, retry_initial_s=1.0, retry_max_s=4.0),
                          stop=StopRequest(clock=clock), clock=clock)
    assert 55 <= sum(clock.slept) <= 60 and time.monotonic() - started < 20


def test_earlier_releases_attributes_read_and_refuse_a_write(tmp_path):
    """save_interval_steps=0 meant "never" before the options object and still does; the old attributes read the
    options, and a write, which the manager would ignore, says where the option went."""
    with pytest.raises(BadStateError, match="archive= got the options"):  # once made a folder named after them
        CheckpointManager(tmp_path / "hot", CheckpointManagerOptions())
    with CheckpointManager(tmp_path / "hot", None, CheckpointManagerOptions(save_interval_steps=0, async_save=False)) as mgr:
        assert mgr.save_interval_steps == 0 and not any(mgr.should_save(step) for step in range(1, 50))
        assert mgr.keep_hot == 2
        with pytest.raises(AttributeError, match=r"options=CheckpointManagerOptions\(save_interval_steps=...\)"):
            mgr.save_interval_steps = 5
    with pytest.raises(BadStateError, match="options=dict: give a CheckpointManagerOptions"):
        CheckpointManager(tmp_path / "hot", options={"keep_hot": 3})


def test_a_stop_request_on_another_clock_is_refused(tmp_path):
    """A grace period is measured from when the stop was asked for: a stop stamped by one clock and read against
    another made an 18-hour deadline of a 30-second one."""
    with pytest.raises(BadStateError, match="same clock"):
        CheckpointManager(tmp_path / "hot", stop=StopRequest(), clock=FakeClock())
    with pytest.raises(BadStateError, match="same clock"):
        CheckpointManager(tmp_path / "hot", stop=StopRequest(clock=FakeClock()))
    from trainready.errors import UsageError

    with pytest.raises(UsageError, match="same clock"):
        _session(tmp_path, FakeClock(), StopRequest())


def test_a_session_that_cannot_start_gives_back_its_share_of_the_context(tmp_path):
    ctx = DistContext(_users=1)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    clock = FakeClock()
    with pytest.raises(Exception, match="file"):
        Session(RunSettings(run_dir=tmp_path / "run", hot=str(blocker / "hot")), context=ctx,
                stop=StopRequest(clock=clock), clock=clock)
    assert ctx._users == 1  # the caller's share alone


def test_manager_stops_on_the_stop_request_it_is_given(tmp_path):
    clock = FakeClock()
    stop = StopRequest(clock=clock)
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False), stop=stop,
                           clock=clock) as mgr:
        mgr.install_preemption_handler(deadline_s=30, signals=())
        assert not mgr.should_save(1)
        stop.request(signal.SIGTERM)  # as a signal routed to this request would
        assert mgr.should_save(2) and mgr.preempted
        mgr.save(2, {"model": {"w": torch.ones(2)}})
        assert mgr.reached_preemption(2) and mgr.latest_step() == 2


def test_a_context_passed_in_is_shared_and_released_once_per_user():
    ctx = DistContext(_users=1)
    with pytest.raises(BadStateError, match="process_group or context"):
        CheckpointManager("/nonexistent/never-made", context=ctx, process_group=object())
    assert ctx._users == 1  # refused before it took a share


def test_manager_records_its_lease_on_the_clock_it_is_given(tmp_path):
    clock = FakeClock()
    with CheckpointManager(tmp_path / "hot", options=CheckpointManagerOptions(async_save=False),
                           stop=StopRequest(clock=clock), clock=clock) as mgr:
        assert mgr.lease.started_unix == clock.now


# ---- Session ------------------------------------------------------------------------------------------------


def _session(tmp_path, clock, stop, **settings) -> Session:
    return Session(RunSettings(run_dir=tmp_path / "run", hot=str(tmp_path / "hot"), **settings),
                   context=DistContext(_users=1), stop=stop, clock=clock)


def _records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / "telemetry.jsonl").read_text().splitlines()]


def test_session_bills_and_stops_for_the_budget_on_the_clock_it_is_given(tmp_path):
    """$1 a second and a $300 budget: hours of training on the clock given, none in real time; the session stops
    before the budget with a checkpoint, and every number it records is the given clock's."""
    clock = FakeClock()
    stop = StopRequest(clock=clock)
    sess = _session(tmp_path, clock, stop, budget_usd=300.0, usd_per_hour=3600.0, total_steps=1000, async_save=False)
    state = {"model": {"w": torch.zeros(2)}}
    try:
        with pytest.raises(SystemExit) as stopped:
            for step in range(sess.start_step, 1000):
                with sess.step(tokens=10):
                    clock.advance(10.0)  # a 10-second step
                sess.maybe_save(step, state)
        assert stopped.value.code == EXIT_BUDGET
    finally:
        stop.reset()
    end = [r for r in _records(tmp_path) if r["type"] == "stop"][-1]
    assert end["reason"] == "budget" and end["checkpoint"] == end["step"]
    assert 200.0 <= end["cost_usd"] <= 300.0  # spent by the fake clock: 10 s a step at $1/s
    records = _records(tmp_path)
    assert {r["t"] for r in records} <= {round(clock.now - 10.0 * k, 3) for k in range(1000)}
    steps = [r for r in records if r["type"] == "step"]
    assert steps and all(r["step_s"] == pytest.approx(10.0) for r in steps)


def test_session_stops_on_the_stop_request_it_is_given(tmp_path):
    clock = FakeClock()
    stop = StopRequest(clock=clock)
    sess = _session(tmp_path, clock, stop, total_steps=100, async_save=False)
    try:
        with pytest.raises(SystemExit) as stopped:
            for step in range(sess.start_step, 100):
                with sess.step(tokens=1):
                    clock.advance(1.0)
                    if step == 3:
                        stop.request(signal.SIGTERM)
                sess.maybe_save(step, {"model": {"w": torch.full((2,), float(step))}})
        assert stopped.value.code == 128 + signal.SIGTERM
    finally:
        stop.reset()
    end = [r for r in _records(tmp_path) if r["type"] == "stop"][-1]
    assert (end["reason"], end["step"], end["checkpoint"]) == ("signal", 3, 3)


# ---- Launcher -----------------------------------------------------------------------------------------------

# a worker that takes a first SIGTERM without stopping (a hung collective) and a second one as a stop
_WORKER = """import signal, sys, time
seen = []
def on_term(*_):
    seen.append(1)
    if len(seen) > 1:
        sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print('worker up', flush=True)
time.sleep(float(sys.argv[1]))
"""


def _launch_spec(tmp_path, **settings) -> LaunchSpec:
    return LaunchSpec(command=["python", "train.py"], settings=RunSettings(run_dir=tmp_path / "run", **settings))


class FakeSpawner:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, []

    def __call__(self, argv, env):
        self.calls.append((argv, env))
        return subprocess.Popen([sys.executable, "-c", _WORKER, str(self.seconds)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def test_launcher_starts_what_its_spawner_gives_and_routes_signals_through_what_it_is_given(tmp_path):
    spec = _launch_spec(tmp_path)
    spawn, said, handlers = FakeSpawner(0.0), [], []
    result = Launcher(spec, said.append, lambda records: None, spawn=spawn, clock=FakeClock(),
                      install_signal=lambda sig, handler: handlers.append((sig, handler)) or signal.SIG_DFL).run()
    assert result.reason == "finished" and result.exit_code == 0
    (argv, env), = spawn.calls
    assert argv == torchrun_argv(spec) and json.loads(env["TRAINREADY_COMMAND"]) == ["python", "train.py"]
    assert any("worker up" in line for line in said)
    installed = [sig for sig, handler in handlers if handler is not signal.SIG_DFL]
    assert sorted(installed) == sorted([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
    assert [sig for sig, handler in handlers if handler is signal.SIG_DFL] == installed  # and put back
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the process's own handlers never touched


def test_launcher_grace_period_runs_on_the_clock_it_is_given(tmp_path):
    """A stop signal, then workers that never stop: past the 100 s grace period on the given clock (a few real
    seconds) the launcher has the agent stopped and says so."""
    clock = FakeClock()
    spec = _launch_spec(tmp_path, grace_s=100.0)
    handlers: dict[int, object] = {}
    said: list[str] = []
    launcher = Launcher(spec, said.append, lambda records: None, spawn=FakeSpawner(600.0), clock=clock,
                        install_signal=lambda sig, handler: handlers.__setitem__(sig, handler))
    pressed: list[float] = []

    def tick() -> None:
        if not pressed and any("worker up" in line for line in said):  # it runs: the user presses Ctrl-C
            handlers[signal.SIGINT](signal.SIGINT, None)
            pressed.append(clock.monotonic())
        elif pressed and launcher.agent.poll() is None and clock.monotonic() - pressed[0] < 100:
            clock.advance(150.0)  # the workers hang past the grace period
    clock.on_sleep = tick
    started = time.monotonic()
    result = launcher.run()
    assert result.reason == "signal" and result.exit_code == 128 + signal.SIGINT
    assert "did not stop within the 100 s grace period" in result.message
    assert time.monotonic() - started < 60


def test_the_system_clock_is_the_default():
    assert Launcher.__init__.__kwdefaults__["clock"] is SYSTEM_CLOCK
    assert Session.__init__.__kwdefaults__["clock"] is SYSTEM_CLOCK


def test_a_launch_ends_cleanly_when_a_collaborator_fails(tmp_path):
    """A signal handler that cannot be installed (an application's non-main thread) or a spawner that hands over
    no output: the launch is recorded as ended, the handlers put back, and the run directory free for the next."""
    spec = _launch_spec(tmp_path)
    installed: list = []

    def second_fails(sig, handler):
        if sig == signal.SIGTERM and handler is not signal.SIG_DFL:  # the second of SIGINT, SIGTERM, SIGHUP
            raise ValueError("signal only works in main thread of the main interpreter")
        installed.append((sig, handler))
        return signal.SIG_DFL

    with pytest.raises(ValueError, match="main thread"):
        Launcher(spec, [].append, lambda records: None, spawn=FakeSpawner(0.0), install_signal=second_fails).run()
    assert installed[-1] == (installed[0][0], signal.SIG_DFL)  # the one that went in was put back
    launch = json.loads((spec.run_dir / "run.json").read_text())["launches"][-1]
    assert launch["end_unix"] is not None and launch["reason"] == "failed"

    def no_output(argv, env):
        return subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.DEVNULL)

    with pytest.raises(RuntimeError, match="without stdout"):
        Launcher(spec, [].append, lambda records: None, spawn=no_output).run()
    result = Launcher(spec, [].append, lambda records: None, spawn=FakeSpawner(0.0), clock=FakeClock(),
                      install_signal=lambda sig, handler: signal.SIG_DFL).run()
    assert result.reason == "finished"  # the lock of the failed launches was let go


def test_a_refused_or_interrupted_launch_lets_go_of_the_run_directory(tmp_path, monkeypatch):
    """An application that embeds the launcher: a refusal after the lock was taken (another command in this run
    directory) and Ctrl-C while the launch record is written both leave the directory free, the launch ended."""
    import fcntl

    from trainready.errors import UsageError
    from trainready.run import launcher as launcher_module

    spec = _launch_spec(tmp_path)
    quiet = {"clock": FakeClock(), "install_signal": lambda sig, handler: signal.SIG_DFL}
    assert Launcher(spec, [].append, lambda records: None, spawn=FakeSpawner(0.0), **quiet).run().reason == "finished"
    other = LaunchSpec(command=["python", "other.py"], settings=spec.settings)
    with pytest.raises(UsageError, match="holds a run of"):
        Launcher(other, [].append, lambda records: None, spawn=FakeSpawner(0.0), **quiet).run()

    def interrupted(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher_module, "torchrun_argv", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Launcher(spec, [].append, lambda records: None, spawn=FakeSpawner(0.0), **quiet).run()
    launches = json.loads((spec.run_dir / "run.json").read_text())["launches"]
    assert len(launches) == 2 and launches[-1]["end_unix"] is not None and launches[-1]["reason"] == "failed"
    with open(spec.run_dir / ".lock") as lock:  # another open file: flock conflicts with a leaked one
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
