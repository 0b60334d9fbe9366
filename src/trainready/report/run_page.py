"""`trainready report RUN_DIR --html FILE`: the run as one self-contained page.

Sections, each a chart or a line saying why it is not there: loss over steps; tokens/s and MFU
over time with the plan's prediction (recorded by `run --job` in run.json's config) as a line;
the stacked step-time breakdown; per-rank step time as a heatmap; checkpoint stalls; goodput and
badput as a waterfall in dollars (hours without a price); the launch history. The data comes from
the run summary (run/summary.py, with its goodput model) and telemetry.jsonl; nothing is computed
here that the text report does not also say, except the reductions a chart needs (bins).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainready.io import redact
from trainready.run.records import finite

from .page import Page
from .svg import require_matplotlib

REFRESH_S = 15  # --live: the page reloads itself this often while the run is going


def run_page(run_dir: Path, *, live: bool = False) -> tuple[str, Any]:
    """The page's HTML and the RunSummary it was made from (its status decides whether --live goes on)."""
    from trainready.run.summary import gc_paused

    with gc_paused():  # matplotlib's import, the records, the artists: no collector pass until the page is out
        require_matplotlib()
        return _run_page(run_dir, live)


def _run_page(run_dir: Path, live: bool) -> tuple[str, Any]:
    from trainready.run.summary import summarize

    from . import charts_run as charts

    records: list[dict[str, Any]] = []  # the summary's own, screened: malformed records left out
    info: dict[str, Any] = {}  # its run.json (a multi-node run: the node where global rank 0 ran), bad launches out
    summary = summarize(run_dir, records_out=records, info_out=info)
    goodput = getattr(summary, "goodput", None)  # the goodput model (run/goodput.py) where it is computed
    prediction = _prediction(info)
    page = Page(title=f"trainready run report: {summary.run_dir}", subtitle=_subtitle(summary, live))
    page.key_values(_key_figures(summary, goodput, prediction))
    steps = [r for r in records if r.get("type") == "step"]
    kept = charts.last_per_step(steps)
    _section(page, "loss", "Loss over steps", lambda: charts.loss(kept))
    _section(page, "throughput", "Tokens/s and MFU over time", lambda: charts.throughput(steps, records, prediction))
    _section(page, "breakdown", "Step time breakdown", lambda: charts.breakdown(kept))
    _section(page, "ranks", "Per-rank step time", lambda: charts.rank_heatmap(goodput))
    if goodput is not None and getattr(goodput, "ranks", None):
        page.table(["rank", "steps", "min s", "median s", "max s", "straggler score"],
                   [[r.rank, r.samples, f"{r.step_s_min:.4g}", f"{r.step_s_median:.4g}", f"{r.step_s_max:.4g}",
                     "-" if r.straggler_score is None else f"{r.straggler_score:.2f}"] for r in goodput.ranks],
                   numeric={0, 1, 2, 3, 4, 5})
    _section(page, "checkpoints", "Checkpoint stalls", lambda: charts.ckpt_stalls(records))
    _section(page, "goodput", "Goodput and badput", lambda: charts.waterfall(goodput))
    if goodput is not None:
        for note in goodput.notes:
            page.note(note)
    _section(page, "launches", "Launch history", lambda: charts.launches(info, records, goodput))
    page.table(["#", "started (UTC)", "ended (UTC)", "wall", "outcome", "exit", "message"],
               _launch_rows(info, summary), numeric={0, 3, 5})
    if summary.warnings:
        page.heading("warnings", "Warnings")
        for warning in summary.warnings:
            page.note(warning)
    return page.render(REFRESH_S if live and summary.status == "running" else None), summary


def _section(page: Page, key: str, heading: str, make) -> None:
    """A chart, or the reason it is missing: make() returns (svg, notes) or (None, why)."""
    svg, notes = make()
    if svg is None:
        page.unavailable(key, heading, notes)
    else:
        page.chart(key, heading, svg, notes)


def _prediction(info: dict[str, Any]) -> dict[str, Any] | None:
    """The plan's estimate that `run --job` recorded in run.json (config.prediction), if any."""
    config = info.get("config")
    pred = config.get("prediction") if isinstance(config, dict) else None
    if not isinstance(pred, dict):
        return None
    out: dict[str, Any] = {k: finite(pred.get(k)) for k in ("tokens_per_s", "mfu", "step_s")}
    out["gpus"] = pred.get("gpus") if isinstance(pred.get("gpus"), int) and not isinstance(pred.get("gpus"), bool) else None
    out["source"] = pred["source"] if isinstance(pred.get("source"), str) else "plan estimate"
    return out if any(out[k] is not None for k in ("tokens_per_s", "mfu", "step_s")) else None


def _subtitle(s: Any, live: bool) -> list[str]:
    lines = [f"status: {s.status}" + (f" (exit {s.exit_code})" if s.exit_code is not None else "")
             + (f": {s.message}" if s.message else ""),
             "command: " + (" ".join(s.command) if s.command else "(not recorded)"),
             f"written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
             + (f"; refreshes every {REFRESH_S} s while the run is going" if live and s.status == "running" else "")]
    return lines


def _num(value: float | None, fmt: str = ",.0f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _key_figures(s: Any, goodput: Any, pred: dict[str, Any] | None) -> list[tuple[str, object]]:
    of = f" of {s.total_steps}" if s.total_steps else ""
    rows: list[tuple[str, object]] = [
        ("steps", f"{s.first_step}..{s.last_step}{of}" if s.last_step is not None else f"none yet{of}"),
        ("launches", f"{s.launches} ({s.worker_restarts} worker restart(s))"),
        ("world size", _num(s.world_size, "d")),
        ("tokens/s (median)", _num(s.tokens_per_s_median)
         + (f" (plan predicted {pred['tokens_per_s']:,.0f})" if pred and pred.get("tokens_per_s") else "")),
        ("MFU (median)", _num(None if s.mfu_median is None else 100 * s.mfu_median, ".1f", "%")
         + (f" (plan predicted {100 * pred['mfu']:.1f}%)" if pred and pred.get("mfu") else "")),
        ("step time (median)", _num(s.step_s_median, ".3f", " s")),
        ("loss", f"{_num(s.loss_first, '.4f')} -> {_num(s.loss_last, '.4f')}"),
        ("checkpoints", f"{s.checkpoints_saved} saved, newest {_num(s.last_checkpoint, 'd')}, "
                        + (f"archived up to {_num(s.last_archived, 'd')}" if s.archive else "no archive")),
    ]
    c = s.cost
    if c.usd_per_hour is not None:
        rows.append(("cost", f"${c.spent_usd or 0:,.2f} at ${c.usd_per_hour:g}/h x {c.nnodes} node(s)"
                             + (f", budget ${c.budget_usd:,.2f}" if c.budget_usd else "")))
    else:
        rows.append(("cost", "no price recorded (run --instance or --usd-per-hour)"))
    if goodput is not None and goodput.goodput is not None:
        rows.append(("goodput", f"{100 * goodput.goodput:.1f}% of {goodput.billed_hours:,.2f} billed hours"
                                + (" (upper bound)" if goodput.upper_bound else "")))
    rows.append(("prediction", pred["source"] if pred else "no prediction recorded "
                 "(run with --job job.toml to record the plan's estimate)"))
    return rows


def _utc(unix: float | None) -> str:
    return "-" if unix is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix))


def _launch_rows(info: dict[str, Any], s: Any) -> list[list[object]]:
    from .charts_run import duration

    rows = []
    for i, launch in enumerate(info.get("launches") or []):
        start, end = launch.get("start_unix"), launch.get("end_unix")
        wall = "-" if start is None or end is None else duration(end - start)
        reason = launch.get("reason") if isinstance(launch.get("reason"), str) else None
        outcome = reason or ("running" if i == len(info["launches"]) - 1 and s.status == "running"
                                           else "unknown" if end is None else "-")
        message = launch.get("message")
        rows.append([i, _utc(start), _utc(end), wall, outcome, "-" if launch.get("exit_code") is None
                     else launch["exit_code"], redact(message) if isinstance(message, str) else ""])
    return rows


def write_run_page(run_dir: Path, out: Path, *, live: bool = False) -> Any:
    """Render and replace `out` atomically (a browser reloading it never reads half a page)."""
    from trainready.io import replace_durable

    text, summary = run_page(run_dir, live=live)
    replace_durable(out, text.encode())
    return summary

