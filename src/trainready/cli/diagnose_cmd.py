"""`trainready diagnose LOGFILE...`: explain failures in NCCL, torch, torchrun and training logs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from trainready.errors import UsageError

from . import options as o
from .console import emit_json, err, out

if TYPE_CHECKING:
    from trainready.run.diagnose import DiagnosisReport

CODES = ("Exit codes: 0 no known problem found; 1 at least one problem found (an error or a warning); "
         "2 usage error (a log file missing, unreadable, empty as a path, or a device; a FIFO no writer opens within "
         "10 s; a bad job file); 3 internal error.")
HELP = f"""Explain known failures in NCCL, torch, torchrun and training logs, with fixes.

LOGFILE is a file or a directory; a directory is read recursively for *.log, *.txt and *.jsonl files, such as the tree torchrun --log-dir writes (<run-id>_*/attempt_<n>/<local_rank>/stdout.log, stderr.log). - reads standard input, and a pipe or FIFO (bash's <(cmd)) is read too: each until its writer closes it (end of input).

Example: trainready diagnose train.log      trainready diagnose /tmp/torchelastic/ --job job.toml      kubectl logs pod | trainready diagnose -

{CODES}"""

SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow"}
EVIDENCE_WIDTH = 160
FILES_SHOWN = 8


def diagnose(logfiles: Annotated[list[str], typer.Argument(metavar="LOGFILE...", help="Log files or directories to read (- for standard input).", show_default=False)],
             job: Annotated[Optional[str], typer.Option("--job", help="A job spec (plan --save): an out-of-memory diagnosis then shows the plan's memory estimate and which changes would fit.")] = None,
             json_out: o.Json = False) -> None:
    from trainready.plan.job import load_job
    from trainready.run.diagnose import STDIN, diagnose_files

    if STDIN in logfiles and sys.stdin.isatty() and not json_out:
        err.print("reading the log from the terminal: paste it, then Ctrl-D")
    if job is not None and not job.strip():  # (as a Path, '' would be '.': "is a directory")
        raise UsageError("--job is empty: name a job file (plan --save writes one)")
    report = diagnose_files(list(logfiles), job=load_job(Path(job)) if job is not None else None)
    if json_out:
        emit_json(report)
    else:
        render_diagnoses(out, report)
    if report.diagnoses:
        raise typer.Exit(1)


def _clip(text: str, width: int = EVIDENCE_WIDTH) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def render_diagnoses(console: Console, report: DiagnosisReport) -> None:
    """Each diagnosis: severity and title, evidence lines, explanation, fixes; then the summary line.
    Log text and file names are printed as plain Text, never as Rich markup (logs are full of [rank0]-style
    brackets), wrapped to the console with hanging indents and no trailing spaces (output is pasted and piped)."""
    shown = ", ".join(report.files[:FILES_SHOWN]) + (f" (+{len(report.files) - FILES_SHOWN} more)"
                                                      if len(report.files) > FILES_SHOWN else "")
    _print_wrapped(console, Text(f"read: {shown}", style="dim"), "", "  ")
    for diagnosis in report.diagnoses:
        console.print()
        style = SEVERITY_STYLE[diagnosis.severity]
        heading = Text(f"{diagnosis.severity}: {diagnosis.title}", style=style)
        heading.append(f"  [{diagnosis.id}" + (f", {diagnosis.count} lines]" if diagnosis.count > 1 else "]"), style="dim")
        _print_wrapped(console, heading, "", "  ")
        for ev in diagnosis.evidence:
            _print_wrapped(console, Text(f"{ev.file}:{ev.line}  {_clip(ev.text)}", style="dim"), "  ", "    ")
        if diagnosis.count > len(diagnosis.evidence):
            console.print(Text(f"  ... and {diagnosis.count - len(diagnosis.evidence)} more", style="dim"))
        _print_wrapped(console, Text(diagnosis.explanation), "  ", "  ")
        for fix in diagnosis.fixes:
            _print_wrapped(console, Text(fix), "   - ", "     ")
    console.print()
    style = "bold red" if any(d.severity == "error" for d in report.diagnoses) else \
        "bold yellow" if report.diagnoses else "bold green"
    _print_wrapped(console, Text(report.summary, style=style), "", "  ")


def _print_wrapped(console: Console, text: Text, first: str, rest: str) -> None:
    """`text` wrapped to the console width after the prefix `first` (later lines after `rest`); a word
    longer than a line (a path, a URL) is folded, never cut."""
    width = max(console.width - max(len(first), len(rest)), 20)
    for number, piece in enumerate(text.wrap(console, width, overflow="fold")):
        piece.rstrip()
        console.print(Text(first if number == 0 else rest) + piece, soft_wrap=True)
