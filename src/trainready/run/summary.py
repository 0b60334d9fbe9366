"""What a run did, from its run directory: the launcher writes it as summary.json at the end,
`trainready report` computes it for finished and running runs alike.

Rates skip each launch's first WARMUP_STEPS steps (compilation, allocator growth, first save).
Time shares are of the wall time between step ends, so they add up to 1 with `other`
(checkpoint stalls, logging, anything outside `with sess.step()`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainready.errors import UsageError
from trainready.io import redact, redact_argv, redact_json
from trainready.plan.divergence import PlanCheck

from .budget import usd_per_second
from .goodput import compute_goodput
from .goodput_model import GoodputReport
from .kill_cause import vanished_as
from .record_decoder import decode_launches
from .records import finite
from .run_dir import RunDir
from .settings import node_run_dirs
from .telemetry import FILE

SUMMARY_SCHEMA_VERSION = 1
WARMUP_STEPS = 2


class TimeShares(BaseModel):
    """Shares of the wall time between step ends; None = a part some step did not measure (its time is in
    `unattributed`, with compute, never folded into compute)."""

    model_config = ConfigDict(extra="forbid")
    data: float | None
    compute: float | None
    optimizer: float | None
    comm: float | None
    other: float
    unattributed: float | None = Field(None, description="compute plus the unmeasured parts (None: all measured)")
    timing: str | None = Field(None, description="how the split was timed: host, cuda-events, or both "
                                                "(host+cuda-events); unknown: a record's timing field was malformed")


class CostSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spent_usd: float | None
    projected_usd: float | None
    budget_usd: float | None
    usd_per_hour: float | None
    nnodes: int


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SUMMARY_SCHEMA_VERSION
    kind: Literal["trainready-run-summary"] = "trainready-run-summary"
    run_dir: str
    status: Literal["running", "finished", "stopped", "failed", "interrupted", "killed", "unknown"]
    exit_code: int | None
    message: str | None
    command: list[str]
    launches: int
    worker_restarts: int
    world_size: int | None
    first_step: int | None
    last_step: int | None
    total_steps: int | None
    steps_logged: int
    tokens: float
    wall_s: float | None
    step_s_median: float | None
    tokens_per_s_median: float | None
    mfu_median: float | None
    shares: TimeShares | None
    loss_first: float | None
    loss_last: float | None
    nonfinite_losses: int
    checkpoints_saved: int
    last_checkpoint: int | None
    last_archived: int | None
    archive: str | None = None  # the archive tier (redacted), None: none configured
    ckpt_interval: str | None
    eta_s: float | None
    cost: CostSummary
    warnings: list[str]
    stop: dict[str, Any] | None
    goodput: GoodputReport | None = Field(None, description="share of billed time that produced kept steps, badput "
                                                            "by cause in hours and dollars, per launch and per rank")
    plan_check: PlanCheck | None = Field(None, description="`report`: the measured step against the planner's "
                                                       "prediction for the run's job spec, part by part")


@contextlib.contextmanager
def gc_paused():
    """Python's cycle collector off for a burst of allocation that makes no garbage cycles: reading
    a run (every telemetry record a dict of floats and lists) triggers its full passes over every
    live object again and again, a fifth of `report --html`'s CPU time on a 10,000-step run
    (bench/report_html.py); reference counting still frees everything as usual. Nests; the previous
    state comes back on the way out."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_run_info(run_dir: Path) -> dict[str, Any]:
    """run.json: {} when absent. Read as a hostile file (run_dir.RunDir.read_run_info): opened without following
    a symlink or blocking on a FIFO swapped in after a check, size-capped; anything else is a UsageError naming it."""
    return RunDir(run_dir).read_run_info()


def _read_telemetry(run_dir: Path, skipped: dict[str, int]) -> list[dict[str, Any]]:
    """The node's telemetry records, decoded (RunDir.read_records); what was left out counted in `skipped`."""
    return RunDir(run_dir).read_records(skipped)


_LEADS: dict[Path, tuple[tuple[Any, ...], Path]] = {}  # run dir -> (its nodes' telemetry size and time, the lead)


def _lead_node_dir(run_dir: Path) -> Path:
    """A multi-node run's --run-dir holds one node<R>/ per node: report the node where global rank 0
    ran (its telemetry has the run's steps; c10d rendezvous may put it on any node), else node0."""
    return _lead_node(run_dir)[0]


def _lead_node(run_dir: Path) -> tuple[Path, tuple[list[dict[str, Any]], dict[str, int]] | None]:
    """_lead_node_dir's answer and, when finding it read the lead's telemetry, those records and what reading
    skipped (summarize reads the file once). The answer is kept while no node's telemetry changes: `report`
    asks again for its plan check, and every node's file would be parsed anew."""
    if RunDir(run_dir).holds_a_run():
        return run_dir, None
    nodes = [p for p in node_run_dirs(run_dir) if RunDir(p).run_json.exists()]
    state = tuple((st.st_size, st.st_mtime_ns) if (st := _stat(n / FILE)) else None for n in nodes)
    known = _LEADS.get(run_dir)
    if known is not None and known[0] == state:
        return known[1], None
    lead, read = (nodes[0] if nodes else run_dir), None
    for node in nodes:
        skipped: dict[str, int] = {}
        records = _read_telemetry(node, skipped)
        if any(r["type"] == "start" for r in records):
            lead, read = node, (records, skipped)
            break
    _LEADS[run_dir] = (state, lead)
    return lead, read


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def summarize(run_dir: Path, records_out: list[dict[str, Any]] | None = None,
              info_out: dict[str, Any] | None = None) -> RunSummary:
    """What the run did; `records_out` and `info_out`, when given, receive the screened telemetry records and
    the run.json (its unusable launches left out) the summary was made from: report --html draws them without
    reading and screening the files again."""
    with gc_paused():
        return _summarize(Path(run_dir), records_out, info_out)


def _summarize(run_dir: Path, records_out: list[dict[str, Any]] | None,
               info_out: dict[str, Any] | None) -> RunSummary:
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    run_dir, read = _lead_node(run_dir)
    info = load_run_info(run_dir)
    if read is None:
        unreadable: dict[str, int] = {}
        raw = _read_telemetry(run_dir, unreadable)
    else:
        raw, unreadable = read
    if not info and not raw:
        raise UsageError(f"{run_dir} is not a trainready run directory (no run.json, no {FILE})")
    records = raw  # decoded as read: malformed records (wrong types, negative or huge times) left out, counted
    if records_out is not None:
        records_out.extend(records)
    all_launches = info.get("launches", []) if isinstance(info.get("launches", []), list) else []
    info = {**info, "launches": decode_launches(all_launches)}
    if info_out is not None:
        info_out.update(info)
    steps = [r for r in records if r["type"] == "step"]
    starts = [r for r in records if r["type"] == "start"]
    stop = next((r for r in reversed(records) if r["type"] == "stop"), None)
    launches = info.get("launches", [])
    last_launch = launches[-1] if launches else {}  # decoded: a field of the wrong type is unknown (None)
    steady = _steady(steps, records)
    saved, archived = _checkpoints(records)
    status = _status(last_launch, records)
    return RunSummary(
        run_dir=str(run_dir), status=status, exit_code=last_launch.get("exit_code"),
        message=_redacted(last_launch.get("message") or (stop or {}).get("message") or _vanished(last_launch, status)),
        command=redact_argv(info.get("command", [])),  # a run.json of an older version may hold it verbatim
        launches=len(launches) or len({r.get("run_id") for r in starts} - {None}) or 0,
        worker_restarts=sum(1 for r in starts if r.get("restart_count", 0) > 0),
        world_size=starts[-1].get("world_size") if starts else None,
        first_step=steps[0]["step"] if steps else None, last_step=steps[-1]["step"] if steps else None,
        total_steps=starts[-1].get("total_steps") if starts else None, steps_logged=len(steps),
        tokens=sum(r.get("tokens") or 0 for r in steps), wall_s=_wall(launches, records),
        step_s_median=_median(steady, "interval_s"), tokens_per_s_median=_median(steady, "tokens_per_s"),
        mfu_median=_median(steady, "mfu"), shares=_shares(steady),
        loss_first=_loss(steps[0]) if steps else None, loss_last=_loss(steps[-1]) if steps else None,
        nonfinite_losses=sum(1 for r in steps if "loss" in ((r.get("metrics") or {}).get("nonfinite") or [])),
        checkpoints_saved=sum(1 for r in records if r["type"] == "ckpt"),
        last_checkpoint=saved, last_archived=archived,
        archive=_redacted(starts[-1].get("archive")) if starts else None,
        ckpt_interval=next((r.get("message") for r in reversed(records) if r["type"] == "ckpt_interval"), None),
        eta_s=steps[-1].get("eta_s") if steps else None, cost=_cost(starts, steps, stop, launches, records),
        warnings=[r["message"] for r in records if r["type"] == "budget" and r.get("message")],
        stop=redact_json({k: v for k, v in stop.items() if k not in ("schema_version", "type", "source")}) if stop else None,
        goodput=_goodput(all_launches, records, status, info.get("config"), unreadable),
    )


def _goodput(launches: list[Any], records: list[dict[str, Any]], status: str, config: Any,
             skipped: dict[str, int]) -> GoodputReport | None:
    """Goodput from the screened records; `skipped`: what reading and screening left out."""
    config = config if isinstance(config, dict) else {}
    price, nnodes = config.get("usd_per_hour"), config.get("nnodes")
    report = compute_goodput(launches or launches_from_telemetry(records), records, running=status == "running",
                             usd_per_hour=price if isinstance(price, (int, float)) and price > 0 else None,
                             nnodes=nnodes if isinstance(nnodes, int) and nnodes > 0 else None, skipped=skipped,
                             screened=True)
    return report if report.billed_s > 0 or report.steps_kept else None


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact(text)


def _launcher_alive(launch: dict[str, Any]) -> bool:
    from .watchdog import process_start_ticks

    pid = launch.get("pid")
    now = process_start_ticks(pid) if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None
    ticks = launch.get("pid_start_ticks")
    # alive and shown to be that launcher: the same pid started at the same tick. Where start ticks can be read
    # (Linux) our launcher records them, so a launch without them is not shown to be ours (pid 1 in a crafted
    # run.json would keep `report --html --live` going for ever)
    return now is not None and ticks is not None and now == ticks


def _vanished(launch: dict[str, Any], status: str) -> str | None:
    """Why a launch that recorded no end ended, where the machine can tell: the launcher records every ending it
    can see (exit, exception, SIGTERM/SIGINT/SIGHUP), so one gone without a word on the same boot was killed with
    SIGKILL (signal 9), the one signal it cannot catch; across a reboot, the machine went down."""
    if status == "interrupted":
        return "the machine restarted during this launch (its boot id changed): the launcher could not record its end"
    if status != "killed":
        return None
    # who sent it is not said here: the OOM count read now may have risen for another process since
    return ("the launcher ended without recording its end: killed by a signal it cannot record (SIGKILL, signal 9, "
            "is the usual one; SIGUSR1, SIGQUIT or a crash end it the same way); committed checkpoints are intact "
            "and the next run resumes from the newest")


def _status(launch: dict[str, Any], records: list[dict[str, Any]]) -> str:
    if launch and launch.get("exit_code") is None and launch.get("end_unix") is None:
        if _launcher_alive(launch):
            return "running"
        return vanished_as(launch) or "unknown"
    code = launch.get("exit_code")
    reason = launch.get("reason")
    if reason:
        return {"finished": "finished", "budget": "stopped", "max_steps": "stopped", "signal": "interrupted",
                "failed": "failed"}.get(reason, "unknown")
    if code == 0:
        return "finished"
    if records and records[-1]["type"] == "end":
        return "finished"
    return "unknown" if code is None else "failed"


def _steady(steps: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step records after each (re)start's warm-up."""
    out, since_start = [], 0
    for r in records:
        if r["type"] in ("start", "restore"):
            since_start = 0 if r["type"] == "start" else since_start
        elif r["type"] == "step":
            since_start += 1
            if since_start > WARMUP_STEPS:
                out.append(r)
    return out or steps


def _median(steps: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in steps if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


SPLIT_PARTS = ("data", "comm", "optimizer")
_NUMBER_TYPES = {int, float}  # what isinstance(v, (int, float)) accepts, bar subclasses (bool): checked one by one


def has_split(record: dict[str, Any]) -> bool:
    """A step record with a step split (CUDA events: not the first step of a launch, read a step later)."""
    return "split_step" not in record or record["split_step"] is not None


_SPLIT_KEYS = tuple(f"{k}_s" for k in (*SPLIT_PARTS, "compute", "unattributed"))


def split_total(record: dict[str, Any]) -> float:
    """The time a step record's split covers: its parts, compute or the unattributed rest."""
    return sum(v for k in _SPLIT_KEYS if isinstance(v := record.get(k), (int, float)))


def _shares(steps: list[dict[str, Any]]) -> TimeShares | None:
    steps = [r for r in steps if "split_step" not in r or r["split_step"] is not None]  # has_split, inlined
    total = sum(r.get("interval_s") or 0 for r in steps)
    if total <= 0:
        return None
    columns = {k: [r.get(f"{k}_s") for r in steps] for k in SPLIT_PARTS}
    unknown = {k for k, col in columns.items() if not set(map(type, col)) <= _NUMBER_TYPES
               and not all(isinstance(v, (int, float)) for v in col)}  # the set test decides the common case
    parts: dict[str, float | None] = {k: None if k in unknown else sum(columns[k]) / total for k in SPLIT_PARTS}
    rest = sum(map(split_total, steps)) / total - sum(v for v in parts.values() if v is not None)
    parts["compute"], unattributed = (None, max(0.0, rest)) if unknown else (max(0.0, rest), None)
    other = max(0.0, 1.0 - sum(v for v in parts.values() if v is not None) - (unattributed or 0.0))
    sources = sorted({r.get("timing") or "host" for r in steps})
    return TimeShares(**{k: None if v is None else round(v, 4) for k, v in parts.items()}, other=round(other, 4),
                      unattributed=None if unattributed is None else round(unattributed, 4), timing="+".join(sources))


def _loss(record: dict[str, Any]) -> float | None:
    return finite((record.get("metrics") or {}).get("loss"))


def billed_seconds(launches: list[dict[str, Any]], records: list[dict[str, Any]]) -> float:
    """Wall time of every launch; one that crashed has no end: its last telemetry record before the next launch."""
    total = 0.0
    for i, launch in enumerate(launches):
        start = launch.get("start_unix") or 0
        before = launches[i + 1].get("start_unix") if i + 1 < len(launches) else float("inf")
        end = launch.get("end_unix") or max((r["t"] for r in records if start <= r["t"] < before), default=start)
        total += max(0.0, end - start)
    return total


def launches_from_telemetry(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """run.json's launches rebuilt from the launcher's `launch` and `exit` telemetry records, for a
    run.json that was lost or torn. A launch starts at its `launch` record (a second or so after
    the launcher started) and ends at its `exit` record; one without (the launcher was killed)
    ends, for billed_seconds, at its last record."""
    launches: list[dict[str, Any]] = []
    for r in records:
        if r.get("type") == "launch":
            launches.append({"start_unix": r["t"], "end_unix": None, "exit_code": None, "reason": None, "pid": None,
                             "node_rank": r.get("node_rank", 0), "prior_billed_s": r.get("prior_billed_s") or 0.0,
                             "recovered_from": FILE})
        elif r.get("type") == "exit" and launches and launches[-1]["end_unix"] is None:
            launches[-1].update(end_unix=r["t"], exit_code=r.get("exit_code"), reason=r.get("reason"),
                                message=r.get("message"))
    return launches


def _wall(launches: list[dict[str, Any]], records: list[dict[str, Any]]) -> float | None:
    return round(billed_seconds(launches, records), 3) if launches else None


def _checkpoints(records: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """The newest committed and the newest archived checkpoint. A step record holds the status while
    training (a save or upload may still be running); the `end` record, written after the last save
    and its upload finished, holds the final truth: the newest record wins."""
    saved = archived = None
    for r in records:
        kind = r["type"]
        if kind == "step":
            ckpt = r.get("ckpt") or {}
            saved, archived = ckpt.get("last_saved", saved), ckpt.get("archived", archived)
        elif kind == "stop" and r.get("checkpoint") is not None:
            saved = r["checkpoint"]
        elif kind == "end":
            saved = r.get("last_saved", saved)
            archived = r["archived"] if "archived" in r else archived
    return saved, archived


def _cost(starts: list[dict[str, Any]], steps: list[dict[str, Any]], stop: dict[str, Any] | None,
          launches: list[dict[str, Any]], records: list[dict[str, Any]]) -> CostSummary:
    latest = starts[-1] if starts else {}
    spent = steps[-1].get("cost_usd") if steps else None
    if stop and stop.get("cost_usd") is not None:
        spent = max(spent or 0.0, stop["cost_usd"])
    price, nnodes = latest.get("usd_per_hour"), latest.get("nnodes") or 1
    if price is not None and launches:  # the billed wall time of every launch: start-up and shutdown included
        spent = max(spent or 0.0, usd_per_second(price, nnodes) * billed_seconds(launches, records))
    return CostSummary(spent_usd=_r4(spent), projected_usd=steps[-1].get("projected_usd") if steps else None,
                       budget_usd=latest.get("budget_usd"), usd_per_hour=price, nnodes=nnodes)


def _r4(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
