"""Human output of `trainready check`: one table grouped by area (the area with the worst finding
first, failures first within it), one summary line."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainready.check.findings import SEVERITY, CheckReport
from trainready.cli.console import styled

STYLE = {"fail": "bold red", "warn": "yellow", "pass": "green", "skip": "dim"}


def render_check(console: Console, report: CheckReport) -> None:
    title = f"trainready check: {report.instance_type or 'instance type unknown'} ({report.source})"
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    for column in ("status", "check", "observed", "why / fix"):
        table.add_column(column, overflow="fold")
    by_area: dict[str, list] = {}
    for finding in report.checks:  # already failures first
        by_area.setdefault(finding.area, []).append(finding)
    for n, (_area, findings) in enumerate(sorted(by_area.items(), key=lambda kv: (SEVERITY[kv[1][0].status], kv[0]))):
        if n:
            table.add_section()
        for finding in findings:
            detail = finding.reason + (f"\n-> {finding.advice}" if finding.advice and finding.status != "pass" else "")
            table.add_row(styled(finding.status, STYLE[finding.status]), finding.id, finding.observed, detail)
    console.print(table)
    s = report.summary
    console.print(f"{s['fail']} fail, {s['warn']} warn, {s['pass']} pass, {s['skip']} skip"
                  + ("  -> not ready: fix the failures first" if s["fail"] else ""))
