"""Goodput of a run directory across all its launches: the share of billed time that produced
steps kept in the final lineage, and where the rest went, in hours and dollars. Pure: records
(telemetry.jsonl) and launches (run.json) in, a GoodputReport (goodput_model.py) out.

Every launch's wall time [start, end] is cut at the telemetry records' times, so each second
lands in one bucket and the buckets add up to billed time:
* start-up: launch start (or a crashed attempt's last record) to the restore, or to the first
  step's start when the script does not restore; restore: the restore record's duration_s;
* each step execution: rank 0's span from the previous step's end to its own end. Executions
  outside the final lineage are lost progress, whole. For a kept one: checkpoint stalls recorded
  inside it, data wait (mean over ranks), the wait for the slowest rank (straggler_s), time
  outside `with sess.step()` (other), and the rest is productive (goodput);
* after a launch's last step: the final save's stall, then shutdown (torchrun, the launcher, or
  a crash until the launcher noticed).
Lineage: an attempt that restores step s (or, without a restore record, starts at step s+1)
makes every earlier execution of a step after s lost: it is recomputed. A final attempt that
ended without an `end` or `stop` record (killed, crashed) and is not running loses the steps
after its newest committed checkpoint. A split read a step late (CUDA events) is matched to its
step by `split_step`.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .budget import usd_per_second
from .goodput_model import BadputCause, GoodputReport, LaunchGoodput, RankStats, RankWindow
from .kill_cause import vanished_as
from .record_decoder import decode_launches, decode_records

WINDOWS = 60
SLOW_SCORE = 1.05  # a rank 5% slower than the typical one is named

CAUSES: dict[str, tuple[str, str]] = {
    "startup": ("start-up", "launch (or a crashed attempt's last record) to the restore or the first step's start: "
                            "process start, torch import, rendezvous, model build"),
    "restore": ("restore", "finding, loading and verifying the checkpoint (the restore record's duration_s)"),
    "data_wait": ("data wait", "kept steps waiting for their batch (t.data(), mean over ranks)"),
    "ckpt_stall": ("checkpoint stall", "training blocked by saves (ckpt records' stall_s, rank 0), final saves "
                                       "included"),
    "lost_progress": ("lost progress", "step executions outside the final lineage: recomputed after a crash or "
                                       "preemption, or never saved; their whole span"),
    "straggler_wait": ("slowest rank", "kept steps waiting for the slowest rank: its work minus the typical "
                                       "rank's (straggler_s)"),
    "shutdown": ("shutdown", "a launch's last step (and final save) to its end: workers and torchrun exiting, or a "
                             "crash until the launcher noticed"),
    "other": ("other", "rank 0's time outside `with sess.step()` in kept steps (logging, evaluation, the per-step "
                       "exchange) and anything not matched to a record"),
    "idle_between_launches": ("idle between launches", "from a launch's recorded end to the next launch's start: no "
                                                       "launcher ran, not billed by the budget (what it costs if the "
                                                       "nodes were kept)"),
}


def screen(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Telemetry records decoded by the one decoder (record_decoder: the documented models' types and bounds),
    malformed ones left out, and how many were left out or made unknown, by reason. The summary and goodput read
    only screened records."""
    skipped: Counter = Counter()
    return decode_records(records, skipped), dict(skipped)


# ---- the timeline ---------------------------------------------------------------------------------


@dataclass
class _Exec:
    """One execution of a step (a step record) and the span of rank 0's time it stands for."""

    launch: int
    attempt: int
    step: int
    span: float
    stall: float
    record: dict[str, Any]
    split: dict[str, Any] | None = None
    world: int | None = None
    lost: bool = False


@dataclass
class _Launch:
    index: int
    start: float
    end: float
    end_known: bool
    reason: str | None
    records: list[dict[str, Any]]
    buckets: Counter = field(default_factory=Counter)
    attempts: int = 0
    restored: int | None = None
    restore_seen: bool = False
    clean_end: bool = False
    committed: int | None = None
    gone: str | None = None  # no end recorded: "killed" (same boot: SIGKILL) or "interrupted" (a reboot), else unknown


def _launch_windows(launches: list[dict[str, Any]], records: list[dict[str, Any]],
                    skipped: Counter) -> tuple[list[_Launch], str]:
    valid = decode_launches(launches, skipped)
    good = [(float(la["start_unix"]), None if la.get("end_unix") is None else float(la["end_unix"]),
             la.get("reason") if isinstance(la.get("reason"), str) else None,
             _gone(la, valid[i + 1] if i + 1 < len(valid) else None))
            for i, la in enumerate(valid)]
    source = "run.json" if good and not any(isinstance(la, dict) and la.get("recovered_from") for la in launches) \
        else "telemetry"
    if not good and records:  # a script run without the launcher: its records are all we have
        ts = [r["t"] for r in records]
        good = [(min(ts), max(ts), None, None)]
    good.sort(key=lambda g: g[0])
    out = []
    for i, (start, end, reason, gone) in enumerate(good):
        before = good[i + 1][0] if i + 1 < len(good) else math.inf
        mine = [r for r in records if start <= r["t"] < before]
        stop = end if end is not None else max((r["t"] for r in mine), default=start)
        out.append(_Launch(i, start, max(start, stop), end is not None, reason, mine, gone=gone))
    first = good[0][0] if good else math.inf
    early = sum(1 for r in records if r["t"] < first)
    if early:
        skipped["record before the first launch"] += early
    return out, source


_SPLIT = ("data_s", "comm_s", "optimizer_s", "compute_s", "unattributed_s", "straggler_s")


def _split_of(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in (*_SPLIT, "rank_step_s", "rank_comm_s", "unmeasured")}


def _walk(launch: _Launch, execs: list[_Exec], kept: dict[int, _Exec], skipped: Counter) -> None:
    """Cut one launch's wall time at its records; step executions go to `execs` (bucketed later,
    once the lineage is known), the rest into launch.buckets. Updates the lineage `kept`."""
    end = launch.end
    cursor = launch.start
    pending_stall = 0.0
    trained = False
    attempt_no = -1
    world: int | None = None
    by_step: dict[int, _Exec] = {}
    steps_started = False
    restored_seen = False

    def to(t: float) -> float:
        return min(max(t, cursor), end)

    def gap_to(t: float, bucket: str) -> None:
        """[cursor, t] into `bucket`, less the saves recorded in it (a final save before a restart)."""
        nonlocal cursor, pending_stall
        t = to(t)
        stall = min(pending_stall, t - cursor)
        launch.buckets["ckpt_stall"] += stall
        launch.buckets[bucket] += t - cursor - stall
        cursor, pending_stall = t, 0.0

    def supersede(after: int) -> None:
        for step in [s for s in kept if s > after]:
            kept.pop(step).lost = True

    for r in launch.records:
        kind = r["type"]
        if kind == "start":
            attempt_no += 1
            launch.attempts += 1
            world = r.get("world_size") or world
            by_step = {}
            steps_started = restored_seen = False
            launch.clean_end = False
        elif attempt_no < 0:
            continue  # the launcher's own records before the workers start (launch, budget)
        elif kind == "restore" and not restored_seen:
            restored_seen = True
            gap_to(r["t"] - (r.get("duration_s") or 0.0), "startup")
            gap_to(r["t"], "restore")
            if not launch.restore_seen:
                launch.restore_seen = True
                launch.restored = r.get("step")
            supersede(-1 if r.get("step") is None else r["step"])
            trained = True
        elif kind == "step":
            if r["t"] < cursor - 1e-3:
                skipped["step: out of time order"] += 1
                continue
            if not steps_started:
                steps_started = True
                if not restored_seen:  # no restore: the first interval runs from the session's start
                    gap_to(r["t"] - r["interval_s"], "startup")
                    supersede(r["step"] - 1)
            done = to(r["t"])
            span = done - cursor
            ex = _Exec(launch.index, attempt_no, r["step"], span, min(pending_stall, span), r, world=world)
            pending_stall = 0.0
            cursor = done
            trained = True
            if r["step"] in kept:
                kept.pop(r["step"]).lost = True
            kept[r["step"]] = ex
            execs.append(ex)
            by_step[r["step"]] = ex
            of = r.get("split_step", r["step"])
            if of is not None and of in by_step:
                by_step[of].split = _split_of(r)
            saved = (r.get("ckpt") or {}).get("last_saved")
            if isinstance(saved, int) and not isinstance(saved, bool):
                launch.committed = saved
        elif kind == "ckpt":
            pending_stall += r["stall_s"]
        elif kind in ("end", "stop"):
            launch.clean_end = True
            saved = r.get("last_saved") if kind == "end" else r.get("checkpoint")
            if isinstance(saved, int):
                launch.committed = saved
    tail = end - cursor
    stall = min(pending_stall, tail)
    launch.buckets["ckpt_stall"] += stall
    launch.buckets["shutdown" if trained else "startup"] += tail - stall


def _bucket(ex: _Exec, launch: _Launch, unmeasured: Counter) -> None:
    b = launch.buckets
    if ex.lost:
        b["lost_progress"] += ex.span
        return
    b["ckpt_stall"] += ex.stall
    inside = ex.span - ex.stall
    split = ex.split
    total = None
    if split is not None:
        parts = [split.get(k) for k in ("data_s", "comm_s", "optimizer_s", "compute_s", "unattributed_s")]
        if any(p is not None for p in parts):
            total = sum(p for p in parts if p is not None)
    if total is None:  # no split for this execution: the whole span counts as the step
        unmeasured["data_wait"] += 1
        unmeasured["straggler_wait"] += 1
        b["productive"] += inside
        return
    step = min(total, inside)
    b["other"] += inside - step
    data = split.get("data_s")
    if data is None:
        unmeasured["data_wait"] += 1
        data = 0.0
    data = min(data, step)
    straggler = split.get("straggler_s")
    if straggler is None and ex.world == 1:
        straggler = 0.0
    if straggler is None:
        unmeasured["straggler_wait"] += 1
        straggler = 0.0
    straggler = min(straggler, step - data)
    b["data_wait"] += data
    b["straggler_wait"] += straggler
    b["productive"] += step - data - straggler


def _final_lineage(launches: list[_Launch], kept: dict[int, _Exec], running: bool) -> None:
    """The last attempt of the last launch ended without saying so (killed, crashed) and nothing
    runs now: the steps after its newest committed checkpoint are in no checkpoint."""
    if not launches or running:
        return
    last = launches[-1]
    if last.clean_end or last.reason in ("finished", "budget", "signal", "max_steps"):
        return
    committed = -1 if last.committed is None else last.committed
    for step in [s for s, ex in kept.items() if s > committed and ex.launch == last.index]:
        kept.pop(step).lost = True


# ---- ranks ----------------------------------------------------------------------------------------


def _rank_samples(execs: list[_Exec], world: int | None, skipped: Counter
                  ) -> list[tuple[int, list[float | None], list[float | None]]]:
    """(step, every rank's step time, every rank's exposed comm) of the executions whose split has them; the
    decoder has checked every value (a time or None), so only a list of the wrong length is skipped, counted."""
    samples: list[tuple[int, list[float | None], list[float | None]]] = []
    for ex in execs:
        split = ex.split
        steps = split.get("rank_step_s") if split else None
        if steps is None:
            continue
        n = ex.world or world
        if n is None or len(steps) != n:
            skipped["rank_step_s: length is not the world size"] += 1
            continue
        comms = split.get("rank_comm_s")
        samples.append((ex.step, steps, comms if comms is not None and len(comms) == n else [None] * n))
    return samples


def _rank_view(execs: list[_Exec], world: int | None, skipped: Counter) -> tuple[list[RankStats], list[int],
                                                                                 list[RankWindow]]:
    samples = _rank_samples(execs, world, skipped)
    if not samples:
        return [], [], []
    n = max(len(s) for _, s, _ in samples)
    # One column per rank (a launch with fewer ranks: None for the others); the work is step time less
    # exposed comm, known when every step time has its comm.
    step_cols = list(zip(*(s if len(s) == n else s + [None] * (n - len(s)) for _, s, _ in samples), strict=True))
    comm_cols = list(zip(*(c if len(c) == n else c + [None] * (n - len(c)) for _, _, c in samples), strict=True))
    work_known = all(None not in cc or all(st is None or cm is not None for st, cm in zip(sc, cc, strict=True))
                     for sc, cc in zip(step_cols, comm_cols, strict=True))
    basis_cols = [tuple(map(operator.sub, sc, cc)) if None not in sc else
                  tuple(None if st is None else st - cm for st, cm in zip(sc, cc, strict=True))
                  for sc, cc in zip(step_cols, comm_cols, strict=True)] if work_known else step_cols
    slowest: Counter = Counter()
    for row in zip(*basis_cols, strict=True):
        if None not in row:
            if n > 1:
                slowest[n - 1 - row[::-1].index(max(row))] += 1  # a tie: the highest rank, as max((w, r)) picks
        else:
            known = [(w, r) for r, w in enumerate(row) if w is not None]
            if len(known) > 1:
                slowest[max(known)[1]] += 1
    per_step = [_known(col) for col in step_cols]
    per_work = [_known(col) for col in basis_cols] if work_known else [[] for _ in range(n)]
    basis_of = per_work if work_known else per_step
    medians = {r: statistics.median(v) for r, v in enumerate(basis_of) if v}
    typical = statistics.median(medians.values()) if medians else None
    stats = []
    for r in range(n):
        if not per_step[r]:
            continue
        score = medians[r] / typical if typical and r in medians else None
        stats.append(RankStats(rank=r, samples=len(per_step[r]), step_s_min=_r(min(per_step[r])),
                               step_s_median=_r(statistics.median(per_step[r])), step_s_max=_r(max(per_step[r])),
                               work_s_median=_r(statistics.median(per_work[r])) if per_work[r] else None,
                               straggler_score=None if score is None else round(score, 4),
                               slowest_steps=slowest[r]))
    ranked = sorted((s for s in stats if s.straggler_score is not None and s.straggler_score >= SLOW_SCORE),
                    key=lambda s: -s.straggler_score)
    return stats, [s.rank for s in ranked[:3]], _windows([step for step, _, _ in samples], step_cols,
                                                         basis_cols if work_known else None)


def _known(values: tuple[float | None, ...]) -> list[float]:
    return list(values) if None not in values else [v for v in values if v is not None]


def _windows(steps: list[int], step_cols: list[tuple[float | None, ...]],
             work_cols: list[tuple[float | None, ...]] | None) -> list[RankWindow]:
    """Per-rank medians over at most WINDOWS runs of consecutive samples; `work_cols`: None when the
    work (step time less exposed comm) is not known for every sample."""

    def med(values: tuple[float | None, ...]) -> float | None:
        known = _known(values)
        return _r(statistics.median(known)) if known else None

    size = max(1, math.ceil(len(steps) / WINDOWS))
    n = len(step_cols)
    return [RankWindow(first_step=steps[i], last_step=steps[min(i + size, len(steps)) - 1],
                       step_s=[med(col[i:i + size]) for col in step_cols],
                       work_s=[med(col[i:i + size]) for col in work_cols] if work_cols is not None else [None] * n)
            for i in range(0, len(steps), size)]


# ---- the report -----------------------------------------------------------------------------------


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _idle(launches: list[_Launch]) -> tuple[float | None, int]:
    """Known gaps between launches (a launch whose end was recorded), and how many are unknown."""
    known, unknown = [], 0
    for a, b in zip(launches, launches[1:], strict=False):
        if a.end_known:
            known.append(max(0.0, b.start - a.end))
        else:
            unknown += 1
    if unknown and not known:
        return None, unknown
    return sum(known), unknown


def _outcome(launch: _Launch, is_last: bool, running: bool) -> str:
    if is_last and running:
        return "running"
    mapped = {"finished": "finished", "budget": "stopped", "max_steps": "stopped", "signal": "interrupted",
              "failed": "failed"}.get(launch.reason or "")
    if mapped:
        return mapped
    if launch.clean_end and launch.end_known:
        return "finished"
    return launch.gone if not launch.end_known and launch.gone else "unknown"


def _gone(la: dict[str, Any], later: dict[str, Any] | None) -> str | None:
    """How a launch that recorded no end ended, where its boot id tells, against the next launch's when there is one
    (summary._vanished says why)."""
    if la.get("end_unix") is not None or la.get("reason") is not None:
        return None
    return vanished_as(la, later)


def compute_goodput(launches: list[dict[str, Any]], records: list[dict[str, Any]], *, running: bool = False,
                    usd_per_hour: float | None = None, nnodes: int | None = None,
                    skipped: dict[str, int] | None = None, screened: bool = False) -> GoodputReport:
    """The goodput report of a run from its run.json launches and its telemetry records (raw:
    they are screened here). `running`: the last launch is still going (its steps are kept).
    `usd_per_hour` (per node) and `nnodes`: used when no start record gives them. `skipped`:
    counts from reading the file (unreadable lines), reported with the screen's. `screened`: the
    records already went through screen() and `skipped` holds its counts."""
    records, skipped_d = (records, {}) if screened else screen(records)
    skipped_all: Counter = Counter(skipped or {})
    skipped_all.update(skipped_d)
    skipped = skipped_all
    windows, source = _launch_windows(launches if isinstance(launches, list) else [], records, skipped)
    execs: list[_Exec] = []
    kept: dict[int, _Exec] = {}
    for launch in windows:
        _walk(launch, execs, kept, skipped)
    _final_lineage(windows, kept, running)
    unmeasured: Counter = Counter()
    for ex in execs:
        _bucket(ex, windows[ex.launch], unmeasured)
    starts = [r for r in records if r["type"] == "start"]
    price = next((r["usd_per_hour"] for r in reversed(starts) if r.get("usd_per_hour")), None) or usd_per_hour
    nodes = next((r["nnodes"] for r in reversed(starts) if r.get("nnodes")), None) or nnodes or 1
    world = next((r["world_size"] for r in reversed(starts) if r.get("world_size")), None)
    usd_per_s = usd_per_second(price, nodes)
    billed = sum(la.end - la.start for la in windows)
    total: Counter = Counter()
    for la in windows:
        total.update(la.buckets)
    productive = total.pop("productive", 0.0)
    named = sum(v for k, v in total.items() if k != "other")
    total["other"] = max(0.0, billed - productive - named)  # what no record explains; exact sum by construction
    idle, idle_unknown = _idle(windows)

    def usd(seconds: float | None) -> float | None:
        return None if usd_per_s is None or seconds is None else round(seconds * usd_per_s, 4)

    causes = []
    for cause, (label, description) in CAUSES.items():
        in_billed = cause != "idle_between_launches"
        seconds = total.get(cause, 0.0) if in_billed else idle
        if cause in ("data_wait", "straggler_wait") and unmeasured[cause] and not total.get(cause):
            seconds = None  # not one kept step measured it: unknown, not zero
        if cause == "idle_between_launches" and idle_unknown:
            description += f" ({idle_unknown} gap(s) after a launch whose end was not recorded: not counted)"
        causes.append(BadputCause(
            cause=cause, label=label, description=description, seconds=_r(seconds, 3),
            hours=_r(None if seconds is None else seconds / 3600.0), usd=usd(seconds),
            share=_r(seconds / billed, 4) if in_billed and seconds is not None and billed > 0 else None,
            in_billed=in_billed, unmeasured_steps=unmeasured[cause]))
    ranks, slow, rank_windows = _rank_view(execs, world, skipped)
    last = len(windows) - 1
    per_launch = []
    for la in windows:
        mine = [ex for ex in execs if ex.launch == la.index]
        buckets = {k: round(v, 3) for k, v in la.buckets.items() if k != "productive" and v > 0}
        per_launch.append(LaunchGoodput(
            index=la.index, start_unix=la.start, end_unix=la.end, billed_s=round(la.end - la.start, 3),
            outcome=_outcome(la, la.index == last, running), attempts=la.attempts, restored_step=la.restored,
            first_step=mine[0].step if mine else None, last_step=mine[-1].step if mine else None,
            steps_run=len(mine), steps_lost=sum(ex.lost for ex in mine),
            productive_s=round(la.buckets.get("productive", 0.0), 3), causes_s=buckets))
    notes = []
    if price is None:
        notes.append("no price recorded (--instance or --usd-per-hour): dollars unknown")
    if any(unmeasured.values()):
        notes.append(f"{max(unmeasured.values())} kept step(s) without a measured data wait or wait for the slowest "
                     "rank: their time counts as productive, so goodput is an upper bound")
    if ranks and any(s.work_s_median is None for s in ranks):
        notes.append("exposed communication not measured: straggler scores compare step times, which collective "
                     "operations make nearly equal; call sess.watch(ddp_model) to separate work from waiting")
    sources = Counter(ex.record.get("timing") or "host" for ex in execs)
    return GoodputReport(
        billed_s=round(billed, 3), billed_hours=round(billed / 3600.0, 6), billed_source=source, usd_per_hour=price,
        nnodes=nodes, billed_usd=usd(billed), productive_s=round(productive, 3), productive_usd=usd(productive),
        goodput=round(productive / billed, 4) if billed > 0 else None, upper_bound=any(unmeasured.values()),
        causes=causes, steps_kept=sum(not ex.lost for ex in execs), steps_lost=sum(ex.lost for ex in execs),
        launches=per_launch, world_size=world, ranks=ranks, slowest_ranks=slow, rank_windows=rank_windows,
        timing_sources=dict(sources), skipped=dict(skipped), notes=notes)
