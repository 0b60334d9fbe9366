"""The session API a training script uses: `sess = trainready.init()`.

    sess = trainready.init(total_steps=1000)
    step = sess.restore(state)                  # newest valid checkpoint, or None
    for step in range(sess.start_step, 1000):
        with sess.step(tokens=n) as t:
            batch = t.data(next(it))            # time waiting for data
            ...
            t.log(loss=loss)
        sess.maybe_save(step, state)
    sess.finish()

Every decision that must be the same on all ranks (save now? stop now?) is computed from
the numbers all ranks exchange once per step (one small all-gather on the control group of
trainready.dist, on the training thread), so ranks always agree without a second round; the
checkpoint writer's collectives run on a group of their own. Signals reach the session through
trainready.dist's one signal path. Telemetry is written by rank 0.
Contract: one session per process, used from the training thread.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import statistics
import sys
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import torch
import torch.distributed as dist

from trainready.clock import SYSTEM_CLOCK, Clock
from trainready.dist import STOP, DistContext, StopRequest, identity
from trainready.errors import UsageError
from trainready.io import redact

from .budget import EXIT_S_DEFAULT, BudgetGuard, CostClock
from .interval import IntervalChoice, choose_interval, job_mtbf
from .launch_spec import EXIT_BUDGET
from .run_dir import RunDir
from .settings import RunSettings
from .telemetry import TelemetryWriter
from .timing import CommWatch, CudaMarks, FinishedStep, HostMarks, Marks, SplitQueue, StepTimer, StepTimes
from .watchdog import start_watch

log = logging.getLogger("trainready.run")

class RankNumbers(NamedTuple):
    """What every rank reports after every step, exchanged as one float64 tensor in this field order; NaN =
    unknown (not measured, or not resolved yet)."""

    step_s: float
    """The host's time inside the step."""
    split_of: float
    """The step the split below describes (one step behind with CUDA events)."""
    split_s: float
    """The time the split covers."""
    data_s: float
    comm_s: float
    optimizer_s: float
    tokens: float
    interval_s: float
    """Since the previous step ended on this rank."""
    signal: float
    """The stop signal this rank has seen (0: none)."""
    now: float
    """This rank's wall clock (time.time())."""
    commit_s: float
    """Seconds the newest checkpoint commit took (0: none yet)."""
    stall_s: float
    billed_s: float
    """Billed seconds by this rank's clock."""


_FIELDS = RankNumbers._fields
_PACE_WINDOW = 20
RANK_LISTS_MAX = 64  # per-rank times go into about this many ranks' worth of step records (every k-th step)


@dataclass(frozen=True, slots=True)
class Decision:
    save: bool
    stop: str | None  # "signal" | "budget" | "max_steps" | None


class Session:
    """See the module docstring. Build it with `trainready.init()`.

    `settings` are the run's options. What the session works with is passed in, each defaulting to the process's
    own: `context` (the ranks and their control group; default: built on torch.distributed's world, which is
    initialized first if torchrun started us), `stop` (the stop request signals reach) and `clock` (billing, step
    pacing and the grace period). The checkpoint manager it makes shares all three."""

    def __init__(self, settings: RunSettings, *, flops_per_token: float | None = None, backend: str | None = None,
                 context: DistContext | None = None, stop: StopRequest = STOP, clock: Clock = SYSTEM_CLOCK):
        self.settings = settings
        if stop.clock is not clock:  # a grace period is measured from `stop.at`: on one clock, or it is nonsense
            raise UsageError("the stop request and the session must use the same clock: pass "
                             "stop=StopRequest(clock=...) with the clock given to the session")
        if settings.budget_usd is not None and settings.usd_per_hour is None:
            raise UsageError("a budget needs a price: give usd_per_hour= (per node-hour) with budget_usd=")
        self.stop, self.clock = stop, clock
        if context is None:
            self._init_distributed(backend)
        me = identity()
        self.rank, self.world_size, self.local_rank = me.rank, me.world_size, me.local_rank
        self.device = torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        self.ctx = context.retain() if context is not None else DistContext.acquire()
        self.telemetry = TelemetryWriter(None, "rank0", clock)
        self.manager: Any = None
        try:
            self._start(settings, flops_per_token)
        except BaseException:  # give back what was taken: a share of the (perhaps the caller's) context, files
            if self.manager is not None:
                with contextlib.suppress(Exception):
                    self.manager.close(timeout_s=10.0)
            self.telemetry.close()
            self.ctx.release()
            raise

    def _start(self, settings: RunSettings, flops_per_token: float | None) -> None:
        """What the constructor builds once it holds the context (undone by it if anything here fails)."""
        clock = self.clock
        self._group = self.ctx.control
        self._watch = start_watch(settings.launcher_pid, settings.launcher_start_ticks,
                                  watch_parent="TORCHELASTIC_RUN_ID" in os.environ)
        if self.rank == 0 and settings.run_dir is not None:  # rank 0 writes the run's records; others: nowhere
            self.telemetry = RunDir(settings.run_dir).telemetry_writer("rank0", clock)
        self.flops_per_token = settings.flops_per_token or flops_per_token
        self.gpu_name, self.peak_flops = _detect_peak(self.device, settings.peak_tflops)
        launch = settings.launch_unix or clock.time()
        # under the launcher it announces the 50%/80% crossings on its own clock; on our own we do
        self.budget = BudgetGuard(settings.budget_usd, CostClock(settings.usd_per_hour, settings.nnodes,
                                                                 settings.prior_s, launch),
                                  exit_s=EXIT_S_DEFAULT if settings.exit_s is None else settings.exit_s,
                                  warn_spent=settings.launcher_pid is None)
        mtbf_h, self._mtbf_note = job_mtbf(settings.nnodes, int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)),
                                           settings.spot, settings.mtbf_h)
        self._mtbf_h = mtbf_h
        self.manager = self._make_manager()
        self._stop_at: float | None = None  # monotonic time a budget stop began: the grace period counts from it
        self.stop.install()
        self.start_step = 0
        self._next_step = 0
        self._steps_this_launch = 0
        self._since_save = 0
        self._last_end = clock.perf_counter()
        self._pace: deque[float] = deque(maxlen=_PACE_WINDOW)
        self._stalls: deque[float] = deque(maxlen=5)  # the slowest rank's stall of each save (exchanged)
        self._local_stall = 0.0
        self._commit_max = 0.0  # the slowest commit seen in this launch (any rank): what the final save may take
        self._interval: IntervalChoice | None = None
        self._decision: Decision | None = None
        self._comm_watch: CommWatch | None = None
        self._last_saved: int | None = None
        self._finished = False
        self._dropped_seen = 0
        self._marks: Marks = _marks(self.device, settings.timing, clock)
        self._measured: set[str] = set() if self.world_size > 1 else {"comm"}  # one rank: nothing to communicate
        self._splits = SplitQueue()
        self._rank_every = max(1, -(-self.world_size // RANK_LISTS_MAX))
        self._start_record()

    # ---- setup -------------------------------------------------------------------------------

    def _init_distributed(self, backend: str | None) -> None:
        if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
            return
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))

    def _make_manager(self) -> Any:
        from trainready.store import CheckpointManager, CheckpointManagerOptions

        options = CheckpointManagerOptions(keep_hot=self.settings.keep_hot, async_save=self.settings.async_save)
        return CheckpointManager(self.settings.hot_dir, self.settings.archive, options, context=self.ctx, stop=self.stop,
                                 clock=self.clock)

    def _start_record(self) -> None:
        import socket

        ident = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "agreed": self._agreed_settings()}
        everyone = self._gather_objects(ident)
        differing = [w for w in everyone if w["agreed"] != everyone[0]["agreed"]]
        if differing:  # every rank raises: decisions computed from different settings would split the job
            raise UsageError(f"rank {differing[0]['rank']} on {differing[0]['host']} runs with other settings than rank 0 "
                             f"({differing[0]['agreed']} vs {everyone[0]['agreed']}): start every node with the same options")
        everyone = [{k: w[k] for k in ("rank", "pid", "host")} for w in everyone]
        self.telemetry.write(
            "start", world_size=self.world_size, restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            backend=dist.get_backend() if dist.is_initialized() else None, device=str(self.device), gpu=self.gpu_name,
            peak_tflops=self.peak_flops / 1e12 if self.peak_flops else None, flops_per_token=self.flops_per_token,
            hot=self.settings.hot_dir, archive=redact(self.settings.archive) if self.settings.archive else None,
            ckpt_every=self.settings.ckpt_every,
            total_steps=self.settings.total_steps, budget_usd=self.settings.budget_usd,
            usd_per_hour=self.settings.usd_per_hour, nnodes=self.settings.nnodes, workers=everyone,
            run_id=self.manager.run_id, generation=self.manager.generation, timing=self._marks.source)

    def _agreed_settings(self) -> dict[str, Any]:
        s = self.settings
        return {"budget_usd": s.budget_usd, "usd_per_hour": s.usd_per_hour, "nnodes": s.nnodes, "ckpt_every": s.ckpt_every,
                "mtbf_h": s.mtbf_h, "spot": s.spot, "total_steps": s.total_steps, "max_steps": s.max_steps,
                "timing": s.timing}

    def _gather_objects(self, obj: Any) -> list[Any]:
        if self._group is None:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    # ---- the API -----------------------------------------------------------------------------

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def restore(self, state: dict[str, Any]) -> int | None:
        """Load the newest checkpoint that verifies into `state`; returns its step (the last one
        completed) or None. Training continues at `sess.start_step`."""
        t0 = self.clock.perf_counter()
        result = self.manager.restore_details(state)
        duration = self.clock.perf_counter() - t0
        step = result.step if result else None
        self.start_step = self._next_step = 0 if step is None else step + 1
        self._last_saved = step
        self.telemetry.write("restore", step=step, tier=result.tier if result else None,
                             skipped=list(result.skipped) if result else [], duration_s=_r(duration))
        self._last_end = self.clock.perf_counter()
        return step

    def watch(self, ddp_model: Any) -> Any:
        """Time a DDP model's gradient all-reduce (a comm hook around the default one). Anything else
        (FSDP, a plain module) is not hooked: its communication stays unknown unless `t.comm()` times it."""
        if self._comm_watch is None:
            self._comm_watch = CommWatch(self._marks)
        if self._comm_watch.attach(ddp_model):
            self._measured.add("comm")
        elif self.world_size > 1 and self.is_main:
            log.warning("sess.watch(%s): not a DistributedDataParallel model, its communication is not measured "
                        "(recorded as unknown); wrap collectives in `with t.comm():` to time them",
                        type(ddp_model).__name__)
        return ddp_model

    @contextmanager
    def step(self, tokens: float | None = None) -> Iterator[StepTimer]:
        """Time one training step; `tokens`: tokens this rank processes in it."""
        timer = StepTimer(tokens=tokens or 0, comm_watch=self._comm_watch, marks=self._marks, measured=self._measured,
                          now=self.clock.perf_counter)
        timer.begin()
        yield timer
        if self.device.type == "cuda" and not self._marks.lagged:  # host clocks on a GPU: wait for its work
            torch.cuda.synchronize(self.device)
        self._after_step(timer.end(), timer.metrics)

    def maybe_save(self, step: int, state: dict[str, Any], *, force: bool = False) -> bool:
        """Save when due (interval, auto interval, last step) or forced; on a stop for a signal or
        the budget save, wait for the upload, and exit (max_steps exits without saving). Without
        `with sess.step()` blocks, each call marks a step. Returns whether it saved."""
        if self._decision is None:  # no `with sess.step()`: this call marks the step (times unknown)
            self._after_step(None, {})
        decision = self._decision
        self._decision = None
        last = self.settings.total_steps is not None and step >= self.settings.total_steps - 1
        saved = False
        if force or decision.save or last:
            saved = self._save(step, state)
        if decision.stop:
            self._stop(step, decision.stop)
        return saved

    def finish(self, timeout_s: float | None = 600.0) -> None:
        """Wait (up to `timeout_s`) for the last save and its upload, then write the end record (what
        is committed and archived once they are done, which the report shows), release resources."""
        if self._finished:
            return
        self._finished = True
        try:
            self.manager.close(timeout_s=timeout_s)
        finally:
            commit = self.manager.last_commit
            if commit is not None:
                self._last_saved = commit[0]
            archived = self.manager.status().archived_step if self.settings.archive else None
            self.telemetry.write("end", last_step=self._next_step - 1, steps_this_launch=self._steps_this_launch,
                                 last_saved=self._last_saved, archived=archived)
            self.telemetry.close()
            self.ctx.release()
            self._group = None

    # ---- per step ----------------------------------------------------------------------------

    def _after_step(self, finished: FinishedStep | None, metrics: dict[str, Any]) -> None:
        step = self._next_step
        ready = self._splits.push(step, finished.pending) if finished is not None else None
        split_of, split = ready if ready is not None else (None, StepTimes())
        now_perf = self.clock.perf_counter()
        interval = now_perf - self._last_end
        self._last_end = now_perf
        commit = self.manager.last_commit  # set when a (background) commit finishes
        if commit is not None:
            self._last_saved = commit[0]
        now = self.clock.time()
        unknown = math.nan

        def known(value: float | None) -> float:
            return unknown if value is None else value
        mine = RankNumbers(step_s=finished.host_s if finished else unknown,
                           split_of=unknown if split_of is None else float(split_of), split_s=known(split.step_s),
                           data_s=known(split.data_s), comm_s=known(split.comm_s), optimizer_s=known(split.optimizer_s),
                           tokens=finished.tokens if finished else 0.0, interval_s=interval,
                           signal=float(self.stop.signum or 0), now=now, commit_s=commit[1] if commit else 0.0,
                           stall_s=self._local_stall, billed_s=self.budget.clock.billed_s(now))
        rows = self._exchange(mine)
        self._next_step += 1
        self._steps_this_launch += 1
        self._since_save += 1
        col = {name: [getattr(r, name) for r in rows] for name in _FIELDS}
        if self._steps_this_launch == 2:
            self._pace.clear()  # the first interval of a launch holds start-up and restore, not a step
        self._pace.append(col["interval_s"][0])  # rank 0's
        pace = statistics.median(self._pace)
        self._decision = self._decide(step, col, pace)
        self._record_step(step, col, pace, metrics)

    def _exchange(self, values: RankNumbers) -> list[RankNumbers]:
        """Every rank's numbers, in rank order (one all_gather of a float64 tensor)."""
        if self._group is None:
            return [values]
        mine = torch.tensor(values, dtype=torch.float64)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine, group=self._group)
        return [RankNumbers(*t.tolist()) for t in out]

    def _decide(self, step: int, col: dict[str, list[float]], pace: float) -> Decision:
        """The same inputs (every rank's numbers, by field) on every rank give the same decision."""
        billed = col["billed_s"][0]  # rank 0's clock: every node's launcher started at another moment
        stall = max(col["stall_s"])
        if stall > 0 and (not self._stalls or stall != self._stalls[-1]):
            self._stalls.append(stall)
        signals = [int(s) for s in col["signal"] if s]
        if signals:
            self.stop.request(signals[0])  # another rank was signalled: stop together (no-op where one was)
            return Decision(save=True, stop="signal")
        if self.settings.max_steps is not None and self._steps_this_launch >= self.settings.max_steps:
            return Decision(save=False, stop="max_steps")
        commit_s = max(col["commit_s"])
        self._commit_max = max(self._commit_max, commit_s)
        view = self.budget.assess(billed, pace, self._final_save_estimate(self._commit_max, pace),
                                  self._remaining_after(step))
        for warning in view.warnings:
            self._warn("budget", warning, spent_usd=view.spent_usd, projected_usd=view.projected_usd)
        if view.stop:
            self._stop_at = self.clock.monotonic()
            return Decision(save=True, stop="budget")
        # with a budget, what the final checkpoint costs must be known early: save at the second step
        measure = self.settings.budget_usd is not None and commit_s == 0 and self._steps_this_launch == 2
        return Decision(save=measure or self._interval_due(step, pace), stop=None)

    def _remaining_after(self, step: int) -> int | None:
        return None if self.settings.total_steps is None else max(0, self.settings.total_steps - step - 1)

    def _final_save_estimate(self, commit_s: float, pace: float) -> float:
        if commit_s <= 0:
            commit_s = 2 * pace + 1.0  # not measured yet (it is at the second step)
        return commit_s * (2 if self.settings.archive else 1)  # the upload takes about as long again

    def _fixed_interval_due(self, step: int) -> bool:
        every = self.settings.ckpt_every
        return isinstance(every, int) and (step + 1) % every == 0

    def _interval_due(self, step: int, pace: float) -> bool:
        if self.settings.ckpt_every != "auto":
            return self._fixed_interval_due(step)
        if not self._stalls:  # measure a save's stall early: the second step of the launch
            return self._steps_this_launch >= 2
        if len(self._pace) < 3:
            return False
        choice = choose_interval(max(self._stalls), pace, self._mtbf_h, self._mtbf_note)
        if self._interval is None or abs(choice.every_steps - self._interval.every_steps) > 0.2 * self._interval.every_steps:
            self._interval = choice
            self._say(choice.describe())
            self.telemetry.write("ckpt_interval", every_steps=choice.every_steps, tau_s=round(choice.tau_s, 3),
                                 stall_s=round(choice.stall_s, 4), step_s=round(choice.step_s, 4), mtbf_h=choice.mtbf_h,
                                 assumption=choice.assumption, message=choice.describe())
        return self._since_save >= self._interval.every_steps

    def _record_step(self, step: int, col: dict[str, list[float]], pace: float, metrics: dict[str, Any]) -> None:
        if not self.is_main or self.telemetry.path is None:
            return
        tokens = sum(col["tokens"])
        interval = col["interval_s"][0]
        tokens_per_s = tokens / interval if interval > 0 and tokens else None
        mfu = None
        if tokens_per_s and self.flops_per_token and self.peak_flops:
            mfu = tokens_per_s * self.flops_per_token / (self.world_size * self.peak_flops)
        view = self.budget.assess(col["billed_s"][0], pace, 0.0, self._remaining_after(step), peek=True)
        status = self.manager.status()
        dropped = list(status.dropped_unarchived)
        if len(dropped) > self._dropped_seen:
            self._warn("ckpt_dropped", f"checkpoint(s) {', '.join(dropped[self._dropped_seen:])} dropped from the hot tier "
                       f"before reaching the archive (last upload error: {status.last_upload_error or 'none'})",
                       names=dropped[self._dropped_seen:])
            self._dropped_seen = len(dropped)
        split = split_fields(col, self._marks.source, self._rank_every)
        self.telemetry.write(
            "step", step=step, step_s=_r(_finite(col["step_s"][0])), interval_s=_r(interval), **split,
            tokens=tokens, tokens_per_s=_r(tokens_per_s), mfu=_r(mfu),
            cost_usd=_r(view.spent_usd), projected_usd=_r(view.projected_usd), eta_s=_r(view.eta_s),
            ckpt={"last_saved": self._last_saved, "saving": status.saving, "uploading": status.uploading,
                  "archived": status.archived_step, "dropped_unarchived": len(dropped)},
            metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or v is None})

    def _warn(self, kind: str, message: str, **fields: Any) -> None:
        self._say(message)
        self.telemetry.write(kind, message=message, **fields)

    def _say(self, message: str) -> None:
        """Once, on rank 0's stderr, when no launcher shows it: under `trainready run` the record in
        telemetry.jsonl reaches the console through the launcher (printing it here too showed it
        two or three times: worker log, worker stderr echoed by torchrun, launcher)."""
        if self.is_main and not self.settings.launcher_pid:
            sys.stderr.write(f"trainready: {message}\n")
            sys.stderr.flush()

    # ---- saving and stopping -----------------------------------------------------------------

    def _save(self, step: int, state: dict[str, Any]) -> bool:
        t0 = self.clock.perf_counter()
        saved = self.manager.save(step, state)
        stall = self.clock.perf_counter() - t0
        if saved:
            self._local_stall = stall
            self._since_save = 0
            # "ckpt" = a save started (staged; committed later when async): last_saved follows commits
            self.telemetry.write("ckpt", step=step, stall_s=_r(stall), async_save=self.settings.async_save,
                                 hot=self.settings.hot_dir)
        return saved

    def _stop(self, step: int, reason: str) -> None:
        """Wait for the final checkpoint (and its upload) within the grace period counted from the
        signal or the budget decision, record what is really committed, and exit."""
        from trainready.store.errors import ArchiveUnavailableError

        started = (self.stop.at if reason == "signal" else self._stop_at) or self.clock.monotonic()
        remaining = max(1.0, self.settings.grace_s - 5.0 - (self.clock.monotonic() - started))
        upload_error = save_error = None
        try:
            self.manager.wait(timeout_s=remaining)
        except ArchiveUnavailableError as exc:  # committed on the hot tier; the upload did not finish
            upload_error = str(exc)
        except Exception as exc:  # the final save itself failed: say so, name the last good one
            save_error = f"{type(exc).__name__}: {exc}"
        commit = self.manager.last_commit
        committed = commit[0] if commit else self._last_saved
        self._last_saved = committed
        now = self.clock.time()
        kept = f"with a checkpoint of step {committed}" if committed is not None else "with no checkpoint"
        if save_error:
            kept += f" (the final save failed: {save_error})"
        if reason == "signal":
            signum = self.stop.signum
            message = f"stopped by signal {signal.Signals(signum).name if signum else '?'} after step {step}, {kept}"
        elif reason == "budget":
            message = f"{self.budget.stop_message(self.budget.clock.billed_s(now), step)}; {kept}"
        else:
            message = f"stopped after {self._steps_this_launch} steps (max_steps)"
        exit_code = {"signal": 128 + (self.stop.signum or signal.SIGTERM), "budget": EXIT_BUDGET, "max_steps": 0}[reason]
        message = redact(message)
        info = {"schema_version": 1, "reason": reason, "step": step, "checkpoint": committed,
                "message": message, "exit_code": exit_code, "upload_error": redact(upload_error) if upload_error else None,
                "cost_usd": self.budget.clock.spent_usd(now)}
        self.telemetry.write("stop", **info)
        self._say(message)  # under the launcher: its result line
        if self.local_rank == 0 and self.settings.run_dir is not None:  # every node's launcher reads its own
            RunDir(self.settings.run_dir).write_stop(info)
        try:
            self.finish(timeout_s=max(1.0, self.settings.grace_s - 5.0 - (self.clock.monotonic() - started)))
        except Exception as exc:  # never trade a clean stop for a traceback: what is committed is intact
            log.error("while finishing after the stop: %s", exc)
        # under the launcher every worker exits 0 (torchrun would restart a failure) and the
        # launcher turns stop.json into the exit code; on its own the process exits with it
        raise SystemExit(0 if self.settings.launcher_pid else exit_code)


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _mean(values: list[float]) -> float | None:
    """Mean over ranks; None (unknown) when any rank did not measure it."""
    return statistics.fmean(values) if values and all(math.isfinite(v) for v in values) else None


def _marks(device: torch.device, timing: str, clock: Clock) -> Marks:
    if device.type == "cuda" and timing in ("auto", "cuda-events"):
        return CudaMarks()
    if timing == "cuda-events":
        log.warning("timing=cuda-events needs a CUDA device; using host clocks on %s", device)
    return HostMarks(clock.perf_counter)


def split_fields(col: dict[str, list[float]], source: str, rank_every: int = 1) -> dict[str, Any]:
    """A step record's split, from every rank's exchanged numbers (NaN = unknown): means over ranks,
    what is unmeasured, the wait for the slowest rank, and (every `rank_every`-th split) every
    rank's step time and exposed communication."""
    world = len(col["split_s"])
    of = col["split_of"][0]
    mean = StepTimes(step_s=_mean(col["split_s"]), data_s=_mean(col["data_s"]), comm_s=_mean(col["comm_s"]),
                     optimizer_s=_mean(col["optimizer_s"]), source=source)
    # work: a rank's step minus its exposed communication, where fast ranks wait for the slow one
    work = [s - c for s, c in zip(col["split_s"], col["comm_s"], strict=True)]
    work_known = all(math.isfinite(w) for w in work)
    straggler = max(work) - statistics.median_low(work) if work_known and world > 1 else (0.0 if work_known else None)
    basis = work if work_known else col["split_s"] if all(math.isfinite(v) for v in col["split_s"]) else col["step_s"]
    slowest = max(range(world), key=lambda r: basis[r] if math.isfinite(basis[r]) else -1.0)
    out: dict[str, Any] = {
        "timing": source, "split_step": None if not math.isfinite(of) else int(of),
        "data_s": _r(mean.data_s), "data_s_max": _r(max(col["data_s"])) if mean.data_s is not None else None,
        "comm_s": _r(mean.comm_s), "optimizer_s": _r(mean.optimizer_s), "compute_s": _r(mean.compute_s),
        "unattributed_s": _r(mean.unattributed_s), "unmeasured": mean.unmeasured if mean.step_s is not None else [],
        "straggler_s": _r(max(0.0, straggler)) if straggler is not None else None, "slowest_rank": slowest}
    if math.isfinite(of) and int(of) % rank_every == 0:
        out["rank_step_s"] = [_r(_finite(v), 5) for v in col["split_s"]]
        out["rank_comm_s"] = [_r(_finite(v), 5) for v in col["comm_s"]]
    return out


def _detect_peak(device: torch.device, given_tflops: float | None) -> tuple[str | None, float | None]:
    if device.type != "cuda":
        return None, given_tflops * 1e12 if given_tflops else None
    name = torch.cuda.get_device_name(device)
    if given_tflops:
        return name, given_tflops * 1e12
    from trainready.catalog import load_catalog

    catalog = load_catalog()
    for candidate in (name, name.replace("NVIDIA ", ""), *name.replace("NVIDIA ", "").split("-")[:1]):
        try:
            gpu = catalog.gpu(candidate)
            peak = gpu.peak_tflops("bf16") or gpu.peak_tflops("fp16")  # V100 has no bf16: it trains fp16
            return name, peak * 1e12 if peak else None
        except UsageError:
            continue
    return name, None


def init(*, model: Any = None, seq_len: int | None = None, flops_per_token: float | None = None,
         backend: str | None = None, **settings: Any) -> Session:
    """Start a session: settings from the launcher's TRAINREADY_* variables, overridden by
    keyword arguments (any RunSettings field: hot, archive, ckpt_every, total_steps, ...).

    model + seq_len (a trainready ModelSpec or preset name) give the FLOPs per token for MFU
    through the planner's FLOP model; or pass flops_per_token directly."""
    _show_our_log()
    if model is not None and flops_per_token is None:
        flops_per_token = model_flops(model, seq_len)
    _keep_launchers_run_dir(settings)
    return Session(RunSettings.from_env(**settings), flops_per_token=flops_per_token, backend=backend)


class _StderrUntilConfigured(logging.StreamHandler):
    """Our lines on stderr while the script has no logging of its own; once it configures the root logger (after
    init()), our lines reach it by propagation, and this handler steps aside rather than print them twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def _show_our_log() -> None:
    """Our INFO lines (saves, restores, stops) reach stderr when the script has configured no logging. Only the
    "trainready" logger gets a handler; the root logger, and with it every other library's logging, stays as the
    script left it (logging.basicConfig here would have turned on torch's and fsspec's INFO lines too)."""
    ours = logging.getLogger("trainready")
    if logging.getLogger().handlers or ours.handlers:
        return
    handler = _StderrUntilConfigured()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)


def _keep_launchers_run_dir(settings: dict[str, Any]) -> None:
    """Under `trainready run` the launcher owns the run directory: it reads stop.json and telemetry
    there, so a script's own run_dir= would turn a clean stop into a failure. Its directory wins."""
    own, launchers = settings.get("run_dir"), os.environ.get("TRAINREADY_RUN_DIR")
    if own is None or not launchers or not os.environ.get("TRAINREADY_LAUNCHER_PID"):
        return
    if Path(own).resolve() != Path(launchers).resolve():
        log.warning("init(run_dir=%r) ignored: `trainready run` set the run directory to %s (it reads stop.json "
                    "and telemetry there); pass --run-dir to the launcher instead", str(own), launchers)
    del settings["run_dir"]


def model_flops(model: Any, seq_len: int | None) -> float:
    from trainready.plan.performance import flops_per_token
    from trainready.plan.presets import preset

    spec = preset(model) if isinstance(model, str) else model
    if seq_len is None:
        raise UsageError("init(model=...) needs seq_len= to count attention FLOPs")
    return flops_per_token(spec, seq_len)
