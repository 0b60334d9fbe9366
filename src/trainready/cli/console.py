"""One place that writes to the terminal: Rich for people, plain JSON for programs."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from trainready.io import redact

# all C0/C1 controls but tab and newline, and the characters that reorder or break what follows them on a
# terminal: bidirectional marks, embeddings, overrides and isolates (U+202E makes "exe.txt" read "txt.exe"),
# and the line and paragraph separators
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """Control characters (a terminal escape in a file name, a log line, a catalog entry) shown as
    \\xNN instead of acting on the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        text)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        raise BrokenPipeError  # `| head` closed our output: cli.main ends the process the Unix way

    def render_str(self, text: str, **kwargs: Any) -> Text:  # every str printed or put in a table
        return super().render_str(visible(text), **kwargs)

    def _render_buffer(self, buffer: Any) -> str:
        # last line of defence for Text built elsewhere: text segments never carry control
        # characters to the terminal (Rich's own control segments, cursor moves, pass)
        return super()._render_buffer(
            Segment(_CONTROL.sub("\ufffd", text), style, control) if not control and _CONTROL.search(text)
            else Segment(text, style, control) for text, style, control in buffer)


def make_console(**kwargs: Any) -> Console:
    """Every console we print through: markup off, so text a user, a file or a library wrote
    (`llama[/x]`, `[rank0]:`, `:smile:`, botocore's `[/:]`) prints as written. Our own styles go through
    `styled`/`line`, never through `[tags]` in strings."""
    return _Console(markup=False, emoji=False, highlight=False, **kwargs)


def styled(text: object, style: str) -> Text:
    return Text(visible(str(text)), style=style)


def line(*parts: str | Text | tuple[str, str]) -> Text:
    """One line from plain strings, `styled` pieces and (text, style) pairs."""
    return Text.assemble(*(visible(p) if isinstance(p, str) else (visible(p[0]), p[1]) if isinstance(p, tuple) else p
                           for p in parts))


out = make_console(soft_wrap=False)
err = make_console(stderr=True)


def emit_json(data: BaseModel | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        text = data.model_dump_json(indent=2)
    else:
        text = json.dumps(data, indent=2, default=str)
    _write_all(text + "\n")


def _write_all(text: str) -> None:
    """All of it or an error: unbuffered (PYTHONUNBUFFERED=1) a single write to a pipe may take
    only part, and the rest would be dropped without a word."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a test's StringIO
        sys.stdout.write(text)
        return
    view = memoryview(text.encode(sys.stdout.encoding or "utf-8", errors="replace"))
    while view:
        written = buffer.write(view)
        view = view[written if written is not None else len(view):]
    buffer.flush()


def error(message: str, *, as_json: bool, exit_code: int) -> None:
    # never wrapped: an error is copied, grepped and read in logs whole
    # one line: a library's message may span several ("Parameter validation failed:\n...")
    # redacted: a message may quote what the user typed or an endpoint answered (s3://KEY:SECRET@bucket in a
    # bucket-name error, user:password@host of an AWS_ENDPOINT_URL), in the text and in --json alike
    message = redact(message, pairs=False)
    err.print(line(("error:", "bold red"), " ", visible(" ".join(message.split()))), soft_wrap=True)
    if as_json:
        emit_json({"schema_version": 1, "error": {"message": message, "exit_code": exit_code}})


class ProgressSink:
    """What long work reports to: `advance(n)` as work is done, `set_total(n)` once known.
    Library code takes a plain callable (`on_progress=sink.advance`) and never imports the CLI."""

    def __init__(self, progress: Any = None, task: Any = None):
        self._progress, self._task = progress, task

    def advance(self, amount: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, amount)

    def set_total(self, total: float | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)


@contextmanager
def progress(description: str, *, total: float | None = None, as_json: bool = False,
             unit: str = "items") -> Iterator[ProgressSink]:
    """A progress bar on stderr for long work (pull, verify, bench, deep checks): shown only on a
    terminal and never with --json; in a pipe or a log the work is silent until its result."""
    if as_json or not err.is_terminal:
        yield ProgressSink()
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    amount = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), amount, TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        yield ProgressSink(bar, bar.add_task(description, total=total))
