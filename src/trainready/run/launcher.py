"""`trainready run`: start the user's command on torchrun, watch it, stop it cleanly.

torchrun (torch.distributed.run) is the engine: it spawns the workers, restarts them up to
--max-restarts times, writes per-rank logs (--log-dir/--redirects/--tee). This module adds:
* the run directory (run.json, telemetry.jsonl, logs/, summary.json),
* settings for the workers as TRAINREADY_* variables (settings.py),
* the agent dies with the launcher (PR_SET_PDEATHSIG) and workers watch the launcher
  (watchdog.py), so a SIGKILLed launcher leaves no orphan writing checkpoints,
* SIGINT/SIGTERM forwarded as SIGTERM: workers save, upload and exit within --grace,
* exit codes (EXIT_*) from what happened, and the failing worker's last lines when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainready import parent_death
from trainready.clock import SYSTEM_CLOCK, Clock
from trainready.io import child_umask, dir_mode, file_mode, make_dir, open_nofollow, parse_json, redact, redact_argv, redact_json

from . import kill_cause
from .budget import EXIT_JITTER, KILL_S, MARGIN, SpendWarnings, usd_per_second
from .failure import explain_failure
from .launch_spec import EXIT_BUDGET, EXIT_INTERNAL, EXIT_OK, LaunchResult, LaunchSpec
from .records import StopInfo
from .run_dir import RunDir, run_info_problem
from .summary import billed_seconds, launches_from_telemetry, summarize
from .telemetry import FILE, median_step_s
from .watchdog import children, process_start_ticks

RUN_SCHEMA_VERSION = 1
PYTHONS = ("python", "python3", sys.executable, os.path.basename(sys.executable))
SHIM = Path(__file__).with_name("shim.py")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the ssh session closed


def spawn_agent(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """The process spawner a Launcher uses by default: torchrun's agent in a session of its own (a Ctrl-C at the
    terminal reaches the launcher alone, which forwards it), output on one pipe, dying with the launcher, and
    creating files as privately as ours."""
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=parent_death.setter(), umask=child_umask())


def torchrun_argv(spec: LaunchSpec) -> list[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(spec.nnodes),
            "--nproc-per-node", str(spec.nproc_per_node), "--max-restarts", str(spec.max_restarts),
            "--log-dir", str(spec.run_dir / "logs"), "--redirects", "3", "--tee", "3",
            "--local-ranks-filter", spec.show_ranks, "--shutdown-timeout", str(int(spec.settings.grace_s)),
            "--monitor-interval", "0.5"]
    if spec.nnodes == 1 and not spec.rdzv_endpoint:
        argv += ["--standalone"]  # c10d on a port the agent binds itself: two runs on one machine never collide
    else:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", spec.rdzv_endpoint or "",
                 "--rdzv-id", spec.rdzv_id or "trainready", "--node-rank", str(spec.node_rank)]
    return argv + [str(SHIM)]  # the command itself travels in TRAINREADY_COMMAND (shim.py says why)


def _launches(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Telemetry split at the launcher's `launch` records (each part: one launch's records)."""
    parts: list[list[dict[str, Any]]] = []
    for r in records:
        if r.get("type") == "launch":
            parts.append([])
        if parts:
            parts[-1].append(r)
    return parts


def measured_exit_s(records: list[dict[str, Any]]) -> float | None:
    """The slowest shutdown of earlier launches: from the workers' stop (or end) record to the
    launcher's exit record (workers exiting, torchrun noticing, the launcher writing run.json)."""
    gaps = []
    for part in _launches(records):
        done = next((r for r in part if r.get("type") in ("stop", "end")), None)
        ended = next((r for r in part if r.get("type") == "exit"), None)
        if done is not None and ended is not None:
            gaps.append(max(0.0, ended["t"] - done["t"]))
    return max(gaps, default=None)


def measured_relaunch_s(records: list[dict[str, Any]]) -> tuple[float, str]:
    """Seconds a relaunch needs before it can stop cleanly again: the slowest start-up (launch to
    first step) plus two median steps (one step, and a final save guessed at one step) plus the
    slowest shutdown, as measured in earlier launches; (0, ...) when nothing was measured. A
    launch the budget stopped before its first step is a lower bound on start-up."""
    step = median_step_s(records)
    startups = []
    for part in _launches(records):
        first = next((r for r in part if r.get("type") == "step"), None)
        if first is not None:
            startups.append(max(0.0, first["t"] - part[0]["t"] - (first.get("interval_s") or 0)))
        elif (ended := next((r for r in part if r.get("type") == "exit"), None)) and ended.get("reason") == "budget":
            startups.append(max(0.0, ended["t"] - part[0]["t"]))  # start-up took longer than this
    if step is None and not startups:
        return 0.0, "anything (nothing measured yet)"
    startup = max(startups, default=0.0)
    if step is None:
        return startup, f"start-up (more than {startup:.0f} s, measured: a launch ran out of budget before its first step)"
    down = measured_exit_s(records) or 0.0
    return (startup + 2 * step + down,
            f"start-up, one step, a final save and shutdown ({startup:.0f} s + 2 x {step:.1f} s + {down:.0f} s, measured)")


def process_start_unix(pid: int | None = None) -> float | None:
    """When a process started (unix seconds, to 10 ms), from /proc: the launcher's start-up is billed
    too. Its start is in clock ticks since boot; the age is measured on the boot clock (/proc/stat's
    whole-second boot time would put it up to a second early)."""
    ticks = process_start_ticks(pid or os.getpid())
    try:
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK") if ticks is not None else None
    except (OSError, ValueError, AttributeError):
        return None
    return time.time() - age if age is not None and age >= 0 else None


class Launcher:
    """One launch of a run (a run may be launched again with the same command: it resumes).

    `spec` holds its options. What it works with is passed in: `on_output` (each line for the console) and
    `on_records` (new telemetry records, for the live view); `spawn(argv, env)` starts the agent and returns a
    Popen-like object whose stdout is its output (default: torchrun's agent, spawn_agent); `clock` (billing, the
    grace period, polling); `install_signal(signum, handler)` routes a stop signal to it and returns the handler
    it replaced (default signal.signal; a test or an embedding application passes its own)."""

    def __init__(self, spec: LaunchSpec, on_output: Callable[[str], None], on_records: Callable[[list], None],
                 started_unix: float | None = None, *,
                 spawn: Callable[[list[str], dict[str, str]], subprocess.Popen] = spawn_agent,
                 clock: Clock = SYSTEM_CLOCK, install_signal: Callable[[int, Any], Any] = signal.signal):
        """`started_unix`: when this launch began costing money (the CLI passes its process's start);
        default now."""
        self.spec = spec
        self.on_output, self.on_records = on_output, on_records
        self.spawn, self.clock, self.install_signal = spawn, clock, install_signal
        self.agent: subprocess.Popen | None = None
        self.signalled: int | None = None
        self.start_unix = min(clock.time(), started_unix or clock.time())
        self._starting = True  # no step reported since the launch or the latest (re)start of the workers
        self._spend: SpendWarnings | None = None
        self._budget_stop: str | None = None  # set when the launcher stopped the workers for the budget
        self._projected: float | None = None
        self.output_tail: list[str] = []
        self._offset = 0
        self._signal_deadline: float | None = None
        self._escalated = False  # the grace period ran out and the launcher had torchrun stop the workers
        self._lock_fd: int | None = None
        self._info: dict[str, Any] = {}

    # ---- run.json ----------------------------------------------------------------------------

    def _run_json(self) -> Path:
        return RunDir(self.spec.run_dir).run_json

    def _load_info(self, records: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """run.json of earlier launches, and whether it had to be rebuilt. One that cannot be parsed
        (torn by a crash, edited by hand) is moved aside and its launches rebuilt from
        telemetry.jsonl: an empty record would reset the budget's count of what was spent."""
        path = self._run_json()
        try:
            raw = RunDir(self.spec.run_dir).read_run_bytes()  # bounded: a FIFO or a symlink is a usage error
        except FileNotFoundError:
            return {}, False
        try:
            info = parse_json(raw)
            if not isinstance(info, dict) or run_info_problem(info, every_launch=True):
                raise ValueError("not a run.json object")
            return info, False
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past json's parser
            pass
        aside = path.with_name(f"run.json.corrupt-{int(self.clock.time())}")
        os.replace(path, aside)
        # it may hold an unredacted command of an older version: take away what our mode would not give
        os.chmod(aside, os.stat(aside).st_mode & file_mode())
        launches = launches_from_telemetry(records)
        if launches:
            spent = billed_seconds(launches, records)
            self.on_output(f"trainready: warning: {path} was unreadable (moved to {aside.name}); rebuilt {len(launches)} "
                           f"earlier launch(es) from {FILE}: {spent:.0f} s billed so far, still counted by the budget")
        else:
            self.on_output(f"trainready: warning: {path} was unreadable (moved to {aside.name}) and {FILE} has no launch "
                           "records: what earlier launches spent is unknown and NOT counted by the budget")
        return {"launches": launches}, True

    def _private_logs_dir(self) -> None:
        """torchrun's per-rank logs hold whatever the script prints (a token it echoes, a traceback's locals):
        logs/ gets our mode even inside a --run-dir the user made 0755, and an existing logs/ of ours (a real
        directory we own, written by an older version) is narrowed to it; the agent's umask (run) covers files."""
        logs = make_dir(RunDir(self.spec.run_dir).logs)
        try:
            fd = os.open(logs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # a symlink or file in its place: torchrun reports what it cannot write
            return
        try:
            st = os.fstat(fd)
            if st.st_uid == os.getuid():
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & dir_mode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def _write_info(self, info: dict[str, Any]) -> None:
        RunDir(self.spec.run_dir).write_run_info(info)

    def _begin(self) -> LaunchResult | None:
        """Everything before the workers start; a LaunchResult when there is nothing to launch."""
        run_dir = self.spec.run_dir
        try:
            make_dir(run_dir)  # private (0700) unless TRAINREADY_FILE_MODE says otherwise
            self._private_logs_dir()
            self._lock_run_dir()
        except OSError as exc:  # a read-only or full disk, a path through a file: the user's to change
            from trainready.errors import UsageError, printable

            where = printable(exc.filename) if exc.filename else printable(run_dir)
            raise UsageError(f"--run-dir {printable(run_dir)}: cannot write {where} ({exc.strerror or exc}): fix that, "
                             "or give a --run-dir on a writable disk") from None
        # earlier launches' telemetry; the live view starts after it (nothing appends: the lock is ours, no workers)
        records, self._offset = RunDir(run_dir).read_new_records()
        info, rebuilt = self._load_info(records)
        # run.json holds the command with its secrets hidden: compare like with like
        command = redact_argv(self.spec.command)
        self._check_same_run(info, command)
        finished = self._already_finished(info, records, command)
        if finished is not None:  # said once, as the result (the caller prints it)
            return LaunchResult(EXIT_OK, "finished", finished)
        from .environment import describe_environment

        info.setdefault("schema_version", RUN_SCHEMA_VERSION)
        info.setdefault("kind", "trainready-run")
        info["command"] = command
        info["config"] = redact_json(self.spec.config)  # --archive may carry credentials or a presigned URL
        info["environment"] = redact_json(describe_environment(self.spec.command))
        info.setdefault("created_unix", min((launch.get("start_unix") or self.start_unix for launch in info.get("launches", [])),
                                            default=self.start_unix))
        if rebuilt:
            self._write_info(info)  # what was rebuilt survives a budget refusal below
        prior = billed_seconds(info.get("launches", []), records)
        self._check_budget_left(prior, records)
        self._announce_budget(prior)
        exit_s = measured_exit_s(records)
        if exit_s is not None:  # one launch's shutdown says little about the next one's on a busy machine
            exit_s *= EXIT_JITTER
        info.setdefault("launches", []).append({
            "start_unix": self.start_unix, "end_unix": None, "exit_code": None, "reason": None,
            "pid": os.getpid(), "pid_start_ticks": process_start_ticks(os.getpid()), "node_rank": self.spec.node_rank,
            "prior_billed_s": round(prior, 3), **kill_cause.at_launch()})
        self._write_info(info)
        self._info = info
        RunDir(run_dir).clear_stop()
        self.settings = self.spec.settings.model_copy(update={
            "prior_s": prior, "launch_unix": self.start_unix, "launcher_pid": os.getpid(),
            "launcher_start_ticks": process_start_ticks(os.getpid()), "exit_s": exit_s})
        s = self.settings
        if s.budget_usd is not None and s.usd_per_hour is not None:
            self._spend = SpendWarnings(s.budget_usd, usd_per_second(s.usd_per_hour, s.nnodes) * prior)

    def _check_same_run(self, info: dict[str, Any], command: list[str]) -> None:
        """Another command in this run directory is another experiment: resuming its weights silently
        would train the wrong thing. Refused unless --resume says that is what is wanted."""
        from trainready.errors import UsageError

        earlier = redact_argv(info.get("command") or [])
        run_dir = self.spec.run_dir
        if earlier and command_key(earlier) != command_key(command):
            if not self.spec.resume:
                raise UsageError(f"{run_dir} holds a run of `{' '.join(earlier)}`, not of `{' '.join(command)}`: a "
                                 "different command is a different run. Give it its own --run-dir to start fresh, or "
                                 "pass --resume to continue that run's checkpoints with the changed command")
            self.on_output(f"trainready: --resume: continuing the run of `{' '.join(earlier)}` in {run_dir} with "
                           f"`{' '.join(command)}`")
        elif self.spec.resume and not info.get("launches") and self.spec.nnodes > 1:
            # a replacement node starts with an empty disk while the others wait at the rendezvous
            self.on_output(f"trainready: --resume: {run_dir} holds no earlier launch on this node; it joins the run "
                           "and restores from the archive or its peers' checkpoints")
        elif self.spec.resume and not info.get("launches"):
            raise UsageError(f"--resume: {run_dir} holds no run to resume (no run.json with a launch): check "
                             "--run-dir, or leave out --resume to start a new run there")

    def _already_finished(self, info: dict[str, Any], records: list[dict[str, Any]], command: list[str]) -> str | None:
        """The same command again in a run whose last launch finished (the script exited 0 on its own): launching
        would bill torchrun's start-up (about 25 s on a GPU node) to restore the last step and exit. Said, and
        nothing launched, unless --resume asks to go on (a script whose total_steps was raised)."""
        launches = info.get("launches") or []
        last = launches[-1] if launches and isinstance(launches[-1], dict) else {}
        earlier = redact_argv(info.get("command") or [])
        if (self.spec.resume or self.spec.nnodes > 1 or last.get("reason") != "finished" or last.get("exit_code") != 0
                or not earlier or command_key(earlier) != command_key(command)):
            return None  # several nodes decide each from its own run.json: they could disagree and half-launch
        # only a run that declared its length (trainready.init(total_steps=N)) and reached it is known to be done: a
        # script without one (an eval, data prep) may do something new each time it runs
        parts = _launches(records)
        last_launch = parts[-1] if parts else []
        steps = [r["step"] for r in last_launch if r.get("type") == "step" and type(r.get("step")) is int]
        totals = [r["total_steps"] for r in last_launch if r.get("type") == "start" and type(r.get("total_steps")) is int]
        if not steps or not totals or max(steps) + 1 < totals[-1]:
            return None
        return (f"{self.spec.run_dir} already finished (step {max(steps) + 1:,} of {totals[-1]:,}): nothing launched. "
                f"To train further (a larger total_steps), add --resume; for a new run, give another --run-dir")

    def _announce_budget(self, prior_s: float) -> None:
        """What the budget buys, before anything is spent on workers: start-up is billed too."""
        s = self.spec.settings
        if s.budget_usd is None or s.usd_per_hour is None:
            return
        per_s = usd_per_second(s.usd_per_hour, s.nnodes)
        spent = prior_s * per_s
        left = max(0.0, s.budget_usd - spent)
        earlier = (f"earlier launches spent ${spent:.2f} ({spent / s.budget_usd:.0%}), " if prior_s > 0 else "")
        self.on_output(f"trainready: budget ${s.budget_usd:.2f} at ${s.usd_per_hour:g}/h x {s.nnodes} node(s): "
                       f"{earlier}${left:.2f} left = {_clock(left / per_s)} of wall time, start-up and shutdown "
                       "included; the run stops with a checkpoint before it is spent")

    def _lock_run_dir(self) -> None:
        """One launcher per run directory: a second one would fence the first one's checkpoints."""
        import fcntl

        from trainready.errors import UsageError

        fd = open_nofollow(self.spec.run_dir / ".lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:  # taken (BlockingIOError), or a file system without locks (ENOLCK): never leaked
            os.close(fd)
            if not isinstance(exc, BlockingIOError):
                raise
            same_rank = (" (another node of this job with the same --node-rank on a shared filesystem? give each node "
                         "its own --node-rank)") if self.spec.nnodes > 1 else ""
            raise UsageError(f"another `trainready run` is using {self.spec.run_dir} (it holds {self.spec.run_dir}/.lock)"
                             f"{same_rank}: wait for it, stop it, or give this run its own --run-dir") from None
        self._lock_fd = fd

    def _check_budget_left(self, prior_s: float, records: list[dict[str, Any]]) -> None:
        """Refuse a relaunch that cannot afford start-up, one step and a final save (as measured in
        earlier launches): it would only pay for start-up and stop again."""
        s = self.spec.settings
        if s.budget_usd is None or s.usd_per_hour is None:
            return
        from trainready.errors import UsageError

        per_s = usd_per_second(s.usd_per_hour, s.nnodes)
        spent = prior_s * per_s
        need_s, why = measured_relaunch_s(records)
        need_s = max(need_s, KILL_S * MARGIN)  # at the very least, starting and being stopped again
        now_s = max(0.0, self.clock.time() - self.start_unix)  # this launcher's own start-up, billed too
        if spent + per_s * (now_s + need_s) >= s.budget_usd * 0.999:
            left = max(0.0, s.budget_usd - spent)
            if prior_s <= 0:
                raise UsageError(f"--budget-usd {s.budget_usd:g} at ${s.usd_per_hour:g}/h x {s.nnodes} node(s) buys "
                                 f"{_clock(s.budget_usd / per_s)}: not even enough to start the workers and stop them "
                                 "again; raise --budget-usd")
            raise UsageError(f"earlier launches of this run already spent ${spent:.2f} of the ${s.budget_usd:.2f} budget "
                             f"({prior_s:.0f} s billed); the ${left:.2f} left does not cover {why} (${per_s * need_s:.2f}): "
                             "raise --budget-usd to continue from the last checkpoint")

    def _end(self, result: LaunchResult) -> None:
        info = self._info  # ours since _begin (the lock): not read back, so a damaged file cannot lose it
        launch = info["launches"][-1]
        launch.update(end_unix=self.clock.time(), exit_code=result.exit_code, reason=result.reason, message=result.message)
        self._write_info(info)
        with RunDir(self.spec.run_dir).telemetry_writer("launcher", self.clock) as writer:
            writer.write("exit", exit_code=result.exit_code, reason=result.reason, message=result.message)
        result.summary = summarize(self.spec.run_dir)
        RunDir(self.spec.run_dir).write_summary(result.summary.model_dump_json(indent=2))

    # ---- running -----------------------------------------------------------------------------

    def _release_run_dir(self) -> None:
        """The run directory is free again: an application that embeds the launcher may launch anew."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def run(self) -> LaunchResult:
        try:
            done = self._begin()
        except BaseException:  # a refusal (another command, no budget left): the lock is let go of, not leaked
            self._release_run_dir()
            raise
        if done is not None:  # nothing to launch
            self._release_run_dir()
            done.summary = summarize(self.spec.run_dir)
            return done
        # Workers share the store torchrun's agent already listens on: rank 0 hosting its own would bind a port
        # the agent picked and let go of, which another process can take first (EADDRINUSE, seen under parallel
        # tests). But workers of a restarted attempt read the previous attempt's keys from the shared store and
        # fail to connect (gloo, torch 2.13), so with restarts rank 0 hosts a fresh store per attempt; a taken
        # port then costs one restart, each attempt picking a new port.
        own_store = "1" if self.spec.max_restarts > 0 else "0"
        previous: dict[int, Any] = {}
        result = LaunchResult(EXIT_INTERNAL, "failed", "the launcher stopped unexpectedly")
        # from here every path ends the launch in run.json and lets go of the lock: a full disk writing the launch
        # record, or Ctrl-C before the agent starts, included
        try:  # the handlers too: one that cannot be installed still ends the launch and puts the others back
            env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": own_store, **os.environ, **self.settings.to_env(),
                   "PYTHONUNBUFFERED": "1", "TRAINREADY_COMMAND": json.dumps(self.spec.command),
                   "TRAINREADY_USER_UMASK": f"{_current_umask():o}"}  # the shim gives the script the user's umask back
            argv = torchrun_argv(self.spec)  # recorded as launched
            with RunDir(self.spec.run_dir).telemetry_writer("launcher", self.clock) as writer:
                writer.write("launch", argv=argv, node_rank=self.spec.node_rank, prior_billed_s=self.settings.prior_s)
            for sig in FORWARDED:
                previous[sig] = self.install_signal(sig, self._on_signal)
            self.agent = self.spawn(argv, env)
            if self.agent.stdout is None:  # a spawner of our own must hand over the output, or it is lost
                self.agent.kill()
                raise RuntimeError("the process spawner gave an agent without stdout: spawn with stdout=PIPE")
            pump = threading.Thread(target=self._pump, daemon=True)
            pump.start()
            while self.agent.poll() is None:
                self._poll_telemetry()
                self._watch_budget()
                self._escalate_if_overdue()
                self.clock.sleep(0.25)
            pump.join(timeout=5)
            self._poll_telemetry()
            result = self._outcome(self.agent.returncode)
        finally:
            for sig, handler in previous.items():
                with contextlib.suppress(Exception):  # put back what can be; the launch is ended either way
                    self.install_signal(sig, handler)
            try:
                self._end(result)  # run.json and summary.json, whatever happened
            finally:
                self._release_run_dir()
        return result

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.agent is None or self.agent.poll() is not None:
            return
        if self.signalled is None:
            self.signalled = signum
            self._signal_deadline = self.clock.monotonic() + self.spec.settings.grace_s
            self.on_output(f"trainready: {signal.Signals(signum).name}: asking the workers to save and stop "
                           f"(up to {self.spec.settings.grace_s:.0f} s; signal again to stop at once)")
            # to the workers, not the agent: they save and exit 0, and torchrun, seeing success, exits
            # without restarting them (a SIGTERM the agent got twice would cut its own grace period short)
            workers = children(self.agent.pid)  # torchrun's workers
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            if not workers:  # not started yet (rendezvous): torchrun itself stops
                self.agent.send_signal(signal.SIGTERM)
        elif signum == signal.SIGTERM and self.signalled == signal.SIGTERM:
            return  # the same SIGTERM again (a process-group or cgroup kill): keep waiting for the save
        else:
            self.on_output("trainready: second signal: stopping now, without waiting for the checkpoint")
            self.agent.kill()  # workers see their parent go and exit (watchdog)

    def _escalate_if_overdue(self) -> None:
        """Past the grace period the workers are stuck (a hung collective?): torchrun stops them."""
        if self._signal_deadline is not None and self.clock.monotonic() > self._signal_deadline and self.agent is not None:
            self._signal_deadline = None
            self._escalated = True
            self.on_output("trainready: the workers did not stop within the grace period: terminating them")
            self.agent.send_signal(signal.SIGTERM)

    def _pump(self) -> None:
        """torchrun's output to launcher.log and the console, drained to the end whatever happens to either: a pump
        that stopped (a full disk under the log, a console pipe whose reader left: `run ... | head`) would leave
        torchrun blocked on a full pipe and the training hung. What cannot be written is said once and skipped."""
        assert self.agent is not None and self.agent.stdout is not None
        log: Any = None
        try:
            fd = os.open(self.spec.run_dir / "launcher.log",
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
            log = open(fd, "ab")  # noqa: SIM115 - closed below, after the loop
        except OSError as exc:
            self._say_once(f"trainready: launcher.log cannot be written ({exc.strerror or exc}): the workers' output "
                           "is still in logs/")
        echo = True
        try:
            for raw in iter(self.agent.stdout.readline, b""):
                if log is not None:
                    try:
                        log.write(raw)
                        log.flush()
                    except OSError as exc:
                        self._say_once(f"trainready: launcher.log stopped at a write error ({exc.strerror or exc}); "
                                       "the workers' output is still in logs/ where the disk allows")
                        with contextlib.suppress(OSError):
                            log.close()
                        log = None
                line = raw.decode(errors="replace").rstrip("\n")
                self.output_tail = (self.output_tail + [line])[-400:]
                if echo:
                    try:
                        self.on_output(line)
                    except (OSError, ValueError, SystemExit):  # the console went away (EPIPE: Rich exits on a
                        echo = False                              # broken pipe, a closed file): training goes on
        finally:
            if log is not None:
                with contextlib.suppress(OSError):
                    log.close()

    def _say_once(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError, SystemExit):
            self.on_output(text)

    def _poll_telemetry(self) -> None:
        records, self._offset = RunDir(self.spec.run_dir).read_new_records(self._offset)
        for r in records:
            if r.get("type") == "start":
                self._starting = True  # a (re)started attempt: nothing new to save until its first step
            elif r.get("type") == "step":
                self._starting = False
                self._projected = r.get("projected_usd")
        if records:
            self.on_records(records)

    def _watch_budget(self) -> None:
        """The launcher's part of the budget guard, on its own clock (the billed one): the 50% and 80%
        warnings when crossed, and, while the workers have no step to save (start-up, a restart),
        the stop: ended at once, they lose nothing, and the budget is not spent on start-up alone.
        From their first step on, the workers stop themselves with a final checkpoint."""
        s = self.settings
        if self._spend is None or s.usd_per_hour is None or s.budget_usd is None or self._budget_stop:
            return
        per_s = usd_per_second(s.usd_per_hour, s.nnodes)
        spent = per_s * (s.prior_s + self.clock.time() - self.start_unix)
        crossed = self._spend.crossed(spent)
        if crossed:  # as telemetry: the live view shows it (once), report lists it
            with RunDir(self.spec.run_dir).telemetry_writer("launcher", self.clock) as writer:
                for message in crossed:
                    writer.write("budget", message=message, spent_usd=round(spent, 4), projected_usd=self._projected)
        # only where global rank 0 runs: it alone reports steps, so elsewhere "no step yet" is not known
        if self._starting and self.spec.node_rank == 0 and self.signalled is None \
                and spent + per_s * KILL_S * MARGIN >= s.budget_usd:
            self._budget_stop = (f"budget guard: stopped during start-up (no step reported yet) with ${spent:.2f} of the "
                                 f"${s.budget_usd:.2f} budget spent; nothing new to save: raise --budget-usd to "
                                 "continue from the newest checkpoint")
            assert self.agent is not None
            self.agent.kill()  # its workers see it go and exit within 0.5 s (watchdog.py)

    # ---- outcome -----------------------------------------------------------------------------

    def _outcome(self, returncode: int) -> LaunchResult:
        if self._budget_stop is not None:
            return LaunchResult(EXIT_BUDGET, "budget", self._budget_stop)
        stop = self._read_stop()
        if stop is not None:
            reason, code = stop.reason, stop.exit_code
            message = redact(stop.message)  # may quote an upload error: it goes to run.json and the console
            if reason == "signal" and self.signalled is not None:  # the workers only saw the SIGTERM we sent
                code = 128 + self.signalled
                message = message.replace("SIGTERM", signal.Signals(self.signalled).name, 1)
            return LaunchResult(code, reason, message)
        if self.signalled is not None:
            guard = (f"; they did not stop within the {self.spec.settings.grace_s:.0f} s grace period, so trainready's "
                     f"guard had torchrun stop them (SIGTERM, then SIGKILL after its shutdown timeout)"
                     if self._escalated else "")
            return LaunchResult(128 + self.signalled, "signal",
                                f"interrupted by {signal.Signals(self.signalled).name} before the workers could save"
                                f"{guard}: the newest committed checkpoint is intact and the next run resumes from it")
        if returncode == 0:
            return LaunchResult(EXIT_OK, "finished", "training finished")

        launch = (self._info.get("launches") or [{}])[-1]
        return explain_failure(self.spec, self.output_tail, returncode, sigkill_by=kill_cause.sigkill_cause(launch))

    def _read_stop(self) -> StopInfo | None:
        return RunDir(self.spec.run_dir).read_stop()


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec} s")


_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def command_key(argv: list[str]) -> list[str]:
    """What makes two commands the same experiment: any Python interpreter is `python`, and a word
    naming an existing file or directory (alone or after `--opt=`) is that path resolved, so
    `.venv/bin/python ./train.py` and `/abs/.venv/bin/python train.py` are one run."""
    def word(text: str) -> str:
        head, sep, value = text.partition("=") if text.startswith("-") else ("", "", text)
        if value and os.path.exists(value):
            value = os.path.realpath(value)
        return head + sep + value

    key = [word(w) for w in argv]
    if argv and _PYTHON.fullmatch(os.path.basename(argv[0])):
        key[0] = "python"
    return key


def _current_umask() -> int:
    """This process's umask (reading it means setting it: set straight back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
