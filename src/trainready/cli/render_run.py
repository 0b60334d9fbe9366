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


def launch_and_render(configured: Any, *, json_out: bool, console: Console, log_to: list[str] | None = None) -> int:
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
        launcher = Launcher(spec, view.print, view.update, started_unix=process_start_unix())
        sink, result = None, None
        if log_to:  # fed what the launcher tails from telemetry.jsonl (run/exporters.py says why there)
            from trainready.run.exporters import ExportSink, outcome_of

            sink = ExportSink(log_to, spec.run_dir, view.print, eager=spec.nnodes == 1)
            view.print(f"trainready: {sink.describe()}")
            launcher.on_records = lambda records: (view.update(records), sink.feed(records))
        try:
            result = launcher.run()
        finally:
            if sink is not None:
                sink.close(outcome_of(result.reason) if result is not None else "failed")
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
        rows.append(("time went to", _shares(s.shares)))
    if getattr(s, "plan_check", None) is not None:  # `report` only: predicted vs measured per part
        rows.append(("vs plan", _plan_check(s.plan_check)))
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
    if not brief and s.goodput is not None:
        render_goodput(console, s.goodput)


def _plan_check(pc: Any) -> str:
    """Each part as measured/predicted, then the finding: "step 1.31x, compute 1.05x, communication 2.3x, ..."."""
    def part(c: Any) -> str:
        if c.ratio is not None:
            return f"{c.part} {c.ratio:.2f}x"
        return f"{c.part} {_num(c.measured_s, 3)} s (not predicted)" if c.measured_s is not None else f"{c.part} -"
    measured = [part(c) for c in pc.parts if c.measured_s is not None]
    return (f"measured/predicted: {', '.join(measured) or 'nothing measured'}; {pc.message} "
            f"(predicted for {pc.configuration}; factors: {pc.factors})")


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def render_goodput(console: Console, g: Any) -> None:
    """Goodput and badput by cause, the launches, and per-rank step times; fits 80 columns."""
    bound = " (at most: some steps did not measure every cause)" if g.upper_bound else ""
    head = (f"goodput {g.goodput:.1%}{bound} of {_dur(g.billed_s)} billed" if g.goodput is not None
            else f"goodput unknown ({_dur(g.billed_s)} billed)")
    if g.billed_usd is not None:
        head += f" ({_usd(g.billed_usd)} at ${g.usd_per_hour:g}/h x {g.nnodes} node(s))"
    console.print(Text(head, style="bold"), soft_wrap=True)
    table = Table(box=None, pad_edge=False)
    for name, justify in (("where billed time went", "left"), ("time", "right"), ("hours", "right"),
                          ("USD", "right"), ("share", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_row("productive (goodput)", _dur(g.productive_s), f"{g.productive_s / 3600:.4f}", _usd(g.productive_usd),
                  f"{g.goodput:.1%}" if g.goodput is not None else "-", style="green")
    for c in g.causes:
        if c.seconds == 0 and not c.unmeasured_steps:
            continue
        name = c.label if c.in_billed else f"({c.label})"
        table.add_row(name, _dur(c.seconds), "-" if c.hours is None else f"{c.hours:.4f}", _usd(c.usd),
                      f"{c.share:.1%}" if c.share is not None else "-")
    console.print(table)
    if any(not c.in_billed and c.seconds for c in g.causes):
        console.print(Text("(idle between launches is not billed by the budget: its cost if the nodes were kept)",
                           style="dim"), soft_wrap=True)
    if len(g.launches) > 1 or g.steps_lost:
        launches = Table(title=Text(f"launches: {g.steps_kept} step(s) kept, {g.steps_lost} lost"),
                         title_justify="left", box=None, pad_edge=False)
        for name in ("#", "outcome", "billed", "restored", "steps", "lost", "productive"):
            launches.add_column(name, justify="left" if name == "outcome" else "right", no_wrap=True)
        for la in g.launches:
            steps = f"{la.first_step}..{la.last_step}" if la.first_step is not None else "-"
            launches.add_row(str(la.index), Text(la.outcome), _dur(la.billed_s),
                             "fresh" if la.restored_step is None else str(la.restored_step), steps,
                             str(la.steps_lost), _dur(la.productive_s))
        console.print(launches)
    _render_ranks(console, g)
    for note in g.notes:
        console.print(Text(f"note: {note}", style="dim"), soft_wrap=True)
    if g.skipped:
        total = sum(g.skipped.values())
        reasons = ", ".join(f"{reason} ({n})" for reason, n in sorted(g.skipped.items(), key=lambda kv: -kv[1])[:4])
        console.print(Text(f"skipped {total} malformed telemetry record(s)/field(s): {reasons}", style="yellow"),
                      soft_wrap=True)


def _render_ranks(console: Console, g: Any) -> None:
    if len(g.ranks) < 2:
        return
    shown = g.ranks if len(g.ranks) <= 8 else sorted(g.ranks, key=lambda r: -(r.straggler_score or 0))[:6]
    slow = f"slowest: rank {', '.join(map(str, g.slowest_ranks))}" if g.slowest_ranks else "no straggler"
    more = f", showing the {len(shown)} slowest of {len(g.ranks)}" if len(shown) < len(g.ranks) else ""
    table = Table(title=Text(f"step time per rank ({slow}{more})"), title_justify="left", box=None, pad_edge=False)
    for name in ("rank", "steps", "min s", "median s", "max s", "work s", "score", "slowest in"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in shown:
        table.add_row(str(r.rank), str(r.samples), f"{r.step_s_min:.3f}", f"{r.step_s_median:.3f}",
                      f"{r.step_s_max:.3f}", "-" if r.work_s_median is None else f"{r.work_s_median:.3f}",
                      "-" if r.straggler_score is None else f"{r.straggler_score:.2f}", str(r.slowest_steps),
                      style="bold red" if r.rank in g.slowest_ranks else None)
    console.print(table)


def _shares(sh: Any) -> str:
    """Measured parts as shares; an unmeasured part is named as such, never shown as 0%."""
    def pct(name: str, value: float | None) -> str | None:
        return f"{name} {value:.0%}" if value is not None else None

    parts = [pct("compute", sh.compute), pct("data wait", sh.data), pct("comm", sh.comm),
             pct("optimizer", sh.optimizer), pct("other", sh.other)]
    text = ", ".join(p for p in parts if p)
    unknown = [name for name, value in (("data wait", sh.data), ("comm", sh.comm), ("optimizer", sh.optimizer))
               if value is None]
    if unknown:
        text += f", compute + unmeasured {' + '.join(unknown)} {sh.unattributed or 0:.0%}"
    return text + (f" ({sh.timing} timing)" if sh.timing else "")


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_scaling(console: Console, report: Any) -> None:
    table = Table(title="scaling (weak: the same batch per process); seconds per step", box=None)
    unknown = any(p.unattributed_s is not None for p in report.points)  # "-" = not measured, never 0
    for col in ("procs", "tok/s", "tok/s/proc", "eff", "step", "data", "comm", "compute", "optim", "other",
                *(("compute+unmeasured",) if unknown else ())):
        table.add_column(col, justify="right", no_wrap=True)  # numbers: never wrapped or cut
    for p in report.points:
        table.add_row(str(p.processes), _num(p.tokens_per_s), _num(p.tokens_per_s_per_process),
                      f"{p.efficiency:.0%}" if p.efficiency is not None else "-", _num(p.step_s, 3), _num(p.data_s, 3),
                      _num(p.comm_s, 3), _num(p.compute_s, 3), _num(p.optimizer_s, 3), _num(p.other_s, 3),
                      *((_num(p.unattributed_s, 3),) if unknown else ()))
    console.print(table)
    for line in report.findings:
        console.print(Text(f"- {line}"), soft_wrap=True)
