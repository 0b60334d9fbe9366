"""`report --html FILE [--live]` and `plan --html FILE`: write the page, say where it went."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from trainready.errors import UsageError, printable
from trainready.io import output_file

OURS_PROBE = 4096
"""The head of an existing file read to find our generator tag (it is in the first few hundred bytes)."""


def html_target(html: Path, *, force: bool = False, run_dir: Path | None = None) -> Path:
    """Where --html writes: never a file inside the run directory being reported (it would replace the run's own
    telemetry or run.json), and an existing file only when it is a page we wrote (GENERATOR) or with --force."""
    from trainready.io import read_regular
    from trainready.report.page import GENERATOR

    path = output_file(html, "--html", "report.html")
    if run_dir is not None:
        try:
            inside = path.resolve().is_relative_to(Path(run_dir).resolve())
        except OSError:
            inside = False
        if inside:
            raise UsageError(f"--html {printable(path)}: inside the run directory {printable(run_dir)}, whose files "
                             "it could replace; write the page elsewhere, e.g. report.html")
    if force or not path.exists():
        return path
    try:
        head = read_regular(path, 1 << 40)[:OURS_PROBE] if path.stat().st_size <= 64 << 20 else b""
    except OSError:
        head = b""
    if GENERATOR.encode() not in head:
        raise UsageError(f"--html {printable(path)}: exists and is not a page trainready wrote; give another file "
                         "name, or --force to replace it")
    return path


def _wrote(console: Console, path: Path, what: str) -> None:
    size = path.stat().st_size
    console.print(Text(f"trainready: wrote {what} {path} ({size / 1024:,.0f} KiB, self-contained: open it in a browser)"),
                  soft_wrap=True)


def _write(write, path: Path) -> Any:
    try:
        return write()
    except PermissionError:
        raise UsageError(f"--html {printable(path)}: permission denied") from None
    except OSError as exc:
        raise UsageError(f"--html {printable(path)}: cannot write ({exc.strerror})") from None


def _freeze_imports() -> None:
    """Import what the page is drawn with, then gc.freeze() every object alive now: modules, classes, the
    CLI's pydantic models, numpy and matplotlib (about 100,000 objects) live as long as the process, and
    every collection after, the one at exit among them, would walk them all again: 0.15-0.2 s of the
    command's CPU on a 10,000-step run (bench/report_html.py). Done here in the command, never in a library
    call, which must not freeze its caller's objects; the records and figures made later are collected."""
    import gc

    from trainready.report.svg import load_matplotlib, require_matplotlib

    require_matplotlib()
    from trainready.report import charts_run  # noqa: F401  (numpy, and the rest of the page's modules)

    load_matplotlib()
    gc.freeze()


def report_html(run_dir: Path, html: Path | None, *, live: bool, console: Console, force: bool = False) -> Any:
    """Write the run's page (again every REFRESH_S while the run goes on, with --live); the last summary."""
    from trainready.report.run_page import REFRESH_S, write_run_page

    if html is None:
        raise UsageError("--live rewrites the --html page while the run goes on: give --html FILE")
    path = html_target(html, force=force, run_dir=run_dir)
    _freeze_imports()
    summary = _write(lambda: write_run_page(run_dir, path, live=live), path)
    _wrote(console, path, "run report")
    if live and summary.status != "running":
        console.print(Text(f"trainready: the run is not going ({summary.status}): written once"), soft_wrap=True)
    while live and summary.status == "running":
        time.sleep(REFRESH_S)
        summary = _write(lambda: write_run_page(run_dir, path, live=True), path)
    return summary


def plan_html(result: Any, html: Path, *, console: Console, force: bool = False) -> None:
    from trainready.report.plan_page import write_plan_page

    path = html_target(html, force=force)
    _write(lambda: write_plan_page(result, path), path)
    _wrote(console, path, "plan")
