"""`trainready run --log-to tensorboard,mlflow,wandb`: the run's per-step telemetry, written through
each project's own client into the run directory (nothing leaves the machine).

Where it runs: in the launcher, fed the records it already tails from telemetry.jsonl every
0.25 s (launcher.py `_poll_telemetry`), not in rank 0. The workers never wait for an exporter
(rank 0 only appends a line to a file, as before), a library that hangs or fails cannot stop a
rank (the others would wait for it in the next collective), and the launcher outlives torchrun's
worker restarts. Each backend has a thread and a queue of its own (a "lane"): the launcher's loop
only appends to the queues, and a slow or stuck backend delays nobody else. A backend that raises
(disk full, a library error) is warned about once and dropped for the rest of the launch.

Steps never repeat in a backend. `RUN_DIR/exporters.json` keeps, per backend, the newest step it
wrote (after a flush) and the ids a resumed run needs. At start each lane first reads
telemetry.jsonl from the beginning and writes what it has not written yet (steps an earlier
launch's exporter missed, or the whole run when `--log-to` is added later), then the live
records; a step at or below the newest written one is skipped: after a crash the steps between
the restored checkpoint and the crash are computed again, and their first values stay.
"""

from __future__ import annotations

import importlib.util
import json
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trainready.errors import UsageError, closest, printable
from trainready.io import make_dir, parse_json, read_regular, replace_durable

from .run_dir import RunDir

STATE_FILE = "exporters.json"
FLUSH_EVERY_S = 2.0  # flush each backend and save exporters.json at most this often
# at the end of a launch: wait this long for the lanes, then leave them. MLflow's first open of a new
# SQLite store runs its schema migrations: measured here on 2 shared cores, 2.9 s, and 17 s at load average 10
CLOSE_TIMEOUT_S = 60.0
QUIET_WAIT_S = 3.0  # say that the launcher is waiting for an exporter after this long
MAX_PENDING = 100_000  # records queued in one lane before it skips new ones (a stuck backend)

# step-record fields that describe the step named by `split_step` (CUDA events are read a step later)
SPLIT = {"data_s": "time/data_s", "data_s_max": "time/data_s_max", "comm_s": "time/comm_s",
         "optimizer_s": "time/optimizer_s", "compute_s": "time/compute_s", "unattributed_s": "time/unattributed_s",
         "straggler_s": "time/straggler_s", "slowest_rank": "time/slowest_rank"}
OWN = {"step_s": "perf/step_s", "interval_s": "perf/interval_s", "tokens": "perf/tokens",
       "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu", "cost_usd": "cost/spent_usd",
       "projected_usd": "cost/projected_usd", "eta_s": "cost/eta_s"}
CKPT = {"last_saved": "ckpt/last_saved", "archived": "ckpt/archived", "dropped_unarchived": "ckpt/dropped_unarchived"}
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-./ ]")  # MLflow's rule for metric names, the strictest of the three


def _number(value: Any, nonfinite: bool) -> float | None:
    if nonfinite:
        return math.nan  # telemetry writes NaN/inf as null and names the field: a NaN loss is news
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def step_scalars(record: dict[str, Any]) -> list[tuple[int, dict[str, float]]]:
    """A `step` record as (step, {metric: value}) pairs: the split at `split_step` first (it may be
    the step before), then the step's own numbers and the script's `t.log` metrics."""
    step = int(record["step"])
    bad = set(record.get("nonfinite") or [])
    split_at = record.get("split_step")
    split_at = step if not isinstance(split_at, int) else split_at
    split = {name: v for key, name in SPLIT.items() if (v := _number(record.get(key), key in bad)) is not None}
    own = {name: v for key, name in OWN.items() if (v := _number(record.get(key), key in bad)) is not None}
    ckpt = record.get("ckpt") or {}
    own.update({name: v for key, name in CKPT.items() if (v := _number(ckpt.get(key), False)) is not None})
    metrics = record.get("metrics") or {}
    bad_metrics = set(metrics.get("nonfinite") or [])
    for key, value in metrics.items():
        if key != "nonfinite" and (v := _number(value, key in bad_metrics)) is not None:
            own["train/" + _BAD_KEY.sub("_", str(key))] = v
    if split_at == step:
        return [(step, {**split, **own})]
    return [(split_at, split), (step, own)] if split else [(step, own)]


def run_config(record: dict[str, Any]) -> dict[str, Any]:
    """A `start` record's settings (world size, device, price, ...) as flat key/value pairs."""
    skip = {"schema_version", "type", "t", "source", "workers", "nonfinite"}
    return {k: v for k, v in record.items() if k not in skip and (v is None or isinstance(v, (str, int, float, bool)))}


class Exporter:
    """One backend. `open` gets the run directory and this backend's saved state (a dict it may
    add ids to, kept in exporters.json); `log` one step's scalars (steps never go down by more
    than one: see `step_scalars`); `config` the run's settings at each (re)start."""

    name = ""
    extra = ""
    modules: tuple[str, ...] = ()
    where = ""  # what it writes, for the launch message

    def open(self, run_dir: Path, state: dict[str, Any], resumed_after: int | None) -> None:
        raise NotImplementedError

    def config(self, info: dict[str, Any], step: int, wall: float) -> None:
        pass

    def log(self, step: int, scalars: dict[str, float], wall: float) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def close(self, outcome: str) -> None:
        pass


class TensorBoardExporter(Exporter):
    """Event files in RUN_DIR/tensorboard through torch.utils.tensorboard's SummaryWriter (it needs
    the `tensorboard` package, which also views them). tensorboardX was not lighter here: it imports
    torch too when torch is installed, as it is beside every launcher. A resumed run writes a new
    event file in the same directory, opened with `purge_step` = the next step: TensorBoard hides
    anything an earlier file holds from that step on. tensorboard's writer thread keeps its error
    (disk full) and raises it at the next write or flush, so a failure is seen, not swallowed."""

    name, extra, modules, where = "tensorboard", "tensorboard", ("tensorboard", "torch"), "tensorboard/"

    def open(self, run_dir: Path, state: dict[str, Any], resumed_after: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = resumed_after + 1 if resumed_after is not None else None
        # its own directory, private (dir_mode) even inside a --run-dir the user made 0755: event files hold config
        self.writer = SummaryWriter(log_dir=str(make_dir(run_dir / "tensorboard")), purge_step=purge,
                                    flush_secs=FLUSH_EVERY_S)

    def config(self, info: dict[str, Any], step: int, wall: float) -> None:
        text = "\n".join(f"| {printable(k)} | {printable(v)} |" for k, v in info.items())
        self.writer.add_text("trainready/start", "| setting | value |\n|---|---|\n" + text, step, walltime=wall)

    def log(self, step: int, scalars: dict[str, float], wall: float) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step, walltime=wall)

    def flush(self) -> None:
        self.writer.flush()

    def close(self, outcome: str) -> None:
        self.writer.close()


class MLflowExporter(Exporter):
    """An MLflow run in a SQLite store, RUN_DIR/mlflow/mlflow.db (MLflow 3's file store refuses to
    start unless MLFLOW_ALLOW_FILE_STORE=true: "maintenance mode", mlflow-skinny 3.17.2). The run
    id is kept in exporters.json: every launch logs into the same MLflow run; its status follows the
    launch (RUNNING, then FINISHED, KILLED for a stop on purpose, FAILED). Settings are tags, not
    params (MLflow refuses to change a param, and a restart may change the world size)."""

    name, extra, modules, where = "mlflow", "mlflow", ("mlflow", "sqlalchemy", "alembic"), "mlflow/mlflow.db"

    def open(self, run_dir: Path, state: dict[str, Any], resumed_after: int | None) -> None:
        import logging

        from mlflow.tracking import MlflowClient

        for noisy in ("mlflow", "alembic"):  # table creation is logged at INFO on the launcher's console
            logging.getLogger(noisy).setLevel(logging.WARNING)

        home = make_dir(run_dir / "mlflow")
        self.client = MlflowClient(tracking_uri=f"sqlite:///{home.resolve() / 'mlflow.db'}")
        run_id = state.get("run_id")
        if run_id and self._exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
        else:  # a new run (or mlflow.db was deleted: a new one rather than nothing)
            found = self.client.get_experiment_by_name("trainready")
            experiment = found.experiment_id if found else self.client.create_experiment(
                "trainready", artifact_location=(home.resolve() / "artifacts").as_uri())
            run_id = self.client.create_run(experiment, run_name=run_dir.name).info.run_id
            state.update(run_id=run_id, experiment_id=experiment)
        self.run_id = run_id

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except MlflowException:
            return False

    def config(self, info: dict[str, Any], step: int, wall: float) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(f"trainready.{k}", str(v)[:5000]) for k, v in info.items()])

    def log(self, step: int, scalars: dict[str, float], wall: float) -> None:
        from mlflow.entities import Metric

        ms = int(wall * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in scalars.items()])

    def close(self, outcome: str) -> None:
        status = {"finished": "FINISHED", "stopped": "KILLED"}.get(outcome, "FAILED")
        self.client.set_terminated(self.run_id, status=status)


class WandbExporter(Exporter):
    """W&B in offline mode (never the network): RUN_DIR/wandb/offline-run-<time>-<id>/run-<id>.wandb.
    The run id is kept in exporters.json. wandb 0.31 ignores `resume` offline, so each launch writes
    a new offline-run directory with the same id; `wandb sync RUN_DIR/wandb/offline-run-*` uploads
    them into one run, in order of start time (`wandb sync --help`, 0.31.0). Console capture is off:
    the launcher's output stays the launcher's."""

    name, extra, modules, where = "wandb", "wandb", ("wandb",), "wandb/offline-run-*"

    def open(self, run_dir: Path, state: dict[str, Any], resumed_after: int | None) -> None:
        import secrets

        import wandb

        run_id = state.get("run_id") or secrets.token_hex(4)  # W&B's own ids are 8 characters of [a-z0-9]
        state["run_id"] = run_id
        # wandb/ is made private here, even inside a --run-dir the user made 0755 (wandb would make it 0755). No
        # metadata, git or code capture: W&B would record the launcher's whole command line (--hf-token ...,
        # --password=...) and the git remote with its user name, and `wandb sync` uploads what it records
        make_dir(run_dir / "wandb")
        self.run = wandb.init(project="trainready", name=run_dir.name, id=run_id, dir=str(run_dir), mode="offline",
                              settings=wandb.Settings(console="off", silent=True, x_disable_meta=True,
                                                      x_disable_machine_info=True, disable_git=True,
                                                      disable_code=True, save_code=False, disable_job_creation=True,
                                                      program="trainready"))

    def config(self, info: dict[str, Any], step: int, wall: float) -> None:
        self.run.config.update(info, allow_val_change=True)

    def log(self, step: int, scalars: dict[str, float], wall: float) -> None:
        self.run.log(scalars, step=step)

    def close(self, outcome: str) -> None:
        self.run.finish(exit_code={"finished": 0, "stopped": 0}.get(outcome, 1))


BACKENDS: dict[str, type[Exporter]] = {cls.name: cls for cls in (TensorBoardExporter, MLflowExporter, WandbExporter)}


def parse_log_to(text: str | None, backends: dict[str, type[Exporter]] | None = None) -> list[str]:
    """`--log-to a,b`: the backend names, each known and installed, or a UsageError (before launch).
    Presence is checked without importing (importing wandb and mlflow costs a second of start-up)."""
    backends = backends or BACKENDS
    if text is None:
        return []
    names: list[str] = []
    for word in (w.strip().lower() for w in text.split(",")):
        if not word:
            raise UsageError(f"--log-to {printable(text)!r}: give backend names separated by commas: {', '.join(backends)}")
        if word not in backends:
            near = closest(word, backends)
            raise UsageError(f"--log-to: unknown backend '{printable(word)}'. Valid: {', '.join(backends)}"
                             f"{f'. Did you mean: {near[0]}?' if near else ''}")
        if word not in names:
            names.append(word)
    for name in names:
        cls = backends[name]
        missing = [m for m in cls.modules if importlib.util.find_spec(m) is None]
        if missing:
            raise UsageError(f"--log-to {name} needs {', '.join(missing)}, not installed here: "
                             f"pip install 'trainready[{cls.extra}]'")
    return names


STATE_LIMIT = 1 << 20
"""exporters.json holds a few ids and step numbers per backend: anything larger is not ours."""
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # MLflow: 32 hex digits; W&B: 8 of [a-z0-9]; never a path
_CHECKED = ("last_step", "last_ckpt", "run_id", "experiment_id")


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _load_state(path: Path) -> dict[str, Any]:
    """exporters.json as far as it can be trusted: read without following a symlink or blocking on a
    FIFO, size-capped; per backend, step numbers only as non-negative ints, ids only as short plain tokens
    (a W&B id names a directory), other fields only as scalars. Anything else is unknown: dropped, so a backend
    starts a new run or rewrites steps rather than trusting a broken or planted file."""
    try:
        state = parse_json(read_regular(path, STATE_LIMIT))
    except (OSError, ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        return {}
    if not isinstance(state, dict):
        return {}
    clean: dict[str, Any] = {}
    for name, lane in state.items():
        if name == "schema_version" or not isinstance(lane, dict):
            continue
        # a backend's own fields (its exporter checks them) pass if plain scalars; ours are checked here
        kept: dict[str, Any] = {k: v for k, v in lane.items() if k not in _CHECKED and isinstance(v, (int, float, str))}
        for k in ("last_step", "last_ckpt"):
            if (step := _step(lane.get(k))) is not None:
                kept[k] = step
        for k in ("run_id", "experiment_id"):
            if isinstance(lane.get(k), str) and _RUN_ID.fullmatch(lane[k]):
                kept[k] = lane[k]
        clean[name] = kept
    return clean


class _Lane(threading.Thread):
    """One backend's thread: earlier telemetry first, then the live records, each step once."""

    def __init__(self, sink: ExportSink, exporter: Exporter, state: dict[str, Any]):
        super().__init__(name=f"trainready-export-{exporter.name}", daemon=True)
        self.sink, self.exporter, self.state = sink, exporter, state
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = 0
        self.failed = self.opened = self.overflowed = False
        self.done = threading.Event()
        self.outcome = "failed"
        self.written = state.get("last_step")  # the newest step in the backend, as of its last flush
        self.last_step = self.written
        self.last_ckpt = state.get("last_ckpt")

    def offer(self, records: list[dict[str, Any]]) -> None:
        if self.failed or self.done.is_set():
            return
        if self.pending > MAX_PENDING:
            if not self.overflowed:
                self.overflowed = True
                self.sink.warn(f"--log-to {self.exporter.name} is {MAX_PENDING:,} records behind: skipping new ones")
            return
        self.pending += len(records)
        self.inbox.put(records)

    def run(self) -> None:
        try:
            if self.sink.eager:  # rank 0 runs here: open now, while the workers start (MLflow's first open is slow)
                self._open()
            backlog = RunDir(self.sink.run_dir).read_records()
            self._take(backlog)
            flushed = time.monotonic()
            while True:
                try:
                    batch = self.inbox.get(timeout=0.5)
                except queue.Empty:
                    batch = []
                if batch is None:
                    break
                self.pending -= len(batch)
                self._take(batch)
                if time.monotonic() - flushed >= FLUSH_EVERY_S:
                    self._flush()
                    flushed = time.monotonic()
            self._flush()
            if self.opened:
                self.exporter.close(self.outcome)
        except Exception as exc:  # never the launcher's problem: say it once, drop this backend
            self._drop(exc)
        finally:
            self.done.set()

    def _drop(self, exc: Exception) -> None:
        self.failed = True
        self.sink.warn(f"--log-to {self.exporter.name} failed after step {self.last_step if self.last_step is not None else '-'}"
                       f" ({type(exc).__name__}: {printable(str(exc))[:300]}); it is dropped for the rest of this launch, "
                       "training goes on")
        if not self.opened:
            return
        try:  # keep what it wrote before the error (a writer's queue, a run's status)
            self.exporter.close("failed")
            # closed cleanly: it holds every step before the one that failed; the next launch writes
            # the rest from telemetry.jsonl
            self.state.update(last_step=self.last_step, last_ckpt=self.last_ckpt)
            self.sink.save_state()
        except Exception:  # noqa: BLE001 - being dropped anyway; exporters.json keeps its last flush
            pass

    def _take(self, records: Iterable[dict[str, Any]]) -> None:
        for r in records:
            kind = r.get("type")
            if kind not in ("start", "step", "ckpt"):
                continue
            wall = float(r.get("t") or time.time())
            self._open()
            if kind == "start":
                self.exporter.config(run_config(r), 0 if self.last_step is None else self.last_step + 1, wall)
            elif kind == "step" and isinstance(r.get("step"), int):
                if self.last_step is not None and r["step"] <= self.last_step:
                    continue  # recomputed after a restore: this step is in the backend already
                for step, scalars in step_scalars(r):
                    if scalars and (self.last_step is None or step >= self.last_step):
                        self.exporter.log(step, scalars, wall)
                self.last_step = r["step"]
            elif kind == "ckpt" and isinstance(r.get("step"), int) and isinstance(r.get("stall_s"), (int, float)):
                if (self.last_ckpt is None or r["step"] > self.last_ckpt) and \
                        (self.last_step is None or r["step"] >= self.last_step):
                    self.exporter.log(r["step"], {"ckpt/stall_s": float(r["stall_s"])}, wall)
                    self.last_ckpt = r["step"]

    def _open(self) -> None:
        if not self.opened:
            self.exporter.open(self.sink.run_dir, self.state, self.last_step)
            self.opened = True

    def _flush(self) -> None:
        if not self.opened:
            return
        self.exporter.flush()
        if (self.written, self.state.get("last_ckpt")) != (self.last_step, self.last_ckpt):
            self.written = self.last_step
            self.state.update(last_step=self.last_step, last_ckpt=self.last_ckpt)
            self.sink.save_state()


class ExportSink:
    """The exporters of one launch: `feed` records (from the launcher's loop: never blocks), `close`."""

    def __init__(self, names: list[str], run_dir: Path, warn: Callable[[str], None],
                 backends: dict[str, type[Exporter]] | None = None, eager: bool = False):
        """`eager`: open the backends as the launch starts (one node: rank 0's telemetry is here), not
        at the first `start` record (on other nodes there is none: they write no empty runs)."""
        backends = backends or BACKENDS
        self.eager = eager
        self.run_dir, self.warn_fn = Path(run_dir), warn
        self.path = self.run_dir / STATE_FILE
        self.state = _load_state(self.path)
        self._lock = threading.Lock()
        self.lanes = [_Lane(self, backends[n](), self.state.setdefault(n, {})) for n in names]
        self.started = False  # at the first records: the launcher has the run directory's lock by then
        self.closed = False

    def describe(self) -> str:
        """Where each backend writes, said at launch."""
        return "--log-to: " + ", ".join(f"{lane.exporter.name} in {self.run_dir / lane.exporter.where}" for lane in self.lanes)

    def warn(self, message: str) -> None:
        self.warn_fn(f"trainready: warning: {message}")

    def feed(self, records: list[dict[str, Any]]) -> None:
        if not self.started:
            self.started = True
            for lane in self.lanes:
                lane.start()
        for lane in self.lanes:
            lane.offer(records)

    def save_state(self) -> None:
        with self._lock:  # each lane updates only its own dict; dict() copies one in a single step
            if self.closed:  # a lane left behind by close() no longer speaks for the run directory
                return
            snapshot = {k: dict(v) if isinstance(v, dict) else v for k, v in list(self.state.items())}
            replace_durable(self.path, json.dumps({**snapshot, "schema_version": 1}, indent=2, default=str).encode())

    def close(self, outcome: str, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """`outcome`: finished | stopped (signal, budget, max steps) | failed. Waits for the lanes to
        write what is queued, at most `timeout_s` in all."""
        if not self.started:
            return
        for lane in self.lanes:
            lane.outcome = outcome
            lane.inbox.put(None)
        deadline = time.monotonic() + timeout_s
        quiet = time.monotonic() + min(QUIET_WAIT_S, timeout_s)
        for lane in self.lanes:
            lane.done.wait(max(0.0, quiet - time.monotonic()))
        slow = [lane.exporter.name for lane in self.lanes if not lane.done.is_set()]
        if slow:
            self.warn_fn(f"trainready: writing the last steps to --log-to {', '.join(slow)} (up to {timeout_s:.0f} s)")
        for lane in self.lanes:
            if not lane.done.wait(max(0.0, deadline - time.monotonic())):
                self.warn(f"--log-to {lane.exporter.name} did not finish writing within {timeout_s:.0f} s: it may miss "
                          "the last steps; the next launch writes them from telemetry.jsonl")
        with self._lock:
            self.closed = True


def outcome_of(reason: str) -> str:
    """A launch's reason (launcher.LaunchResult) as an exporter outcome."""
    return {"finished": "finished", "failed": "failed"}.get(reason, "stopped")
