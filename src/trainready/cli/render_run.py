"""Human and JSON output of `trainready run` and `trainready report`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainready.io import redact_argv

from .console import emit_json


def _diagnose(files: list[str], job_path: str | None) -> Any:
    """What the failing ranks' logs say (with the job's memory estimate for an OOM)."""
    from pathlib import Path

    from trainready.plan.job import load_job
    from trainready.run.diagnose import diagnose_files

    existing = [f for f in files if Path(f).exists()]
    return diagnose_files(existing, job=load_job(job_path) if job_path else None) if existing else None


def launch_and_render(configured: Any, *, json_out: bool, console: Console) -> int:
    from trainready.run.launcher import Launcher, process_start_unix
    from trainready.run.live import LiveView
    from trainready.run.records import RunOutcome
    spec = configured.spec
    for note in configured.notes:
        console.print(Text(f"trainready: {note}"), soft_wrap=True)
    price = spec.settings.usd_per_hour
    priced = (f"price ${price:g}/h per node ({configured.price_source})" if price is not None else
              "no price (give --instance or --usd-per-hour to see the cost and to set a budget)")
    console.print(Text(f"trainready: run directory {spec.run_dir}; {priced}"), soft_wrap=True)
    title = " ".join(redact_argv(spec.command))[:80]  # redact first: a cut URL could keep half a secret
    view = LiveView(console, title, live=console.is_terminal and not json_out)
    with view:  # the launch is billed from this process's start: its own start-up costs money too
        result = Launcher(spec, view.print, view.update, started_unix=process_start_unix()).run()
    report = _diagnose(result.log_files, spec.config.get("job")) if result.reason == "failed" else None
    summary = result.summary  # set by the launcher as the launch ended (summary.json)
    if json_out:
        emit_json(RunOutcome(exit_code=result.exit_code, reason=result.reason, message=result.message,
                             run_dir=str(spec.run_dir), failed_ranks=result.failed_ranks, log_tail=result.log_tail,
                             log_files=result.log_files,
                             diagnoses=[d.model_dump() for d in report.diagnoses] if report else [],
                             summary=summary.model_dump()))
    else:
        _render_result(console, result, report)
        render_summary(console, summary, brief=True)
    return result.exit_code


def _render_result(console: Console, result: Any, report: Any) -> None:
    style = {"finished": "green", "failed": "bold red", "budget": "yellow", "signal": "yellow"}.get(result.reason, "cyan")
    console.print(Text(f"trainready: {result.message} (exit {result.exit_code})", style=style), soft_wrap=True)
    for path, lines in result.log_tail.items():
        console.print(Text(f"--- last lines of {path}", style="bold"), soft_wrap=True)
        for line in lines:
            console.print(Text(line, style="dim"), soft_wrap=True)
    if report is not None and report.diagnoses:
        from .diagnose_cmd import render_diagnoses

        render_diagnoses(console, report)


def _steps(s: Any) -> str:
    of = f" of {s.total_steps}" if s.total_steps else ""
    done = f"{s.first_step}..{s.last_step}{of}" if s.last_step is not None else f"none yet{of}"
    return f"{done} ({s.steps_logged} logged, {s.launches} launch(es), {s.worker_restarts} worker restart(s))"


def _checkpoints(s: Any) -> str:
    newest = f"newest step {s.last_checkpoint}" if s.last_checkpoint is not None else "none committed"
    if s.last_archived is not None:
        where = f"archived up to step {s.last_archived}"
    else:
        where = "none archived" if s.archive else "no archive"
    return f"{s.checkpoints_saved} saved, {newest}, {where}"


def render_summary(console: Console, s: Any, brief: bool = False) -> None:
    table = Table(title=None if brief else Text(f"run {s.run_dir}"), show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    rows = [
        ("status", f"{s.status}{f' (exit {s.exit_code})' if s.exit_code is not None else ''}"
                   f"{f': {s.message}' if s.message and not brief else ''}"),
        ("steps", _steps(s)),
        ("throughput", f"{_num(s.tokens_per_s_median)} tokens/s, {_num(s.step_s_median, 3)} s/step (median, after warm-up)"),
        ("MFU", f"{100 * s.mfu_median:.1f}%" if s.mfu_median is not None else "n/a (no GPU peak or FLOP model)"),
    ]
    if s.shares is not None:
        sh = s.shares
        rows.append(("time went to", f"compute {sh.compute:.0%}, data wait {sh.data:.0%}, comm {sh.comm:.0%}, "
                                     f"optimizer {sh.optimizer:.0%}, other {sh.other:.0%}"))
    if s.loss_last is not None:
        rows.append(("loss", f"{_num(s.loss_first, 4)} -> {_num(s.loss_last, 4)}"
                             f"{f' ({s.nonfinite_losses} non-finite)' if s.nonfinite_losses else ''}"))
    rows.append(("checkpoints", _checkpoints(s)))
    if s.ckpt_interval:
        rows.append(("interval", s.ckpt_interval))
    c = s.cost
    if c.usd_per_hour is not None:
        rows.append(("cost", f"${c.spent_usd or 0:,.2f} at ${c.usd_per_hour:g}/h x {c.nnodes} node(s)"
                             f"{f', projected ${c.projected_usd:,.2f}' if c.projected_usd is not None else ''}"
                             f"{f', budget ${c.budget_usd:,.2f}' if c.budget_usd else ''}"))
    if not brief:  # after a run they were just shown, as they happened
        for warning in s.warnings:
            rows.append(("warning", warning))
    for key, value in rows:
        table.add_row(key, Text(str(value)))
    console.print(table)


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_scaling(console: Console, report: Any) -> None:
    table = Table(title="scaling (weak: the same batch per process); seconds per step", box=None)
    for col in ("procs", "tok/s", "tok/s/proc", "eff", "step", "data", "comm", "compute", "optim", "other"):
        table.add_column(col, justify="right", no_wrap=True)  # numbers: never wrapped or cut
    for p in report.points:
        table.add_row(str(p.processes), _num(p.tokens_per_s), _num(p.tokens_per_s_per_process),
                      f"{p.efficiency:.0%}" if p.efficiency is not None else "-", _num(p.step_s, 3), _num(p.data_s, 3),
                      _num(p.comm_s, 3), _num(p.compute_s, 3), _num(p.optimizer_s, 3), _num(p.other_s, 3))
    console.print(table)
    for line in report.findings:
        console.print(Text(f"- {line}"), soft_wrap=True)
