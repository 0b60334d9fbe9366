"""Human output of `trainready check`: one table grouped by area (the area with the worst finding
first, failures first within it), one summary line. Status and check ids never wrap; below 120
columns what was observed goes above the reason in one column, so 80 columns stay readable."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainready.check.findings import SEVERITY, CheckReport, Finding
from trainready.cli.console import line, styled

STYLE = {"fail": "bold red", "warn": "yellow", "pass": "green", "skip": "dim"}
WIDE = 120


def _detail(finding: Finding, with_observed: bool) -> Text:
    parts: list[str | Text] = []
    if with_observed and finding.observed:
        parts.append(styled(finding.observed, "bold"))
    if finding.reason:
        parts.append(finding.reason)
    if finding.advice and finding.status != "pass":
        parts.append(line("-> ", finding.advice))
    return Text("\n").join(Text(p) if isinstance(p, str) else p for p in parts)


def render_check(console: Console, report: CheckReport) -> None:
    where = ("this machine" if report.source == "live" else report.source if report.source == "given files"
             else f"bundle {report.source}")
    title = f"trainready check: {report.instance_type or 'instance type unknown'} ({where})"
    wide = console.width >= WIDE
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    if wide:
        table.add_column("observed", overflow="fold", ratio=2)
    table.add_column("why / fix" if wide else "observed / why / fix", overflow="fold", ratio=3)
    by_area: dict[str, list[Finding]] = {}
    for finding in report.checks:  # already failures first
        by_area.setdefault(finding.area, []).append(finding)
    for n, (_area, findings) in enumerate(sorted(by_area.items(), key=lambda kv: (SEVERITY[kv[1][0].status], kv[0]))):
        if n:
            table.add_section()
        for finding in findings:
            cells = [styled(finding.status, STYLE[finding.status]), finding.id]
            cells += [finding.observed, _detail(finding, False)] if wide else [_detail(finding, True)]
            table.add_row(*cells)
    console.print(table)
    s = report.summary
    console.print(line(f"{s['fail']} fail, {s['warn']} warn, {s['pass']} pass, {s['skip']} skip",
                       styled("  -> not ready: fix the failures first", "bold red") if s["fail"] else ""))
    verdict = report.readiness
    if verdict is not None:
        style = {"ready": "bold green", "not-ready": "bold red", "not-verified": "bold yellow"}[verdict.status]
        console.print(line(styled("verdict: ", "bold"), styled(verdict.text, style)))
        for item in verdict.unverified[:8] if verdict.status == "not-verified" else []:
            console.print(line("  not verified: ", item))
